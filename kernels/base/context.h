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
//   OpenBLAS's own threads (kernels/threads.h) are the exception: see kernels/gemm.h.
// - Gradient outputs have an `accumulate` flag: false overwrites, true adds (gradient accumulation
//   across micro-batches, or dx of a tensor that feeds several layers such as Q/K/V).
#pragma once

#include <cstdint>

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
// SetDefaultPoolThreads() (or kernels::SetNumThreads, kernels/threads.h), else ThreadPool::Default()
// (FEDLORA_NUM_THREADS or the core count).
ThreadPool& DefaultPool();

// Makes the default pool `n` threads wide (n <= 0: the core count). Call it at start-up or between
// steps, never while kernels are running on another thread. Earlier default pools are kept alive
// (idle) so that a pointer taken to one stays valid. A program that also multiplies with OpenBLAS
// calls kernels::SetNumThreads (kernels/threads.h), which sizes both.
void SetDefaultPoolThreads(int n);
// The default pool's thread count.
int NumThreads();

}  // namespace fedlora::kernels
