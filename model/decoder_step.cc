// CausalLm's forward, backward, evaluation and logits (see model/decoder.h for the network).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/lora_linear.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/decoder_impl.h"

namespace fedlora {
namespace {

// Every dropout site of a step draws from its own core/rng.h stream of the step's seed.
constexpr uint64_t kSiteLayerBase = 16, kSitesPerLayer = 16, kSiteAttnProbs = 0, kSiteLora = 8;

}  // namespace

kernels::DropoutSpec CausalLm::Impl::LoraSpec(bool training, uint64_t seed, int64_t layer,
                                              DecoderTarget t) const {
  return kernels::DropoutSpec{
      .p = training ? lora_p : 0.0f,
      .seed = seed,
      .offset = 0,
      .stream = kSiteLayerBase + layer * kSitesPerLayer + kSiteLora + static_cast<int>(t)};
}

absl::Status CausalLm::Impl::GatherEmbeddings(const int32_t* ids, int64_t tokens) {
  const int64_t h = H();
  // The rows are gathered on the host (the table may be block-quantized), then uploaded.
  float* rows = on_host() ? x[0].data() : embed_host.data();
  for (int64_t i = 0; i < tokens; ++i) weights.embed.RowToF32(ids[i], rows + i * h);
  if (!on_host())
    FEDLORA_RETURN_IF_ERROR(backend->Upload(x[0].data(), rows, tokens * h * sizeof(float)));
  return absl::OkStatus();
}

absl::Status CausalLm::Impl::Embed(const Batch& b) {
  const int64_t tokens = static_cast<int64_t>(b.batch_size) * b.seq_len;
  FEDLORA_RETURN_IF_ERROR(GatherEmbeddings(b.input_ids.data(), tokens));
  for (int64_t i = 0; i < tokens; ++i) {
    // Padding keys get a large negative bias, so exp() underflows to exactly 0.
    mask_host[i] = b.attention_mask.empty() || b.attention_mask[i] != 0 ? 0.0f : -1e30f;
    positions_host[i] = static_cast<int32_t>(i % b.seq_len);  // right padding: position = index
  }
  FEDLORA_ASSIGN_OR_RETURN(mask_ptr, Stage(*backend, mask_host, tokens, dev_mask));
  FEDLORA_ASSIGN_OR_RETURN(positions_ptr, Stage(*backend, positions_host, tokens, dev_positions));
  if (fused_attention) {
    for (int64_t s = 0; s <= b.batch_size; ++s)
      seq_start_host[s] = static_cast<int32_t>(s * b.seq_len);
    FEDLORA_ASSIGN_OR_RETURN(seq_start_ptr,
                             Stage(*backend, seq_start_host, b.batch_size + 1, dev_seq_start));
  }
  return absl::OkStatus();
}

absl::Status CausalLm::Impl::Linear(int64_t layer, DecoderTarget t, const float* in, int64_t rows,
                                    float* y, bool training, uint64_t seed, DecoderLayerActs& a) {
  const int ti = static_cast<int>(t);
  const FrozenLinear& lin = weights.layers[layer].proj[ti];
  const DevLinear& dl = dev_layers[layer].proj[ti];
  const int lp = lora_param[layer][ti];
  if (lp < 0) {
    return kernels::LinearForward(ctx, {.rows = rows,
                                        .in_features = lin.w.cols,
                                        .out_features = lin.w.rows,
                                        .x = in,
                                        .w = dl.w,
                                        .bias = dl.bias,
                                        .y = y,
                                        .workspace = workspace,
                                        .workspace_bytes = workspace_bytes});
  }
  return kernels::LoraLinearForward(ctx, {.rows = rows,
                                          .in_features = lin.w.cols,
                                          .out_features = lin.w.rows,
                                          .rank = r(),
                                          .x = in,
                                          .w = dl.w,
                                          .bias = dl.bias,
                                          .lora_a = dev_params.Value(lp),
                                          .lora_b = dev_params.Value(lp + 1),
                                          .scaling = lora_scaling,
                                          .dropout = LoraSpec(training, seed, layer, t),
                                          .y = y,
                                          .h = a.lora_h[ti].data(),
                                          .workspace = workspace,
                                          .workspace_bytes = workspace_bytes});
}

absl::Status CausalLm::Impl::LinearBackward(int64_t layer, DecoderTarget t, const float* in,
                                            const float* dy, int64_t rows, float* dx_out,
                                            bool accumulate_dx, uint64_t seed,
                                            DecoderLayerActs& a) {
  const int ti = static_cast<int>(t);
  const FrozenLinear& lin = weights.layers[layer].proj[ti];
  const DevLinear& dl = dev_layers[layer].proj[ti];
  const int lp = lora_param[layer][ti];
  if (lp < 0) {
    if (dx_out == nullptr)
      return absl::OkStatus();  // frozen, and nothing below needs its input gradient
    return kernels::LinearBackward(ctx, {.rows = rows,
                                         .in_features = lin.w.cols,
                                         .out_features = lin.w.rows,
                                         .w = dl.w,
                                         .dy = dy,
                                         .dx = dx_out,
                                         .accumulate_dx = accumulate_dx,
                                         .workspace = workspace,
                                         .workspace_bytes = workspace_bytes});
  }
  float* da = dev_params.param(lp).frozen ? nullptr : dev_params.Grad(lp);  // FFA-LoRA: no dA
  return kernels::LoraLinearBackward(ctx, {.rows = rows,
                                           .in_features = lin.w.cols,
                                           .out_features = lin.w.rows,
                                           .rank = r(),
                                           .x = in,
                                           .w = dl.w,
                                           .lora_a = dev_params.Value(lp),
                                           .lora_b = dev_params.Value(lp + 1),
                                           .scaling = lora_scaling,
                                           .dropout = LoraSpec(true, seed, layer, t),
                                           .h = a.lora_h[ti].data(),
                                           .dy = dy,
                                           .dx = dx_out,
                                           .accumulate_dx = accumulate_dx,
                                           .da = da,
                                           .db = dev_params.Grad(lp + 1),
                                           .accumulate_params = true,
                                           .workspace = workspace,
                                           .workspace_bytes = workspace_bytes});
}

kernels::AttentionDims CausalLm::Impl::AttentionDimsFor(int64_t batch, int64_t seq) const {
  return {.batch = batch,
          .heads = config.num_attention_heads,
          .seq = seq,
          .head_dim = config.head_dim,
          .layout = kernels::AttentionLayout::kBSHD,
          .kv_heads = config.num_key_value_heads,
          .causal = true};
}

absl::Status CausalLm::Impl::AttentionNorm(int64_t l, int64_t T) {
  return kernels::RmsNormForward(ctx, {.rows = T,
                                       .cols = H(),
                                       .eps = static_cast<float>(config.rms_norm_eps),
                                       .x = x[l].data(),
                                       .gamma = dev_layers[l].input_norm,
                                       .y = norm.data(),
                                       .rstd = rstd.data()});
}

absl::Status CausalLm::Impl::MlpNorm(int64_t l, int64_t T, const DecoderLayerActs& a) {
  return kernels::RmsNormForward(ctx, {.rows = T,
                                       .cols = H(),
                                       .eps = static_cast<float>(config.rms_norm_eps),
                                       .x = a.z.data(),
                                       .gamma = dev_layers[l].post_attention_norm,
                                       .y = norm.data(),
                                       .rstd = rstd.data()});
}

kernels::FusedAttentionDims CausalLm::Impl::FusedDimsFor(int64_t batch, int64_t seq) const {
  return {.tokens = batch * seq,
          .num_seqs = batch,
          .heads = config.num_attention_heads,
          .head_dim = config.head_dim,
          .kv_heads = config.num_key_value_heads,
          .causal = true,
          .seq_start = seq_start_ptr};
}

absl::Status CausalLm::Impl::Attention(int64_t l, int64_t batch, int64_t seq, bool training,
                                       uint64_t seed, DecoderLayerActs& a, float* out) {
  const kernels::DropoutSpec drop{.p = training ? attention_p : 0.0f,
                                  .seed = seed,
                                  .offset = 0,
                                  .stream = kSiteLayerBase + l * kSitesPerLayer + kSiteAttnProbs};
  if (fused_attention) {
    // Right padding and causal attention: a real token never sees a padding key, so each row of
    // the batch is one sequence and the mask is not needed.
    return kernels::FusedAttentionForward(ctx, {.dims = FusedDimsFor(batch, seq),
                                                .q = a.q.data(),
                                                .k = a.k.data(),
                                                .v = a.v.data(),
                                                .dropout = drop,
                                                .out = out,
                                                .lse = a.lse.data()});
  }
  return kernels::AttentionForward(ctx, {.dims = AttentionDimsFor(batch, seq),
                                         .q = a.q.data(),
                                         .k = a.k.data(),
                                         .v = a.v.data(),
                                         .mask = mask_ptr,
                                         .dropout = drop,
                                         .probs = probs.data(),
                                         .out = out,
                                         .workspace = workspace,
                                         .workspace_bytes = workspace_bytes});
}

absl::Status CausalLm::Impl::LayerForward(int64_t l, int64_t batch, int64_t seq, bool training,
                                          uint64_t seed, DecoderLayerActs& a) {
  const int64_t T = batch * seq, h = H(), inter = config.intermediate_size;
  const float* in = x[l].data();
  float* out = x[l + 1].data();
  // n1 = RMSNorm(x); q, k, v = projections; rotary on q and k
  FEDLORA_RETURN_IF_ERROR(AttentionNorm(l, T));
  FEDLORA_RETURN_IF_ERROR(
      Linear(l, DecoderTarget::kQProj, norm.data(), T, a.q.data(), training, seed, a));
  FEDLORA_RETURN_IF_ERROR(
      Linear(l, DecoderTarget::kKProj, norm.data(), T, a.k.data(), training, seed, a));
  FEDLORA_RETURN_IF_ERROR(
      Linear(l, DecoderTarget::kVProj, norm.data(), T, a.v.data(), training, seed, a));
  for (auto [buf, heads] : {std::pair<float*, int64_t>{a.q.data(), config.num_attention_heads},
                            {a.k.data(), config.num_key_value_heads}}) {
    FEDLORA_RETURN_IF_ERROR(kernels::Rope(ctx, {.tokens = T,
                                                .heads = heads,
                                                .head_dim = config.head_dim,
                                                .max_positions = rope.max_positions,
                                                .positions = positions_ptr,
                                                .cos = rope_cos_ptr,
                                                .sin = rope_sin_ptr,
                                                .x = buf}));
  }
  FEDLORA_RETURN_IF_ERROR(Attention(l, batch, seq, training, seed, a, a.ctx.data()));
  // z = x + o_proj(ctx)
  FEDLORA_RETURN_IF_ERROR(
      Linear(l, DecoderTarget::kOProj, a.ctx.data(), T, tmp.data(), training, seed, a));
  FEDLORA_RETURN_IF_ERROR(
      kernels::Add(ctx, {.n = T * h, .a = tmp.data(), .b = in, .out = a.z.data()}));
  // n2 = RMSNorm(z); x' = z + down_proj(silu(gate_proj(n2)) * up_proj(n2))
  FEDLORA_RETURN_IF_ERROR(MlpNorm(l, T, a));
  FEDLORA_RETURN_IF_ERROR(
      Linear(l, DecoderTarget::kGateProj, norm.data(), T, a.gate.data(), training, seed, a));
  FEDLORA_RETURN_IF_ERROR(
      Linear(l, DecoderTarget::kUpProj, norm.data(), T, a.up.data(), training, seed, a));
  FEDLORA_RETURN_IF_ERROR(kernels::SwiGluForward(
      ctx, {.n = T * inter, .gate = a.gate.data(), .up = a.up.data(), .y = act.data()}));
  FEDLORA_RETURN_IF_ERROR(
      Linear(l, DecoderTarget::kDownProj, act.data(), T, tmp.data(), training, seed, a));
  return kernels::Add(ctx, {.n = T * h, .a = tmp.data(), .b = a.z.data(), .out = out});
}

absl::Status CausalLm::Impl::LayerBackward(int64_t l, int64_t batch, int64_t seq, uint64_t seed,
                                           DecoderLayerActs& a) {
  const DevLayer& lw = dev_layers[l];
  const int64_t T = batch * seq, h = H(), inter = config.intermediate_size;
  const bool first = l == 0;  // nothing below the first layer needs an input gradient
  // x' = z + down(act): dz starts as dx' (kept in dx), d(act) through down_proj. act, and below
  // n2, P and n1, are recomputed as the forward made them (same kernels, inputs and seed).
  FEDLORA_RETURN_IF_ERROR(kernels::SwiGluForward(
      ctx, {.n = T * inter, .gate = a.gate.data(), .up = a.up.data(), .y = act.data()}));
  FEDLORA_RETURN_IF_ERROR(LinearBackward(l, DecoderTarget::kDownProj, act.data(), dx.data(), T,
                                         dact.data(), false, seed, a));
  FEDLORA_RETURN_IF_ERROR(kernels::SwiGluBackward(ctx, {.n = T * inter,
                                                        .gate = a.gate.data(),
                                                        .up = a.up.data(),
                                                        .dy = dact.data(),
                                                        .dgate = dgate.data(),
                                                        .dup = dup.data()}));
  FEDLORA_RETURN_IF_ERROR(MlpNorm(l, T, a));
  FEDLORA_RETURN_IF_ERROR(LinearBackward(l, DecoderTarget::kGateProj, norm.data(), dgate.data(), T,
                                         dn.data(), false, seed, a));
  FEDLORA_RETURN_IF_ERROR(LinearBackward(l, DecoderTarget::kUpProj, norm.data(), dup.data(), T,
                                         dn.data(), true, seed, a));
  FEDLORA_RETURN_IF_ERROR(kernels::RmsNormBackward(ctx, {.rows = T,
                                                         .cols = h,
                                                         .x = a.z.data(),
                                                         .gamma = lw.post_attention_norm,
                                                         .rstd = rstd.data(),
                                                         .dy = dn.data(),
                                                         .dx = dx.data(),
                                                         .accumulate_dx = true}));
  // z = x + o(ctx): dx now holds dz.
  FEDLORA_RETURN_IF_ERROR(LinearBackward(l, DecoderTarget::kOProj, a.ctx.data(), dx.data(), T,
                                         dctx.data(), false, seed, a));
  const kernels::DropoutSpec drop{.p = attention_p,
                                  .seed = seed,
                                  .offset = 0,
                                  .stream = kSiteLayerBase + l * kSitesPerLayer + kSiteAttnProbs};
  if (fused_attention) {
    // O (a.ctx) and the log-sum-exp are the forward's; P is recomputed inside.
    FEDLORA_RETURN_IF_ERROR(
        kernels::FusedAttentionBackward(ctx, {.dims = FusedDimsFor(batch, seq),
                                              .q = a.q.data(),
                                              .k = a.k.data(),
                                              .v = a.v.data(),
                                              .out = a.ctx.data(),
                                              .lse = a.lse.data(),
                                              .dropout = drop,
                                              .dout = dctx.data(),
                                              .dq = dq.data(),
                                              .dk = dk.data(),
                                              .dv = dv.data(),
                                              .workspace = workspace,
                                              .workspace_bytes = workspace_bytes}));
  } else {
    FEDLORA_RETURN_IF_ERROR(Attention(l, batch, seq, /*training=*/true, seed, a, /*out=*/nullptr));
    FEDLORA_RETURN_IF_ERROR(kernels::AttentionBackward(ctx, {.dims = AttentionDimsFor(batch, seq),
                                                             .q = a.q.data(),
                                                             .k = a.k.data(),
                                                             .v = a.v.data(),
                                                             .probs = probs.data(),
                                                             .dropout = drop,
                                                             .dout = dctx.data(),
                                                             .dq = dq.data(),
                                                             .dk = dk.data(),
                                                             .dv = dv.data(),
                                                             .workspace = workspace,
                                                             .workspace_bytes = workspace_bytes}));
  }
  for (auto [buf, heads] : {std::pair<float*, int64_t>{dq.data(), config.num_attention_heads},
                            {dk.data(), config.num_key_value_heads}}) {
    FEDLORA_RETURN_IF_ERROR(kernels::Rope(ctx, {.tokens = T,
                                                .heads = heads,
                                                .head_dim = config.head_dim,
                                                .max_positions = rope.max_positions,
                                                .positions = positions_ptr,
                                                .cos = rope_cos_ptr,
                                                .sin = rope_sin_ptr,
                                                .x = buf,
                                                .inverse = true}));
  }
  float* dn1 = first ? nullptr : dn.data();
  FEDLORA_RETURN_IF_ERROR(AttentionNorm(l, T));
  FEDLORA_RETURN_IF_ERROR(
      LinearBackward(l, DecoderTarget::kQProj, norm.data(), dq.data(), T, dn1, false, seed, a));
  FEDLORA_RETURN_IF_ERROR(
      LinearBackward(l, DecoderTarget::kKProj, norm.data(), dk.data(), T, dn1, true, seed, a));
  FEDLORA_RETURN_IF_ERROR(
      LinearBackward(l, DecoderTarget::kVProj, norm.data(), dv.data(), T, dn1, true, seed, a));
  if (first) return absl::OkStatus();
  return kernels::RmsNormBackward(ctx, {.rows = T,
                                        .cols = h,
                                        .x = x[l].data(),
                                        .gamma = lw.input_norm,
                                        .rstd = rstd.data(),
                                        .dy = dn.data(),
                                        .dx = dx.data(),
                                        .accumulate_dx = true});
}

absl::Status CausalLm::Impl::Forward(const Batch& b, bool training, uint64_t seed) {
  FEDLORA_RETURN_IF_ERROR(Embed(b));
  for (int64_t l = 0; l < L(); ++l) {
    FEDLORA_RETURN_IF_ERROR(LayerForward(l, b.batch_size, b.seq_len, training, seed, ActsFor(l)));
  }
  const int64_t T = static_cast<int64_t>(b.batch_size) * b.seq_len;
  return kernels::RmsNormForward(ctx, {.rows = T,
                                       .cols = H(),
                                       .eps = static_cast<float>(config.rms_norm_eps),
                                       .x = x[L()].data(),
                                       .gamma = dev_final_norm,
                                       .y = nf.data(),
                                       .rstd = rstd_f.data()});
}

absl::Status CausalLm::Impl::Head(const Batch& b, bool backward, LossSum* sum) {
  const int64_t S = b.seq_len, h = H(), V = config.vocab_size;
  const size_t row_bytes = static_cast<size_t>(h) * sizeof(float);
  // Rows with a target: position t of sequence s predicts labels[s, t + 1].
  std::vector<int64_t> rows;
  for (int64_t s = 0; s < b.batch_size; ++s) {
    for (int64_t t = 0; t + 1 < S; ++t) {
      if (b.labels[s * S + t + 1] != kernels::kIgnoreIndex) rows.push_back(s * S + t);
    }
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  sum->nll = 0.0;
  sum->tokens = n;
  if (backward)
    FEDLORA_RETURN_IF_ERROR(
        backend->Zero(dn.data(), static_cast<size_t>(b.batch_size) * S * row_bytes));
  // Copies chunk rows [c0, c0 + c) between the packed chunk buffer and their rows of a [T, h]
  // array, one copy per run of consecutive rows (the targets are runs of each sequence's tokens).
  auto copy_rows = [&](int64_t c0, int64_t c, float* chunk, float* full,
                       bool to_chunk) -> absl::Status {
    for (int64_t i = 0; i < c;) {
      int64_t run = 1;
      while (i + run < c && rows[c0 + i + run] == rows[c0 + i] + run) ++run;
      float* packed = chunk + i * h;
      float* spread = full + rows[c0 + i] * h;
      FEDLORA_RETURN_IF_ERROR(
          to_chunk ? backend->CopyRows(packed, row_bytes, spread, row_bytes, row_bytes, run)
                   : backend->CopyRows(spread, row_bytes, packed, row_bytes, row_bytes, run));
      i += run;
    }
    return absl::OkStatus();
  };
  int64_t chunks = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kLmHeadChunkRows, ++chunks) {
    const int64_t c = std::min(kLmHeadChunkRows, n - c0);
    FEDLORA_RETURN_IF_ERROR(copy_rows(c0, c, head_in.data(), nf.data(), /*to_chunk=*/true));
    for (int64_t i = 0; i < c; ++i) head_labels_host[i] = b.labels[rows[c0 + i] + 1];
    FEDLORA_ASSIGN_OR_RETURN(const int32_t* labels,
                             Stage(*backend, head_labels_host, c, head_labels));
    FEDLORA_RETURN_IF_ERROR(kernels::LinearForward(ctx, {.rows = c,
                                                         .in_features = h,
                                                         .out_features = V,
                                                         .x = head_in.data(),
                                                         .w = dev_head,
                                                         .y = head_logits.data(),
                                                         .workspace = workspace,
                                                         .workspace_bytes = workspace_bytes}));
    // Each chunk's mean times c / n: the chunks' gradients add up to those of the mean over n.
    FEDLORA_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(
        ctx, {.batch = c,
              .classes = V,
              .logits = head_logits.data(),
              .labels = labels,
              .loss = head_loss.data() + chunks,
              .dlogits = backward ? head_logits.data() : nullptr,
              .loss_scale = static_cast<float>(c) / static_cast<float>(n)}));
    if (!backward) continue;
    FEDLORA_RETURN_IF_ERROR(kernels::LinearBackward(ctx, {.rows = c,
                                                          .in_features = h,
                                                          .out_features = V,
                                                          .w = dev_head,
                                                          .dy = head_logits.data(),
                                                          .dx = dhead_in.data(),
                                                          .workspace = workspace,
                                                          .workspace_bytes = workspace_bytes}));
    // Each target row appears once and dn starts at zero: its gradient is copied into place.
    FEDLORA_RETURN_IF_ERROR(copy_rows(c0, c, dhead_in.data(), dn.data(), /*to_chunk=*/false));
  }
  std::vector<float> chunk_loss(static_cast<size_t>(chunks));
  FEDLORA_RETURN_IF_ERROR(
      backend->Download(chunk_loss.data(), head_loss.data(), chunk_loss.size() * sizeof(float)));
  for (int64_t k = 0; k < chunks; ++k) {
    sum->nll +=
        static_cast<double>(chunk_loss[k]) * std::min(kLmHeadChunkRows, n - k * kLmHeadChunkRows);
  }
  if (!backward) return absl::OkStatus();
  // Through the final norm into dx = d(loss)/d(x[L]).
  const int64_t T = static_cast<int64_t>(b.batch_size) * S;
  return kernels::RmsNormBackward(ctx, {.rows = T,
                                        .cols = h,
                                        .x = x[L()].data(),
                                        .gamma = dev_final_norm,
                                        .rstd = rstd_f.data(),
                                        .dy = dn.data(),
                                        .dx = dx.data()});
}

absl::StatusOr<float> CausalLm::ForwardBackward(const Batch& batch, uint64_t dropout_seed) {
  Impl& im = *impl_;
  FEDLORA_RETURN_IF_ERROR(im.CheckBatch(batch, /*need_labels=*/true));
  FEDLORA_RETURN_IF_ERROR(im.dev_params.ToDevice(/*grads=*/true));
  FEDLORA_RETURN_IF_ERROR(im.Forward(batch, /*training=*/true, dropout_seed));
  LossSum sum;
  FEDLORA_RETURN_IF_ERROR(im.Head(batch, /*backward=*/true, &sum));
  if (sum.tokens == 0)
    return absl::InvalidArgumentError(
        "the batch has no target (every label after the first is -100)");
  for (int64_t l = im.L() - 1; l >= 0; --l) {
    if (options_.recompute_activations) {
      // The same seed gives the same dropout masks, so the recomputed layer equals the first pass.
      FEDLORA_RETURN_IF_ERROR(
          im.LayerForward(l, batch.batch_size, batch.seq_len, true, dropout_seed, im.ActsFor(l)));
    }
    FEDLORA_RETURN_IF_ERROR(
        im.LayerBackward(l, batch.batch_size, batch.seq_len, dropout_seed, im.ActsFor(l)));
  }
  FEDLORA_RETURN_IF_ERROR(im.dev_params.GradsToHost());
  return static_cast<float>(sum.nll / static_cast<double>(sum.tokens));
}

absl::StatusOr<CausalLm::LossSum> CausalLm::Evaluate(const Batch& batch) {
  Impl& im = *impl_;
  FEDLORA_RETURN_IF_ERROR(im.CheckBatch(batch, /*need_labels=*/true));
  FEDLORA_RETURN_IF_ERROR(im.dev_params.ToDevice(/*grads=*/false));
  FEDLORA_RETURN_IF_ERROR(im.Forward(batch, /*training=*/false, 0));
  LossSum sum;
  FEDLORA_RETURN_IF_ERROR(im.Head(batch, /*backward=*/false, &sum));
  return sum;
}

absl::StatusOr<std::vector<float>> CausalLm::Logits(const Batch& batch) {
  Impl& im = *impl_;
  FEDLORA_RETURN_IF_ERROR(im.CheckBatch(batch, /*need_labels=*/false));
  FEDLORA_RETURN_IF_ERROR(im.dev_params.ToDevice(/*grads=*/false));
  FEDLORA_RETURN_IF_ERROR(im.Forward(batch, /*training=*/false, 0));
  const int64_t T = static_cast<int64_t>(batch.batch_size) * batch.seq_len, h = im.H(),
                V = config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(T * V));
  for (int64_t r0 = 0; r0 < T; r0 += kLmHeadChunkRows) {
    const int64_t c = std::min(kLmHeadChunkRows, T - r0);
    // On the CPU straight into the result; on a GPU through head_logits.
    float* y = im.on_host() ? logits.data() + r0 * V : im.head_logits.data();
    FEDLORA_RETURN_IF_ERROR(
        kernels::LinearForward(im.ctx, {.rows = c,
                                        .in_features = h,
                                        .out_features = V,
                                        .x = im.nf.data() + r0 * h,
                                        .w = im.dev_head,
                                        .y = y,
                                        .workspace = im.workspace,
                                        .workspace_bytes = im.workspace_bytes}));
    if (!im.on_host()) {
      FEDLORA_RETURN_IF_ERROR(
          im.backend->Download(logits.data() + r0 * V, y, c * V * sizeof(float)));
    }
  }
  return logits;
}

}  // namespace fedlora
