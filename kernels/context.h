// Execution context shared by every kernel: which backend runs it, on which CUDA stream, and which
// CPU thread pool the CPU path may use.
//
//   kernels::ExecContext cpu;                                   // CPU, ThreadPool default pool
//   kernels::ExecContext gpu{Device::kCuda, stream};            // CUDA on `stream` (cudaStream_t)
//   FEDLORA_RETURN_IF_ERROR(kernels::LayerNormForward(gpu, args));
//
// Conventions for every kernel in kernels/ (read once, they are not repeated in each header):
// - Entry points take `(const ExecContext&, const XArgs&)` and return absl::Status. `CanRun(ctx,
//   args)` answers the same validation without running: InvalidArgument for bad shapes or missing
//   buffers, FailedPrecondition when the backend is not available (CUDA requested but not built or
//   no device), Unimplemented for a combination no backend supports.
// - All pointers in an args struct live on ctx.device (host memory for kCpu, device memory for
//   kCuda), including scalar outputs such as a loss, unless the field says host (SumSquaresMany's
//   tables of tensors). Tensors are dense, row-major, fp32 unless the field says otherwise; bf16
//   tensors are raw bit patterns (uint16_t), as in core/tensor.h.
// - Scratch memory comes from the caller as (workspace, workspace_bytes), sized by the op's
//   *WorkspaceBytes(args) function; saved activations (mean/rstd, probabilities) are explicit
//   outputs of the forward and inputs of the backward. The exceptions take a few bytes per row or
//   tensor from the stream's memory pool (cudaMallocAsync) on CUDA: FixedPointAccumulate,
//   SoftmaxCrossEntropy and SumSquaresMany.
// - CUDA work is enqueued on ctx.stream and is asynchronous; the CPU path is synchronous and
//   multi-threaded on ctx pool. Outputs must not alias inputs unless the header says so.
// - CPU results do not depend on the pool's width (ThreadPool::Width): a sum across ParallelFor
//   chunks (norm parameter gradients, SumSquares, ColumnSum, the cross-entropy loss) is split by
//   the problem size alone and combined in a fixed order (tests/kernels/thread_invariance_test.cc).
//   OpenBLAS's own threads (SetNumThreads) are the exception: see kernels/gemm.h.
// - Gradient outputs have an `accumulate` flag: false overwrites, true adds (gradient accumulation
//   across micro-batches, or dx of a tensor that feeds several layers such as Q/K/V).
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"  // fedlora::Device
#include "core/thread_pool.h"

namespace fedlora::kernels {

struct ExecContext {
  Device device = Device::kCpu;
  // cudaStream_t for kCuda (null is the legacy default stream); ignored on the CPU.
  void* stream = nullptr;
  // Pool for CPU kernels; null means DefaultPool().
  ThreadPool* pool = nullptr;

  ThreadPool& Pool() const;
};

// The pool CPU kernels use when ExecContext::pool is null: the one made by the last
// SetNumThreads(), else ThreadPool::Default() (FEDLORA_NUM_THREADS or the core count).
ThreadPool& DefaultPool();

// Sizes CPU parallelism in one place: the kernels' default ThreadPool and OpenBLAS's own threads
// (openblas_set_num_threads) both get `n` threads (n <= 0: the core count). Call it at start-up
// or between steps, never while kernels are running on another thread. Earlier default pools are
// kept alive (idle) so that a pointer taken to one stays valid.
void SetNumThreads(int n);
// The thread count last set (or that of ThreadPool::Default()).
int NumThreads();

// OpenBLAS picks its kernels by CPU model when it loads; Debian 12's (0.3.21) does not know the
// Xeons after Sapphire Rapids and runs its Prescott (SSE3) kernels on them, far slower than its
// AVX-512 ones (measured on 2 cores at the FFN shape: 34 against 281 GFLOP/s, see
// docs/benchmarks.md). It reads OPENBLAS_CORETYPE only when it loads, so a program calls this
// first thing in main: on such a fallback kernel, on a CPU with AVX-512 (or AVX2 and FMA), with
// OPENBLAS_CORETYPE unset, it sets OPENBLAS_CORETYPE to SkylakeX (Haswell) and re-executes
// /proc/self/exe with the same arguments. Returns (and the program goes on as it is) when nothing
// needs changing or the exec fails.
void RestartForFasterOpenBlas(char** argv);
// The kernel set OpenBLAS chose ("SkylakeX", "Prescott", ...).
std::string OpenBlasCoreName();

}  // namespace fedlora::kernels
