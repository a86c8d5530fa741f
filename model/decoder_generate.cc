// CausalLm::Generate: greedy decoding. With the KV cache, the prompt runs once through the
// training forward (eval mode) and each new token through a one-row step that attends to the
// cached keys and values; without it, every step reruns the whole sequence (the reference the
// cache is tested against).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/decoder_impl.h"

namespace fedlora {
namespace {

int32_t ArgMax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> CausalLm::Generate(const std::vector<int32_t>& prompt,
                                                        const GenerateOptions& go) {
  Impl& im = *impl_;
  if (!im.on_host()) {
    return absl::UnimplementedError("Generate: greedy decoding runs on the CPU so far (DecoderOptions::device)");
  }
  const DecoderConfig& c = config();
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (P == 0) return absl::InvalidArgumentError("Generate: empty prompt");
  if (go.max_new_tokens < 0) return absl::InvalidArgumentError("Generate: max_new_tokens is negative");
  if (P + go.max_new_tokens > options_.max_seq) {
    return absl::InvalidArgumentError(absl::StrCat("Generate: prompt (", P, " tokens) + max_new_tokens (",
                                                   go.max_new_tokens, ") exceed max_seq ", options_.max_seq));
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("Generate: prompt token ", id, " outside the vocabulary"));
    }
  }
  const int64_t h = c.hidden_size, V = c.vocab_size, kvd = c.kv_dim(), D = c.head_dim;
  const int64_t heads = c.num_attention_heads, group = heads / c.num_key_value_heads;
  const FrozenMatrix& head = im.weights.head();
  std::vector<float> logits(static_cast<size_t>(V));
  // Logits of one normalised row (nf row `row`).
  auto row_logits = [&](const float* row) {
    return kernels::LinearForward(im.ctx, {.rows = 1, .in_features = h, .out_features = V, .x = row,
                                           .w = head.ptr(), .y = logits.data(), .workspace = im.workspace,
                                           .workspace_bytes = im.workspace_bytes});
  };
  std::vector<int32_t> seq = prompt, out;
  auto emit = [&](int32_t tok) {
    out.push_back(tok);
    seq.push_back(tok);
    return std::find(go.stop_ids.begin(), go.stop_ids.end(), tok) != go.stop_ids.end();
  };
  if (go.max_new_tokens == 0) return out;

  if (!go.use_cache) {
    for (int i = 0; i < go.max_new_tokens; ++i) {
      Batch b{.batch_size = 1, .seq_len = static_cast<int>(seq.size()), .input_ids = seq, .attention_mask = {}, .labels = {}};
      FEDLORA_RETURN_IF_ERROR(im.Forward(b, false, 0));
      FEDLORA_RETURN_IF_ERROR(row_logits(im.nf.data() + (seq.size() - 1) * h));
      if (emit(ArgMax(logits.data(), V))) break;
    }
    return out;
  }

  // Prefill: the prompt through every layer, keeping each layer's rotated keys and values.
  std::vector<std::vector<float>> cache_k(im.L(), std::vector<float>(options_.max_seq * kvd));
  std::vector<std::vector<float>> cache_v = cache_k;
  Batch pb{.batch_size = 1, .seq_len = static_cast<int>(P), .input_ids = prompt, .attention_mask = {}, .labels = {}};
  FEDLORA_RETURN_IF_ERROR(im.Embed(pb));
  for (int64_t l = 0; l < im.L(); ++l) {
    DecoderLayerActs& a = im.ActsFor(l);
    FEDLORA_RETURN_IF_ERROR(im.LayerForward(l, 1, P, false, 0, a));
    std::copy(a.k.data(), a.k.data() + P * kvd, cache_k[l].begin());
    std::copy(a.v.data(), a.v.data() + P * kvd, cache_v[l].begin());
  }
  const float eps = static_cast<float>(c.rms_norm_eps);
  FEDLORA_RETURN_IF_ERROR(kernels::RmsNormForward(im.ctx, {.rows = 1, .cols = h, .eps = eps,
                                                           .x = im.x[im.L()].data() + (P - 1) * h,
                                                           .gamma = im.weights.final_norm.data(), .y = im.nf.data()}));
  FEDLORA_RETURN_IF_ERROR(row_logits(im.nf.data()));
  if (emit(ArgMax(logits.data(), V))) return out;

  // One token at a time: position p attends to cached positions 0..p.
  std::vector<float> xrow(h), scores(options_.max_seq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int i = 1; i < go.max_new_tokens; ++i) {
    const int64_t p = static_cast<int64_t>(seq.size()) - 1;
    const int32_t pos = static_cast<int32_t>(p);
    im.weights.embed.RowToF32(seq.back(), xrow.data());
    for (int64_t l = 0; l < im.L(); ++l) {
      DecoderLayerActs& a = im.ActsFor(l);
      const DecoderLayerWeights& lw = im.weights.layers[l];
      FEDLORA_RETURN_IF_ERROR(kernels::RmsNormForward(
          im.ctx, {.rows = 1, .cols = h, .eps = eps, .x = xrow.data(), .gamma = lw.input_norm.data(), .y = im.norm.data()}));
      float* kp = cache_k[l].data() + p * kvd;
      float* vp = cache_v[l].data() + p * kvd;
      FEDLORA_RETURN_IF_ERROR(im.Linear(l, DecoderTarget::kQProj, im.norm.data(), 1, a.q.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(im.Linear(l, DecoderTarget::kKProj, im.norm.data(), 1, kp, false, 0, a));
      FEDLORA_RETURN_IF_ERROR(im.Linear(l, DecoderTarget::kVProj, im.norm.data(), 1, vp, false, 0, a));
      for (auto [buf, nh] : {std::pair<float*, int64_t>{a.q.data(), heads}, {kp, c.num_key_value_heads}}) {
        FEDLORA_RETURN_IF_ERROR(kernels::Rope(im.ctx, {.tokens = 1, .heads = nh, .head_dim = D,
                                                       .max_positions = im.rope.max_positions, .positions = &pos,
                                                       .cos = im.rope.cos.data(), .sin = im.rope.sin.data(),
                                                       .x = buf}));
      }
      for (int64_t hq = 0; hq < heads; ++hq) {
        const float* q = a.q.data() + hq * D;
        const int64_t kvh = hq / group;
        float m = -INFINITY;
        for (int64_t j = 0; j <= p; ++j) {
          const float* k = cache_k[l].data() + j * kvd + kvh * D;
          float dot = 0.0f;
          for (int64_t e = 0; e < D; ++e) dot += q[e] * k[e];
          scores[j] = dot * scale;
          m = std::max(m, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j <= p; ++j) sum += (scores[j] = std::exp(scores[j] - m));
        float* o = a.ctx.data() + hq * D;
        std::fill(o, o + D, 0.0f);
        for (int64_t j = 0; j <= p; ++j) {
          const float w = scores[j] / sum;
          const float* v = cache_v[l].data() + j * kvd + kvh * D;
          for (int64_t e = 0; e < D; ++e) o[e] += w * v[e];
        }
      }
      FEDLORA_RETURN_IF_ERROR(im.Linear(l, DecoderTarget::kOProj, a.ctx.data(), 1, im.tmp.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(kernels::Add(im.ctx, {.n = h, .a = im.tmp.data(), .b = xrow.data(), .out = a.z.data()}));
      FEDLORA_RETURN_IF_ERROR(kernels::RmsNormForward(
          im.ctx, {.rows = 1, .cols = h, .eps = eps, .x = a.z.data(), .gamma = lw.post_attention_norm.data(),
                   .y = im.norm.data()}));
      FEDLORA_RETURN_IF_ERROR(im.Linear(l, DecoderTarget::kGateProj, im.norm.data(), 1, a.gate.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(im.Linear(l, DecoderTarget::kUpProj, im.norm.data(), 1, a.up.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(kernels::SwiGluForward(
          im.ctx, {.n = c.intermediate_size, .gate = a.gate.data(), .up = a.up.data(), .y = im.act.data()}));
      FEDLORA_RETURN_IF_ERROR(im.Linear(l, DecoderTarget::kDownProj, im.act.data(), 1, im.tmp.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(kernels::Add(im.ctx, {.n = h, .a = im.tmp.data(), .b = a.z.data(), .out = xrow.data()}));
    }
    FEDLORA_RETURN_IF_ERROR(kernels::RmsNormForward(
        im.ctx, {.rows = 1, .cols = h, .eps = eps, .x = xrow.data(), .gamma = im.weights.final_norm.data(),
                 .y = im.nf.data()}));
    FEDLORA_RETURN_IF_ERROR(row_logits(im.nf.data()));
    if (emit(ArgMax(logits.data(), V))) break;
  }
  return out;
}

}  // namespace fedlora
