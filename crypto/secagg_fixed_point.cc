#include "crypto/secagg_fixed_point.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace fedlora::crypto {
namespace {

uint64_t Mask(uint32_t m) { return m >= 64 ? ~uint64_t{0} : (uint64_t{1} << m) - 1; }

// Encodes every value with `round` (a double -> integral double with |result| <= ceil(|x|)).
template <typename Round>
absl::StatusOr<std::vector<uint64_t>> Encode(std::span<const float> values, double range,
                                             uint32_t frac_bits, uint32_t modulus_bits,
                                             Round round) {
  FEDLORA_RETURN_IF_ERROR(CheckSecAggFixedPoint(1, range, frac_bits, modulus_bits));
  const uint64_t mask = Mask(modulus_bits);
  std::vector<uint64_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    if (!std::isfinite(v) || std::fabs(v) > range) {
      return absl::InvalidArgumentError(
          absl::StrCat("value ", i, " (", v, ") is outside [-", range, ", ", range, "]"));
    }
    FEDLORA_ASSIGN_OR_RETURN(const double r, round(std::ldexp(v, static_cast<int>(frac_bits)), i));
    out[i] = static_cast<uint64_t>(static_cast<int64_t>(r)) & mask;
  }
  return out;
}

}  // namespace

absl::Status CheckSecAggFixedPoint(uint64_t num_clients, double range, uint32_t frac_bits,
                                   uint32_t modulus_bits) {
  if (num_clients < 1)
    return absl::InvalidArgumentError("fixed point: num_clients must be at least 1");
  if (!std::isfinite(range) || range <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: range must be finite and > 0, got ", range));
  }
  if (modulus_bits < 1 || modulus_bits > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: modulus_bits must be 1..64, got ", modulus_bits));
  }
  if (frac_bits > 62) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: frac_bits must be <= 62, got ", frac_bits));
  }
  const double scaled = std::ceil(std::ldexp(range, static_cast<int>(frac_bits)));
  if (scaled > 0x1p62) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: range * 2^", frac_bits, " is above 2^62"));
  }
  const unsigned __int128 bound = static_cast<unsigned __int128>(static_cast<uint64_t>(scaled));
  const unsigned __int128 limit = (static_cast<unsigned __int128>(1) << (modulus_bits - 1)) - 1;
  if (bound * num_clients > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: a sum of ", num_clients, " values of magnitude up to ",
                     static_cast<uint64_t>(scaled), " (range ", range, " x 2^", frac_bits,
                     ") could overflow the signed range of 2^", modulus_bits,
                     "; lower frac_bits or range, or raise modulus_bits"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> EncodeSecAggFixedPoint(std::span<const float> values,
                                                             double range, uint32_t frac_bits,
                                                             uint32_t modulus_bits, Prg& prg) {
  return Encode(values, range, frac_bits, modulus_bits,
                [&prg](double s, size_t) -> absl::StatusOr<double> {
                  const double fl = std::floor(s);
                  const double frac = s - fl;
                  if (frac == 0) return fl;
                  FEDLORA_ASSIGN_OR_RETURN(const double u, prg.NextUniform());
                  return u < frac ? fl + 1 : fl;
                });
}

absl::StatusOr<std::vector<uint64_t>> EncodeSecAggFixedPointNearest(std::span<const float> values,
                                                                    double range,
                                                                    uint32_t frac_bits,
                                                                    uint32_t modulus_bits) {
  return Encode(values, range, frac_bits, modulus_bits,
                [](double s, size_t) -> absl::StatusOr<double> { return std::round(s); });
}

absl::StatusOr<std::vector<double>> DecodeSecAggFixedPointSum(std::span<const uint64_t> sum,
                                                              uint32_t frac_bits,
                                                              uint32_t modulus_bits) {
  if (modulus_bits < 1 || modulus_bits > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: modulus_bits must be 1..64, got ", modulus_bits));
  }
  if (frac_bits > 62) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: frac_bits must be <= 62, got ", frac_bits));
  }
  const uint64_t mask = Mask(modulus_bits);
  const uint64_t half = uint64_t{1} << (modulus_bits - 1);
  std::vector<double> out(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) {
    const uint64_t v = sum[i];
    if ((v & ~mask) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fixed point: sum value ", i, " is not below 2^", modulus_bits));
    }
    // Two's complement mod 2^m: values >= 2^(m-1) are negative. Sign-extend to 64 bits.
    const uint64_t extended = v >= half ? (v | ~mask) : v;
    out[i] = std::ldexp(static_cast<double>(static_cast<int64_t>(extended)),
                        -static_cast<int>(frac_bits));
  }
  return out;
}

}  // namespace fedlora::crypto
