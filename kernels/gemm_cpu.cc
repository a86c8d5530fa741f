// Gemm: validation, dispatch and the CPU backend (OpenBLAS).
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "kernels/base/kernel_util.h"
#include "kernels/gemm.h"
#include "kernels/weight.h"

namespace fedlora::kernels {
namespace {

constexpr std::string_view kOp = "Gemm";

// Stored shape of B: rows x cols as laid out in memory.
int64_t BStoredRows(const GemmArgs& g) { return g.trans_b ? g.n : g.k; }
int64_t BStoredCols(const GemmArgs& g) { return g.trans_b ? g.k : g.n; }

// Fills leading dimensions left at 0 with the packed value.
GemmArgs Resolved(const GemmArgs& in) {
  GemmArgs g = in;
  if (g.lda == 0) g.lda = std::max<int64_t>(1, g.trans_a ? g.m : g.k);
  if (g.ldb == 0) g.ldb = std::max<int64_t>(1, BStoredCols(g));
  if (g.ldc == 0) g.ldc = std::max<int64_t>(1, g.n);
  return g;
}

CBLAS_TRANSPOSE Op(bool t) { return t ? CblasTrans : CblasNoTrans; }

// C = beta * C for the degenerate k == 0 product (BLAS semantics: beta == 0 writes zeros).
void ScaleC(const GemmArgs& g, float* c) {
  for (int64_t i = 0; i < g.m; ++i) {
    float* row = c + i * g.ldc;
    if (g.beta == 0.0f) {
      std::fill(row, row + g.n, 0.0f);
    } else {
      for (int64_t j = 0; j < g.n; ++j) row[j] *= g.beta;
    }
  }
}

// fp32 GEMMs with OpenBLAS single-threaded (SgemmOnPool): OpenBLAS runs on blocks of C's rows, or
// on whole batch entries, spread over our pool. The blocks depend on the shape only, never on the
// pool's width (one thread runs them in turn), so every width gives the same bits
// (tests/kernels/gemm_test.cc checks the models' shapes). Whether a block's bits equal one call on
// the whole product depends on OpenBLAS's kernel for the CPU (they do with AVX-512, not on an AVX2
// EPYC), which is why a width of one thread splits too. Blocks hold at least kSplitMinMacs
// multiply-adds, so that OpenBLAS keeps its blocked kernel (its small-matrix and "direct" kernels
// take products below about 7.3M), and start at multiples of kSplitRowAlign rows.
constexpr int64_t kSplitMinMacs = int64_t{1} << 23;
constexpr int64_t kSplitRowAlign = 16;

// Rows [r0, r1) of batch entry i.
void SgemmRows(const GemmArgs& g, int64_t i, int64_t r0, int64_t r1) {
  const float* a = g.a + i * g.stride_a + (g.trans_a ? r0 : r0 * g.lda);
  cblas_sgemm(CblasRowMajor, Op(g.trans_a), Op(g.trans_b), static_cast<int>(r1 - r0),
              static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, a, static_cast<int>(g.lda),
              g.b + i * g.stride_b, static_cast<int>(g.ldb), g.beta,
              g.c + i * g.stride_c + r0 * g.ldc, static_cast<int>(g.ldc));
}

// Rows where block j of `blocks` starts (GemmCpuRowBlocks): whole units of kSplitRowAlign rows,
// at least min_units per block; the last block also takes the rows past the last whole unit.
int64_t BlockStart(const GemmArgs& g, int64_t blocks, int64_t j) {
  return j == blocks ? g.m : kSplitRowAlign * (j * (g.m / kSplitRowAlign) / blocks);
}

void SgemmOnPool(ThreadPool& pool, const GemmArgs& g) {
  if (g.batch > 1 && g.stride_c != 0) {  // entries with C's of their own: whole entries per thread
    pool.ParallelFor(0, g.batch, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) SgemmRows(g, i, 0, g.m);
    });
    return;
  }
  const int64_t blocks = internal::GemmCpuRowBlocks(g);
  for (int64_t i = 0; i < g.batch; ++i) {  // several entries here share one C: in order
    if (blocks < 2) {
      SgemmRows(g, i, 0, g.m);
      continue;
    }
    pool.ParallelFor(0, blocks, 1, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j)  // one call per block, however many a thread takes
        SgemmRows(g, i, BlockStart(g, blocks, j), BlockStart(g, blocks, j + 1));
    });
  }
}

}  // namespace

size_t GemmWorkspaceBytes(const GemmArgs& args) {
  // bf16 math on CUDA: cuBLASLt's workspace and the bf16 copies (0 for an empty product).
  size_t need = args.bf16_math ? internal::CudaBf16MathWorkspace(args).total : 0;
  if (args.b_bf16 == nullptr && args.b_quant == nullptr) return need;
  const int64_t rows = BStoredRows(args), cols = BStoredCols(args);
  if (rows <= 0 || cols <= 0) return need;
  const size_t panel =
      static_cast<size_t>(std::min(rows, kGemmBf16PanelRows) * cols) * sizeof(float);
  need = std::max(need, panel);
  // bf16 math on the CPU needs the bf16 copy of A; the panel keeps the fp32 path runnable too.
  if (args.bf16_math && args.b_bf16 != nullptr && Bf16MathAvailable()) {
    return std::max(need, internal::Bf16MathABytes(args));
  }
  if (args.int8_math && args.b_quant != nullptr) {
    GemmArgs g = Resolved(args);
    if (internal::UsesInt8Math(g)) return std::max(need, internal::Int8MathWorkspaceBytes(g));
  }
  return need;
}

absl::Status CanRun(const ExecContext& ctx, const GemmArgs& in) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {in.m, in.n}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {in.m, in.k}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {in.k, in.n}));
  if (in.batch < 1) return internal::InvalidArg(kOp, absl::StrCat("batch ", in.batch, " < 1"));
  if (in.stride_a < 0 || in.stride_b < 0 || in.stride_c < 0)
    return internal::InvalidArg(kOp, "negative batch stride");
  const GemmArgs g = Resolved(in);
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc}) {
    if (v > INT_MAX)
      return internal::InvalidArg(kOp,
                                  absl::StrCat("dimension ", v, " exceeds the BLAS int range"));
  }
  if (g.lda < (g.trans_a ? g.m : g.k))
    return internal::InvalidArg(kOp, absl::StrCat("lda ", g.lda, " too small"));
  if (g.ldb < BStoredCols(g))
    return internal::InvalidArg(kOp, absl::StrCat("ldb ", g.ldb, " too small"));
  if (g.ldc < g.n) return internal::InvalidArg(kOp, absl::StrCat("ldc ", g.ldc, " < n ", g.n));
  const int set_b = (g.b != nullptr) + (g.b_bf16 != nullptr) + (g.b_quant != nullptr);
  if (set_b != 1 && g.k > 0 && g.m > 0 && g.n > 0) {
    return internal::InvalidArg(kOp, "exactly one of b, b_bf16 and b_quant must be set");
  }
  if (g.m > 0 && g.n > 0) {
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, g.c, "c"));
    if (g.k > 0) FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, g.a, "a"));
  }
  if (g.bf16_math && g.b_bf16 == nullptr && g.k > 0 && ctx.device != Device::kCuda) {
    return internal::InvalidArg(kOp, "bf16_math applies to a bf16 B only on the CPU");
  }
  if (g.int8_math && g.b_quant_type != GgmlType::kQ8_0 && g.k > 0) {
    return internal::InvalidArg(kOp, "int8_math applies to a Q8_0 B only");
  }
  if ((g.b_bf16 != nullptr || g.b_quant != nullptr) && g.batch != 1) {
    return absl::UnimplementedError(absl::StrCat(
        "Gemm: ", g.b_bf16 != nullptr ? "bf16" : "quantized", " B requires batch == 1"));
  }
  if (const size_t need = GemmWorkspaceBytes(g);
      need > 0 && (g.workspace == nullptr || g.workspace_bytes < need)) {
    const char* kind = g.b_bf16 != nullptr    ? "bf16 B"
                       : g.b_quant != nullptr ? "quantized B"
                                              : "bf16 math";
    return internal::InvalidArg(kOp,
                                absl::StrCat(kind, " needs a workspace of ", need, " bytes, got ",
                                             g.workspace == nullptr ? 0 : g.workspace_bytes));
  }
  if (g.b_quant != nullptr) {
    if (g.ldb != BStoredCols(g)) {
      return internal::InvalidArg(kOp, absl::StrCat("quantized B must be packed: ldb ", g.ldb,
                                                    " != stored columns ", BStoredCols(g)));
    }
    if (absl::StatusOr<int64_t> rb = GgmlRowBytes(g.b_quant_type, BStoredCols(g)); !rb.ok()) {
      return absl::Status(rb.status().code(),
                          absl::StrCat("Gemm: quantized B: ", rb.status().message()));
    }
    if (ctx.device == Device::kCuda && g.b_quant_type != GgmlType::kQ8_0 &&
        g.b_quant_type != GgmlType::kQ4_0 && g.b_quant_type != GgmlType::kQ4_1) {
      return absl::UnimplementedError(absl::StrCat("Gemm: quantized B of type ",
                                                   std::string(GgmlTypeName(g.b_quant_type)),
                                                   " on CUDA (supported there: Q8_0, Q4_0, Q4_1)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Gemm(const ExecContext& ctx, const GemmArgs& args) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, args));
  const GemmArgs g = Resolved(args);
  if (g.m == 0 || g.n == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::GemmCuda(ctx, g));
  return internal::GemmCpu(ctx, g);
}

namespace internal {

CudaBf16MathLayout CudaBf16MathWorkspace(const GemmArgs& g) {
  CudaBf16MathLayout l;
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch < 1) return l;
  constexpr size_t kAlign = 256;
  auto round_up = [](size_t v) { return (v + kAlign - 1) / kAlign * kAlign; };
  const size_t a_entries = g.stride_a == 0 ? 1 : static_cast<size_t>(g.batch);
  const size_t b_entries = g.stride_b == 0 ? 1 : static_cast<size_t>(g.batch);
  const size_t a_bytes = a_entries * static_cast<size_t>(g.m * g.k) * 2;
  const size_t b_bytes = g.b_bf16 != nullptr ? 0 : b_entries * static_cast<size_t>(g.k * g.n) * 2;
  l.a_offset = round_up(kGemmCublasLtWorkspaceBytes);
  l.b_offset = l.a_offset + round_up(a_bytes);
  l.total = l.b_offset + round_up(b_bytes) + kAlign;  // the base may need rounding up to 256
  return l;
}

int64_t GemmCpuRowBlocks(const GemmArgs& g) {
  if (g.n <= 0 || g.k <= 0) return 1;
  const int64_t unit_macs = kSplitRowAlign * g.n * g.k;
  const int64_t min_units = (kSplitMinMacs + unit_macs - 1) / unit_macs;
  return std::max<int64_t>(1, (g.m / kSplitRowAlign) / min_units);
}

absl::Status GemmCpu(const ExecContext& ctx, const GemmArgs& g) {
  if (g.k == 0) {
    for (int64_t i = 0; i < g.batch; ++i) ScaleC(g, g.c + i * g.stride_c);
    return absl::OkStatus();
  }
  if (g.b_bf16 == nullptr && g.b_quant == nullptr) {
    // Single-threaded OpenBLAS (the simulator's setting, see sim/simulator.h): blocks of the
    // product on the pool, whatever its width.
    if (openblas_get_num_threads() == 1) {
      SgemmOnPool(ctx.Pool(), g);
      return absl::OkStatus();
    }
    // Otherwise batches run one after another, each on OpenBLAS's own threads (see SetNumThreads);
    // calling a multi-threaded OpenBLAS from several of our pool threads would oversubscribe the cores.
    for (int64_t i = 0; i < g.batch; ++i) {
      cblas_sgemm(CblasRowMajor, Op(g.trans_a), Op(g.trans_b), static_cast<int>(g.m),
                  static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, g.a + i * g.stride_a,
                  static_cast<int>(g.lda), g.b + i * g.stride_b, static_cast<int>(g.ldb), g.beta,
                  g.c + i * g.stride_c, static_cast<int>(g.ldc));
    }
    return absl::OkStatus();
  }
  if (g.bf16_math && g.b_bf16 != nullptr && Bf16MathAvailable()) return GemmBf16MathCpu(ctx, g);
  if (UsesInt8Math(g)) return GemmInt8MathCpu(ctx, g);
  // bf16 or quantized B: widen a panel of stored rows into the workspace, multiply, next panel.
  // The widening is exact (dequantization as ggml's), so the result equals the fp32 GEMM on the
  // widened weight.
  const int64_t rows = BStoredRows(g), cols = BStoredCols(g);
  const int64_t row_bytes =
      g.b_quant != nullptr ? *GgmlRowBytes(g.b_quant_type, cols) : 0;  // checked by CanRun
  const int64_t panel = std::clamp<int64_t>(
      static_cast<int64_t>(g.workspace_bytes / (cols * sizeof(float))), 1, rows);
  float* ws = static_cast<float*>(g.workspace);
  ThreadPool& pool = ctx.Pool();
  for (int64_t r0 = 0; r0 < rows; r0 += panel) {
    const int64_t p = std::min(panel, rows - r0);
    pool.ParallelFor(0, p, std::max<int64_t>(1, kElementwiseGrain / cols),
                     [&](int64_t b, int64_t e) {
                       if (g.b_quant != nullptr) {
                         (void)DequantizeRows(g.b_quant_type, g.b_quant + (r0 + b) * row_bytes,
                                              e - b, cols, ws + b * cols, cols);
                         return;
                       }
                       for (int64_t r = b; r < e; ++r) {
                         const uint16_t* src = g.b_bf16 + (r0 + r) * g.ldb;
                         float* dst = ws + r * cols;
                         for (int64_t j = 0; j < cols; ++j) dst[j] = Bf16BitsToF32(src[j]);
                       }
                     });
    if (g.trans_b) {
      // Stored rows are output columns: C[:, r0:r0+p] = alpha op(A) panel^T + beta C[:, r0:r0+p].
      cblas_sgemm(CblasRowMajor, Op(g.trans_a), CblasTrans, static_cast<int>(g.m),
                  static_cast<int>(p), static_cast<int>(g.k), g.alpha, g.a, static_cast<int>(g.lda),
                  ws, static_cast<int>(cols), g.beta, g.c + r0, static_cast<int>(g.ldc));
    } else {
      // Stored rows are a block of k: C += alpha op(A)[:, r0:r0+p] panel (beta on the first only).
      const float* a_block = g.trans_a ? g.a + r0 * g.lda : g.a + r0;
      cblas_sgemm(CblasRowMajor, Op(g.trans_a), CblasNoTrans, static_cast<int>(g.m),
                  static_cast<int>(g.n), static_cast<int>(p), g.alpha, a_block,
                  static_cast<int>(g.lda), ws, static_cast<int>(cols), r0 == 0 ? g.beta : 1.0f, g.c,
                  static_cast<int>(g.ldc));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace fedlora::kernels
