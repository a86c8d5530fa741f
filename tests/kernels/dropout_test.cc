#include "kernels/dropout.h"

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;
using testing::Guarded;
using testing::Random;

TEST(Philox, KnownAnswerVectors) {
  // The generator the masks come from (core/rng.h), pinned here too because a change to it
  // changes every mask: Random123's kat_vectors for philox4x32_10.
  Philox4x32Block r = Philox4x32(Philox4x32Block{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  r = Philox4x32(Philox4x32Block{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu,
                 0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
  r = Philox4x32(Philox4x32Block{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                 0x299f31d0u);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(Dropout, KeepsAboutOneMinusPAndScales) {
  const int64_t n = 100000;
  const float p = 0.25f;
  const std::vector<float> x(n, 3.0f);
  Guarded y(n);
  ASSERT_TRUE(Dropout(Cpu(), DropoutArgs{.n = n,
                                         .spec = {.p = p, .seed = 1234, .offset = 0},
                                         .x = x.data(),
                                         .out = y.data()})
                  .ok());
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (y[i] != 0.0f) {
      ++kept;
      EXPECT_FLOAT_EQ(y[i], 4.0f);  // 3 / (1 - 0.25)
    }
  }
  // Binomial(1e5, 0.75): sd = 137; 6 sd is a false-failure chance below 1e-8.
  EXPECT_NEAR(static_cast<double>(kept), 0.75 * n, 6 * 137.0);
  EXPECT_TRUE(y.GuardsIntact());
}

TEST(Dropout, MaskIsAFunctionOfSeedAndIndex) {
  const int64_t n = 1003;
  const auto x = Random(n, 61);
  const DropoutSpec spec{.p = 0.5f, .seed = 42, .offset = 5};
  std::vector<float> whole(n), head(400), tail(n - 400), again(n), other_seed(n);
  ASSERT_TRUE(
      Dropout(Cpu(), DropoutArgs{.n = n, .spec = spec, .x = x.data(), .out = whole.data()}).ok());
  // Split at an index that is not a multiple of 4: the tail's offset moves by 400 + ... = 405.
  ASSERT_TRUE(
      Dropout(Cpu(), DropoutArgs{.n = 400, .spec = spec, .x = x.data(), .out = head.data()}).ok());
  ASSERT_TRUE(Dropout(Cpu(), DropoutArgs{.n = n - 400,
                                         .spec = {.p = 0.5f, .seed = 42, .offset = 405},
                                         .x = x.data() + 400,
                                         .out = tail.data()})
                  .ok());
  for (int64_t i = 0; i < 400; ++i) ASSERT_EQ(whole[i], head[i]) << i;
  for (int64_t i = 400; i < n; ++i) ASSERT_EQ(whole[i], tail[i - 400]) << i;
  // Deterministic across calls (and thread splits), different for another seed.
  ASSERT_TRUE(
      Dropout(Cpu(), DropoutArgs{.n = n, .spec = spec, .x = x.data(), .out = again.data()}).ok());
  EXPECT_EQ(whole, again);
  ASSERT_TRUE(Dropout(Cpu(), DropoutArgs{.n = n,
                                         .spec = {.p = 0.5f, .seed = 43, .offset = 5},
                                         .x = x.data(),
                                         .out = other_seed.data()})
                  .ok());
  EXPECT_NE(whole, other_seed);
  // Matches UniformAt element by element (the documented definition).
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = UniformAt(42, 0, 5 + i) >= 0.5f;
    ASSERT_EQ(whole[i], keep ? x[i] * 2.0f : 0.0f) << i;
  }
}

TEST(Dropout, BackwardIsTheSameLinearMapAndPZeroIsIdentity) {
  const int64_t n = 64;
  const auto x = Random(n, 62), dy = Random(n, 63);
  const DropoutSpec spec{.p = 0.3f, .seed = 9, .offset = 0};
  std::vector<float> y(n), dx(n);
  ASSERT_TRUE(
      DropoutForward(Cpu(), DropoutArgs{.n = n, .spec = spec, .x = x.data(), .out = y.data()})
          .ok());
  ASSERT_TRUE(
      DropoutBackward(Cpu(), DropoutArgs{.n = n, .spec = spec, .x = dy.data(), .out = dx.data()})
          .ok());
  // <dy, D x> == <D dy, x> for the diagonal map D; also zero pattern identical.
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < n; ++i) {
    lhs += double(dy[i]) * y[i];
    rhs += double(dx[i]) * x[i];
    EXPECT_EQ(y[i] == 0.0f, dx[i] == 0.0f) << i;
  }
  EXPECT_NEAR(lhs, rhs, 1e-5);
  std::vector<float> id(n);
  ASSERT_TRUE(
      Dropout(Cpu(), DropoutArgs{.n = n, .spec = {}, .x = x.data(), .out = id.data()}).ok());
  EXPECT_EQ(id, x);
  EXPECT_EQ(
      Dropout(Cpu(), DropoutArgs{.n = n, .spec = {.p = 1.0f}, .x = x.data(), .out = id.data()})
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora::kernels
