// Memory-efficient attention over packed sequences, CUDA backend: one warp per query row (forward,
// dQ) or key row (dK, dV), lanes splitting head_dim, an online softmax over the sequence's keys.
#include "core/rng.h"
#include "kernels/base/cuda_util.cuh"
#include "kernels/base/warp_reduce.cuh"
#include "kernels/fused_attention.h"

namespace fedlora::kernels::internal {
namespace {

constexpr int kWarp = 32;
constexpr int kPerLane = kFusedAttentionMaxHeadDim / kWarp;  // head_dim elements per lane, at most
constexpr int kWarpsPerBlock = 4;

struct Geometry {
  int64_t tokens, num_seqs, heads, kv_heads, head_dim;
  float scale, p, keep_scale;
  bool causal, dropout;
  uint64_t seed, stream, offset;
  const int32_t* seq_start;
  const float* mask;  // [tokens] or null
};

__device__ float MaskAt(const Geometry& g, int64_t key) {
  return g.mask != nullptr ? g.mask[key] : 0.0f;
}

// The sequence holding token t (binary search over seq_start) and its dropout base index.
__device__ void SequenceOf(const Geometry& g, int64_t t, int64_t* begin, int64_t* n,
                           uint64_t* base) {
  int64_t lo = 0, hi = g.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (g.seq_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  *begin = g.seq_start[lo];
  *n = g.seq_start[lo + 1] - *begin;
  uint64_t o = g.offset;
  for (int64_t s = 0; s < lo; ++s) {
    const uint64_t len = static_cast<uint64_t>(g.seq_start[s + 1] - g.seq_start[s]);
    o += static_cast<uint64_t>(g.heads) * len * len;
  }
  *base = o;
}

__device__ float Keep(const Geometry& g, uint64_t idx) {
  return UniformAt(g.seed, g.stream, idx) >= g.p ? g.keep_scale : 0.0f;
}

// Loads row `src` (head_dim floats) into this lane's registers.
__device__ void LoadRow(const Geometry& g, const float* src, float (&r)[kPerLane]) {
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t e = c * kWarp + (threadIdx.x % kWarp);
    r[c] = e < g.head_dim ? src[e] : 0.0f;
  }
}

__device__ float RowDot(const Geometry& g, const float (&r)[kPerLane], const float* other) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t e = c * kWarp + (threadIdx.x % kWarp);
    if (e < g.head_dim) s += r[c] * other[e];
  }
  return WarpSum(s);
}

// What a warp handling query row `warp` (= token * heads + head) needs to know of it: its token,
// head and kv head, its sequence's first token, how many keys it sees, and the dropout index of
// its (row, key 0) element.
struct QueryRow {
  int64_t t, h, kvh, begin, lim;
  uint64_t row;
};

__device__ QueryRow QueryRowOf(const Geometry& g, int64_t warp) {
  QueryRow r;
  r.t = warp / g.heads;
  r.h = warp % g.heads;
  r.kvh = r.h / (g.heads / g.kv_heads);
  int64_t n;
  uint64_t base;
  SequenceOf(g, r.t, &r.begin, &n, &base);
  const int64_t i = r.t - r.begin;
  r.lim = g.causal ? i + 1 : n;
  r.row = base + static_cast<uint64_t>((r.h * n + i) * n);
  return r;
}

__global__ void ForwardKernel(Geometry g, const float* q, const float* k, const float* v,
                              float* out, float* lse) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (warp >= g.tokens * g.heads) return;
  const QueryRow r = QueryRowOf(g, warp);
  const int64_t t = r.t, h = r.h, kvh = r.kvh, D = g.head_dim, begin = r.begin, lim = r.lim;
  const uint64_t row = r.row;
  float qr[kPerLane], acc[kPerLane] = {};
  LoadRow(g, q + (t * g.heads + h) * D, qr);
  // Online softmax: m the running max, l the running sum of exp(s - m), acc the dropped-out
  // weighted sum of values, all rescaled when m grows.
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < lim; ++j) {
    const float s =
        g.scale * RowDot(g, qr, k + ((begin + j) * g.kv_heads + kvh) * D) + MaskAt(g, begin + j);
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * correction + p;
    const float w = g.dropout ? p * Keep(g, row + j) : p;
    const float* vj = v + ((begin + j) * g.kv_heads + kvh) * D;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t e = c * kWarp + (threadIdx.x % kWarp);
      acc[c] = acc[c] * correction + (e < D ? w * vj[e] : 0.0f);
    }
    m = m_new;
  }
  const float inv = 1.0f / l;
  float* o = out + (t * g.heads + h) * D;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t e = c * kWarp + (threadIdx.x % kWarp);
    if (e < D) o[e] = acc[c] * inv;
  }
  if (threadIdx.x % kWarp == 0) lse[t * g.heads + h] = m + logf(l);
}

// D[t, h] = dO . O
__global__ void RowDotKernel(Geometry g, const float* dout, const float* out, float* dsum) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (warp >= g.tokens * g.heads) return;
  float r[kPerLane];
  LoadRow(g, dout + warp * g.head_dim, r);
  const float s = RowDot(g, r, out + warp * g.head_dim);
  if (threadIdx.x % kWarp == 0) dsum[warp] = s;
}

__global__ void DqKernel(Geometry g, const float* q, const float* k, const float* v,
                         const float* lse, const float* dout, const float* dsum, float* dq) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (warp >= g.tokens * g.heads) return;
  const QueryRow r = QueryRowOf(g, warp);
  const int64_t kvh = r.kvh, D = g.head_dim, begin = r.begin, lim = r.lim;
  const uint64_t row = r.row;
  float qr[kPerLane], dor[kPerLane], acc[kPerLane] = {};
  LoadRow(g, q + warp * D, qr);
  LoadRow(g, dout + warp * D, dor);
  const float l = lse[warp], rowdot = dsum[warp];
  for (int64_t j = 0; j < lim; ++j) {
    const float* kj = k + ((begin + j) * g.kv_heads + kvh) * D;
    const float p = expf(g.scale * RowDot(g, qr, kj) + MaskAt(g, begin + j) - l);
    const float keep = g.dropout ? Keep(g, row + j) : 1.0f;
    const float ds = p * (keep * RowDot(g, dor, v + ((begin + j) * g.kv_heads + kvh) * D) - rowdot);
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t e = c * kWarp + (threadIdx.x % kWarp);
      if (e < D) acc[c] += g.scale * ds * kj[e];
    }
  }
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t e = c * kWarp + (threadIdx.x % kWarp);
    if (e < D) dq[warp * D + e] = acc[c];
  }
}

// One warp per (key token j, kv head): sums over the query heads of the group and the queries of
// the sequence that see key j.
__global__ void DkvKernel(Geometry g, const float* q, const float* k, const float* v,
                          const float* lse, const float* dout, const float* dsum, float* dk,
                          float* dv) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (warp >= g.tokens * g.kv_heads) return;
  const int64_t tj = warp / g.kv_heads, kvh = warp % g.kv_heads, D = g.head_dim,
                group = g.heads / g.kv_heads;
  int64_t begin, n;
  uint64_t base;
  SequenceOf(g, tj, &begin, &n, &base);
  const int64_t j = tj - begin;
  float kr[kPerLane], vr[kPerLane], dk_acc[kPerLane] = {}, dv_acc[kPerLane] = {};
  LoadRow(g, k + warp * D, kr);
  LoadRow(g, v + warp * D, vr);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i = g.causal ? j : 0; i < n; ++i) {
      const int64_t t = begin + i;
      const float* qi = q + (t * g.heads + h) * D;
      const float* doi = dout + (t * g.heads + h) * D;
      const float p = expf(g.scale * RowDot(g, kr, qi) + MaskAt(g, tj) - lse[t * g.heads + h]);
      const float keep =
          g.dropout ? Keep(g, base + static_cast<uint64_t>((h * n + i) * n + j)) : 1.0f;
      const float ds = p * (keep * RowDot(g, vr, doi) - dsum[t * g.heads + h]);
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) {
        const int64_t e = c * kWarp + (threadIdx.x % kWarp);
        if (e < D) {
          dk_acc[c] += g.scale * ds * qi[e];
          dv_acc[c] += keep * p * doi[e];
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t e = c * kWarp + (threadIdx.x % kWarp);
    if (e < D) {
      dk[warp * D + e] = dk_acc[c];
      dv[warp * D + e] = dv_acc[c];
    }
  }
}

Geometry GeometryOf(const FusedAttentionDims& d, const DropoutSpec& drop) {
  Geometry g{};
  g.tokens = d.tokens;
  g.num_seqs = d.num_seqs;
  g.heads = d.heads;
  g.kv_heads = d.kv_heads == 0 ? d.heads : d.kv_heads;
  g.head_dim = d.head_dim;
  g.scale = d.scale != 0.0f ? d.scale : 1.0f / sqrtf(static_cast<float>(d.head_dim));
  g.p = drop.p;
  g.keep_scale = 1.0f / (1.0f - drop.p);
  g.causal = d.causal;
  g.dropout = drop.active();
  g.seed = drop.seed;
  g.stream = drop.stream;
  g.offset = drop.offset;
  g.seq_start = d.seq_start;
  g.mask = d.mask;
  return g;
}

unsigned BlocksFor(int64_t warps) {
  return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

absl::Status FusedAttentionForwardCuda(const ExecContext& ctx, const FusedAttentionForwardArgs& a) {
  const Geometry g = GeometryOf(a.dims, a.dropout);
  ForwardKernel<<<BlocksFor(g.tokens * g.heads), kWarpsPerBlock * kWarp, 0, Stream(ctx)>>>(
      g, a.q, a.k, a.v, a.out, a.lse);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status FusedAttentionBackwardCuda(const ExecContext& ctx,
                                        const FusedAttentionBackwardArgs& a) {
  const Geometry g = GeometryOf(a.dims, a.dropout);
  float* dsum = static_cast<float*>(a.workspace);
  const unsigned threads = kWarpsPerBlock * kWarp;
  RowDotKernel<<<BlocksFor(g.tokens * g.heads), threads, 0, Stream(ctx)>>>(g, a.dout, a.out, dsum);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  DqKernel<<<BlocksFor(g.tokens * g.heads), threads, 0, Stream(ctx)>>>(g, a.q, a.k, a.v, a.lse,
                                                                       a.dout, dsum, a.dq);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  DkvKernel<<<BlocksFor(g.tokens * g.kv_heads), threads, 0, Stream(ctx)>>>(
      g, a.q, a.k, a.v, a.lse, a.dout, dsum, a.dk, a.dv);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
