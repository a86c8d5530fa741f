#include "kernels/rmsnorm.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;
using testing::ExpectGradient;
using testing::Guarded;
using testing::Random;

constexpr int64_t kRows = 5, kCols = 37;  // odd width: exercises the 8-lane tails

std::vector<float> Forward(const std::vector<float>& x, const std::vector<float>& gamma, float eps,
                           std::vector<float>* rstd = nullptr) {
  std::vector<float> y(x.size()), r(kRows);
  EXPECT_TRUE(RmsNormForward(Cpu(), {.rows = kRows,
                                     .cols = kCols,
                                     .eps = eps,
                                     .x = x.data(),
                                     .gamma = gamma.data(),
                                     .y = y.data(),
                                     .rstd = r.data()})
                  .ok());
  if (rstd != nullptr) *rstd = r;
  return y;
}

TEST(RmsNorm, ForwardMatchesDefinition) {
  const auto x = Random(kRows * kCols, 1, -3.0f, 3.0f);
  const auto gamma = Random(kCols, 2, 0.5f, 1.5f);
  std::vector<float> rstd;
  const auto y = Forward(x, gamma, 1e-5f, &rstd);
  for (int64_t r = 0; r < kRows; ++r) {
    double sq = 0;
    for (int64_t j = 0; j < kCols; ++j) sq += double(x[r * kCols + j]) * x[r * kCols + j];
    const double want_rstd = 1.0 / std::sqrt(sq / kCols + 1e-5);
    EXPECT_NEAR(rstd[r], want_rstd, 1e-6 * want_rstd);
    for (int64_t j = 0; j < kCols; ++j) {
      EXPECT_NEAR(y[r * kCols + j], gamma[j] * x[r * kCols + j] * want_rstd, 2e-6);
    }
  }
}

TEST(RmsNorm, InPlaceEqualsOutOfPlace) {
  const auto x = Random(kRows * kCols, 3);
  const auto gamma = Random(kCols, 4);
  const auto want = Forward(x, gamma, 1e-6f);
  std::vector<float> inplace = x;
  ASSERT_TRUE(RmsNormForward(Cpu(), {.rows = kRows,
                                     .cols = kCols,
                                     .x = inplace.data(),
                                     .gamma = gamma.data(),
                                     .y = inplace.data()})
                  .ok());
  EXPECT_EQ(inplace, want);
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  auto x = Random(kRows * kCols, 5);
  auto gamma = Random(kCols, 6, 0.5f, 1.5f);
  const auto dy = Random(kRows * kCols, 7);
  std::vector<float> rstd;
  Forward(x, gamma, 1e-6f, &rstd);
  Guarded dx(kRows * kCols), dgamma(kCols);
  ASSERT_TRUE(RmsNormBackward(Cpu(), {.rows = kRows,
                                      .cols = kCols,
                                      .x = x.data(),
                                      .gamma = gamma.data(),
                                      .rstd = rstd.data(),
                                      .dy = dy.data(),
                                      .dx = dx.data(),
                                      .dgamma = dgamma.data()})
                  .ok());
  EXPECT_TRUE(dx.GuardsIntact() && dgamma.GuardsIntact());
  auto fwd = [&] { return Forward(x, gamma, 1e-6f); };
  ExpectGradient(fwd, x, dy, dx.values(), "dx");
  ExpectGradient(fwd, gamma, dy, dgamma.values(), "dgamma");

  // Accumulation adds to what is there.
  Guarded dx2(kRows * kCols, 1.0f), dgamma2(kCols, 2.0f);
  ASSERT_TRUE(RmsNormBackward(Cpu(), {.rows = kRows,
                                      .cols = kCols,
                                      .x = x.data(),
                                      .gamma = gamma.data(),
                                      .rstd = rstd.data(),
                                      .dy = dy.data(),
                                      .dx = dx2.data(),
                                      .accumulate_dx = true,
                                      .dgamma = dgamma2.data(),
                                      .accumulate_params = true})
                  .ok());
  for (int64_t i = 0; i < kRows * kCols; ++i) EXPECT_FLOAT_EQ(dx2[i], dx[i] + 1.0f);
  // (summed from 2 onwards: another rounding order)
  for (int64_t j = 0; j < kCols; ++j) EXPECT_NEAR(dgamma2[j], dgamma[j] + 2.0f, 1e-5);
}

TEST(RmsNorm, RejectsBadArguments) {
  std::vector<float> x(kCols), g(kCols), y(kCols);
  EXPECT_EQ(
      RmsNormForward(
          Cpu(),
          {.rows = 1, .cols = kCols, .eps = -1.0f, .x = x.data(), .gamma = g.data(), .y = y.data()})
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormForward(Cpu(), {.rows = 1, .cols = kCols, .x = x.data(), .y = y.data()}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      RmsNormBackward(Cpu(), {.rows = 1, .cols = kCols, .x = x.data(), .dy = y.data()}).code(),
      absl::StatusCode::kInvalidArgument);  // nothing requested
}

}  // namespace
}  // namespace fedlora::kernels
