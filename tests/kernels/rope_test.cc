#include "kernels/rope.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;
using testing::ExpectGradient;
using testing::Random;

constexpr int64_t kTokens = 6, kHeads = 3, kDim = 8, kMaxPos = 40;

std::vector<float> Apply(const RopeTables& t, const std::vector<int32_t>& pos, std::vector<float> x,
                         bool inverse) {
  EXPECT_TRUE(Rope(Cpu(), {.tokens = kTokens,
                           .heads = kHeads,
                           .head_dim = kDim,
                           .max_positions = t.max_positions,
                           .positions = pos.data(),
                           .cos = t.cos.data(),
                           .sin = t.sin.data(),
                           .x = x.data(),
                           .inverse = inverse})
                  .ok());
  return x;
}

TEST(Rope, TablesFollowTheDefinition) {
  const RopeTables t = MakeRopeTables(10000.0, kDim, kMaxPos);
  ASSERT_EQ(t.half, kDim / 2);
  for (int64_t p : {0, 1, 17, 39}) {
    for (int64_t i = 0; i < kDim / 2; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / kDim);
      EXPECT_NEAR(t.cos[p * t.half + i], std::cos(angle), 2e-6 * std::max(1.0, std::abs(angle)));
      EXPECT_NEAR(t.sin[p * t.half + i], std::sin(angle), 2e-6 * std::max(1.0, std::abs(angle)));
    }
  }
}

TEST(Rope, RotatesHalvesAsHuggingFaceLlama) {
  const RopeTables t = MakeRopeTables(100000.0, kDim, kMaxPos);
  const std::vector<int32_t> pos = {0, 1, 2, 5, 21, 39};
  const auto x = Random(kTokens * kHeads * kDim, 11);
  const auto y = Apply(t, pos, x, false);
  for (int64_t tok = 0; tok < kTokens; ++tok) {
    for (int64_t h = 0; h < kHeads; ++h) {
      const float* in = x.data() + (tok * kHeads + h) * kDim;
      const float* out = y.data() + (tok * kHeads + h) * kDim;
      for (int64_t i = 0; i < kDim / 2; ++i) {
        const double angle = pos[tok] * std::pow(100000.0, -2.0 * i / kDim);
        // q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q2, q1)
        EXPECT_NEAR(out[i], in[i] * std::cos(angle) - in[i + kDim / 2] * std::sin(angle), 1e-5);
        EXPECT_NEAR(out[i + kDim / 2], in[i + kDim / 2] * std::cos(angle) + in[i] * std::sin(angle),
                    1e-5);
      }
    }
  }
  // Position 0 is the identity.
  for (int64_t j = 0; j < kHeads * kDim; ++j) EXPECT_EQ(y[j], x[j]);
}

TEST(Rope, InverseIsTheBackward) {
  const RopeTables t = MakeRopeTables(10000.0, kDim, kMaxPos);
  const std::vector<int32_t> pos = {3, 1, 4, 1, 5, 9};
  auto x = Random(kTokens * kHeads * kDim, 12);
  const auto dy = Random(x.size(), 13);
  // Undoes the forward.
  const auto back = Apply(t, pos, Apply(t, pos, x, false), true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-6);
  // The inverse rotation of dy is d(dy . R x)/dx.
  const auto dx = Apply(t, pos, dy, true);
  ExpectGradient([&] { return Apply(t, pos, x, false); }, x, dy, dx, "dx");
}

TEST(Rope, RejectsPositionsOutsideTheTableAndOddHeadDim) {
  const RopeTables t = MakeRopeTables(10000.0, kDim, kMaxPos);
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, kMaxPos};
  std::vector<float> x(kTokens * kHeads * kDim, 1.0f);
  const absl::Status st = Rope(Cpu(), {.tokens = kTokens,
                                       .heads = kHeads,
                                       .head_dim = kDim,
                                       .max_positions = kMaxPos,
                                       .positions = pos.data(),
                                       .cos = t.cos.data(),
                                       .sin = t.sin.data(),
                                       .x = x.data()});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("positions[5] = 40"), std::string::npos) << st;
  for (float v : x) EXPECT_EQ(v, 1.0f);  // nothing written
  pos.back() = 0;
  EXPECT_EQ(Rope(Cpu(), {.tokens = kTokens,
                         .heads = kHeads,
                         .head_dim = 7,
                         .max_positions = kMaxPos,
                         .positions = pos.data(),
                         .cos = t.cos.data(),
                         .sin = t.sin.data(),
                         .x = x.data()})
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora::kernels
