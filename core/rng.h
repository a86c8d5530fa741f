// Deterministic, counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel Random
// Numbers: As Easy as 1, 2, 3", SC'11), the generator of cuRAND, PyTorch and JAX.
//
// A counter-based generator maps (key, counter) to random bits with no state in between, so any
// element of a stream can be computed directly. That is what makes dropout masks and noise
// identical whatever the thread split or backend:
//
//   Rng rng(/*seed=*/42, /*stream=*/client_id);     // sequential use, e.g. data shuffling
//   rng.Shuffle(indices);
//   double z = rng.Normal();
//
//   // In a kernel (CPU or CUDA): element i of the dropout mask for step s, layer l.
//   bool keep = UniformAt(seed, MakeStream(s, l), i) >= p;
//
// Layout: the key is the 64-bit seed; the 128-bit counter is (block index: words 0-1, stream:
// words 2-3). Word j of the stream (seed, stream) is word j % 4 of block j / 4, both for Rng and
// for U32At/UniformAt, so Rng(seed, stream) yields U32At(seed, stream, 0), U32At(..., 1), ...
// Use different streams for different purposes; the same (seed, stream) gives the same bits.
//
// Rng is not thread-safe (one per thread, or one stream per task); the free functions are pure.
// Integer outputs are bit-identical on every platform; Normal() goes through std::log/cos/sin,
// whose last bit may differ between C libraries.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/host_device.h"

namespace fedlora {

struct Philox4x32Block {
  uint32_t v[4];
};

namespace rng_internal {
// Multipliers and Weyl key increments from the Random123 reference.
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1
inline constexpr int kPhiloxRounds = 10;
}  // namespace rng_internal

// The raw bijection: counter (4 words) and key (2 words) to 4 random words, 10 rounds.
FEDLORA_HOST_DEVICE inline Philox4x32Block Philox4x32(Philox4x32Block ctr, uint32_t key0,
                                                      uint32_t key1) {
  using namespace rng_internal;
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {  // the key schedule bumps before every round but the first
      key0 += kPhiloxW0;
      key1 += kPhiloxW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * ctr.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * ctr.v[2];
    ctr = Philox4x32Block{
        {static_cast<uint32_t>(p1 >> 32) ^ ctr.v[1] ^ key0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ ctr.v[3] ^ key1, static_cast<uint32_t>(p0)}};
  }
  return ctr;
}

// Keyed by a 64-bit seed (low word = key word 0) with a 128-bit counter (lo, hi).
FEDLORA_HOST_DEVICE inline Philox4x32Block Philox4x32(uint64_t seed, uint64_t counter_lo,
                                                      uint64_t counter_hi) {
  return Philox4x32(
      Philox4x32Block{{static_cast<uint32_t>(counter_lo), static_cast<uint32_t>(counter_lo >> 32),
                       static_cast<uint32_t>(counter_hi), static_cast<uint32_t>(counter_hi >> 32)}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Word `index` of stream (seed, stream).
FEDLORA_HOST_DEVICE inline uint32_t U32At(uint64_t seed, uint64_t stream, uint64_t index) {
  return Philox4x32(seed, index / 4, stream).v[index % 4];
}

// Maps 32 random bits to [0, 1) on the 2^-24 grid (24 bits: every value is exact in float).
FEDLORA_HOST_DEVICE inline float U32ToUniformFloat(uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1p-24f;
}

// Uniform in [0, 1) for element `index` of stream (seed, stream): a pure function, so a kernel
// gets the same value for element i however the work is split across threads or devices.
FEDLORA_HOST_DEVICE inline float UniformAt(uint64_t seed, uint64_t stream, uint64_t index) {
  return U32ToUniformFloat(U32At(seed, stream, index));
}

// Packs two 32-bit identifiers (e.g. step and layer) into one stream id.
FEDLORA_HOST_DEVICE inline uint64_t MakeStream(uint32_t hi, uint32_t lo) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0) : seed_(seed), stream_(stream) {}

  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }

  uint32_t NextU32() {
    if (pos_ == 4) {
      block_ = Philox4x32(seed_, block_index_++, stream_);
      pos_ = 0;
    }
    return block_.v[pos_++];
  }

  // Two consecutive words, the first in the low half.
  uint64_t NextU64() {
    const uint64_t lo = NextU32();
    return lo | (static_cast<uint64_t>(NextU32()) << 32);
  }

  // Uniform in [0, 1) with 53 random bits (every double in the 2^-53 grid equally likely).
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1p-53; }
  // Uniform in [0, 1) with 24 random bits, consuming one word (same mapping as UniformAt).
  float UniformFloat() { return U32ToUniformFloat(NextU32()); }

  // Standard normal by Box-Muller; the second value of each pair is cached.
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform();  // (0, 1]: log(u1) is finite
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * 3.14159265358979323846 * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }
  double Normal(double mean, double stddev) { return mean + stddev * Normal(); }

  // Uniform integer in [0, n) without modulo bias (Lemire, "Fast Random Integer Generation in an
  // Interval", 2019): the high half of a 64x64-bit product, rejecting the few low halves that
  // would over-represent some outputs. n must be > 0 (returns 0 for n == 0).
  uint64_t UniformInt(uint64_t n) {
    if (n == 0) return 0;
    unsigned __int128 m = static_cast<unsigned __int128>(NextU64()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
      while (low < threshold) {
        m = static_cast<unsigned __int128>(NextU64()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Fisher-Yates: every permutation equally likely.
  template <class T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      using std::swap;
      swap(v[i - 1], v[static_cast<size_t>(UniformInt(i))]);
    }
  }

 private:
  uint64_t seed_;
  uint64_t stream_;
  uint64_t block_index_ = 0;
  Philox4x32Block block_{};
  int pos_ = 4;  // 4 = block exhausted
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace fedlora
