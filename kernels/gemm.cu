// Gemm, CUDA backend: cuBLAS with fp32 compute; bf16 math through cuBLASLt. Row-major
// C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T, i.e. cuBLAS gets (B, A)
// swapped and n, m swapped.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>

#include "kernels/base/cuda_util.cuh"
#include "kernels/gemm.h"
#include "kernels/weight.h"

namespace fedlora::kernels {
namespace internal {

// The calling thread's cuBLAS handle for the current device, bound to ctx.stream. Handles are
// created on first use and deliberately never destroyed (destroying them in a thread_local
// destructor can run after the CUDA runtime has shut down at exit).
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

// The calling thread's cuBLASLt handle for the current device (bf16 math), kept the same way.
// cuBLASLt takes the stream per call.
absl::StatusOr<cublasLtHandle_t> CublasLtHandle() {
  constexpr int kMaxDevices = 64;
  thread_local cublasLtHandle_t handles[kMaxDevices] = {};
  int dev = 0;
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return absl::OutOfRangeError("CUDA device index beyond 64");
  if (handles[dev] == nullptr) FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handles[dev]));
  return handles[dev];
}

namespace {

cublasOperation_t CuOp(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

__device__ __forceinline__ float ToF32(float x) { return x; }
__device__ __forceinline__ float ToF32(uint16_t bf16_bits) { return Bf16BitsToF32(bf16_bits); }
__device__ __forceinline__ void Put(float* p, float v) { *p = v; }
__device__ __forceinline__ void Put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Copies `entries` matrices of `rows` stored rows (row stride ld, entry stride `stride`) into packed
// [entries, rows, cols] of Out: bf16 -> fp32 exactly, fp32 -> bf16 rounded to nearest even.
template <typename In, typename Out>
__global__ void ConvertRowsKernel(const In* __restrict__ src, int64_t ld, int64_t stride,
                                  int64_t entries, int64_t rows, int64_t cols,
                                  Out* __restrict__ dst) {
  const int64_t per_entry = rows * cols, total = entries * per_entry;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i / per_entry, rem = i - e * per_entry, r = rem / cols, c = rem - r * cols;
    Put(dst + i, ToF32(src[e * stride + r * ld + c]));
  }
}

// Dequantizes `rows` packed rows of ggml blocks (32 elements each: Q8_0, Q4_0, Q4_1; row_bytes
// apart) into a packed [rows, cols] of Out (fp32, or bf16 rounded from the fp32 value): one thread
// per block, the arithmetic of ggml's reference (each multiply and add rounded on its own:
// __fmul_rn / __fadd_rn, no contraction).
__device__ __forceinline__ float HalfBits(const uint8_t* p) {
  const unsigned short bits = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}
template <typename Out>
__global__ void DequantBlocksKernel(const uint8_t* __restrict__ src, int64_t row_bytes,
                                    int64_t rows, int64_t cols, int type, Out* __restrict__ dst) {
  const int64_t blocks_per_row = cols / 32, total = rows * blocks_per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / blocks_per_row, b = i - r * blocks_per_row;
    Out* out = dst + r * cols + b * 32;
    if (type == static_cast<int>(GgmlType::kQ8_0)) {  // d, 32 x int8
      const uint8_t* blk = src + r * row_bytes + b * 34;
      const float d = HalfBits(blk);
      for (int j = 0; j < 32; ++j)
        Put(out + j, __fmul_rn(static_cast<float>(static_cast<int8_t>(blk[2 + j])), d));
    } else if (type == static_cast<int>(GgmlType::kQ4_0)) {  // d, 16 bytes of nibbles: (q - 8) * d
      const uint8_t* blk = src + r * row_bytes + b * 18;
      const float d = HalfBits(blk);
      for (int j = 0; j < 16; ++j) {
        Put(out + j, __fmul_rn(static_cast<float>((blk[2 + j] & 0x0f) - 8), d));
        Put(out + j + 16, __fmul_rn(static_cast<float>((blk[2 + j] >> 4) - 8), d));
      }
    } else {  // Q4_1: d, m, 16 bytes of nibbles: q * d + m
      const uint8_t* blk = src + r * row_bytes + b * 20;
      const float d = HalfBits(blk), m = HalfBits(blk + 2);
      for (int j = 0; j < 16; ++j) {
        Put(out + j, __fadd_rn(__fmul_rn(static_cast<float>(blk[4 + j] & 0x0f), d), m));
        Put(out + j + 16, __fadd_rn(__fmul_rn(static_cast<float>(blk[4 + j] >> 4), d), m));
      }
    }
  }
}

absl::Status Sgemm(cublasHandle_t h, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc) {
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      h, CuOp(tb), CuOp(ta), static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha,
      b, CUDA_R_32F, static_cast<int>(ldb), a, CUDA_R_32F, static_cast<int>(lda), &beta, c,
      CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

// Owns one cuBLASLt descriptor; destroyed on every return path.
template <typename T, cublasStatus_t (*Destroy)(T)>
struct LtOwned {
  T h = nullptr;
  LtOwned() = default;
  LtOwned(const LtOwned&) = delete;
  LtOwned& operator=(const LtOwned&) = delete;
  ~LtOwned() {
    if (h != nullptr) (void)Destroy(h);
  }
};
using LtDesc = LtOwned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = LtOwned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPref = LtOwned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// The alignment cuBLASLt may assume for pointers base + i * stride_bytes, i < count: the largest
// power of two (at most 256) dividing all of them. Its default (256) would admit kernels that
// fault on our sub-allocated or offset operands.
uint32_t Alignment(const void* base, size_t stride_bytes, int64_t count) {
  uint64_t v = reinterpret_cast<uintptr_t>(base) | 256u;
  if (count > 1) v |= stride_bytes;
  return static_cast<uint32_t>(v & (~v + 1));
}

// bf16 math: A (and B unless stored bf16) converted to packed bf16 in the workspace
// (CudaBf16MathWorkspace), then one cublasLtMatmul per batch entry with fp32 accumulation into
// fp32 C. Column-major view as for cuBLAS: Lt's A is our B, Lt's B our A, C^T is [n, m].
absl::Status GemmBf16MathCuda(const ExecContext& ctx, const GemmArgs& g) {
  FEDLORA_ASSIGN_OR_RETURN(cublasLtHandle_t lt, CublasLtHandle());
  const cudaStream_t stream = Stream(ctx);
  const CudaBf16MathLayout layout = CudaBf16MathWorkspace(g);
  char* ws =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(g.workspace) + 255) & ~uintptr_t{255});
  // op(A)'s stored matrix, packed.
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t a_entries = g.stride_a == 0 ? 1 : g.batch;
  const int64_t a_stride = g.stride_a == 0 ? 0 : a_rows * a_cols;
  auto* a16 = reinterpret_cast<__nv_bfloat16*>(ws + layout.a_offset);
  ConvertRowsKernel<<<GridFor(a_entries * a_rows * a_cols, 256), 256, 0, stream>>>(
      g.a, g.lda, g.stride_a, a_entries, a_rows, a_cols, a16);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  // B: used in place when stored bf16 (then batch == 1), else converted or dequantized, packed.
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  const __nv_bfloat16* b16 = reinterpret_cast<const __nv_bfloat16*>(g.b_bf16);
  int64_t ldb16 = g.ldb, b_stride = 0;
  if (g.b_bf16 == nullptr) {
    auto* dst = reinterpret_cast<__nv_bfloat16*>(ws + layout.b_offset);
    if (g.b_quant != nullptr) {
      const int64_t row_bytes = *GgmlRowBytes(g.b_quant_type, b_cols);  // checked by CanRun
      DequantBlocksKernel<__nv_bfloat16><<<GridFor(b_rows * b_cols / 32, 256), 256, 0, stream>>>(
          g.b_quant, row_bytes, b_rows, b_cols, static_cast<int>(g.b_quant_type), dst);
    } else {
      const int64_t b_entries = g.stride_b == 0 ? 1 : g.batch;
      ConvertRowsKernel<<<GridFor(b_entries * b_rows * b_cols, 256), 256, 0, stream>>>(
          g.b, g.ldb, g.stride_b, b_entries, b_rows, b_cols, dst);
      b_stride = g.stride_b == 0 ? 0 : b_rows * b_cols;
    }
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    b16 = dst;
    ldb16 = b_cols;
  }

  LtDesc desc;
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_b = CuOp(g.trans_b), op_a = CuOp(g.trans_a);
  FEDLORA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
  FEDLORA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)));
  LtLayout lay_b, lay_a,
      lay_c;  // stored matrices, column-major: [cols, rows] with the row stride as ld
  FEDLORA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&lay_b.h, CUDA_R_16BF, b_cols, b_rows, ldb16));
  FEDLORA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&lay_a.h, CUDA_R_16BF, a_cols, a_rows, a_cols));
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&lay_c.h, CUDA_R_32F, g.n, g.m, g.ldc));

  LtPref pref;
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref.h));
  const uint64_t lt_bytes = kGemmCublasLtWorkspaceBytes;
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_bytes, sizeof(lt_bytes)));
  const uint32_t align_b = Alignment(b16, b_stride * 2, g.batch),
                 align_a = Alignment(a16, a_stride * 2, g.batch),
                 align_c = Alignment(g.c, g.stride_c * sizeof(float), g.batch);
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b, sizeof(align_b)));
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a, sizeof(align_a)));
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
  // The heuristic costs more host time than the descriptors: its answer is kept per thread for
  // each handle (device), shape, leading dimensions and alignments.
  thread_local std::map<std::array<int64_t, 12>, cublasLtMatmulAlgo_t> algos;
  const std::array<int64_t, 12> key = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(lt)),
                                       g.trans_a,
                                       g.trans_b,
                                       g.m,
                                       g.n,
                                       g.k,
                                       ldb16,
                                       a_cols,
                                       g.ldc,
                                       align_a,
                                       align_b,
                                       align_c};
  auto cached = algos.find(key);
  if (cached == algos.end()) {
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(
        lt, desc.h, lay_b.h, lay_a.h, lay_c.h, lay_c.h, pref.h, 1, &heuristic, &found));
    if (found == 0) {
      return absl::InternalError(
          absl::StrCat("Gemm: cublasLtMatmulAlgoGetHeuristic found no bf16 algorithm for m=", g.m,
                       " n=", g.n, " k=", g.k));
    }
    if (algos.size() >= 4096) algos.clear();  // bounded: many distinct row counts come and go
    cached = algos.emplace(key, heuristic.algo).first;
  }
  // C and D are one matrix (in place, beta == 0 reads no C); one call per batch entry, so that a
  // C shared by the entries (stride_c == 0) accumulates in order as on the CPU.
  for (int64_t i = 0; i < g.batch; ++i) {
    float* c = g.c + i * g.stride_c;
    FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
        lt, desc.h, &g.alpha, b16 + i * b_stride, lay_b.h, a16 + i * a_stride, lay_a.h, &g.beta, c,
        lay_c.h, c, lay_c.h, &cached->second, ws, kGemmCublasLtWorkspaceBytes, stream));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GemmCuda(const ExecContext& ctx, const GemmArgs& g) {
  if (g.bf16_math && g.k > 0) return GemmBf16MathCuda(ctx, g);
  FEDLORA_ASSIGN_OR_RETURN(cublasHandle_t h, CublasHandle(ctx));
  if (g.b_bf16 == nullptr && g.b_quant == nullptr) {
    if (g.batch == 1)
      return Sgemm(h, g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta,
                   g.c, g.ldc);
    if (g.stride_c == 0) {
      // Entries sharing one C accumulate in order, as on the CPU: a strided batch would run them
      // concurrently on the same output.
      for (int64_t i = 0; i < g.batch; ++i) {
        FEDLORA_RETURN_IF_ERROR(Sgemm(h, g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha,
                                      g.a + i * g.stride_a, g.lda, g.b + i * g.stride_b, g.ldb,
                                      g.beta, g.c, g.ldc));
      }
      return absl::OkStatus();
    }
    FEDLORA_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        h, CuOp(g.trans_b), CuOp(g.trans_a), static_cast<int>(g.n), static_cast<int>(g.m),
        static_cast<int>(g.k), &g.alpha, g.b, CUDA_R_32F, static_cast<int>(g.ldb), g.stride_b, g.a,
        CUDA_R_32F, static_cast<int>(g.lda), g.stride_a, &g.beta, g.c, CUDA_R_32F,
        static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }
  if (g.k == 0) {
    // cuBLAS applies beta and reads no B.
    return Sgemm(h, g.trans_a, g.trans_b, g.m, g.n, 0, g.alpha, g.a, g.lda, nullptr, g.ldb, g.beta,
                 g.c, g.ldc);
  }
  // bf16 or quantized B: the same panel scheme as the CPU (gemm_cpu.cc), widening on the GPU.
  const int64_t rows = g.trans_b ? g.n : g.k, cols = g.trans_b ? g.k : g.n;
  const int64_t row_bytes =
      g.b_quant != nullptr ? *GgmlRowBytes(g.b_quant_type, cols) : 0;  // checked by CanRun
  const int64_t panel = std::clamp<int64_t>(
      static_cast<int64_t>(g.workspace_bytes / (cols * sizeof(float))), 1, rows);
  float* ws = static_cast<float*>(g.workspace);
  for (int64_t r0 = 0; r0 < rows; r0 += panel) {
    const int64_t p = std::min(panel, rows - r0);
    if (g.b_quant != nullptr) {
      DequantBlocksKernel<float><<<GridFor(p * cols / 32, 256), 256, 0, Stream(ctx)>>>(
          g.b_quant + r0 * row_bytes, row_bytes, p, cols, static_cast<int>(g.b_quant_type), ws);
    } else {
      ConvertRowsKernel<<<GridFor(p * cols, 256), 256, 0, Stream(ctx)>>>(
          g.b_bf16 + r0 * g.ldb, g.ldb, int64_t{0}, int64_t{1}, p, cols, ws);
    }
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    if (g.trans_b) {
      FEDLORA_RETURN_IF_ERROR(Sgemm(h, g.trans_a, true, g.m, p, g.k, g.alpha, g.a, g.lda, ws, cols,
                                    g.beta, g.c + r0, g.ldc));
    } else {
      const float* a_block = g.trans_a ? g.a + r0 * g.lda : g.a + r0;
      FEDLORA_RETURN_IF_ERROR(Sgemm(h, g.trans_a, false, g.m, g.n, p, g.alpha, a_block, g.lda, ws,
                                    cols, r0 == 0 ? g.beta : 1.0f, g.c, g.ldc));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace fedlora::kernels
