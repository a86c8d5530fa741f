// Fixed-point encoding of real-valued updates for secure aggregation: SecAgg+ sums integers mod 2^m,
// so each client encodes its floats in [-range, range] as round(v * 2^f) in two's complement mod 2^m,
// and the server decodes the sum of n of them back to reals.
//
//   FEDLORA_RETURN_IF_ERROR(crypto::CheckSecAggFixedPoint(n, range, f, m));   // refuse the config at start
//   FEDLORA_ASSIGN_OR_RETURN(auto x, crypto::EncodeSecAggFixedPoint(update, range, f, m, prg));
//   ...  // SecAgg+ round; the server gets sum = sum_i x_i mod 2^m
//   FEDLORA_ASSIGN_OR_RETURN(std::vector<double> total, crypto::DecodeSecAggFixedPointSum(sum, f, m));
//
// Each encoded value has magnitude at most B = ceil(range * 2^f) (either rounding), so a sum of n is
// exact and decodes without wrapping whenever n * B <= 2^(m-1) - 1, which CheckSecAggFixedPoint
// enforces. Stochastic rounding (up with probability equal to the fractional part, uniform draws
// from a crypto::Prg) is unbiased: E[decode(encode(v))] = v; round-to-nearest (halves away from
// zero) errs by at most 2^-(f+1) per value but is biased on data concentrated near grid midpoints.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crypto/prg.h"

namespace fedlora::crypto {

// InvalidArgument unless num_clients >= 1, range is finite and > 0, frac_bits <= 62, range * 2^f
// <= 2^62, 1 <= modulus_bits <= 64 and num_clients * ceil(range * 2^frac_bits) <= 2^(m-1) - 1.
absl::Status CheckSecAggFixedPoint(uint64_t num_clients, double range, uint32_t frac_bits,
                                   uint32_t modulus_bits);

// Encodes values in [-range, range] with stochastic rounding driven by `prg`. InvalidArgument for a
// value that is not finite or lies outside the range (clip before encoding), or parameters that fail
// CheckSecAggFixedPoint for one client.
absl::StatusOr<std::vector<uint64_t>> EncodeSecAggFixedPoint(std::span<const float> values,
                                                             double range, uint32_t frac_bits,
                                                             uint32_t modulus_bits, Prg& prg);
// As above, rounding to nearest (deterministic).
absl::StatusOr<std::vector<uint64_t>> EncodeSecAggFixedPointNearest(std::span<const float> values,
                                                                    double range,
                                                                    uint32_t frac_bits,
                                                                    uint32_t modulus_bits);

// Decodes a sum mod 2^m (each value < 2^m) as a two's complement integer times 2^-f.
absl::StatusOr<std::vector<double>> DecodeSecAggFixedPointSum(std::span<const uint64_t> sum,
                                                              uint32_t frac_bits,
                                                              uint32_t modulus_bits);

}  // namespace fedlora::crypto
