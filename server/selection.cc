#include "server/selection.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/sha256.h"

namespace fedlora {
namespace {

// splitmix64: a tiny, well-mixed PRNG step. Selection only needs a reproducible shuffle from a seed,
// not cryptographic strength.
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t DigestPrefix64(const std::string& text) {
  const Sha256DigestBytes d = Sha256Digest(text);
  uint64_t v = 0;
  std::memcpy(&v, d.data(), sizeof(v));
  return v;
}

std::vector<std::string> SampleClients(uint64_t seed, int64_t round,
                                       const std::set<std::string>& candidates, int64_t quota) {
  std::vector<std::string> pool(candidates.begin(), candidates.end());
  uint64_t state = seed ^ DigestPrefix64(absl::StrCat("selection\n", round));
  for (size_t i = pool.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(SplitMix64(state) % i);
    std::swap(pool[i - 1], pool[j]);
  }
  pool.resize(
      static_cast<size_t>(std::clamp<int64_t>(quota, 0, static_cast<int64_t>(pool.size()))));
  std::sort(pool.begin(), pool.end());
  return pool;
}

}  // namespace fedlora
