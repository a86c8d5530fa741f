// Gemm, CUDA backend: cuBLAS with fp32 compute. Row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T, i.e. cuBLAS gets (B, A) swapped and n, m swapped.
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda_util.cuh"
#include "kernels/gemm.h"
#include "kernels/weight.h"

namespace fedlora::kernels {
namespace internal {

absl::StatusOr<cublasHandle_t> CublasHandle(const ExecContext& ctx) {
  constexpr int kMaxDevices = 64;
  thread_local cublasHandle_t handles[kMaxDevices] = {};
  int dev = 0;
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return absl::OutOfRangeError("CUDA device index beyond 64");
  if (handles[dev] == nullptr) {
    FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handles[dev]));
    // Plain fp32 math (no TF32), so that the GPU agrees with the CPU reference.
    FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(handles[dev], CUBLAS_DEFAULT_MATH));
  }
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handles[dev], Stream(ctx)));
  return handles[dev];
}

namespace {

cublasOperation_t CuOp(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

// Widens `rows` stored rows of a bf16 matrix (row stride ld) into a packed fp32 [rows, cols].
__global__ void WidenBf16Kernel(const uint16_t* __restrict__ src, int64_t ld, int64_t rows, int64_t cols,
                                float* __restrict__ dst) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[i] = Bf16BitsToF32(src[r * ld + c]);
  }
}

// Dequantizes `rows` packed rows of ggml blocks (32 elements each: Q8_0, Q4_0, Q4_1; row_bytes
// apart) into a packed fp32 [rows, cols]: one thread per block, the arithmetic of ggml's reference
// (each multiply and add rounded on its own: __fmul_rn / __fadd_rn, no contraction).
__device__ __forceinline__ float HalfBits(const uint8_t* p) {
  const unsigned short bits = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}
__global__ void DequantBlocksKernel(const uint8_t* __restrict__ src, int64_t row_bytes, int64_t rows, int64_t cols,
                                    int type, float* __restrict__ dst) {
  const int64_t blocks_per_row = cols / 32, total = rows * blocks_per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / blocks_per_row, b = i - r * blocks_per_row;
    float* out = dst + r * cols + b * 32;
    if (type == static_cast<int>(GgmlType::kQ8_0)) {  // d, 32 x int8
      const uint8_t* blk = src + r * row_bytes + b * 34;
      const float d = HalfBits(blk);
      for (int j = 0; j < 32; ++j) out[j] = __fmul_rn(static_cast<float>(static_cast<int8_t>(blk[2 + j])), d);
    } else if (type == static_cast<int>(GgmlType::kQ4_0)) {  // d, 16 bytes of nibbles: (q - 8) * d
      const uint8_t* blk = src + r * row_bytes + b * 18;
      const float d = HalfBits(blk);
      for (int j = 0; j < 16; ++j) {
        out[j] = __fmul_rn(static_cast<float>((blk[2 + j] & 0x0f) - 8), d);
        out[j + 16] = __fmul_rn(static_cast<float>((blk[2 + j] >> 4) - 8), d);
      }
    } else {  // Q4_1: d, m, 16 bytes of nibbles: q * d + m
      const uint8_t* blk = src + r * row_bytes + b * 20;
      const float d = HalfBits(blk), m = HalfBits(blk + 2);
      for (int j = 0; j < 16; ++j) {
        out[j] = __fadd_rn(__fmul_rn(static_cast<float>(blk[4 + j] & 0x0f), d), m);
        out[j + 16] = __fadd_rn(__fmul_rn(static_cast<float>(blk[4 + j] >> 4), d), m);
      }
    }
  }
}

absl::Status Sgemm(cublasHandle_t h, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(h, CuOp(tb), CuOp(ta), static_cast<int>(n), static_cast<int>(m),
                                              static_cast<int>(k), &alpha, b, CUDA_R_32F, static_cast<int>(ldb), a,
                                              CUDA_R_32F, static_cast<int>(lda), &beta, c, CUDA_R_32F,
                                              static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace

absl::Status GemmCuda(const ExecContext& ctx, const GemmArgs& g) {
  FEDLORA_ASSIGN_OR_RETURN(cublasHandle_t h, CublasHandle(ctx));
  if (g.b_bf16 == nullptr && g.b_quant == nullptr) {
    if (g.batch == 1) return Sgemm(h, g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, g.c, g.ldc);
    FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        h, CuOp(g.trans_b), CuOp(g.trans_a), static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k),
        &g.alpha, g.b, CUDA_R_32F, static_cast<int>(g.ldb), g.stride_b, g.a, CUDA_R_32F, static_cast<int>(g.lda),
        g.stride_a, &g.beta, g.c, CUDA_R_32F, static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.batch),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }
  if (g.k == 0) {
    // cuBLAS applies beta and reads no B.
    return Sgemm(h, g.trans_a, g.trans_b, g.m, g.n, 0, g.alpha, g.a, g.lda, nullptr, g.ldb, g.beta, g.c, g.ldc);
  }
  // bf16 or quantized B: the same panel scheme as the CPU (gemm_cpu.cc), widening on the GPU.
  const int64_t rows = g.trans_b ? g.n : g.k, cols = g.trans_b ? g.k : g.n;
  const int64_t row_bytes = g.b_quant != nullptr ? *GgmlRowBytes(g.b_quant_type, cols) : 0;  // checked by CanRun
  const int64_t panel = std::clamp<int64_t>(static_cast<int64_t>(g.workspace_bytes / (cols * sizeof(float))), 1, rows);
  float* ws = static_cast<float*>(g.workspace);
  for (int64_t r0 = 0; r0 < rows; r0 += panel) {
    const int64_t p = std::min(panel, rows - r0);
    if (g.b_quant != nullptr) {
      DequantBlocksKernel<<<GridFor(p * cols / 32, 256), 256, 0, Stream(ctx)>>>(
          g.b_quant + r0 * row_bytes, row_bytes, p, cols, static_cast<int>(g.b_quant_type), ws);
    } else {
      WidenBf16Kernel<<<GridFor(p * cols, 256), 256, 0, Stream(ctx)>>>(g.b_bf16 + r0 * g.ldb, g.ldb, p, cols, ws);
    }
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    if (g.trans_b) {
      FEDLORA_RETURN_IF_ERROR(Sgemm(h, g.trans_a, true, g.m, p, g.k, g.alpha, g.a, g.lda, ws, cols, g.beta, g.c + r0, g.ldc));
    } else {
      const float* a_block = g.trans_a ? g.a + r0 * g.lda : g.a + r0;
      FEDLORA_RETURN_IF_ERROR(
          Sgemm(h, g.trans_a, false, g.m, g.n, p, g.alpha, a_block, g.lda, ws, cols, r0 == 0 ? g.beta : 1.0f, g.c, g.ldc));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace fedlora::kernels
