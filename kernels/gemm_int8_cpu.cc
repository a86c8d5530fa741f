// Gemm's int8 math on the CPU: C = alpha * A W^T (+ beta * C) for a Q8_0 W, with A quantized to
// int8 per block of 32 and the block products summed by AVX512-VNNI (vpdpbusd), as kernels/gemm.h
// describes. Per call: A is quantized once into the workspace; W is repacked, a chunk of output
// columns at a time, into panels of 16 columns laid out for vpdpbusd; a 4-row x 32-column tile
// then accumulates each block in int32 and the blocks in fp32 (one FMA per block, in block order),
// so every element is computed the same way whatever the thread count.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/ggml_quant.h"
#include "core/tensor.h"
#include "kernels/base/kernel_util.h"
#include "kernels/gemm.h"

namespace fedlora::kernels {
namespace {

std::atomic<bool> g_allowed{true};

constexpr int64_t kPanelCols = 16;                  // output columns per repacked panel
constexpr int64_t kChunkCols = kGemmBf16PanelRows;  // output columns repacked at a time
constexpr int64_t kPanelBlockBytes =
    kGgmlQK * kPanelCols;  // 8 groups of 4 k x 16 columns x 4 bytes

bool CpuHasVnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
}

// Workspace layout, each part aligned: quantized A [m, k] (u8 = q + 128), A's scales [m, kb],
// then for one chunk of columns: panels [chunk/16][kb][8][16][4] of W's int8 values, W's scales
// [chunk/16][kb][16] and the offset correction [chunk/16][kb][16] (-128 * the block's sum of q).
struct Layout {
  size_t a_q = 0, a_d = 0, w_q = 0, w_d = 0, w_corr = 0, total = 0;
};

Layout MakeLayout(const GemmArgs& g) {
  const int64_t kb = g.k / kGgmlQK;
  const int64_t chunk_panels = (std::min(g.n, kChunkCols) + kPanelCols - 1) / kPanelCols;
  Layout l;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at += internal::AlignUp(bytes);
    return here;
  };
  l.a_q = take(static_cast<size_t>(g.m * g.k));
  l.a_d = take(static_cast<size_t>(g.m * kb) * sizeof(float));
  l.w_q = take(static_cast<size_t>(chunk_panels * kb * kPanelBlockBytes));
  l.w_d = take(static_cast<size_t>(chunk_panels * kb * kPanelCols) * sizeof(float));
  l.w_corr = take(static_cast<size_t>(chunk_panels * kb * kPanelCols) * sizeof(int32_t));
  l.total = at;
  return l;
}

// Row `r` of A, block by block: d = max|a| / 127, q = nearest-even(a * (127 / max|a|)) (0 when the
// block is all zero), stored as q + 128: vpdpbusd multiplies unsigned by signed bytes, and the
// panels' correction takes the 128 * sum(w) back out.
__attribute__((target("avx512f,avx512bw"))) void QuantizeRow(const float* a, int64_t k, uint8_t* q,
                                                             float* d) {
  for (int64_t b = 0; b < k / kGgmlQK; ++b) {
    const __m512 x0 = _mm512_loadu_ps(a + b * kGgmlQK), x1 = _mm512_loadu_ps(a + b * kGgmlQK + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    // A NaN (which max may drop) or an infinity makes the block's scale NaN, so it reaches C.
    const bool finite = std::isfinite(amax) && _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) == 0 &&
                        _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q) == 0;
    d[b] = finite ? amax / 127.0f : std::nanf("");
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i off = _mm512_set1_epi32(128);
    const __m512i q0 = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vinv)), off);
    const __m512i q1 = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vinv)), off);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kGgmlQK), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kGgmlQK + 16), _mm512_cvtepi32_epi8(q1));
  }
}

// Panel p (columns col0 + 16p ..) of the chunk: W's rows as vpdpbusd's second operand. Columns past
// n are zero (they are never stored).
void RepackPanel(const GemmArgs& g, int64_t kb, int64_t row_bytes, int64_t col0, int64_t p,
                 uint8_t* wq, float* wd, int32_t* corr) {
  for (int64_t j = 0; j < kPanelCols; ++j) {
    const int64_t col = col0 + p * kPanelCols + j;
    for (int64_t b = 0; b < kb; ++b) {
      uint8_t* dst = wq + (p * kb + b) * kPanelBlockBytes;
      const size_t at = static_cast<size_t>((p * kb + b) * kPanelCols + j);
      if (col >= g.n) {
        for (int64_t t = 0; t < kGgmlQK; ++t) dst[(t / 4) * 64 + j * 4 + t % 4] = 0;
        wd[at] = 0.0f;
        corr[at] = 0;
        continue;
      }
      BlockQ8_0 blk;
      std::memcpy(&blk, g.b_quant + col * row_bytes + b * static_cast<int64_t>(sizeof(BlockQ8_0)),
                  sizeof(blk));
      int32_t sum = 0;
      for (int64_t t = 0; t < kGgmlQK; ++t) {
        dst[(t / 4) * 64 + j * 4 + t % 4] = static_cast<uint8_t>(blk.qs[t]);
        sum += blk.qs[t];
      }
      wd[at] = F16ToF32(blk.d);
      corr[at] = -128 * sum;
    }
  }
}

// Rows [r0, r0 + MR) x panels p0 (and p0 + 1 when NV == 2) of the chunk.
template <int MR, int NV>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void Tile(const GemmArgs& g, const Layout& l,
                                                                 int64_t kb, int64_t col0,
                                                                 int64_t r0, int64_t p0) {
  const uint8_t* ws = static_cast<const uint8_t*>(g.workspace);
  const uint8_t* aq = ws + l.a_q;
  const float* ad = reinterpret_cast<const float*>(ws + l.a_d);
  const uint8_t* wq = ws + l.w_q;
  const float* wd = reinterpret_cast<const float*>(ws + l.w_d);
  const int32_t* corr = reinterpret_cast<const int32_t*>(ws + l.w_corr);
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    __m512i dot[MR][NV];
    for (int v = 0; v < NV; ++v) {
      const __m512i c = _mm512_loadu_si512(corr + ((p0 + v) * kb + b) * kPanelCols);
      for (int r = 0; r < MR; ++r) dot[r][v] = c;
    }
    for (int g4 = 0; g4 < kGgmlQK / 4; ++g4) {
      __m512i w[NV];
      for (int v = 0; v < NV; ++v)
        w[v] = _mm512_loadu_si512(wq + ((p0 + v) * kb + b) * kPanelBlockBytes + g4 * 64);
      for (int r = 0; r < MR; ++r) {
        int32_t four;
        std::memcpy(&four, aq + (r0 + r) * g.k + b * kGgmlQK + g4 * 4, sizeof(four));
        const __m512i x = _mm512_set1_epi32(four);
        for (int v = 0; v < NV; ++v) dot[r][v] = _mm512_dpbusd_epi32(dot[r][v], x, w[v]);
      }
    }
    for (int v = 0; v < NV; ++v) {
      const __m512 dw = _mm512_loadu_ps(wd + ((p0 + v) * kb + b) * kPanelCols);
      for (int r = 0; r < MR; ++r) {
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(ad[(r0 + r) * kb + b]));
        acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][v]), s, acc[r][v]);
      }
    }
  }
  const __m512 alpha = _mm512_set1_ps(g.alpha), beta = _mm512_set1_ps(g.beta);
  for (int v = 0; v < NV; ++v) {
    const int64_t col = col0 + (p0 + v) * kPanelCols;
    const int64_t valid = std::min<int64_t>(kPanelCols, g.n - col);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    for (int r = 0; r < MR; ++r) {
      float* c = g.c + (r0 + r) * g.ldc + col;
      __m512 out = _mm512_mul_ps(alpha, acc[r][v]);
      if (g.beta != 0.0f)
        out = _mm512_add_ps(out, _mm512_mul_ps(beta, _mm512_maskz_loadu_ps(mask, c)));
      _mm512_mask_storeu_ps(c, mask, out);
    }
  }
}

template <int MR>
void RowTile(const GemmArgs& g, const Layout& l, int64_t kb, int64_t col0, int64_t r0, int64_t p0,
             int64_t panels) {
  if (p0 + 1 < panels) {
    Tile<MR, 2>(g, l, kb, col0, r0, p0);
  } else {
    Tile<MR, 1>(g, l, kb, col0, r0, p0);
  }
}

}  // namespace

bool Int8MathAvailable() {
  static const bool cpu = CpuHasVnni();
  return cpu && g_allowed.load(std::memory_order_relaxed);
}

namespace internal {

void SetInt8MathAllowedForTesting(bool allowed) {
  g_allowed.store(allowed, std::memory_order_relaxed);
}

bool UsesInt8Math(const GemmArgs& g) {
  return g.int8_math && g.b_quant != nullptr && g.b_quant_type == GgmlType::kQ8_0 && g.trans_b &&
         !g.trans_a && g.batch == 1 && g.m >= kGemmInt8MinRows && g.k % kGgmlQK == 0 &&
         Int8MathAvailable();
}

size_t Int8MathWorkspaceBytes(const GemmArgs& g) { return MakeLayout(g).total; }

absl::Status GemmInt8MathCpu(const ExecContext& ctx, const GemmArgs& g) {
  const Layout l = MakeLayout(g);
  const int64_t kb = g.k / kGgmlQK;
  const int64_t row_bytes = kb * static_cast<int64_t>(sizeof(BlockQ8_0));
  uint8_t* ws = static_cast<uint8_t*>(g.workspace);
  ThreadPool& pool = ctx.Pool();
  pool.ParallelFor(0, g.m, std::max<int64_t>(1, kElementwiseGrain / g.k),
                   [&](int64_t b, int64_t e) {
                     for (int64_t r = b; r < e; ++r) {
                       QuantizeRow(g.a + r * g.lda, g.k, ws + l.a_q + r * g.k,
                                   reinterpret_cast<float*>(ws + l.a_d) + r * kb);
                     }
                   });
  constexpr int64_t kRowBlock =
      64;  // rows of A per task: 64 x k bytes stay in L2 while the panels pass
  const int64_t row_blocks = (g.m + kRowBlock - 1) / kRowBlock;
  for (int64_t col0 = 0; col0 < g.n; col0 += kChunkCols) {
    const int64_t cols = std::min(kChunkCols, g.n - col0);
    const int64_t panels = (cols + kPanelCols - 1) / kPanelCols;
    pool.ParallelFor(0, panels, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        RepackPanel(g, kb, row_bytes, col0, p, ws + l.w_q, reinterpret_cast<float*>(ws + l.w_d),
                    reinterpret_cast<int32_t*>(ws + l.w_corr));
      }
    });
    const int64_t pairs = (panels + 1) / 2;
    pool.ParallelFor(0, row_blocks * pairs, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t rb = t / pairs, p0 = 2 * (t % pairs);
        const int64_t r_end = std::min(g.m, (rb + 1) * kRowBlock);
        int64_t r = rb * kRowBlock;
        for (; r + 4 <= r_end; r += 4) RowTile<4>(g, l, kb, col0, r, p0, panels);
        switch (r_end - r) {
          case 3:
            RowTile<3>(g, l, kb, col0, r, p0, panels);
            break;
          case 2:
            RowTile<2>(g, l, kb, col0, r, p0, panels);
            break;
          case 1:
            RowTile<1>(g, l, kb, col0, r, p0, panels);
            break;
          default:
            break;
        }
      }
    });
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace fedlora::kernels
