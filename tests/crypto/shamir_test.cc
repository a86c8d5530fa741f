#include "crypto/shamir.h"

#include <openssl/bn.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "crypto/random.h"
#include "gtest/gtest.h"

namespace fedlora::crypto {
namespace {

std::string Hex(const std::string& bytes) { return absl::BytesToHexString(bytes); }
std::string Bytes(const char* hex) { return absl::HexStringToBytes(hex); }

// p is prime, above 2^256 by 297, and nothing in between is prime.
TEST(Shamir, PrimeIsTheSmallestAbove2To256) {
  BIGNUM* p = nullptr;
  ASSERT_GT(BN_hex2bn(&p, kShamirPrimeHex), 0);
  BN_CTX* ctx = BN_CTX_new();
  EXPECT_EQ(BN_check_prime(p, ctx, nullptr), 1);
  BIGNUM* two256 = BN_new();
  ASSERT_EQ(BN_set_bit(two256, 256), 1);
  ASSERT_GT(BN_cmp(p, two256), 0);  // every 32-byte secret is below p
  BIGNUM* diff = BN_new();
  ASSERT_EQ(BN_sub(diff, p, two256), 1);
  EXPECT_EQ(BN_get_word(diff), 297u);
  BIGNUM* c = BN_new();
  for (unsigned long k = 1; k < 297; ++k) {
    ASSERT_EQ(BN_copy(c, two256), c);
    ASSERT_EQ(BN_add_word(c, k), 1);
    EXPECT_EQ(BN_check_prime(c, ctx, nullptr), 0) << "2^256 + " << k;
  }
  BN_free(c);
  BN_free(diff);
  BN_free(two256);
  BN_CTX_free(ctx);
  BN_free(p);
}

// f(X) = s + (p - 1) X + (2^256 + 5) X^2 + a3 X^3, evaluated in Python with big integers:
//   sum(c * pow(x, i, p) for i, c in enumerate(coeffs)) % p, written as 33 bytes big-endian.
constexpr char kSecretHex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const char* const kCoefficientsHex[] = {
    "010000000000000000000000000000000000000000000000000000000000000128",  // p - 1
    "010000000000000000000000000000000000000000000000000000000000000005",  // 2^256 + 5
    "0369d0369d0369cffc962fc962fc96300369d0369d0369cffc962fc962fc9630",
};
const char* const kSharesHex[] = {
    "00037af269e158d047852fda852fda852f037af269e158d047852fda852fda840a",  // x = 1
    "001b5fa3e82c70b4f76d4b2906e4c2a07f1b5fa3e82c70b4f76d4b2906e4c29bed",  // x = 2
    "005c3a17f5d3b18f672c70b4f93d81c60f5c3a17f5d3b18f672c70b4f93d81bbc8",  // x = 3
    "00da852fda852fda76ae259d148c037affda852fda852fda76ae259d148c0368bb",  // x = 4
    "00aabbccddef001105ddef001122334470aabbccddef001105ddef0011223326bd",  // x = 5
    "00e158d047bf36adf4a751fca751fca781e158d047bf36adf4a751fca751fc7c17",  // x = 6
    "0092d71b5fa3e82c22f5d3b18f6d4b295392d71b5fa3e82c22f5d3b18f6d4aecc0",  // x = 7
};

TEST(Shamir, KnownAnswerSplit) {
  std::vector<std::string> coeffs;
  for (const char* h : kCoefficientsHex) coeffs.push_back(Bytes(h));
  const std::vector<uint32_t> xs = {1, 2, 3, 4, 5, 6, 7};
  auto shares = ShamirSplitWithCoefficients(Bytes(kSecretHex), coeffs, xs);
  ASSERT_TRUE(shares.ok()) << shares.status();
  ASSERT_EQ(shares->size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ((*shares)[i].x, i + 1);
    EXPECT_EQ(Hex((*shares)[i].y), kSharesHex[i]) << "x = " << i + 1;
  }
}

TEST(Shamir, KnownAnswerCombine) {
  // Shares 2, 4, 6, 7 (Python's Lagrange interpolation at 0 gives the secret back), in any order.
  std::vector<ShamirShare> shares = {{7, Bytes(kSharesHex[6])},
                                     {2, Bytes(kSharesHex[1])},
                                     {6, Bytes(kSharesHex[5])},
                                     {4, Bytes(kSharesHex[3])}};
  auto secret = ShamirCombine(shares, 4);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(Hex(*secret), kSecretHex);
}

TEST(Shamir, EverySubsetOfThresholdSizeRecovers) {
  for (int trial = 0; trial < 3; ++trial) {
    auto secret = RandomBytes(32);
    ASSERT_TRUE(secret.ok());
    auto shares = ShamirSplit(*secret, 4, 7);
    ASSERT_TRUE(shares.ok()) << shares.status();
    ASSERT_EQ(shares->size(), 7u);
    int subsets = 0;
    for (unsigned mask = 0; mask < (1u << 7); ++mask) {
      if (__builtin_popcount(mask) != 4) continue;
      std::vector<ShamirShare> subset;
      for (int i = 0; i < 7; ++i) {
        if (mask & (1u << i)) subset.push_back((*shares)[i]);
      }
      std::reverse(subset.begin(), subset.end());  // order does not matter
      auto got = ShamirCombine(subset, 4);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, *secret);
      ++subsets;
    }
    EXPECT_EQ(subsets, 35);
    // Three shares interpolate (as degree-2 polynomials) to something else entirely.
    for (unsigned mask = 0; mask < (1u << 7); ++mask) {
      if (__builtin_popcount(mask) != 3) continue;
      std::vector<ShamirShare> subset;
      for (int i = 0; i < 7; ++i) {
        if (mask & (1u << i)) subset.push_back((*shares)[i]);
      }
      auto got = ShamirCombine(subset, 3);
      if (got.ok()) {
        EXPECT_NE(*got, *secret);  // an error ("inconsistent") is as good
      }
      EXPECT_FALSE(ShamirCombine(subset, 4).ok());
    }
  }
}

TEST(Shamir, FreshCoefficientsEverySplit) {
  const std::string secret(32, '\x42');
  auto a = ShamirSplit(secret, 3, 5);
  auto b = ShamirSplit(secret, 3, 5);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < 5; ++i) EXPECT_NE((*a)[i].y, (*b)[i].y);
}

TEST(Shamir, EdgeSecretsThresholdsAndPoints) {
  for (const std::string& secret : {std::string(32, '\0'), std::string(32, '\xff')}) {
    for (uint32_t t : {1u, 2u, 5u}) {
      auto shares = ShamirSplit(secret, t, 5);
      ASSERT_TRUE(shares.ok()) << shares.status();
      auto got = ShamirCombine(std::vector<ShamirShare>(shares->end() - t, shares->end()), t);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, secret);
    }
  }
  const std::vector<uint32_t> xs = {5, 17, 1000000, 0xffffffffu};
  auto shares = ShamirSplitAt(std::string(32, '\x07'), 3, xs);
  ASSERT_TRUE(shares.ok());
  EXPECT_EQ((*shares)[3].x, 0xffffffffu);
  auto got = ShamirCombine(std::vector<ShamirShare>(shares->begin() + 1, shares->end()), 3);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, std::string(32, '\x07'));
  // With t = 1 every share is the secret itself, padded to 33 bytes.
  auto one = ShamirSplit(std::string(32, '\x09'), 1, 2);
  ASSERT_TRUE(one.ok());
  std::string padded(33, '\x09');
  padded[0] = '\0';
  EXPECT_EQ((*one)[1].y, padded);
}

TEST(Shamir, RejectsMalformedInput) {
  const std::string secret(32, '\x01');
  EXPECT_EQ(ShamirSplit(std::string(31, 'a'), 2, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShamirSplit(secret, 0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShamirSplit(secret, 4, 3).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> dup = {1, 2, 2};
  EXPECT_EQ(ShamirSplitAt(secret, 2, dup).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> zero = {0, 1, 2};
  EXPECT_EQ(ShamirSplitAt(secret, 2, zero).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<std::string> too_big = {
      // p itself
      Bytes("010000000000000000000000000000000000000000000000000000000000000129")};
  EXPECT_FALSE(ShamirSplitWithCoefficients(secret, too_big, std::vector<uint32_t>{1, 2}).ok());

  auto shares = ShamirSplit(secret, 2, 3);
  ASSERT_TRUE(shares.ok());
  std::vector<ShamirShare> s = *shares;
  EXPECT_EQ(ShamirCombine(std::vector<ShamirShare>{s[0]}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShamirCombine(s, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShamirCombine(std::vector<ShamirShare>{s[0], s[0]}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  ShamirShare x0 = s[1];
  x0.x = 0;
  EXPECT_EQ(ShamirCombine(std::vector<ShamirShare>{s[0], x0}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  ShamirShare short_y = s[1];
  short_y.y.pop_back();
  EXPECT_EQ(ShamirCombine(std::vector<ShamirShare>{s[0], short_y}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  ShamirShare at_p{2, Bytes("010000000000000000000000000000000000000000000000000000000000000129")};
  EXPECT_EQ(ShamirCombine(std::vector<ShamirShare>{s[0], at_p}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CheckShamirShare(at_p).ok());
  EXPECT_TRUE(CheckShamirShare(
                  {2, Bytes("010000000000000000000000000000000000000000000000000000000000000128")})
                  .ok());
}

// Shares of a polynomial whose constant term is 2^256 + 1 (so not a 32-byte secret): f(X) = 2^256 + 1 + 7X,
// computed in Python.
TEST(Shamir, ResultAbove2To256IsInconsistent) {
  std::vector<ShamirShare> shares = {
      {1, Bytes("010000000000000000000000000000000000000000000000000000000000000008")},
      {2, Bytes("01000000000000000000000000000000000000000000000000000000000000000f")}};
  auto got = ShamirCombine(shares, 2);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "inconsistent shares")) << got.status();
}

// Adds `k` to a share's y (big-endian). The errors are then fixed numbers, so which polynomials
// pass through which shares does not depend on the random coefficients of the sharing. (y + k
// reaching p would need y within k of it: probability about 2^-250.)
void Add(ShamirShare& share, uint32_t k) {
  uint32_t carry = k;
  for (size_t i = share.y.size(); i-- > 0 && carry != 0;) {
    carry += static_cast<uint8_t>(share.y[i]);
    share.y[i] = static_cast<char>(carry & 0xff);
    carry >>= 8;
  }
}
void Corrupt(ShamirShare& share) { Add(share, 0x5a); }

TEST(Shamir, CheckedCombineFindsTheWrongSharesAndTheSecret) {
  const std::string secret(32, '\x42');
  auto shares = ShamirSplit(secret, /*threshold=*/4, /*num_shares=*/9);
  ASSERT_TRUE(shares.ok()) << shares.status();
  // All right: nothing wrong, the secret.
  auto clean = ShamirCombineChecked(*shares, 4);
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(clean->secret, secret);
  EXPECT_TRUE(clean->wrong_x.empty());
  // Wrong shares anywhere, among them the first (which ShamirCombine uses and so gets wrong): each
  // is named, and the secret is still the dealt one.
  for (const std::vector<size_t>& bad :
       std::vector<std::vector<size_t>>{{0}, {3}, {8}, {0, 5}, {1, 2}}) {
    std::vector<ShamirShare> v = *shares;
    std::vector<uint32_t> want;
    for (size_t i : bad) {
      Corrupt(v[i]);
      want.push_back(v[i].x);
    }
    auto decoded = ShamirCombineChecked(v, 4);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->secret, secret);
    std::sort(decoded->wrong_x.begin(), decoded->wrong_x.end());
    EXPECT_EQ(decoded->wrong_x, want);
    if (bad.front() == 0) {
      auto plain = ShamirCombine(v, 4);
      EXPECT_TRUE(!plain.ok() || *plain != secret);
    }
  }
}

// Two liars who agree on a wrong polynomial: with f the dealt one, f - (x - 3)(x - 4)(x - 5) passes
// through the right shares at x = 3, 4, 5 and the liars' at x = 1, 2 (f(1) + 24, f(2) + 6): five of
// nine, more than half and more than the threshold. Only ceil((9 + 4) / 2) = 7 outvotes them.
TEST(Shamir, CheckedCombineIsNotFooledByLiarsWhoAgree) {
  const std::string secret(32, '\x31');
  auto shares = ShamirSplit(secret, /*threshold=*/4, /*num_shares=*/9);
  ASSERT_TRUE(shares.ok()) << shares.status();
  std::vector<ShamirShare> v = *shares;
  Add(v[0], 24);
  Add(v[1], 6);
  auto decoded = ShamirCombineChecked(v, 4);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->secret, secret);
  std::sort(decoded->wrong_x.begin(), decoded->wrong_x.end());
  EXPECT_EQ(decoded->wrong_x, (std::vector<uint32_t>{1, 2}));
}

TEST(Shamir, CheckedCombineRefusesWhatItCannotDecide) {
  const std::string secret(32, '\x07');
  auto shares = ShamirSplit(secret, 3, 5);
  ASSERT_TRUE(shares.ok());
  // Exactly the threshold: nothing to check against.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      ShamirCombineChecked(std::span<const ShamirShare>(*shares).first(3), 3).status()));
  // Two of five wrong (it corrects one): no polynomial of degree 2 passes through four of these
  // shares (the errors +1 at x = 1 and +1000 at x = 3 fit none), and none is guessed.
  std::vector<ShamirShare> v = *shares;
  Add(v[0], 1);
  Add(v[2], 1000);
  auto decoded = ShamirCombineChecked(v, 3);
  ASSERT_FALSE(decoded.ok());
  EXPECT_TRUE(absl::StrContains(decoded.status().message(), "inconsistent shares"))
      << decoded.status();
}

}  // namespace
}  // namespace fedlora::crypto
