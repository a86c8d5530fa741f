#include "core/sha256_blocks.h"

// OpenSSL 3 marks the low-level SHA256_* functions deprecated in favour of EVP, but EVP keeps the
// chaining value opaque, and the one- and two-lane block functions here need it. SHA256_Update on
// a context with no buffered bytes runs OpenSSL's own CPU-dispatched block function directly.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fedlora::sha256_internal {
namespace {

#if defined(__x86_64__)

alignas(16) constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define FEDLORA_SHA_NI __attribute__((target("sha,sse4.1,ssse3")))

// The SHA-NI round instructions keep the state as two registers, ABEF and CDGH.
struct NiState {
  __m128i abef, cdgh;
};

FEDLORA_SHA_NI inline NiState LoadState(const uint32_t h[8]) {
  const __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));
  const __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4));
  const __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
  const __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  return {_mm_alignr_epi8(cdab, efgh, 8), _mm_blend_epi16(efgh, cdab, 0xF0)};
}

FEDLORA_SHA_NI inline void StoreState(const NiState& s, uint32_t h[8]) {
  const __m128i feba = _mm_shuffle_epi32(s.abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(s.cdgh, 0xB1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), _mm_alignr_epi8(dchg, feba, 8));
}

// Runs kLanes independent states over the same blocks. The message schedule depends only on the
// data, so the lanes share it; each quad-round is then kLanes independent chains of SHA256RNDS2,
// which hides that instruction's latency (one lane alone waits on it: the chain is serial).
template <int kLanes>
FEDLORA_SHA_NI void CompressNi(uint32_t* const states[kLanes], const uint8_t* p, size_t blocks) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  NiState s[kLanes];
#pragma GCC unroll 2
  for (int l = 0; l < kLanes; ++l) s[l] = LoadState(states[l]);
  for (; blocks > 0; --blocks, p += 64) {
    NiState saved[kLanes];
    for (int l = 0; l < kLanes; ++l) saved[l] = s[l];
    __m128i w[4];
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) {  // quad-round q: rounds 4q .. 4q+3, message words w[q % 4]
      if (q < 4)
        w[q] =
            _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * q)), bswap);
      const __m128i& cur = w[q % 4];
      const __m128i wk =
          _mm_add_epi32(cur, _mm_load_si128(reinterpret_cast<const __m128i*>(kK + 4 * q)));
      for (int l = 0; l < kLanes; ++l) s[l].cdgh = _mm_sha256rnds2_epu32(s[l].cdgh, s[l].abef, wk);
      if (q >= 3 && q <= 14) {  // finish the words of quad-round q + 1
        __m128i& next = w[(q + 1) % 4];
        next =
            _mm_sha256msg2_epu32(_mm_add_epi32(next, _mm_alignr_epi8(cur, w[(q + 3) % 4], 4)), cur);
      }
      const __m128i wk_hi = _mm_shuffle_epi32(wk, 0x0E);
      for (int l = 0; l < kLanes; ++l)
        s[l].abef = _mm_sha256rnds2_epu32(s[l].abef, s[l].cdgh, wk_hi);
      if (q >= 1 && q <= 12) {  // start the words of quad-round q + 3
        __m128i& prev = w[(q + 3) % 4];
        prev = _mm_sha256msg1_epu32(prev, cur);
      }
    }
    for (int l = 0; l < kLanes; ++l) {
      s[l].abef = _mm_add_epi32(s[l].abef, saved[l].abef);
      s[l].cdgh = _mm_add_epi32(s[l].cdgh, saved[l].cdgh);
    }
  }
  for (int l = 0; l < kLanes; ++l) StoreState(s[l], states[l]);
}

bool DetectShaNi() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1") &&
         __builtin_cpu_supports("ssse3");
}

#endif  // __x86_64__

std::atomic<Engine> g_engine_override{Engine::kAuto};

}  // namespace

bool CpuHasShaNi() {
#if defined(__x86_64__)
  static const bool has = DetectShaNi();
  return has;
#else
  return false;
#endif
}

void SetEngineForTesting(Engine engine) {
  g_engine_override.store(engine, std::memory_order_relaxed);
}

bool UseShaNi() {
  if (g_engine_override.load(std::memory_order_relaxed) == Engine::kOpenSsl) return false;
  return CpuHasShaNi();
}

void CompressOpenSsl(uint32_t state[8], const uint8_t* blocks, size_t n) {
  if (n == 0) return;
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  std::memcpy(ctx.h, state, sizeof(ctx.h));
  // With nothing buffered, a whole number of blocks goes straight through the block function.
  SHA256_Update(&ctx, blocks, n * 64);
  std::memcpy(state, ctx.h, sizeof(ctx.h));
}

void Compress(uint32_t state[8], const uint8_t* blocks, size_t n) {
#if defined(__x86_64__)
  if (UseShaNi()) {
    uint32_t* states[1] = {state};
    CompressNi<1>(states, blocks, n);
    return;
  }
#endif
  CompressOpenSsl(state, blocks, n);
}

void Compress2(uint32_t a[8], uint32_t b[8], const uint8_t* blocks, size_t n) {
#if defined(__x86_64__)
  if (UseShaNi()) {
    uint32_t* states[2] = {a, b};
    CompressNi<2>(states, blocks, n);
    return;
  }
#endif
  // No two-lane kernel here: two passes, a slice at a time so that the second reads from cache.
  constexpr size_t kSlice = 16 * 1024 / 64;  // blocks: 16 KiB, half of a typical L1
  for (size_t done = 0; done < n; done += kSlice) {
    const size_t m = std::min(kSlice, n - done);
    CompressOpenSsl(a, blocks + done * 64, m);
    CompressOpenSsl(b, blocks + done * 64, m);
  }
}

}  // namespace fedlora::sha256_internal
