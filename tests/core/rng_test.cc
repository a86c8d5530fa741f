#include "core/rng.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

// Known-answer vectors from Random123's kat_vectors (counter[4] key[2] -> output[4]).
TEST(Philox4x32, Random123KnownAnswers) {
  struct Kat {
    Philox4x32Block ctr;
    uint32_t k0, k1;
    Philox4x32Block want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    const Philox4x32Block got = Philox4x32(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], k.want.v[i]) << "word " << i;
  }
  // The 64-bit convenience form packs low words first.
  const Philox4x32Block pi =
      Philox4x32(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(Rng, SameSeedAndStreamSameSequence) {
  Rng a(1234, 5), b(1234, 5);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.NextU64(), b.NextU64());
  Rng c(1234, 5), d(1234, 5);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(c.Normal(), d.Normal());
}

TEST(Rng, SequenceMatchesStatelessIndexing) {
  Rng rng(99, 7);
  for (uint64_t i = 0; i < 37; ++i) ASSERT_EQ(rng.NextU32(), U32At(99, 7, i)) << i;
  Rng f(99, 7);
  for (uint64_t i = 0; i < 37; ++i) ASSERT_EQ(f.UniformFloat(), UniformAt(99, 7, i)) << i;
}

TEST(Rng, StreamsAndSeedsDiffer) {
  Rng s0(42, 0), s1(42, 1), t0(43, 0);
  int same_stream = 0, same_seed = 0;
  for (int i = 0; i < 1000; ++i) {
    const uint32_t a = s0.NextU32(), b = s1.NextU32(), c = t0.NextU32();
    same_stream += a == b;
    same_seed += a == c;
  }
  // Independent 32-bit words collide with probability 2^-32 each.
  EXPECT_EQ(same_stream, 0);
  EXPECT_EQ(same_seed, 0);
}

TEST(Rng, StreamsAreUncorrelated) {
  constexpr int kN = 100000;
  Rng a(7, 0), b(7, 1);
  double sab = 0, sa = 0, sb = 0, saa = 0, sbb = 0;
  for (int i = 0; i < kN; ++i) {
    const double x = a.Uniform(), y = b.Uniform();
    sab += x * y, sa += x, sb += y, saa += x * x, sbb += y * y;
  }
  const double cov = sab / kN - (sa / kN) * (sb / kN);
  const double r = cov / std::sqrt((saa / kN - sa * sa / kN / kN) * (sbb / kN - sb * sb / kN / kN));
  // The sample correlation of independent streams has standard deviation ~1/sqrt(n); allow 5 sigma.
  EXPECT_LT(std::fabs(r), 5.0 / std::sqrt(kN));
}

TEST(Rng, UniformMoments) {
  constexpr int kN = 100000;
  Rng rng(2024);
  double sum = 0, sum_sq = 0, lo = 1, hi = 0;
  for (int i = 0; i < kN; ++i) {
    const double u = rng.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += (u - 0.5) * (u - 0.5);
    lo = std::min(lo, u), hi = std::max(hi, u);
  }
  // Mean 1/2, sd of the sample mean sqrt(1/12 / n) = 9.1e-4; 5 sigma = 4.6e-3.
  EXPECT_NEAR(sum / kN, 0.5, 5 * std::sqrt(1.0 / 12 / kN));
  // Variance 1/12; Var((U-1/2)^2) = 1/80 - 1/144, so sd of the estimate = 2.4e-4; 5 sigma.
  EXPECT_NEAR(sum_sq / kN, 1.0 / 12, 5 * std::sqrt((1.0 / 80 - 1.0 / 144) / kN));
  EXPECT_LT(lo, 1e-3);
  EXPECT_GT(hi, 1 - 1e-3);
}

TEST(Rng, NormalMoments) {
  constexpr int kN = 100000;
  Rng rng(31337);
  double sum = 0, sum_sq = 0, sum_4 = 0;
  for (int i = 0; i < kN; ++i) {
    const double z = rng.Normal();
    ASSERT_TRUE(std::isfinite(z));
    sum += z, sum_sq += z * z, sum_4 += z * z * z * z;
  }
  // Mean 0 (sd 1/sqrt(n)), variance 1 (sd sqrt(2/n)), kurtosis 3 (sd sqrt(96/n)); 5 sigma each.
  EXPECT_NEAR(sum / kN, 0.0, 5 / std::sqrt(kN));
  EXPECT_NEAR(sum_sq / kN, 1.0, 5 * std::sqrt(2.0 / kN));
  EXPECT_NEAR(sum_4 / kN, 3.0, 5 * std::sqrt(96.0 / kN));
  Rng scaled(31337);
  EXPECT_DOUBLE_EQ(scaled.Normal(10, 2), 10 + 2 * Rng(31337).Normal());
}

TEST(Rng, UniformIntBucketsAreEven) {
  constexpr int kN = 100000;
  Rng rng(5);
  int counts[6] = {};
  for (int i = 0; i < kN; ++i) {
    const uint64_t x = rng.UniformInt(6);
    ASSERT_LT(x, 6u);
    ++counts[x];
  }
  // Each count is Binomial(n, 1/6): sd = sqrt(n * 1/6 * 5/6) = 118; 5 sigma.
  const double sd = std::sqrt(kN * (1.0 / 6) * (5.0 / 6));
  for (int c : counts) EXPECT_NEAR(c, kN / 6.0, 5 * sd);
  EXPECT_EQ(rng.UniformInt(1), 0u);
  EXPECT_EQ(rng.UniformInt(0), 0u);
}

TEST(Rng, UniformIntHasNoModuloBias) {
  // n = 3 * 2^62: with `x % n` the values below 2^62 would get probability 1/2 instead of 1/3.
  constexpr int kN = 100000;
  const uint64_t n = 3ull << 62;
  Rng rng(11);
  int below = 0;
  for (int i = 0; i < kN; ++i) below += rng.UniformInt(n) < (1ull << 62);
  EXPECT_NEAR(below / static_cast<double>(kN), 1.0 / 3, 5 * std::sqrt((1.0 / 3) * (2.0 / 3) / kN));
}

TEST(Rng, ShuffleIsAUniformPermutation) {
  Rng rng(8);
  std::map<std::vector<int>, int> counts;
  constexpr int kN = 48000;
  for (int i = 0; i < kN; ++i) {
    std::vector<int> v = {0, 1, 2, 3};
    rng.Shuffle(v);
    ++counts[v];
  }
  ASSERT_EQ(counts.size(), 24u);  // every permutation of 4 appears
  // Each count is Binomial(n, 1/24): sd = sqrt(n/24 * 23/24) = 43.8; 5 sigma.
  for (const auto& [perm, c] : counts)
    EXPECT_NEAR(c, kN / 24.0, 5 * std::sqrt(kN / 24.0 * 23 / 24));

  std::vector<int> big(1000);
  std::iota(big.begin(), big.end(), 0);
  std::vector<int> a = big, b = big;
  Rng r1(3), r2(3);
  r1.Shuffle(a);
  r2.Shuffle(b);
  EXPECT_EQ(a, b);  // deterministic
  EXPECT_NE(a, big);
  std::sort(a.begin(), a.end());
  EXPECT_EQ(a, big);  // a permutation
  std::vector<int> empty;
  r1.Shuffle(empty);
}

TEST(UniformAt, IdenticalForAnyThreadSplit) {
  constexpr int64_t kN = 10007;
  std::vector<float> serial(kN), parallel(kN);
  for (int64_t i = 0; i < kN; ++i) serial[i] = UniformAt(77, MakeStream(3, 9), i);
  for (int threads : {2, 3, 8}) {
    ThreadPool pool(threads);
    pool.ParallelFor(0, kN, 17, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) parallel[i] = UniformAt(77, MakeStream(3, 9), i);
    });
    ASSERT_EQ(serial, parallel) << threads;
  }
  for (float u : serial) {
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
  }
  EXPECT_EQ(U32ToUniformFloat(0xffffffffu), 1.0f - 0x1p-24f);  // the largest value is below 1
  EXPECT_EQ(MakeStream(1, 2), 0x100000002ull);
}

}  // namespace
}  // namespace fedlora
