// One decoding step's attention, CUDA backend (flash-decoding): pass 1 runs one block per (chunk of
// kDecodeAttentionChunk positions, query head): a warp per position for the scores, then the
// chunk's max m, sum of exp(s - m), and unnormalised output sum_j exp(s_j - m) v_j into the
// workspace. Pass 2 runs one block per head and combines its chunks:
//   M = max_c m_c,  out = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) s_c.
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_util.cuh"
#include "kernels/base/warp_reduce.cuh"
#include "kernels/decode_attention.h"

namespace fedlora::kernels::internal {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kChunk = kDecodeAttentionChunk;

// Block-wide max or sum over kThreads threads; every thread gets the result. `sh` holds kWarps floats.
template <bool kMax>
__device__ float BlockReduce(float v, float* sh) {
  v = WarpReduce<kMax>(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = sh[0];
  for (int w = 1; w < kWarps; ++w) v = kMax ? fmaxf(v, sh[w]) : v + sh[w];
  return v;
}

// Grid (chunks, heads). Shared: q row [D], the chunk's scores [kChunk], reduction scratch [kWarps].
__global__ void DecodeChunkKernel(int64_t len, int64_t kv_heads, int64_t D, int64_t group,
                                  float scale, const float* __restrict__ q,
                                  const float* __restrict__ k, const float* __restrict__ v,
                                  float* __restrict__ part_o, float* __restrict__ part_m,
                                  float* __restrict__ part_s) {
  extern __shared__ float sh[];
  float* qs = sh;
  float* s = sh + D;
  float* red = s + kChunk;
  const int64_t chunks = gridDim.x, c = blockIdx.x, hq = blockIdx.y;
  const int64_t j0 = c * kChunk;
  const int64_t n = len - j0 < kChunk ? len - j0 : kChunk;
  const int64_t kvd = kv_heads * D, kv_off = (hq / group) * D;
  for (int64_t e = threadIdx.x; e < D; e += kThreads) qs[e] = q[hq * D + e];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t j = warp; j < n; j += kWarps) {
    const float* kr = k + (j0 + j) * kvd + kv_off;
    float dot = 0.0f;
    for (int64_t e = lane; e < D; e += 32) dot += qs[e] * kr[e];
    dot = WarpSum(dot);
    if (lane == 0) s[j] = dot * scale;
  }
  __syncthreads();
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) m = fmaxf(m, s[j]);
  m = BlockReduce<true>(m, red);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float p = expf(s[j] - m);
    s[j] = p;
    sum += p;
  }
  sum = BlockReduce<false>(sum, red);  // its barriers also publish the s[j] writes
  const int64_t slot = hq * chunks + c;
  for (int64_t e = threadIdx.x; e < D; e += kThreads) {
    const float* vc = v + j0 * kvd + kv_off + e;
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += s[j] * vc[j * kvd];
    part_o[slot * D + e] = acc;
  }
  if (threadIdx.x == 0) {
    part_m[slot] = m;
    part_s[slot] = sum;
  }
}

// Grid (heads). Each thread walks the head's chunk statistics (a few per thousand positions).
__global__ void DecodeCombineKernel(int64_t chunks, int64_t D, const float* __restrict__ part_o,
                                    const float* __restrict__ part_m,
                                    const float* __restrict__ part_s, float* __restrict__ out) {
  const int64_t hq = blockIdx.x;
  const float* pm = part_m + hq * chunks;
  const float* ps = part_s + hq * chunks;
  float M = -FLT_MAX;
  for (int64_t c = 0; c < chunks; ++c) M = fmaxf(M, pm[c]);
  float total = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) total += ps[c] * expf(pm[c] - M);
  const float inv = 1.0f / total;
  for (int64_t e = threadIdx.x; e < D; e += kThreads) {
    float acc = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) acc += part_o[(hq * chunks + c) * D + e] * expf(pm[c] - M);
    out[hq * D + e] = acc * inv;
  }
}

}  // namespace

absl::Status DecodeAttentionCuda(const ExecContext& ctx, const DecodeAttentionArgs& a) {
  const int64_t D = a.head_dim, chunks = (a.len + kChunk - 1) / kChunk;
  const size_t smem = static_cast<size_t>(D + kChunk + kWarps) * sizeof(float);
  if (smem > 48 * 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeAttention: head_dim ", D, " too large for the CUDA backend"));
  }
  if (a.heads > 65535 || chunks > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeAttention: heads ", a.heads, " or len ",
                                                   a.len,
                                                   " too large for the CUDA backend's grid"));
  }
  float* part_o = static_cast<float*>(a.workspace);
  float* part_m = part_o + a.heads * chunks * D;
  float* part_s = part_m + a.heads * chunks;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  DecodeChunkKernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(a.heads)), kThreads,
                      smem, Stream(ctx)>>>(a.len, a.kv_heads, D, a.heads / a.kv_heads, scale, a.q,
                                           a.k_cache, a.v_cache, part_o, part_m, part_s);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  DecodeCombineKernel<<<static_cast<unsigned>(a.heads), kThreads, 0, Stream(ctx)>>>(
      chunks, D, part_o, part_m, part_s, a.out);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
