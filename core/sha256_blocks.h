// SHA-256's block function (FIPS 180-4 compression) on a caller-held chaining value, one lane or
// two. The two-lane form advances two independent states over the same blocks in one pass; the
// upload path uses it to hash a chunk on its own and as part of its whole blob at once.
//
// Engines: the SHA-NI instructions where the CPU has them (x86-64; the two lanes interleave, so
// two states cost little more than one), otherwise OpenSSL's own block function, which picks the
// best code for the CPU it runs on (AVX2, the ARMv8 crypto extensions, ...), run twice for two
// lanes. Internal to core/sha256; tests force the OpenSSL engine to check one against the other.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fedlora::sha256_internal {

// SHA-256's initial chaining value (FIPS 180-4, 5.3.3).
inline constexpr uint32_t kInitialState[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

// Whether this CPU has the SHA-NI instructions (and the SSE levels the kernel needs).
bool CpuHasShaNi();

// Runs `n` 64-byte blocks through `state`.
void Compress(uint32_t state[8], const uint8_t* blocks, size_t n);
// Runs the same `n` blocks through both `a` and `b` (two distinct states).
void Compress2(uint32_t a[8], uint32_t b[8], const uint8_t* blocks, size_t n);
// OpenSSL's block function alone, whatever the CPU: the reference for the SHA-NI kernels.
void CompressOpenSsl(uint32_t state[8], const uint8_t* blocks, size_t n);

enum class Engine { kAuto, kOpenSsl };
// kOpenSsl makes Compress and Compress2 use OpenSSL even where SHA-NI is there. For tests and
// benchmarks; a hash in progress on another thread may see the switch between two blocks, which
// is harmless (both engines compute the same function).
void SetEngineForTesting(Engine engine);
// Whether Compress and Compress2 run the SHA-NI kernels now.
bool UseShaNi();

}  // namespace fedlora::sha256_internal
