// General matrix multiply, row-major:  C = alpha * op(A) op(B) + beta * C,  op(X) = X or X^T.
// CPU: OpenBLAS cblas_sgemm. CUDA: cuBLAS (cublasGemmStridedBatchedEx / cublasGemmEx, fp32
// compute, no TF32, so that both backends agree to fp32 rounding); with bf16_math, cuBLASLt in bf16.
//
//   // y[m,n] = x[m,k] W[n,k]^T
//   kernels::GemmArgs g{.trans_b = true, .m = m, .n = n, .k = k, .a = x, .b = w, .c = y};
//   FEDLORA_RETURN_IF_ERROR(kernels::Gemm(ctx, g));
//
// Shapes: op(A) is [m, k], op(B) is [k, n], C is [m, n]. A is stored [m, k] (lda >= k), or [k, m]
// when trans_a (lda >= m); B is stored [k, n] (ldb >= n), or [n, k] when trans_b (ldb >= k); C is
// stored with ldc >= n. A leading dimension of 0 means "packed" (the stored row length).
//
// Strided batch: when batch > 1, matrix i is A + i*stride_a, B + i*stride_b, C + i*stride_c
// (strides in elements; a stride of 0 broadcasts that operand, e.g. one weight for all batches).
// Attention uses it over the heads of one sequence.
//
// bf16 B (a frozen weight stored as bf16): set b_bf16 instead of b. Both backends convert B to
// fp32 panel by panel into the caller's workspace and run an fp32 GEMM per panel, so results
// equal the fp32 GEMM on the widened weight. A panel is a block of consecutive stored rows of B:
// it covers a block of output columns when trans_b, a block of the k dimension otherwise.
// Workspace: GemmWorkspaceBytes(args) = min(stored_rows, kGemmBf16PanelRows) * stored_cols * 4
// bytes (0 for fp32 B without bf16 math); a larger workspace uses larger panels (up to the whole matrix in one GEMM).
// For BERT-base (768 x 3072 weights) the minimum is 256 * 3072 * 4 = 3 MiB. bf16 B requires
// batch == 1.
//
// Quantized B (b_quant, a frozen weight in a ggml block format, core/ggml_quant.h): the same panel
// scheme, each stored row dequantized exactly as ggml does (a row is stored_cols elements in
// whole blocks, packed: ldb must be 0 or stored_cols). CPU: every type DequantizeRows supports;
// CUDA: Q8_0, Q4_0 and Q4_1 (Unimplemented for the others). Same workspace as bf16.
//
// bf16 math (bf16_math): operands rounded to bf16 (round to nearest even), products summed in
// fp32, about 1e-2 relative from the fp32 result instead of fp32 rounding.
//   CPU (with b_bf16 only; other B are refused there): op(A) is rounded into the workspace and
//   multiplied with the bf16 B by oneDNN's matmul on AVX512_BF16. It is a permission, not a
//   demand: where Bf16MathAvailable() is false (no AVX512_BF16) the exact fp32 path above runs.
//   CUDA (any B: fp32 with any batch and strides, or bf16 / quantized with batch 1): A, and B unless it is
//   stored bf16, are converted to packed bf16 in the workspace (quantized B dequantized straight
//   to bf16), then cublasLtMatmul multiplies them with CUBLAS_COMPUTE_32F into fp32 C.
// Workspace with bf16 math: sized for either backend, the larger of the CPU's (the panel and op(A)
// as bf16, m * k * 2 bytes) and CUDA's (internal::CudaBf16MathWorkspace: kGemmCublasLtWorkspaceBytes
// for cuBLASLt, then A and B as bf16, one copy per batch entry unless its stride is 0).
//
// int8 math (int8_math with a Q8_0 b_quant): the forward product A W^T (trans_b, not trans_a,
// batch 1) quantizes each row of A per block of 32 (d = max|a| / 127, q = nearest-even(a * 127 /
// max|a|)) and sums each block's int8 products exactly in int32 (AVX512-VNNI); C = alpha * sum over
// blocks, in block order, of fma(float(int dot), d_w * d_a, .) (+ beta * C). About 1e-2 relative
// from the fp32 product on the dequantized W; the same bits at every thread count. A permission
// like bf16 math: without AVX512-VNNI, on CUDA, below kGemmInt8MinRows rows (generation: W is
// repacked per call, which a few rows do not repay) and for the other products (the input
// gradient A W) the exact path runs. The workspace then holds A quantized and W repacked, 256 columns at a
// time: Int8MathWorkspaceBytes.
//
// CPU threads: OpenBLAS's own (kernels::SetNumThreads). When OpenBLAS has one thread (the
// simulator, sim/simulator.h), an fp32 product runs instead as single-threaded OpenBLAS calls on
// ctx's pool, one per batch entry or per block of C's rows (blocks fixed by the shape); the result
// is the same bit for bit at every width, one thread included.
// bf16 math runs on oneDNN's OpenMP threads, as many as the pool's width; unlike the fp32
// split, its bits are not promised to be the same at every width.
//
// FLOPs: 2 * m * n * k per batch entry.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "core/ggml_quant.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

inline constexpr int64_t kGemmBf16PanelRows = 256;
inline constexpr int64_t kGemmInt8MinRows = 32;
// cuBLASLt's own workspace inside a bf16-math workspace on CUDA.
inline constexpr size_t kGemmCublasLtWorkspaceBytes = size_t{4} << 20;

struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is write-only (NaN garbage in C is ignored, as BLAS does)
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;          // fp32 B, or
  const uint16_t* b_bf16 = nullptr;  // bf16 B (bit patterns), or
  const uint8_t* b_quant = nullptr;  // block-quantized B; exactly one of b / b_bf16 / b_quant
  GgmlType b_quant_type = GgmlType::kF32;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  bool bf16_math = false;     // may round A and B to bf16 (see bf16 math above)
  bool int8_math = false;     // with a Q8_0 b_quant: may quantize A to int8 (see int8 math above)
  void* workspace = nullptr;  // only for b_bf16 / b_quant / bf16_math; on ctx.device
  size_t workspace_bytes = 0;
};

// True when this CPU multiplies in bf16 (AVX512_BF16 and oneDNN's bf16 matmul): GemmArgs::bf16_math
// takes effect on the CPU. Computed once; thread-safe.
bool Bf16MathAvailable();

// True when this CPU multiplies in int8 (AVX512-VNNI): GemmArgs::int8_math takes effect on the CPU.
bool Int8MathAvailable();

// Minimum workspace for `args` on either backend (0 unless b_bf16, b_quant or bf16_math is set).
size_t GemmWorkspaceBytes(const GemmArgs& args);
absl::Status CanRun(const ExecContext& ctx, const GemmArgs& args);
absl::Status Gemm(const ExecContext& ctx, const GemmArgs& args);

namespace internal {
// Backends, called by Gemm after validation with leading dimensions resolved (never 0).
absl::Status GemmCpu(const ExecContext& ctx, const GemmArgs& args);
absl::Status GemmCuda(const ExecContext& ctx, const GemmArgs& args);
// bf16 math on the CPU (gemm_bf16_cpu.cc): args.bf16_math with b_bf16, Bf16MathAvailable().
absl::Status GemmBf16MathCpu(const ExecContext& ctx, const GemmArgs& args);
// Bytes of the bf16 copy of op(A) that GemmBf16MathCpu keeps at the start of the workspace.
size_t Bf16MathABytes(const GemmArgs& args);
// Tests: false makes Bf16MathAvailable() false from now on (the fp32 path runs); true restores
// the CPU's answer.
void SetBf16MathAllowedForTesting(bool allowed);
// Where the CUDA bf16-math path keeps its pieces in the workspace: offsets from the workspace
// rounded up to 256 bytes (total covers that rounding). cuBLASLt's workspace is at offset 0.
struct CudaBf16MathLayout {
  size_t a_offset =
      0;  // op(A)'s stored matrix as packed bf16, per batch entry (one if stride_a == 0)
  size_t b_offset = 0;  // B as packed bf16 (nothing when B is stored bf16)
  size_t total = 0;     // bytes the workspace needs; 0 when m, n or k is 0
};
CudaBf16MathLayout CudaBf16MathWorkspace(const GemmArgs& args);
// int8 math on the CPU (gemm_int8_cpu.cc): true when `args` runs there (see int8 math above).
bool UsesInt8Math(const GemmArgs& args);
absl::Status GemmInt8MathCpu(const ExecContext& ctx, const GemmArgs& args);
size_t Int8MathWorkspaceBytes(const GemmArgs& args);
void SetInt8MathAllowedForTesting(bool allowed);
// The blocks of rows a batch-1 fp32 product is split into on the CPU pool (1: one call), for any
// width. Blocks are large enough for OpenBLAS to keep its blocked kernel.
int64_t GemmCpuRowBlocks(const GemmArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
