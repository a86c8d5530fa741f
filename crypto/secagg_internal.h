// Internal to fedlora::crypto's SecAgg+ (secagg_*.cc): helpers the client and the server share.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/repeated_field.h"

namespace fedlora::crypto::secagg_internal {

// Appends v as 4 / 8 bytes little-endian.
void AppendU32(std::string& out, uint32_t v);
void AppendU64(std::string& out, uint64_t v);
uint32_t ReadU32(std::string_view bytes);

// 2^m - 1 (all ones for m = 64).
inline uint64_t ModulusMask(uint32_t modulus_bits) {
  return modulus_bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << modulus_bits) - 1;
}

// Copies a list of client indices, checking that it is strictly ascending and every entry < n.
absl::Status ReadIndexList(const google::protobuf::RepeatedField<uint32_t>& list,
                           uint32_t num_clients, std::string_view what, std::vector<uint32_t>* out);

// sum[i] += element i of a packed vector (see PackSecAggVector), mod 2^64. Checks the whole vector
// (size, no value >= 2^m) before adding anything; InvalidArgument leaves `sum` unchanged.
absl::Status AddPackedVector(std::string_view bytes, uint32_t modulus_bits,
                             std::span<uint64_t> sum);

// Overwrites a secret's bytes before it is released.
void Wipe(std::string& secret);

}  // namespace fedlora::crypto::secagg_internal
