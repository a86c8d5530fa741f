// CausalLm::Generate: greedy or sampled decoding (model/sampling.h), on the model's backend (CPU or CUDA). With the KV cache,
// the prompt runs once through the training forward (eval mode) and each new token through a
// one-row step that attends to the cached keys and values (kernels/decode_attention.h); without
// it, every step reruns the whole sequence (the reference the cache is tested against). The cache
// lives where the activations do; per token only the embedding row goes up and the logits row
// comes down.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/decode_attention.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/decoder_impl.h"

namespace fedlora {

absl::StatusOr<std::vector<int32_t>> CausalLm::Generate(const std::vector<int32_t>& prompt,
                                                        const GenerateOptions& go) {
  Impl& im = *impl_;
  const DecoderConfig& c = config();
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (P == 0) return absl::InvalidArgumentError("Generate: empty prompt");
  if (go.max_new_tokens < 0)
    return absl::InvalidArgumentError("Generate: max_new_tokens is negative");
  if (P + go.max_new_tokens > options_.max_seq) {
    return absl::InvalidArgumentError(absl::StrCat("Generate: prompt (", P,
                                                   " tokens) + max_new_tokens (", go.max_new_tokens,
                                                   ") exceed max_seq ", options_.max_seq));
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("Generate: prompt token ", id, " outside the vocabulary"));
    }
  }
  FEDLORA_RETURN_IF_ERROR_CTX(CheckSamplingOptions(go.sampling), "Generate");
  Rng rng(go.sampling.seed);
  std::vector<int32_t> seq = prompt, out;
  if (go.max_new_tokens == 0) return out;
  FEDLORA_RETURN_IF_ERROR(im.dev_params.ToDevice(/*grads=*/false));
  const int64_t h = c.hidden_size, V = c.vocab_size, kvd = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> logits(static_cast<size_t>(V));
  // The token after a final-normed row `row` (on the device): its logits into head_logits, down to
  // the host, and the choice among them.
  auto next_token = [&](const float* row) -> absl::StatusOr<int32_t> {
    FEDLORA_RETURN_IF_ERROR(
        kernels::LinearForward(im.ctx, {.rows = 1,
                                        .in_features = h,
                                        .out_features = V,
                                        .x = row,
                                        .w = im.dev_head,
                                        .y = im.head_logits.data(),
                                        .workspace = im.workspace,
                                        .workspace_bytes = im.workspace_bytes}));
    FEDLORA_RETURN_IF_ERROR(
        im.backend->Download(logits.data(), im.head_logits.data(), V * sizeof(float)));
    return SampleToken(logits, go.sampling, rng);
  };
  // Emits `tok`; true when it is a stop token.
  auto emit = [&](int32_t tok) {
    out.push_back(tok);
    seq.push_back(tok);
    if (go.on_token) go.on_token(tok);
    return std::find(go.stop_ids.begin(), go.stop_ids.end(), tok) != go.stop_ids.end();
  };

  if (!go.use_cache) {
    for (int i = 0; i < go.max_new_tokens; ++i) {
      Batch b{.batch_size = 1,
              .seq_len = static_cast<int>(seq.size()),
              .input_ids = seq,
              .attention_mask = {},
              .labels = {}};
      FEDLORA_RETURN_IF_ERROR(im.Forward(b, false, 0));
      FEDLORA_ASSIGN_OR_RETURN(const int32_t tok, next_token(im.nf.data() + (seq.size() - 1) * h));
      if (emit(tok)) break;
    }
    return out;
  }

  if (im.cache_k.empty()) {
    for (auto* cache : {&im.cache_k, &im.cache_v}) {
      for (int64_t l = 0; l < im.L(); ++l) {
        FEDLORA_ASSIGN_OR_RETURN(
            auto a, Impl::Array::Zeros(*im.backend, static_cast<size_t>(options_.max_seq * kvd)));
        cache->push_back(std::move(a));
      }
    }
  }
  // Prefill: the prompt through every layer, copying each layer's rotated keys and values into
  // the cache.
  Batch pb{.batch_size = 1,
           .seq_len = static_cast<int>(P),
           .input_ids = prompt,
           .attention_mask = {},
           .labels = {}};
  FEDLORA_RETURN_IF_ERROR(im.Embed(pb));
  const size_t prompt_bytes = static_cast<size_t>(P * kvd) * sizeof(float);
  for (int64_t l = 0; l < im.L(); ++l) {
    DecoderLayerActs& a = im.ActsFor(l);
    FEDLORA_RETURN_IF_ERROR(im.LayerForward(l, 1, P, false, 0, a));
    FEDLORA_RETURN_IF_ERROR(im.backend->CopyRows(im.cache_k[l].data(), prompt_bytes, a.k.data(),
                                                 prompt_bytes, prompt_bytes, 1));
    FEDLORA_RETURN_IF_ERROR(im.backend->CopyRows(im.cache_v[l].data(), prompt_bytes, a.v.data(),
                                                 prompt_bytes, prompt_bytes, 1));
  }
  FEDLORA_RETURN_IF_ERROR(kernels::RmsNormForward(im.ctx, {.rows = 1,
                                                           .cols = h,
                                                           .eps = eps,
                                                           .x = im.x[im.L()].data() + (P - 1) * h,
                                                           .gamma = im.dev_final_norm,
                                                           .y = im.nf.data()}));
  FEDLORA_ASSIGN_OR_RETURN(int32_t tok, next_token(im.nf.data()));
  if (emit(tok)) return out;

  // One token at a time: position p attends to cached positions 0..p. x[0]'s first row carries
  // the token's residual stream through the layers.
  float* xrow = im.x[0].data();
  for (int i = 1; i < go.max_new_tokens; ++i) {
    const int64_t p = static_cast<int64_t>(seq.size()) - 1;
    FEDLORA_RETURN_IF_ERROR(im.GatherEmbeddings(&seq.back(), 1));
    im.positions_host[0] = static_cast<int32_t>(p);
    FEDLORA_ASSIGN_OR_RETURN(const int32_t* pos,
                             Stage(*im.backend, im.positions_host, 1, im.dev_positions));
    for (int64_t l = 0; l < im.L(); ++l) {
      DecoderLayerActs& a = im.ActsFor(l);
      const Impl::DevLayer& lw = im.dev_layers[l];
      FEDLORA_RETURN_IF_ERROR(kernels::RmsNormForward(im.ctx, {.rows = 1,
                                                               .cols = h,
                                                               .eps = eps,
                                                               .x = xrow,
                                                               .gamma = lw.input_norm,
                                                               .y = im.norm.data()}));
      float* kp = im.cache_k[l].data() + p * kvd;
      float* vp = im.cache_v[l].data() + p * kvd;
      FEDLORA_RETURN_IF_ERROR(
          im.Linear(l, DecoderTarget::kQProj, im.norm.data(), 1, a.q.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(
          im.Linear(l, DecoderTarget::kKProj, im.norm.data(), 1, kp, false, 0, a));
      FEDLORA_RETURN_IF_ERROR(
          im.Linear(l, DecoderTarget::kVProj, im.norm.data(), 1, vp, false, 0, a));
      for (auto [buf, nh] : {std::pair<float*, int64_t>{a.q.data(), c.num_attention_heads},
                             {kp, c.num_key_value_heads}}) {
        FEDLORA_RETURN_IF_ERROR(kernels::Rope(im.ctx, {.tokens = 1,
                                                       .heads = nh,
                                                       .head_dim = c.head_dim,
                                                       .max_positions = im.rope.max_positions,
                                                       .positions = pos,
                                                       .cos = im.rope_cos_ptr,
                                                       .sin = im.rope_sin_ptr,
                                                       .x = buf}));
      }
      FEDLORA_RETURN_IF_ERROR(
          kernels::DecodeAttention(im.ctx, {.heads = c.num_attention_heads,
                                            .kv_heads = c.num_key_value_heads,
                                            .head_dim = c.head_dim,
                                            .len = p + 1,
                                            .q = a.q.data(),
                                            .k_cache = im.cache_k[l].data(),
                                            .v_cache = im.cache_v[l].data(),
                                            .out = a.ctx.data(),
                                            .workspace = im.workspace,
                                            .workspace_bytes = im.workspace_bytes}));
      FEDLORA_RETURN_IF_ERROR(
          im.Linear(l, DecoderTarget::kOProj, a.ctx.data(), 1, im.tmp.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(
          kernels::Add(im.ctx, {.n = h, .a = im.tmp.data(), .b = xrow, .out = a.z.data()}));
      FEDLORA_RETURN_IF_ERROR(kernels::RmsNormForward(im.ctx, {.rows = 1,
                                                               .cols = h,
                                                               .eps = eps,
                                                               .x = a.z.data(),
                                                               .gamma = lw.post_attention_norm,
                                                               .y = im.norm.data()}));
      FEDLORA_RETURN_IF_ERROR(
          im.Linear(l, DecoderTarget::kGateProj, im.norm.data(), 1, a.gate.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(
          im.Linear(l, DecoderTarget::kUpProj, im.norm.data(), 1, a.up.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(kernels::SwiGluForward(im.ctx, {.n = c.intermediate_size,
                                                              .gate = a.gate.data(),
                                                              .up = a.up.data(),
                                                              .y = im.act.data()}));
      FEDLORA_RETURN_IF_ERROR(
          im.Linear(l, DecoderTarget::kDownProj, im.act.data(), 1, im.tmp.data(), false, 0, a));
      FEDLORA_RETURN_IF_ERROR(
          kernels::Add(im.ctx, {.n = h, .a = im.tmp.data(), .b = a.z.data(), .out = xrow}));
    }
    FEDLORA_RETURN_IF_ERROR(kernels::RmsNormForward(im.ctx, {.rows = 1,
                                                             .cols = h,
                                                             .eps = eps,
                                                             .x = xrow,
                                                             .gamma = im.dev_final_norm,
                                                             .y = im.nf.data()}));
    FEDLORA_ASSIGN_OR_RETURN(tok, next_token(im.nf.data()));
    if (emit(tok)) break;
  }
  return out;
}

}  // namespace fedlora
