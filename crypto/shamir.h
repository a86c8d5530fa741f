// Shamir secret sharing of 32-byte secrets, t of n, over the prime field GF(p) with p = 2^256 + 297,
// the smallest prime above 2^256 (so every 32-byte string is a field element). Arithmetic is
// OpenSSL's BIGNUM; coefficients come from its private CSPRNG (BN_priv_rand_range).
//
//   FEDLORA_ASSIGN_OR_RETURN(auto shares, crypto::ShamirSplit(secret, /*threshold=*/4, /*num_shares=*/7));
//   ...  // any 4 of the 7 shares give the secret back; 3 reveal nothing about it
//   FEDLORA_ASSIGN_OR_RETURN(std::string secret, crypto::ShamirCombine(some_four, 4));
//
// The secret s is read as a big-endian integer and is the constant term of a random polynomial
// f(X) = s + a_1 X + ... + a_{t-1} X^{t-1}; share i is (x_i, f(x_i)) with y written as 33 big-endian
// bytes. Shamir shares are information-theoretically hiding below the threshold but not
// authenticated: a wrong share gives a wrong secret (caught only when the result is >= 2^256).
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora::crypto {

inline constexpr size_t kShamirSecretBytes = 32;
inline constexpr size_t kShamirShareBytes = 33;
// p = 2^256 + 297, big-endian hex.
inline constexpr char kShamirPrimeHex[] =
    "10000000000000000000000000000000000000000000000000000000000000129";

struct ShamirShare {
  uint32_t x = 0;  // the evaluation point, never 0
  std::string y;   // f(x) mod p, 33 bytes big-endian
};

// Splits `secret32` (32 bytes) into shares at x = 1..num_shares, any `threshold` of which recover
// it. InvalidArgument unless 1 <= threshold <= num_shares and the secret is 32 bytes.
absl::StatusOr<std::vector<ShamirShare>> ShamirSplit(std::string_view secret32, uint32_t threshold,
                                                     uint32_t num_shares);

// As ShamirSplit, at the given points (distinct, non-zero; threshold <= xs.size()).
absl::StatusOr<std::vector<ShamirShare>> ShamirSplitAt(std::string_view secret32,
                                                       uint32_t threshold,
                                                       std::span<const uint32_t> xs);

// For known-answer tests only: the shares of the polynomial secret + c[0] X + c[1] X^2 + ... at `xs`,
// each coefficient a big-endian integer below p (at most 33 bytes). Real sharing must use random
// coefficients (ShamirSplit).
absl::StatusOr<std::vector<ShamirShare>> ShamirSplitWithCoefficients(
    std::string_view secret32, std::span<const std::string> coefficients,
    std::span<const uint32_t> xs);

// Recovers the secret by Lagrange interpolation at 0 from the first `threshold` shares (the rest are
// ignored). InvalidArgument for threshold 0, fewer shares than `threshold`, a share with x = 0, a
// y that is not 33 bytes or not below p, repeated x; and "inconsistent shares" when the result is
// not below 2^256 (so not a secret that was shared). Fewer than `threshold` shares of a real sharing
// can never be told apart from random: they give some other value, not an error.
absl::StatusOr<std::string> ShamirCombine(std::span<const ShamirShare> shares, uint32_t threshold);

// A secret recovered from more shares than the threshold, and the points of the shares that are
// not on its polynomial (wrong shares, and so the parties that gave them).
struct ShamirDecoded {
  std::string secret;
  std::vector<uint32_t> wrong_x;
};

// Recovers the secret from n > `threshold` shares some of which may be wrong: the polynomial of
// degree threshold - 1 through at least max(threshold + 1, ceil((n + threshold) / 2)) of them,
// tried from at most `max_tries` runs of `threshold` consecutive shares. With at most
// floor((n - threshold) / 2) wrong shares (colluding or not) no other polynomial gathers that many,
// so what it returns is the dealt secret; it finds it when one run tried holds no wrong share. More
// wrong shares than that are beyond any decoder: chosen together they can pass for the sharing.
// FailedPrecondition with `threshold` shares or fewer (nothing to check against); InvalidArgument
// as ShamirCombine, or "inconsistent shares" when none is found.
absl::StatusOr<ShamirDecoded> ShamirCombineChecked(std::span<const ShamirShare> shares,
                                                   uint32_t threshold, int max_tries = 16);

// Checks one share's form (x != 0, y 33 bytes and below p) without combining.
absl::Status CheckShamirShare(const ShamirShare& share);

}  // namespace fedlora::crypto
