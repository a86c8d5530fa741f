// "Did you mean ...?" for names a person typed: config fields, enum values, flag choices.
//
//   NearestName("clients_per_rund", {"clients_per_round", "min_clients"})  // "clients_per_round"
//   NearestName("FEDAVGG", {"FEDAVG", "FEDPROX"})                            // "FEDAVG"
//   NearestName("xyz", {"FEDAVG", "FEDPROX"})                                // nullopt: nothing close
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fedlora {

// Edit distance between `a` and `b`, ASCII case ignored: insertions, deletions, substitutions and
// swaps of two adjacent characters each cost 1 (optimal string alignment distance).
size_t EditDistance(std::string_view a, std::string_view b);

// The candidate nearest to `typed`, when it is close enough to be a likely typo: at most 2 edits,
// and at most a third of `typed`'s length (at least 1). Ties go to the earlier candidate.
std::optional<std::string> NearestName(std::string_view typed,
                                       const std::vector<std::string>& candidates);

}  // namespace fedlora
