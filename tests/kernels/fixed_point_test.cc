#include "kernels/base/fixed_point.h"

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;

constexpr u128 kOne = u128{1} << 64;  // 1.0 in the 64-fraction-bit fixed point

int64_t Accumulate(const std::vector<float>& x, uint64_t w, int sign, std::vector<u128>& sums) {
  int64_t bad = -7;
  const absl::Status s = FixedPointAccumulate(Cpu(), {.n = static_cast<int64_t>(x.size()),
                                                      .x = x.data(),
                                                      .weight = w,
                                                      .sign = sign,
                                                      .sums = sums.data(),
                                                      .first_bad = &bad});
  EXPECT_TRUE(s.ok()) << s;
  return bad;
}

TEST(FixedPoint, TermsAreExactWeightedValues) {
  // Values chosen so that w * x * 2^64 is an integer: the term is that integer exactly.
  const std::vector<float> x = {1.0f, -0.5f, 0.0f, -0.0f, 3.25f, 1024.0f};
  std::vector<u128> sums(x.size(), 0);
  EXPECT_EQ(Accumulate(x, 3, 1, sums), -1);
  EXPECT_TRUE(sums[0] == 3 * kOne);
  EXPECT_TRUE(sums[1] == static_cast<u128>(-(static_cast<__int128>(3) * kOne / 2)));
  EXPECT_TRUE(sums[2] == 0 && sums[3] == 0);
  EXPECT_TRUE(sums[4] == 39 * kOne / 4);
  EXPECT_TRUE(sums[5] == 3072 * kOne);
}

TEST(FixedPoint, TinyValuesRoundHalfToEven) {
  // 2^-65 is half a unit: ties go to the even neighbour (0); 3 * 2^-65 is 1.5 units: rounds to 2;
  // 2^-64 + 2^-66 (1.25 units) to 1; the smallest subnormal to 0.
  const std::vector<float> x = {std::ldexp(1.0f, -65), std::ldexp(3.0f, -65), std::ldexp(5.0f, -66),
                                std::numeric_limits<float>::denorm_min(), -std::ldexp(3.0f, -65)};
  std::vector<u128> sums(x.size(), 0);
  EXPECT_EQ(Accumulate(x, 1, 1, sums), -1);
  EXPECT_TRUE(sums[0] == 0);
  EXPECT_TRUE(sums[1] == 2);
  EXPECT_TRUE(sums[2] == 1);
  EXPECT_TRUE(sums[3] == 0);
  EXPECT_TRUE(sums[4] == static_cast<u128>(-2));
}

TEST(FixedPoint, OutOfRangeValuesAddNothingAndTheFirstIsReported) {
  const float kNan = std::numeric_limits<float>::quiet_NaN(),
              kInf = std::numeric_limits<float>::infinity();
  // |w * x| must stay below 2^43: 2^42 with weight 2 is the first value past it.
  const std::vector<float> x = {1.0f,  std::ldexp(1.0f, 42), kNan, 2.0f,
                                -kInf, std::ldexp(1.0f, 41)};
  std::vector<u128> sums(x.size(), 5);
  EXPECT_EQ(Accumulate(x, 2, 1, sums), 1);
  EXPECT_TRUE(sums[0] == 5 + 2 * kOne);
  EXPECT_TRUE(sums[1] == 5 && sums[2] == 5 && sums[4] == 5);
  EXPECT_TRUE(sums[3] == 5 + 4 * kOne);
  EXPECT_TRUE(sums[5] == 5 + (u128{1} << 106));  // 2^42 * 2^64: the largest power of two in range
  // Subtracting the same update restores every bit.
  EXPECT_EQ(Accumulate(x, 2, -1, sums), 1);
  for (u128 s : sums) EXPECT_TRUE(s == 5);
}

TEST(FixedPoint, SumsWrapAndStillAddUpExactly) {
  std::vector<u128> sums = {~u128{0}};  // -1 in two's complement
  EXPECT_EQ(Accumulate({1.0f}, 1, 1, sums), -1);
  EXPECT_TRUE(sums[0] == kOne - 1);
}

TEST(FixedPoint, ManyElementsAcrossThreadsGiveTheSerialResult) {
  // Larger than one ParallelFor chunk, with bad values in several chunks: the smallest index wins.
  const int64_t n = 100000;
  std::vector<float> x = testing::Random(n, 5);
  x[70001] = std::numeric_limits<float>::infinity();
  x[40003] = std::nanf("");
  std::vector<u128> sums(n, 0);
  EXPECT_EQ(Accumulate(x, 7, 1, sums), 40003);
  for (int64_t i : {int64_t{0}, int64_t{40002}, int64_t{99999}}) {
    u128 term;
    ASSERT_TRUE(FixedPointTerm(std::bit_cast<uint32_t>(x[i]), 7, &term));
    EXPECT_TRUE(sums[i] == term) << i;
  }
}

TEST(FixedPoint, IndexedValuesGoToTheirSumsAndNowhereElse) {
  // A sparse update: three kept entries of ten sums, one out of range.
  const std::vector<float> x = {1.0f, -2.0f, std::ldexp(1.0f, 50)};
  const std::vector<int64_t> index = {7, 2, 9};
  std::vector<u128> sums(10, 3);
  int64_t bad = -7;
  FixedPointAccumulateArgs a{.n = 3,
                             .x = x.data(),
                             .weight = 2,
                             .sums = sums.data(),
                             .index = index.data(),
                             .first_bad = &bad};
  ASSERT_TRUE(FixedPointAccumulate(Cpu(), a).ok());
  EXPECT_EQ(bad, 2);  // the position in x, not the sum it would have gone to
  for (int64_t i = 0; i < 10; ++i) {
    const u128 want = i == 7 ? 3 + 2 * kOne : i == 2 ? 3 - 4 * kOne : 3;
    EXPECT_TRUE(sums[i] == want) << i;
  }
  a.sign = -1;
  ASSERT_TRUE(FixedPointAccumulate(Cpu(), a).ok());
  for (u128 s : sums) EXPECT_TRUE(s == 3);
}

TEST(FixedPoint, BadArgumentsAreRefused) {
  std::vector<float> x = {1.0f};
  std::vector<u128> sums(1, 0);
  int64_t bad = 0;
  FixedPointAccumulateArgs a{
      .n = 1, .x = x.data(), .weight = 1, .sums = sums.data(), .first_bad = &bad};
  FixedPointAccumulateArgs zero_weight = a, big_weight = a, sign = a, no_sums = a, no_bad = a;
  zero_weight.weight = 0;
  big_weight.weight = (uint64_t{1} << 32) + 1;
  sign.sign = 2;
  no_sums.sums = nullptr;
  no_bad.first_bad = nullptr;
  EXPECT_EQ(FixedPointAccumulate(Cpu(), zero_weight).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FixedPointAccumulate(Cpu(), big_weight).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FixedPointAccumulate(Cpu(), sign).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FixedPointAccumulate(Cpu(), no_sums).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FixedPointAccumulate(Cpu(), no_bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(sums[0] == 0);
}

}  // namespace
}  // namespace fedlora::kernels
