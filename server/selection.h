// Client sampling for a round: which of the waiting candidates get its tasks. A pure function of
// (seed, round, candidates, quota), so that the choice is reproducible (a restarted server chooses
// the same way) and independent of the order in which clients polled.
//
//   std::vector<std::string> chosen = SampleClients(config.seed(), round, candidates, quota);
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace fedlora {

// A seeded Fisher-Yates shuffle of the (sorted) candidates, cut to `quota` (all of them when
// fewer) and sorted by id. Each candidate is equally likely to be chosen.
std::vector<std::string> SampleClients(uint64_t seed, int64_t round,
                                       const std::set<std::string>& candidates, int64_t quota);

// The first 8 bytes of SHA-256(text), little-endian: seeds derived from names.
uint64_t DigestPrefix64(const std::string& text);

}  // namespace fedlora
