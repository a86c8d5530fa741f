// Multi-head attention composed from Gemm (strided over heads) and the fused softmax.
#include "kernels/attention.h"

#include <cmath>

#include "kernels/base/kernel_util.h"
#include "kernels/gemm.h"

namespace fedlora::kernels {
namespace {

constexpr std::string_view kFwd = "AttentionForward";
constexpr std::string_view kBwd = "AttentionBackward";

int64_t KvHeads(const AttentionDims& d) { return d.kv_heads == 0 ? d.heads : d.kv_heads; }

// Element strides of a layout-shaped tensor with `heads` heads: row (one token of one head),
// head, batch.
struct Strides {
  int64_t row, head, batch;
};
Strides LayoutStrides(const AttentionDims& d, int64_t heads) {
  if (d.layout == AttentionLayout::kBHSD)
    return {d.head_dim, d.seq * d.head_dim, heads * d.seq * d.head_dim};
  return {heads * d.head_dim, d.head_dim, d.seq * heads * d.head_dim};
}

float Scale(const AttentionDims& d) {
  return d.scale != 0.0f ? d.scale : 1.0f / std::sqrt(static_cast<float>(d.head_dim));
}

int64_t ProbsElems(const AttentionDims& d) { return d.batch * d.heads * d.seq * d.seq; }

absl::Status CheckDimsCommon(std::string_view op, const AttentionDims& d) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(op, {d.batch, d.heads, d.seq, d.seq}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(op, {d.batch, d.heads, d.seq, d.head_dim}));
  if (d.layout != AttentionLayout::kBHSD && d.layout != AttentionLayout::kBSHD)
    return internal::InvalidArg(op, "unknown layout");
  if (!std::isfinite(d.scale)) return internal::InvalidArg(op, "scale is not finite");
  if (d.kv_heads < 0 || (d.kv_heads > 0 && d.heads % d.kv_heads != 0)) {
    return internal::InvalidArg(
        op, absl::StrCat("kv_heads ", d.kv_heads, " does not divide heads ", d.heads));
  }
  return absl::OkStatus();
}

// Runs `g` (one head's product, pointers at batch 0 / head 0) for every (batch, head): one
// strided-batched call over all batch*heads when the layout makes heads and batches one stride
// (kBHSD), else one call per batch entry over its heads. `batch_offsets` are the per-batch
// element offsets of (a, b, c).
absl::Status ForEachHead(const ExecContext& ctx, const AttentionDims& d, GemmArgs g,
                         int64_t a_batch, int64_t b_batch, int64_t c_batch) {
  g.batch = d.heads;
  if (d.batch == 1 || (a_batch == d.heads * g.stride_a && b_batch == d.heads * g.stride_b &&
                       c_batch == d.heads * g.stride_c)) {
    g.batch = d.batch * d.heads;
    return Gemm(ctx, g);
  }
  for (int64_t b = 0; b < d.batch; ++b) {
    GemmArgs gb = g;
    gb.a = g.a + b * a_batch;
    gb.b = g.b + b * b_batch;
    gb.c = g.c + b * c_batch;
    FEDLORA_RETURN_IF_ERROR(Gemm(ctx, gb));
  }
  return absl::OkStatus();
}

// One operand of a per-head product: its batch and head strides, and whether it has kv_heads heads
// (K, V, dK, dV) or heads heads (Q, O, P and their gradients).
struct Operand {
  int64_t batch, head;
  bool kv = false;
};

// Runs `g` (pointers at batch 0 / head 0) for every (batch, query head h), where a kv operand is
// taken at head h / group. With one query head per K/V head this is ForEachHead. Otherwise each
// K/V head's group of query heads is one strided-batched call that broadcasts the kv operand
// (stride 0), and a kv output (dK, dV) sums over its group: one call per query head, the first
// with g.beta and the rest adding.
absl::Status HeadGemms(const ExecContext& ctx, const AttentionDims& d, GemmArgs g, Operand a,
                       Operand b, Operand c) {
  const int64_t kv = KvHeads(d), group = d.heads / kv;
  if (group == 1) {
    g.stride_a = a.head;
    g.stride_b = b.head;
    g.stride_c = c.head;
    return ForEachHead(ctx, d, g, a.batch, b.batch, c.batch);
  }
  auto at = [](const float* base, const Operand& o, int64_t bi, int64_t h, int64_t kvh) {
    return base + bi * o.batch + (o.kv ? kvh : h) * o.head;
  };
  for (int64_t bi = 0; bi < d.batch; ++bi) {
    if (!c.kv) {
      for (int64_t kvh = 0; kvh < kv; ++kvh) {
        GemmArgs x = g;
        x.batch = group;
        x.a = at(g.a, a, bi, kvh * group, kvh);
        x.b = at(g.b, b, bi, kvh * group, kvh);
        x.c = const_cast<float*>(at(g.c, c, bi, kvh * group, kvh));
        x.stride_a = a.kv ? 0 : a.head;
        x.stride_b = b.kv ? 0 : b.head;
        x.stride_c = c.head;
        FEDLORA_RETURN_IF_ERROR(Gemm(ctx, x));
      }
      continue;
    }
    for (int64_t h = 0; h < d.heads; ++h) {
      GemmArgs x = g;
      x.batch = 1;
      x.a = at(g.a, a, bi, h, h / group);
      x.b = at(g.b, b, bi, h, h / group);
      x.c = const_cast<float*>(at(g.c, c, bi, h, h / group));
      x.beta = h % group == 0 ? g.beta : 1.0f;
      FEDLORA_RETURN_IF_ERROR(Gemm(ctx, x));
    }
  }
  return absl::OkStatus();
}

}  // namespace

size_t AttentionWorkspaceBytes(const AttentionForwardArgs& a) {
  return a.dropout.active() && a.out != nullptr
             ? internal::AlignUp(static_cast<size_t>(ProbsElems(a.dims)) * sizeof(float))
             : 0;
}
size_t AttentionWorkspaceBytes(const AttentionBackwardArgs& a) {
  const size_t one = internal::AlignUp(static_cast<size_t>(ProbsElems(a.dims)) * sizeof(float));
  return a.dropout.active() ? 2 * one : one;
}

absl::Status CanRun(const ExecContext& ctx, const AttentionForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kFwd));
  FEDLORA_RETURN_IF_ERROR(CheckDimsCommon(kFwd, a.dims));
  if (!(a.dropout.p >= 0.0f && a.dropout.p < 1.0f))
    return internal::InvalidArg(kFwd, "dropout p not in [0, 1)");
  if (ProbsElems(a.dims) == 0) return absl::OkStatus();
  for (auto [p, name] :
       {std::pair<const void*, const char*>{a.q, "q"}, {a.k, "k"}, {a.probs, "probs"}}) {
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, p, name));
  }
  if (a.out != nullptr) FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.v, "v"));
  const size_t need = AttentionWorkspaceBytes(a);
  if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) {
    return internal::InvalidArg(kFwd, absl::StrCat("needs a workspace of ", need, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CanRun(const ExecContext& ctx, const AttentionBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kBwd));
  FEDLORA_RETURN_IF_ERROR(CheckDimsCommon(kBwd, a.dims));
  if (!(a.dropout.p >= 0.0f && a.dropout.p < 1.0f))
    return internal::InvalidArg(kBwd, "dropout p not in [0, 1)");
  if (ProbsElems(a.dims) == 0) return absl::OkStatus();
  for (auto [p, name] : {std::pair<const void*, const char*>{a.q, "q"},
                         {a.k, "k"},
                         {a.v, "v"},
                         {a.probs, "probs"},
                         {a.dout, "dout"},
                         {a.dq, "dq"},
                         {a.dk, "dk"},
                         {a.dv, "dv"}}) {
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, p, name));
  }
  const size_t need = AttentionWorkspaceBytes(a);
  if (a.workspace == nullptr || a.workspace_bytes < need) {
    return internal::InvalidArg(kBwd, absl::StrCat("needs a workspace of ", need, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status AttentionForward(const ExecContext& ctx, const AttentionForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  const AttentionDims& d = a.dims;
  if (ProbsElems(d) == 0) return absl::OkStatus();
  const Strides qs = LayoutStrides(d, d.heads), ks = LayoutStrides(d, KvHeads(d));
  const int64_t S = d.seq, D = d.head_dim, SS = S * S;
  const Operand q{qs.batch, qs.head}, kv{ks.batch, ks.head, true}, p{d.heads * SS, SS};
  // S = scale * Q K^T   -> probs [b, h, S, S]
  FEDLORA_RETURN_IF_ERROR(HeadGemms(ctx, d,
                                    GemmArgs{.trans_b = true,
                                             .m = S,
                                             .n = S,
                                             .k = D,
                                             .alpha = Scale(d),
                                             .a = a.q,
                                             .lda = qs.row,
                                             .b = a.k,
                                             .ldb = ks.row,
                                             .c = a.probs,
                                             .ldc = S},
                                    q, kv, p));
  // P = softmax(S + mask) (causal: over keys at or before the query); Pd = dropout(P)
  if (a.out == nullptr) {  // P only: Pd and O are not wanted
    return AttentionSoftmaxForward(ctx, SoftmaxForwardArgs{.batch = d.batch,
                                                           .heads = d.heads,
                                                           .seq = S,
                                                           .mask = a.mask,
                                                           .causal = d.causal,
                                                           .scores = a.probs});
  }
  float* dropped = a.dropout.active() ? static_cast<float*>(a.workspace) : nullptr;
  FEDLORA_RETURN_IF_ERROR(AttentionSoftmaxForward(ctx, SoftmaxForwardArgs{.batch = d.batch,
                                                                          .heads = d.heads,
                                                                          .seq = S,
                                                                          .mask = a.mask,
                                                                          .causal = d.causal,
                                                                          .scores = a.probs,
                                                                          .dropout = a.dropout,
                                                                          .dropped = dropped}));
  // O = Pd V
  return HeadGemms(ctx, d,
                   GemmArgs{.m = S,
                            .n = D,
                            .k = S,
                            .a = dropped != nullptr ? dropped : a.probs,
                            .lda = S,
                            .b = a.v,
                            .ldb = ks.row,
                            .c = a.out,
                            .ldc = qs.row},
                   p, kv, q);
}

absl::Status AttentionBackward(const ExecContext& ctx, const AttentionBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  const AttentionDims& d = a.dims;
  const int64_t n = ProbsElems(d);
  if (n == 0) return absl::OkStatus();
  const Strides qs = LayoutStrides(d, d.heads), ks = LayoutStrides(d, KvHeads(d));
  const int64_t S = d.seq, D = d.head_dim, SS = S * S;
  const Operand q{qs.batch, qs.head}, kv{ks.batch, ks.head, true}, p{d.heads * SS, SS};
  const float scale = Scale(d);
  float* dp = static_cast<float*>(a.workspace);
  const float* pd = a.probs;
  if (a.dropout.active()) {  // Pd, recomputed from the seed
    float* pd_buf =
        reinterpret_cast<float*>(static_cast<char*>(a.workspace) +
                                 internal::AlignUp(static_cast<size_t>(n) * sizeof(float)));
    FEDLORA_RETURN_IF_ERROR(
        Dropout(ctx, DropoutArgs{.n = n, .spec = a.dropout, .x = a.probs, .out = pd_buf}));
    pd = pd_buf;
  }
  // dV = Pd^T dO   (summed over a K/V head's group)
  FEDLORA_RETURN_IF_ERROR(HeadGemms(ctx, d,
                                    GemmArgs{.trans_a = true,
                                             .m = S,
                                             .n = D,
                                             .k = S,
                                             .a = pd,
                                             .lda = S,
                                             .b = a.dout,
                                             .ldb = qs.row,
                                             .c = a.dv,
                                             .ldc = ks.row},
                                    p, q, kv));
  // dPd = dO V^T
  FEDLORA_RETURN_IF_ERROR(HeadGemms(ctx, d,
                                    GemmArgs{.trans_b = true,
                                             .m = S,
                                             .n = S,
                                             .k = D,
                                             .a = a.dout,
                                             .lda = qs.row,
                                             .b = a.v,
                                             .ldb = ks.row,
                                             .c = dp,
                                             .ldc = S},
                                    q, kv, p));
  // dS = softmax'(dropout'(dPd)), in place (masked entries of P are 0, so their dS is too)
  FEDLORA_RETURN_IF_ERROR(AttentionSoftmaxBackward(ctx, SoftmaxBackwardArgs{.batch = d.batch,
                                                                            .heads = d.heads,
                                                                            .seq = S,
                                                                            .probs = a.probs,
                                                                            .dropout = a.dropout,
                                                                            .grad = dp}));
  // dQ = scale dS K
  FEDLORA_RETURN_IF_ERROR(HeadGemms(ctx, d,
                                    GemmArgs{.m = S,
                                             .n = D,
                                             .k = S,
                                             .alpha = scale,
                                             .a = dp,
                                             .lda = S,
                                             .b = a.k,
                                             .ldb = ks.row,
                                             .c = a.dq,
                                             .ldc = qs.row},
                                    p, kv, q));
  // dK = scale dS^T Q   (summed over the group)
  return HeadGemms(ctx, d,
                   GemmArgs{.trans_a = true,
                            .m = S,
                            .n = D,
                            .k = S,
                            .alpha = scale,
                            .a = dp,
                            .lda = S,
                            .b = a.q,
                            .ldb = qs.row,
                            .c = a.dk,
                            .ldc = ks.row},
                   p, q, kv);
}

}  // namespace fedlora::kernels
