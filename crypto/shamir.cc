#include "crypto/shamir.h"

#include <openssl/bn.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "crypto/openssl_errors.h"

namespace fedlora::crypto {
namespace {

struct BnClearFree {
  void operator()(BIGNUM* b) const { BN_clear_free(b); }
};
struct BnCtxFree {
  void operator()(BN_CTX* c) const { BN_CTX_free(c); }
};
using Bn = std::unique_ptr<BIGNUM, BnClearFree>;
using BnCtx = std::unique_ptr<BN_CTX, BnCtxFree>;

absl::Status OpenSslFailure(const char* what) {
  return absl::InternalError(absl::StrCat(what, " failed: ", DrainOpenSslErrors()));
}

// Secret-holding numbers live in the secure heap when one is configured.
absl::StatusOr<Bn> NewBn() {
  Bn b(BN_secure_new());
  if (b == nullptr) return OpenSslFailure("BN_secure_new");
  return b;
}

absl::StatusOr<Bn> FromBytes(std::string_view bytes) {
  Bn b(BN_bin2bn(reinterpret_cast<const unsigned char*>(bytes.data()),
                 static_cast<int>(bytes.size()), BN_secure_new()));
  if (b == nullptr) return OpenSslFailure("BN_bin2bn");
  return b;
}

absl::StatusOr<Bn> FromWord(uint32_t w) {
  FEDLORA_ASSIGN_OR_RETURN(Bn b, NewBn());
  if (BN_set_word(b.get(), w) != 1) return OpenSslFailure("BN_set_word");
  return b;
}

// p, parsed once per call (cheap next to the arithmetic).
absl::StatusOr<Bn> Prime() {
  BIGNUM* p = nullptr;
  if (BN_hex2bn(&p, kShamirPrimeHex) == 0) return OpenSslFailure("BN_hex2bn");
  return Bn(p);
}

absl::StatusOr<std::string> ToBytes(const BIGNUM* b, size_t n) {
  std::string out(n, '\0');
  if (BN_bn2binpad(b, reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) !=
      static_cast<int>(n)) {
    return absl::InvalidArgumentError(absl::StrCat("value does not fit in ", n, " bytes"));
  }
  return out;
}

absl::Status CheckPoints(std::span<const uint32_t> xs, uint32_t threshold) {
  if (threshold == 0) return absl::InvalidArgumentError("Shamir threshold must be at least 1");
  if (xs.size() < threshold) {
    return absl::InvalidArgumentError(
        absl::StrCat("Shamir threshold ", threshold, " is above the number of shares ", xs.size()));
  }
  std::unordered_set<uint32_t> seen;
  for (uint32_t x : xs) {
    if (x == 0)
      return absl::InvalidArgumentError("Shamir share point x = 0 would reveal the secret");
    if (!seen.insert(x).second)
      return absl::InvalidArgumentError(absl::StrCat("repeated Shamir share point x = ", x));
  }
  return absl::OkStatus();
}

// Evaluates sum coeffs[i] x^i mod p at every x (Horner), with coeffs[0] the secret.
absl::StatusOr<std::vector<ShamirShare>> Evaluate(const std::vector<Bn>& coeffs, const BIGNUM* p,
                                                  std::span<const uint32_t> xs, BN_CTX* ctx) {
  std::vector<ShamirShare> shares;
  shares.reserve(xs.size());
  absl::StatusOr<Bn> acc = NewBn();
  if (!acc.ok()) return acc.status();
  for (uint32_t x : xs) {
    absl::StatusOr<Bn> bx = FromWord(x);
    if (!bx.ok()) return bx.status();
    if (BN_copy(acc->get(), coeffs.back().get()) == nullptr) return OpenSslFailure("BN_copy");
    for (size_t i = coeffs.size() - 1; i-- > 0;) {
      if (BN_mod_mul(acc->get(), acc->get(), bx->get(), p, ctx) != 1 ||
          BN_mod_add(acc->get(), acc->get(), coeffs[i].get(), p, ctx) != 1) {
        return OpenSslFailure("BN_mod_mul/BN_mod_add");
      }
    }
    absl::StatusOr<std::string> y = ToBytes(acc->get(), kShamirShareBytes);
    if (!y.ok()) return y.status();
    shares.push_back(ShamirShare{x, *std::move(y)});
  }
  return shares;
}

absl::Status CheckSecret(std::string_view secret32) {
  if (secret32.size() != kShamirSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("Shamir secret must be ", kShamirSecretBytes,
                                                   " bytes, got ", secret32.size()));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Shares of the polynomial secret + a_1 x + ... + a_{threshold-1} x^{threshold-1} at `xs`, with
// `coefficient(i, p, out)` setting a_i.
absl::StatusOr<std::vector<ShamirShare>> SplitWith(
    std::string_view secret32, uint32_t threshold, std::span<const uint32_t> xs,
    const std::function<absl::Status(uint32_t i, const BIGNUM* p, BIGNUM* out)>& coefficient) {
  if (absl::Status s = CheckSecret(secret32); !s.ok()) return s;
  if (absl::Status s = CheckPoints(xs, threshold); !s.ok()) return s;
  BnCtx ctx(BN_CTX_secure_new());
  if (ctx == nullptr) return OpenSslFailure("BN_CTX_secure_new");
  absl::StatusOr<Bn> p = Prime();
  if (!p.ok()) return p.status();
  std::vector<Bn> coeffs;
  absl::StatusOr<Bn> s = FromBytes(secret32);
  if (!s.ok()) return s.status();
  coeffs.push_back(*std::move(s));
  for (uint32_t i = 1; i < threshold; ++i) {
    absl::StatusOr<Bn> a = NewBn();
    if (!a.ok()) return a.status();
    if (absl::Status set = coefficient(i, p->get(), a->get()); !set.ok()) return set;
    coeffs.push_back(*std::move(a));
  }
  return Evaluate(coeffs, p->get(), xs, ctx.get());
}

}  // namespace

absl::StatusOr<std::vector<ShamirShare>> ShamirSplitAt(std::string_view secret32,
                                                       uint32_t threshold,
                                                       std::span<const uint32_t> xs) {
  return SplitWith(secret32, threshold, xs,
                   [](uint32_t, const BIGNUM* p, BIGNUM* out) -> absl::Status {
                     if (BN_priv_rand_range(out, p) != 1)
                       return OpenSslFailure("BN_priv_rand_range");
                     return absl::OkStatus();
                   });
}

absl::StatusOr<std::vector<ShamirShare>> ShamirSplit(std::string_view secret32, uint32_t threshold,
                                                     uint32_t num_shares) {
  std::vector<uint32_t> xs(num_shares);
  for (uint32_t i = 0; i < num_shares; ++i) xs[i] = i + 1;
  return ShamirSplitAt(secret32, threshold, xs);
}

absl::StatusOr<std::vector<ShamirShare>> ShamirSplitWithCoefficients(
    std::string_view secret32, std::span<const std::string> coefficients,
    std::span<const uint32_t> xs) {
  for (const std::string& c : coefficients) {
    if (c.size() > kShamirShareBytes)
      return absl::InvalidArgumentError("Shamir coefficient longer than 33 bytes");
  }
  const uint32_t threshold = static_cast<uint32_t>(coefficients.size()) + 1;
  return SplitWith(secret32, threshold, xs,
                   [&](uint32_t i, const BIGNUM* p, BIGNUM* out) -> absl::Status {
                     const std::string& c = coefficients[i - 1];
                     if (BN_bin2bn(reinterpret_cast<const unsigned char*>(c.data()),
                                   static_cast<int>(c.size()), out) == nullptr) {
                       return OpenSslFailure("BN_bin2bn");
                     }
                     if (BN_cmp(out, p) >= 0)
                       return absl::InvalidArgumentError("Shamir coefficient is not below p");
                     return absl::OkStatus();
                   });
}

absl::Status CheckShamirShare(const ShamirShare& share) {
  if (share.x == 0) return absl::InvalidArgumentError("Shamir share has x = 0");
  if (share.y.size() != kShamirShareBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("Shamir share y must be ", kShamirShareBytes, " bytes, got ", share.y.size()));
  }
  // y < p = 2^256 + 297 = 0x01 || 00 (29 bytes) || 01 29, compared big-endian byte by byte.
  static constexpr unsigned char kP[kShamirShareBytes] = {0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0,    0,
                                                          0,    0, 0, 0, 0, 0, 0, 0, 0, 0,    0,
                                                          0,    0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x29};
  for (size_t i = 0; i < kShamirShareBytes; ++i) {
    const auto b = static_cast<unsigned char>(share.y[i]);
    if (b < kP[i]) return absl::OkStatus();
    if (b > kP[i]) break;
  }
  return absl::InvalidArgumentError("Shamir share y is not below p");
}

namespace {

// The value at `at` of the polynomial through `used` (checked shares at distinct points):
// sum_i y_i * prod_{j != i} (at - x_j) / (x_i - x_j)  (mod p).
absl::StatusOr<Bn> InterpolateAt(std::span<const ShamirShare> used, uint32_t at, const BIGNUM* p,
                                 BN_CTX* ctx) {
  absl::StatusOr<Bn> sum = NewBn(), num = NewBn(), den = NewBn(), diff = NewBn(), term = NewBn(),
                     bat = FromWord(at);
  for (const auto* r : {&sum, &num, &den, &diff, &term, &bat}) {
    if (!r->ok()) return r->status();
  }
  std::vector<Bn> bx;
  for (const ShamirShare& sh : used) {
    FEDLORA_ASSIGN_OR_RETURN(Bn b, FromWord(sh.x));
    bx.push_back(std::move(b));
  }
  BN_zero(sum->get());
  for (size_t i = 0; i < used.size(); ++i) {
    if (BN_one(num->get()) != 1 || BN_one(den->get()) != 1) return OpenSslFailure("BN_one");
    for (size_t j = 0; j < used.size(); ++j) {
      if (j == i) continue;
      if (BN_mod_sub(diff->get(), bat->get(), bx[j].get(), p, ctx) != 1 ||
          BN_mod_mul(num->get(), num->get(), diff->get(), p, ctx) != 1 ||
          BN_mod_sub(diff->get(), bx[i].get(), bx[j].get(), p, ctx) != 1 ||
          BN_mod_mul(den->get(), den->get(), diff->get(), p, ctx) != 1) {
        return OpenSslFailure("Lagrange basis");
      }
    }
    if (BN_mod_inverse(den->get(), den->get(), p, ctx) == nullptr)
      return OpenSslFailure("BN_mod_inverse");
    FEDLORA_ASSIGN_OR_RETURN(Bn y, FromBytes(used[i].y));
    if (BN_mod_mul(term->get(), num->get(), den->get(), p, ctx) != 1 ||
        BN_mod_mul(term->get(), term->get(), y.get(), p, ctx) != 1 ||
        BN_mod_add(sum->get(), sum->get(), term->get(), p, ctx) != 1) {
      return OpenSslFailure("Lagrange sum");
    }
  }
  return std::move(*sum);
}

// Checks every share's form and that the points are distinct.
absl::Status CheckShares(std::span<const ShamirShare> shares, uint32_t threshold) {
  std::vector<uint32_t> xs;
  for (const ShamirShare& s : shares) {
    FEDLORA_RETURN_IF_ERROR(CheckShamirShare(s));
    xs.push_back(s.x);
  }
  return CheckPoints(xs, threshold);
}

absl::StatusOr<std::string> SecretFrom(const BIGNUM* value) {
  if (BN_num_bits(value) > static_cast<int>(8 * kShamirSecretBytes)) {
    return absl::InvalidArgumentError(
        "inconsistent shares: the interpolated value is not a 32-byte secret");
  }
  return ToBytes(value, kShamirSecretBytes);
}

}  // namespace

absl::StatusOr<std::string> ShamirCombine(std::span<const ShamirShare> shares, uint32_t threshold) {
  if (threshold == 0) return absl::InvalidArgumentError("Shamir threshold must be at least 1");
  if (shares.size() < threshold) {
    return absl::InvalidArgumentError(
        absl::StrCat("Shamir combine needs ", threshold, " shares, got ", shares.size()));
  }
  const std::span<const ShamirShare> used = shares.first(threshold);
  FEDLORA_RETURN_IF_ERROR(CheckShares(used, threshold));
  BnCtx ctx(BN_CTX_secure_new());
  if (ctx == nullptr) return OpenSslFailure("BN_CTX_secure_new");
  FEDLORA_ASSIGN_OR_RETURN(Bn p, Prime());
  FEDLORA_ASSIGN_OR_RETURN(Bn at0, InterpolateAt(used, 0, p.get(), ctx.get()));
  return SecretFrom(at0.get());
}

absl::StatusOr<ShamirDecoded> ShamirCombineChecked(std::span<const ShamirShare> shares,
                                                   uint32_t threshold, int max_tries) {
  if (threshold == 0) return absl::InvalidArgumentError("Shamir threshold must be at least 1");
  if (shares.size() <= threshold) {
    return absl::FailedPreconditionError(absl::StrCat("checking Shamir shares needs more than ",
                                                      threshold, " of them, got ", shares.size()));
  }
  FEDLORA_RETURN_IF_ERROR(CheckShares(shares, threshold));
  BnCtx ctx(BN_CTX_secure_new());
  if (ctx == nullptr) return OpenSslFailure("BN_CTX_secure_new");
  FEDLORA_ASSIGN_OR_RETURN(Bn p, Prime());
  const size_t n = shares.size();
  // The polynomial must pass through ceil((n + threshold) / 2) shares (and more than `threshold`).
  // Two polynomials of degree threshold - 1 share at most threshold - 1 points, so with w wrong
  // shares another one gathers at most threshold - 1 + w: up to floor((n - threshold) / 2) wrong
  // shares, even chosen together, only the dealt polynomial reaches that count.
  const size_t needed = std::max<size_t>(threshold + 1, (n + threshold + 1) / 2);
  // Candidate subsets: consecutive runs of `threshold` shares from each start (a wrong share spoils
  // the runs that hold it, so with few wrong shares one of the first runs is clean).
  for (int attempt = 0; attempt < max_tries && static_cast<size_t>(attempt) < n; ++attempt) {
    std::vector<ShamirShare> subset;
    for (uint32_t k = 0; k < threshold; ++k)
      subset.push_back(shares[(static_cast<size_t>(attempt) + k) % n]);
    std::vector<uint32_t> wrong;
    for (const ShamirShare& sh : shares) {
      FEDLORA_ASSIGN_OR_RETURN(Bn v, InterpolateAt(subset, sh.x, p.get(), ctx.get()));
      FEDLORA_ASSIGN_OR_RETURN(std::string y, ToBytes(v.get(), kShamirShareBytes));
      if (y != sh.y) wrong.push_back(sh.x);
      if (wrong.size() > n - needed) break;
    }
    if (n - wrong.size() < needed) continue;
    FEDLORA_ASSIGN_OR_RETURN(Bn at0, InterpolateAt(subset, 0, p.get(), ctx.get()));
    FEDLORA_ASSIGN_OR_RETURN(std::string secret, SecretFrom(at0.get()));
    return ShamirDecoded{std::move(secret), std::move(wrong)};
  }
  return absl::InvalidArgumentError(absl::StrCat("inconsistent shares: no polynomial of degree ",
                                                 threshold - 1, " passes through ", needed,
                                                 " of the ", n, " shares"));
}

}  // namespace fedlora::crypto
