// CPU threads of everything the kernels run on: their default ThreadPool (kernels/base/context.h)
// and OpenBLAS's own threads, sized together; and OpenBLAS's choice of kernel set.
#pragma once

#include <string>

#include "kernels/base/context.h"

namespace fedlora::kernels {

// Sizes CPU parallelism in one place: the kernels' default ThreadPool (SetDefaultPoolThreads) and
// OpenBLAS's own threads (openblas_set_num_threads) both get `n` threads (n <= 0: the core count).
// Call it at start-up or between steps, never while kernels are running on another thread.
void SetNumThreads(int n);

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
