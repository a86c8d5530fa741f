// Gemm's bf16 math on the CPU: op(A) rounded to bf16 in the workspace, multiplied with the bf16 B
// by oneDNN's matmul (brgemm on AVX512_BF16, fp32 accumulation), written to the fp32 C.
#include <immintrin.h>
#include <omp.h>

#include <atomic>
#include <dnnl.hpp>
#include <map>
#include <tuple>

#include "core/tensor.h"
#include "kernels/base/kernel_util.h"
#include "kernels/gemm.h"

namespace fedlora::kernels {
namespace {

std::atomic<bool> g_allowed{true};

bool CpuHasBf16Matmul() {
  if (!__builtin_cpu_supports("avx512bf16")) return false;
  // oneDNN must also pick a bf16 kernel for this CPU (it refuses bf16 matmul it cannot run well).
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::memory::desc a({64, 64}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::ab);
    dnnl::memory::desc c({64, 64}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), eng);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// Rounds `n` floats to bf16 (nearest even; vcvtneps2bf16 also flushes denormals to zero).
__attribute__((target("avx512f,avx512bf16"))) void RoundToBf16(const float* src, uint16_t* dst,
                                                               int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<const __m256i&>(v));
  }
  if (i < n) ConvertF32ToBF16(src + i, dst + i, static_cast<size_t>(n - i));
}

// One matmul primitive per shape and epilogue, made on first use by each thread (oneDNN
// primitives may be executed concurrently, but the map is per thread so no lock is needed).
using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, float, float>;

struct Matmul {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c;
};

const dnnl::engine& Engine() {
  static const dnnl::engine* eng = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *eng;
}

absl::StatusOr<const Matmul*> GetMatmul(const GemmArgs& g) {
  thread_local std::map<Key, Matmul> cache;
  const Key key{g.m, g.n, g.k, g.trans_a, g.trans_b, g.ldb, g.ldc, g.alpha, g.beta};
  if (auto it = cache.find(key); it != cache.end()) return &it->second;
  using dt = dnnl::memory::data_type;
  Matmul mm;
  // A is the packed bf16 copy of op(A)'s stored layout; B is read where it lies.
  mm.a = dnnl::memory::desc({g.m, g.k}, dt::bf16,
                            g.trans_a ? dnnl::memory::dims{1, g.m} : dnnl::memory::dims{g.k, 1});
  mm.b =
      dnnl::memory::desc({g.k, g.n}, dt::bf16,
                         g.trans_b ? dnnl::memory::dims{1, g.ldb} : dnnl::memory::dims{g.ldb, 1});
  mm.c = dnnl::memory::desc({g.m, g.n}, dt::f32, dnnl::memory::dims{g.ldc, 1});
  dnnl::primitive_attr attr;
  if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(g.beta);
    attr.set_post_ops(ops);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(mm.a, mm.b, mm.c), attr, Engine());
    mm.prim = dnnl::matmul(pd);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("Gemm (bf16 math): oneDNN matmul ", g.m, "x", g.n, "x",
                                            g.k, " could not be created: ", e.what()));
  }
  return &cache.emplace(key, std::move(mm)).first->second;
}

}  // namespace

bool Bf16MathAvailable() {
  static const bool cpu = CpuHasBf16Matmul();
  return cpu && g_allowed.load(std::memory_order_relaxed);
}

namespace internal {

void SetBf16MathAllowedForTesting(bool allowed) {
  g_allowed.store(allowed, std::memory_order_relaxed);
}

size_t Bf16MathABytes(const GemmArgs& g) {
  return AlignUp(static_cast<size_t>(g.m) * static_cast<size_t>(g.k) * sizeof(uint16_t));
}

absl::Status GemmBf16MathCpu(const ExecContext& ctx, const GemmArgs& g) {
  FEDLORA_ASSIGN_OR_RETURN(const Matmul* mm, GetMatmul(g));
  // op(A)'s stored rows, packed: [m, k], or [k, m] when trans_a.
  const int64_t rows = g.trans_a ? g.k : g.m, cols = g.trans_a ? g.m : g.k;
  uint16_t* a16 = static_cast<uint16_t*>(g.workspace);
  ThreadPool& pool = ctx.Pool();
  pool.ParallelFor(0, rows, std::max<int64_t>(1, kElementwiseGrain / cols),
                   [&](int64_t b, int64_t e) {
                     for (int64_t r = b; r < e; ++r)
                       RoundToBf16(g.a + r * g.lda, a16 + r * cols, cols);
                   });
  // oneDNN runs on OpenMP threads; this thread's OpenMP width follows the pool's width.
  omp_set_num_threads(pool.Width());
  try {
    const dnnl::engine& eng = Engine();
    dnnl::stream stream(eng);
    dnnl::memory a(mm->a, eng, a16);
    dnnl::memory b(mm->b, eng, const_cast<uint16_t*>(g.b_bf16));
    dnnl::memory c(mm->c, eng, g.c);
    mm->prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("Gemm (bf16 math): oneDNN matmul ", g.m, "x", g.n, "x",
                                            g.k, " failed: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace fedlora::kernels
