// FEDLORA_HOST_DEVICE marks a function that both the host compiler and nvcc's device side compile
// (core/rng.h's counter-based generator, kernels/base/fixed_point.h's fixed-point term).
#pragma once

#if defined(__CUDACC__)
#define FEDLORA_HOST_DEVICE __host__ __device__
#else
#define FEDLORA_HOST_DEVICE
#endif
