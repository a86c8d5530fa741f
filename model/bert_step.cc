// BertClassifier's computation: the layout of a batch's rows, the encoder's forward pass, the
// head and the backward pass, on the classifier's backend (model/bert_impl.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/status.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/lora_linear.h"
#include "model/bert_impl.h"

namespace fedlora {

using bert_internal::kSiteAttnOut;
using bert_internal::kSiteAttnProbs;
using bert_internal::kSiteClassifier;
using bert_internal::kSiteEmbedding;
using bert_internal::kSiteFfnOut;
using bert_internal::kSiteHeadInput;
using bert_internal::kSiteLora;
using bert_internal::LayerSite;
using bert_internal::Spec;

absl::Status BertClassifier::Impl::LinearForward(int layer, LoraTarget t, const float* in,
                                                 int64_t rows, float* y, bool training,
                                                 uint64_t seed) {
  const int ti = static_cast<int>(t);
  const FrozenLinear& lin = layers[layer].lin[ti];
  const DevLinear& dl = dev_layers[layer].lin[ti];
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
  return kernels::LoraLinearForward(
      ctx, {.rows = rows,
            .in_features = lin.w.cols,
            .out_features = lin.w.rows,
            .rank = r(),
            .x = in,
            .w = dl.w,
            .bias = dl.bias,
            .lora_a = Val(lp),
            .lora_b = Val(lp + 1),
            .scaling = lora_scaling,
            .dropout = Spec(training ? lora_p : 0.0f, seed, LayerSite(layer, kSiteLora + ti)),
            .y = y,
            .h = acts[layer].lora_h[ti].data(),
            .workspace = workspace,
            .workspace_bytes = workspace_bytes});
}

absl::Status BertClassifier::Impl::LinearBackward(int layer, LoraTarget t, const float* in,
                                                  const float* dy, int64_t rows, float* dx_out,
                                                  bool accumulate_dx, uint64_t seed) {
  const int ti = static_cast<int>(t);
  const FrozenLinear& lin = layers[layer].lin[ti];
  const DevLinear& dl = dev_layers[layer].lin[ti];
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
  return kernels::LoraLinearBackward(
      ctx, {.rows = rows,
            .in_features = lin.w.cols,
            .out_features = lin.w.rows,
            .rank = r(),
            .x = in,
            .w = dl.w,
            .lora_a = Val(lp),
            .lora_b = Val(lp + 1),
            .scaling = lora_scaling,
            .dropout = Spec(lora_p, seed, LayerSite(layer, kSiteLora + ti)),
            .h = acts[layer].lora_h[ti].data(),
            .dy = dy,
            .dx = dx_out,
            .accumulate_dx = accumulate_dx,
            .da = dev_params.param(lp).frozen ? nullptr : Grad(lp),  // FFA-LoRA: no dA
            .db = Grad(lp + 1),
            .accumulate_params = true,
            .workspace = workspace,
            .workspace_bytes = workspace_bytes});
}

absl::Status BertClassifier::Impl::PerSequence(
    const std::function<absl::Status(int64_t n, int64_t row, int64_t prob)>& run) const {
  int64_t prob = 0;
  for (size_t s = 0; s < layout.len.size(); ++s) {
    const int64_t n = layout.len[s];
    FEDLORA_RETURN_IF_ERROR(run(n, layout.start[s], prob));
    prob += config.num_attention_heads * n * n;
  }
  return absl::OkStatus();
}

kernels::FusedAttentionDims BertClassifier::Impl::FusedDims(int64_t bsz) const {
  return {.tokens = layout.rows,
          .num_seqs = bsz,
          .heads = config.num_attention_heads,
          .head_dim = config.head_dim(),
          .seq_start = seq_start_ptr,
          .mask = fused_mask};
}

absl::Status BertClassifier::Impl::Attention(int l, int64_t bsz, int64_t seq, const float* mask,
                                             bool training, uint64_t seed, LayerActs& a) {
  const int64_t h = H(), heads = config.num_attention_heads;
  const kernels::DropoutSpec spec =
      Spec(training ? attention_p : 0.0f, seed, LayerSite(l, kSiteAttnProbs));
  if (fused_attention) {
    return kernels::FusedAttentionForward(ctx, {.dims = FusedDims(bsz),
                                                .q = a.q.data(),
                                                .k = a.k.data(),
                                                .v = a.v.data(),
                                                .dropout = spec,
                                                .out = a.ctx.data(),
                                                .lse = a.lse.data()});
  }
  auto run = [&](int64_t batch, int64_t n, int64_t row, int64_t prob, const float* m) {
    kernels::DropoutSpec d = spec;
    d.offset = static_cast<uint64_t>(prob);
    return kernels::AttentionForward(ctx, {.dims = {.batch = batch,
                                                    .heads = heads,
                                                    .seq = n,
                                                    .head_dim = config.head_dim(),
                                                    .layout = kernels::AttentionLayout::kBSHD},
                                           .q = a.q.data() + row * h,
                                           .k = a.k.data() + row * h,
                                           .v = a.v.data() + row * h,
                                           .mask = m,
                                           .dropout = d,
                                           .probs = a.probs.data() + prob,
                                           .out = a.ctx.data() + row * h,
                                           .workspace = workspace,
                                           .workspace_bytes = workspace_bytes});
  };
  if (!layout.packed) return run(bsz, seq, 0, 0, mask);
  return PerSequence(
      [&](int64_t n, int64_t row, int64_t prob) { return run(1, n, row, prob, nullptr); });
}

absl::Status BertClassifier::Impl::AttentionBackward(int l, int64_t bsz, int64_t seq, uint64_t seed,
                                                     LayerActs& a) {
  const int64_t h = H(), heads = config.num_attention_heads;
  const kernels::DropoutSpec spec = Spec(attention_p, seed, LayerSite(l, kSiteAttnProbs));
  if (fused_attention) {
    return kernels::FusedAttentionBackward(ctx, {.dims = FusedDims(bsz),
                                                 .q = a.q.data(),
                                                 .k = a.k.data(),
                                                 .v = a.v.data(),
                                                 .out = a.ctx.data(),
                                                 .lse = a.lse.data(),
                                                 .dropout = spec,
                                                 .dout = dctx.data(),
                                                 .dq = dq.data(),
                                                 .dk = dk.data(),
                                                 .dv = dv.data(),
                                                 .workspace = workspace,
                                                 .workspace_bytes = workspace_bytes});
  }
  auto run = [&](int64_t batch, int64_t n, int64_t row, int64_t prob) {
    kernels::DropoutSpec d = spec;
    d.offset = static_cast<uint64_t>(prob);
    return kernels::AttentionBackward(ctx, {.dims = {.batch = batch,
                                                     .heads = heads,
                                                     .seq = n,
                                                     .head_dim = config.head_dim(),
                                                     .layout = kernels::AttentionLayout::kBSHD},
                                            .q = a.q.data() + row * h,
                                            .k = a.k.data() + row * h,
                                            .v = a.v.data() + row * h,
                                            .probs = a.probs.data() + prob,
                                            .dropout = d,
                                            .dout = dctx.data() + row * h,
                                            .dq = dq.data() + row * h,
                                            .dk = dk.data() + row * h,
                                            .dv = dv.data() + row * h,
                                            .workspace = workspace,
                                            .workspace_bytes = workspace_bytes});
  };
  if (!layout.packed) return run(bsz, seq, 0, 0);
  return PerSequence([&](int64_t n, int64_t row, int64_t prob) { return run(1, n, row, prob); });
}

void BertClassifier::Impl::Arrange(const Batch& b) {
  const int64_t bsz = b.batch_size, seq = b.seq_len;
  auto real = [&](int64_t t) { return b.attention_mask.empty() || b.attention_mask[t] != 0; };
  Layout& lay = layout;
  // Packed when it leaves something out: a batch without padding keeps one batched attention.
  bool any_padding = false;
  for (int64_t t = 0; t < bsz * seq; ++t) any_padding = any_padding || !real(t);
  lay.packed = any_padding;
  for (int64_t s = 0; s < bsz; ++s) lay.packed = lay.packed && real(s * seq);
  lay.masked = false;
  lay.start.assign(bsz, 0);
  lay.len.assign(bsz, 0);
  const int32_t pad = static_cast<int32_t>(config.pad_token_id);
  int64_t row = 0;
  for (int64_t s = 0; s < bsz; ++s) {
    lay.start[s] = row;
    int32_t count = 0;  // RoBERTa: real (non-pad) ids so far in the sequence
    for (int64_t j = 0; j < seq; ++j) {
      const int64_t t = s * seq + j;
      int32_t position = static_cast<int32_t>(j);
      if (config.is_roberta()) {
        // HF create_position_ids_from_input_ids: pad + cumulative count of non-pad ids; pads get pad.
        const bool not_pad = b.input_ids[t] != pad;
        count += not_pad ? 1 : 0;
        position = not_pad ? pad + count : pad;
      }
      if (lay.packed && !real(t)) continue;
      row_ids[row] = b.input_ids[t];
      row_types[row] = b.token_type_ids.empty() ? 0 : b.token_type_ids[t];
      row_positions[row] = position;
      // Padding gets a large negative additive bias, so exp() underflows to exactly 0 (HF uses the
      // dtype's minimum; any value below about -100 times the score scale gives the same result).
      mask_host[row] = real(t) ? 0.0f : -1e30f;
      lay.masked = lay.masked || !real(t);
      ++row;
    }
    lay.len[s] = row - lay.start[s];
  }
  lay.rows = row;
}

absl::Status BertClassifier::Impl::Encode(const Batch& b, bool training, uint64_t seed) {
  const int64_t bsz = b.batch_size, seq = b.seq_len, h = H();
  Arrange(b);
  const int64_t tokens = layout.rows;
  const float* mask = nullptr;
  if (layout.masked) {
    FEDLORA_ASSIGN_OR_RETURN(mask, Stage(mask_host, tokens, mask_add));
  }
  FEDLORA_ASSIGN_OR_RETURN(const int32_t* ids, Stage(row_ids, tokens, dev_ids));
  const int32_t* types = nullptr;
  if (!b.token_type_ids.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(types, Stage(row_types, tokens, dev_types));
  }
  FEDLORA_ASSIGN_OR_RETURN(const int32_t* positions, Stage(row_positions, tokens, dev_positions));
  fused_mask = mask;
  if (fused_attention) {
    for (int64_t s = 0; s < bsz; ++s) seq_start_host[s] = static_cast<int32_t>(layout.start[s]);
    seq_start_host[bsz] = static_cast<int32_t>(tokens);
    FEDLORA_ASSIGN_OR_RETURN(seq_start_ptr, Stage(seq_start_host, bsz + 1, dev_seq_start));
  }
  float* x0 = x[0].data();
  FEDLORA_RETURN_IF_ERROR(kernels::EmbeddingForward(ctx, {.tokens = tokens,
                                                          .hidden = h,
                                                          .seq_len = seq,
                                                          .vocab = word_emb.rows,
                                                          .max_positions = pos_emb.rows,
                                                          .type_vocab = type_emb.rows,
                                                          .input_ids = ids,
                                                          .position_ids = positions,
                                                          .token_type_ids = types,
                                                          .word = dev_word,
                                                          .position = dev_pos,
                                                          .token_type = dev_type,
                                                          .out = x0}));
  // The embeddings are frozen: their LayerNorm needs no saved statistics.
  FEDLORA_RETURN_IF_ERROR(
      kernels::LayerNormForward(ctx, {.rows = tokens,
                                      .cols = h,
                                      .eps = static_cast<float>(config.layer_norm_eps),
                                      .x = x0,
                                      .gamma = dev_emb_gamma,
                                      .beta = dev_emb_beta,
                                      .y = x0}));
  FEDLORA_RETURN_IF_ERROR(
      kernels::Dropout(ctx, {.n = tokens * h,
                             .spec = HiddenDropout(training, seed, kSiteEmbedding),
                             .x = x0,
                             .out = x0}));

  const float eps = static_cast<float>(config.layer_norm_eps);
  for (int l = 0; l < L(); ++l) {
    LayerActs& a = acts[l];
    const DevLayer& lw = dev_layers[l];
    const float* in = x[l].data();
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kQuery, in, tokens, a.q.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kKey, in, tokens, a.k.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kValue, in, tokens, a.v.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(Attention(l, bsz, seq, mask, training, seed, a));
    // z1 = x + dropout(ctx Wo^T + bo);  h1 = LN(z1)
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kAttnOut, a.ctx.data(), tokens, a.z1.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        kernels::Dropout(ctx, {.n = tokens * h,
                               .spec = HiddenDropout(training, seed, LayerSite(l, kSiteAttnOut)),
                               .x = a.z1.data(),
                               .out = a.z1.data()}));
    FEDLORA_RETURN_IF_ERROR(
        kernels::Add(ctx, {.n = tokens * h, .a = a.z1.data(), .b = in, .out = a.z1.data()}));
    FEDLORA_RETURN_IF_ERROR(kernels::LayerNormForward(ctx, {.rows = tokens,
                                                            .cols = h,
                                                            .eps = eps,
                                                            .x = a.z1.data(),
                                                            .gamma = lw.ln1_gamma,
                                                            .beta = lw.ln1_beta,
                                                            .y = a.h1.data(),
                                                            .mean = a.mean1.data(),
                                                            .rstd = a.rstd1.data()}));
    // FFN: g = gelu(h1 Wi^T + bi);  z2 = h1 + dropout(g Wo2^T + bo2);  x' = LN(z2)
    FEDLORA_RETURN_IF_ERROR(LinearForward(l, LoraTarget::kIntermediate, a.h1.data(), tokens,
                                          a.u.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(kernels::ActivationForward(
        ctx,
        {.kind = kernels::Activation::kGelu, .n = tokens * I(), .x = a.u.data(), .y = a.g.data()}));
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kOutput, a.g.data(), tokens, a.z2.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        kernels::Dropout(ctx, {.n = tokens * h,
                               .spec = HiddenDropout(training, seed, LayerSite(l, kSiteFfnOut)),
                               .x = a.z2.data(),
                               .out = a.z2.data()}));
    FEDLORA_RETURN_IF_ERROR(kernels::Add(
        ctx, {.n = tokens * h, .a = a.z2.data(), .b = a.h1.data(), .out = a.z2.data()}));
    FEDLORA_RETURN_IF_ERROR(kernels::LayerNormForward(ctx, {.rows = tokens,
                                                            .cols = h,
                                                            .eps = eps,
                                                            .x = a.z2.data(),
                                                            .gamma = lw.ln2_gamma,
                                                            .beta = lw.ln2_beta,
                                                            .y = x[l + 1].data(),
                                                            .mean = a.mean2.data(),
                                                            .rstd = a.rstd2.data()}));
  }
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::Head(const Batch& b, bool training, uint64_t seed,
                                        bool with_loss) {
  const int64_t bsz = b.batch_size, h = H();
  const size_t row = static_cast<size_t>(h) * sizeof(float);
  // Gather the [CLS] / <s> rows (each sequence's first): B*H floats.
  for (int64_t s = 0; s < bsz; ++s) {
    FEDLORA_RETURN_IF_ERROR(backend->CopyRows(cls.data() + s * h, row,
                                              x[L()].data() + layout.start[s] * h, row, row, 1));
  }
  // pooled = tanh(dense(cls)): BERT's frozen pooler, or RoBERTa's trainable classifier.dense
  // applied after a dropout (kept in place in cls: the backward needs the dropped input).
  if (head_dense_param >= 0) {
    FEDLORA_RETURN_IF_ERROR(
        kernels::Dropout(ctx, {.n = bsz * h,
                               .spec = Spec(training ? classifier_p : 0.0f, seed, kSiteHeadInput),
                               .x = cls.data(),
                               .out = cls.data()}));
    FEDLORA_RETURN_IF_ERROR(
        kernels::LinearForward(ctx, {.rows = bsz,
                                     .in_features = h,
                                     .out_features = h,
                                     .x = cls.data(),
                                     .w = kernels::WeightPtr::F32(Val(head_dense_param)),
                                     .bias = Val(head_dense_param + 1),
                                     .y = pooled.data()}));
  } else {
    FEDLORA_RETURN_IF_ERROR(kernels::LinearForward(ctx, {.rows = bsz,
                                                         .in_features = h,
                                                         .out_features = h,
                                                         .x = cls.data(),
                                                         .w = dev_pooler.w,
                                                         .bias = dev_pooler.bias,
                                                         .y = pooled.data(),
                                                         .workspace = workspace,
                                                         .workspace_bytes = workspace_bytes}));
  }
  FEDLORA_RETURN_IF_ERROR(kernels::ActivationForward(
      ctx,
      {.kind = kernels::Activation::kTanh, .n = bsz * h, .x = pooled.data(), .y = pooled.data()}));
  FEDLORA_RETURN_IF_ERROR(
      kernels::Dropout(ctx, {.n = bsz * h,
                             .spec = Spec(training ? classifier_p : 0.0f, seed, kSiteClassifier),
                             .x = pooled.data(),
                             .out = cls_drop.data()}));
  const Param& bias = params[classifier_param + 1];
  // Logit adjustment shifts every row's logits by the same per-class offsets, so it is the head's
  // bias plus the offsets; the bias gradient (the column sums of dlogits) is unchanged by it.
  const float* head_bias = Val(classifier_param + 1);
  if (with_loss && !loss_logit_offsets.empty()) {
    adjusted_bias_host.resize(loss_logit_offsets.size());
    for (size_t c = 0; c < adjusted_bias_host.size(); ++c)
      adjusted_bias_host[c] = bias.value[c] + loss_logit_offsets[c];
    FEDLORA_ASSIGN_OR_RETURN(head_bias,
                             Stage(adjusted_bias_host, adjusted_bias_host.size(), adjusted_bias));
  }
  FEDLORA_RETURN_IF_ERROR(
      kernels::LinearForward(ctx, {.rows = bsz,
                                   .in_features = h,
                                   .out_features = options.num_labels,
                                   .x = cls_drop.data(),
                                   .w = kernels::WeightPtr::F32(Val(classifier_param)),
                                   .bias = head_bias,
                                   .y = logits.data()}));
  if (with_loss) {
    FEDLORA_ASSIGN_OR_RETURN(const int32_t* labels, Stage(b.labels, bsz, dev_labels));
    FEDLORA_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(ctx, {.batch = bsz,
                                                               .classes = options.num_labels,
                                                               .logits = logits.data(),
                                                               .labels = labels,
                                                               .loss = loss_value.data(),
                                                               .dlogits = dlogits.data()}));
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> BertClassifier::Impl::SublayerBackward(
    int l, uint64_t site, int64_t tokens, const float* z, const float* gamma, const float* mean,
    const float* rstd, const float* dy, float* dz_norm, uint64_t seed) {
  FEDLORA_RETURN_IF_ERROR(kernels::LayerNormBackward(ctx, {.rows = tokens,
                                                           .cols = H(),
                                                           .x = z,
                                                           .gamma = gamma,
                                                           .mean = mean,
                                                           .rstd = rstd,
                                                           .dy = dy,
                                                           .dx = dz_norm}));
  if (hidden_p == 0.0f) return dz_norm;  // without dropout the dense's gradient is dz_norm itself
  FEDLORA_RETURN_IF_ERROR(
      kernels::Dropout(ctx, {.n = tokens * H(),
                             .spec = HiddenDropout(true, seed, LayerSite(l, site)),
                             .x = dz_norm,
                             .out = dz.data()}));
  return dz.data();
}

absl::Status BertClassifier::Impl::Backward(const Batch& b, uint64_t seed) {
  const int64_t bsz = b.batch_size, seq = b.seq_len, tokens = layout.rows, h = H();
  // Final linear (trainable): dW += dlogits^T x, db += sum dlogits, dx = dlogits W.
  FEDLORA_RETURN_IF_ERROR(
      kernels::LinearBackward(ctx, {.rows = bsz,
                                    .in_features = h,
                                    .out_features = options.num_labels,
                                    .x = cls_drop.data(),
                                    .w = kernels::WeightPtr::F32(Val(classifier_param)),
                                    .dy = dlogits.data(),
                                    .dx = dcls.data(),
                                    .dw = Grad(classifier_param),
                                    .dbias = Grad(classifier_param + 1),
                                    .accumulate_params = true}));
  const bool encoder_trainable =
      std::any_of(std::begin(use_target), std::end(use_target), [](bool u) { return u; });
  if (!encoder_trainable && head_dense_param < 0)
    return absl::OkStatus();  // nothing below is trainable
  FEDLORA_RETURN_IF_ERROR(kernels::Dropout(ctx, {.n = bsz * h,
                                                 .spec = Spec(classifier_p, seed, kSiteClassifier),
                                                 .x = dcls.data(),
                                                 .out = dcls.data()}));
  FEDLORA_RETURN_IF_ERROR(kernels::ActivationBackward(ctx, {.kind = kernels::Activation::kTanh,
                                                            .n = bsz * h,
                                                            .saved = pooled.data(),
                                                            .dy = dcls.data(),
                                                            .dx = dpooled.data()}));
  if (head_dense_param >= 0) {
    FEDLORA_RETURN_IF_ERROR(
        kernels::LinearBackward(ctx, {.rows = bsz,
                                      .in_features = h,
                                      .out_features = h,
                                      .x = cls.data(),
                                      .w = kernels::WeightPtr::F32(Val(head_dense_param)),
                                      .dy = dpooled.data(),
                                      .dx = encoder_trainable ? dcls.data() : nullptr,
                                      .dw = Grad(head_dense_param),
                                      .dbias = Grad(head_dense_param + 1),
                                      .accumulate_params = true}));
    if (!encoder_trainable) return absl::OkStatus();
    FEDLORA_RETURN_IF_ERROR(kernels::Dropout(ctx, {.n = bsz * h,
                                                   .spec = Spec(classifier_p, seed, kSiteHeadInput),
                                                   .x = dcls.data(),
                                                   .out = dcls.data()}));
  } else {
    FEDLORA_RETURN_IF_ERROR(kernels::LinearBackward(ctx, {.rows = bsz,
                                                          .in_features = h,
                                                          .out_features = h,
                                                          .w = dev_pooler.w,
                                                          .dy = dpooled.data(),
                                                          .dx = dcls.data(),
                                                          .workspace = workspace,
                                                          .workspace_bytes = workspace_bytes}));
  }
  // Only the [CLS] rows of the last hidden state receive a gradient.
  const size_t row = static_cast<size_t>(h) * sizeof(float);
  FEDLORA_RETURN_IF_ERROR(backend->Zero(dx.data(), tokens * row));
  for (int64_t s = 0; s < bsz; ++s) {
    FEDLORA_RETURN_IF_ERROR(
        backend->CopyRows(dx.data() + layout.start[s] * h, row, dcls.data() + s * h, row, row, 1));
  }
  for (int l = static_cast<int>(L()) - 1; l >= 0; --l) {
    LayerActs& a = acts[l];
    const DevLayer& lw = dev_layers[l];
    const float* in = x[l].data();
    // dx holds d(loss)/d(layer output). LN2: dh = d/dz2, also the residual gradient to h1; the
    // FFN output dense's gradient is dropout'(dh).
    FEDLORA_ASSIGN_OR_RETURN(
        const float* d_ffn,
        SublayerBackward(l, kSiteFfnOut, tokens, a.z2.data(), lw.ln2_gamma, a.mean2.data(),
                         a.rstd2.data(), dx.data(), dh.data(), seed));
    FEDLORA_RETURN_IF_ERROR(LinearBackward(l, LoraTarget::kOutput, a.g.data(), d_ffn, tokens,
                                           dg.data(),
                                           /*accumulate_dx=*/false, seed));
    FEDLORA_RETURN_IF_ERROR(kernels::ActivationBackward(ctx, {.kind = kernels::Activation::kGelu,
                                                              .n = tokens * I(),
                                                              .saved = a.u.data(),
                                                              .dy = dg.data(),
                                                              .dx = dg.data()}));
    FEDLORA_RETURN_IF_ERROR(LinearBackward(l, LoraTarget::kIntermediate, a.h1.data(), dg.data(),
                                           tokens, dh.data(),
                                           /*accumulate_dx=*/true, seed));
    // LN1: dx = d/dz1, the residual gradient to the layer input; the attention dense's gradient is
    // dropout'(dx).
    FEDLORA_ASSIGN_OR_RETURN(
        const float* d_attn,
        SublayerBackward(l, kSiteAttnOut, tokens, a.z1.data(), lw.ln1_gamma, a.mean1.data(),
                         a.rstd1.data(), dh.data(), dx.data(), seed));
    FEDLORA_RETURN_IF_ERROR(LinearBackward(l, LoraTarget::kAttnOut, a.ctx.data(), d_attn, tokens,
                                           dctx.data(),
                                           /*accumulate_dx=*/false, seed));
    FEDLORA_RETURN_IF_ERROR(AttentionBackward(l, bsz, seq, seed, a));
    // The embeddings are frozen: layer 0 needs no input gradient, only its LoRA gradients.
    float* dx_in = l > 0 ? dx.data() : nullptr;
    FEDLORA_RETURN_IF_ERROR(
        LinearBackward(l, LoraTarget::kQuery, in, dq.data(), tokens, dx_in, true, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearBackward(l, LoraTarget::kKey, in, dk.data(), tokens, dx_in, true, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearBackward(l, LoraTarget::kValue, in, dv.data(), tokens, dx_in, true, seed));
  }
  return absl::OkStatus();
}

}  // namespace fedlora
