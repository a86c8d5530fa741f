// Exact fixed-point accumulation of weighted fp32 values: the arithmetic of federated averaging
// (aggregation/fedavg.h says why it is fixed point and proves its range and error bounds).
//
//   term(x, w) = round_half_even(w * x * 2^kFracBits) as a two's-complement 128-bit integer
//   FixedPointAccumulate:  sums[j] += sign * term(x[i], weight)   for every i whose term is in range,
//                          where j = index[i] with an index array (a sparse update's kept entries), else i
//
// Integer addition modulo 2^128 is associative, so both backends produce the same bits in any
// order: the CUDA result is bit-identical to the CPU's, not merely close. A value whose term is out
// of range (NaN, Inf, |w * x| >= 2^(kMaxTermLog2 - kFracBits)) adds nothing and is reported:
// `first_bad` (a host pointer on both backends) receives the smallest such i, or -1. Calling
// again with sign -1 subtracts exactly what the first call added, which is how a refused update is
// rolled back.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/host_device.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

using u128 = unsigned __int128;

inline constexpr int kFixedFracBits = 64;      // fraction bits of each term
inline constexpr int kFixedMaxTermLog2 = 107;  // |term| < 2^107, i.e. |w * x| < 2^43

// term(x, w) for 1 <= w <= 2^32; false when x is NaN/Inf or the term is out of range.
// x = mant * 2^exp exactly (mant < 2^24), so w * x = (w * mant) * 2^exp with w * mant < 2^56 an
// exact uint64: the only rounding is the final shift, and it depends on this term alone.
FEDLORA_HOST_DEVICE inline bool FixedPointTerm(uint32_t bits, uint64_t w, u128* out) {
  const bool negative = (bits >> 31) != 0;
  const uint32_t exp_field = (bits >> 23) & 0xFF;
  const uint32_t frac = bits & 0x7FFFFF;
  if (exp_field == 0 && frac == 0) {  // +-0
    *out = 0;
    return true;
  }
  const uint64_t mant = exp_field == 0 ? frac : (frac | 0x800000u);
  const int exp = exp_field == 0 ? -149 : static_cast<int>(exp_field) - 150;
  const uint64_t p = w * mant;  // < 2^32 * 2^24 = 2^56
  const int shift = exp + kFixedFracBits;
  u128 q;
  if (shift >= 0) {
    // NaN/Inf (exponent field 255) land here with shift >= 169 and fail the range check.
#if defined(__CUDA_ARCH__)
    const int width = 64 - __clzll(static_cast<long long>(p));  // p > 0
#else
    const int width = 64 - __builtin_clzll(p);
#endif
    if (width + shift > kFixedMaxTermLog2) return false;
    q = static_cast<u128>(p) << shift;
  } else {
    const int r = -shift;
    if (r > 56) {
      q = 0;  // p < 2^56 <= 2^(r-1): below half of one unit, rounds to 0 (ties included, 0 is even)
    } else {
      uint64_t whole = p >> r;
      const uint64_t rem = p & ((uint64_t{1} << r) - 1);
      const uint64_t half = uint64_t{1} << (r - 1);
      if (rem > half || (rem == half && (whole & 1) != 0)) ++whole;
      q = whole;
    }
  }
  *out = negative ? static_cast<u128>(-q) : q;
  return true;
}

struct FixedPointAccumulateArgs {
  int64_t n = 0;
  const float* x = nullptr;  // [n]
  uint64_t weight = 1;       // in [1, 2^32]
  int sign = 1;              // +1 adds, -1 subtracts
  u128* sums = nullptr;      // [n], or as many as the indices reach; wrapping
  // Optional [n], in the backend's memory: where each value goes. The indices must be distinct (no two
  // threads add to one sum) and within `sums`; the caller checks (StreamingFedAvg::Add does).
  const int64_t* index = nullptr;
  int64_t* first_bad = nullptr;  // host: the smallest i whose term is out of range, or -1
};

absl::Status CanRun(const ExecContext& ctx, const FixedPointAccumulateArgs& args);
absl::Status FixedPointAccumulate(const ExecContext& ctx, const FixedPointAccumulateArgs& args);

namespace internal {
absl::Status FixedPointAccumulateCuda(const ExecContext& ctx, const FixedPointAccumulateArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
