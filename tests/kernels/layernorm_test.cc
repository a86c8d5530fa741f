#include "kernels/layernorm.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::AllClose;
using testing::Cpu;
using testing::ExpectGradient;
using testing::Guarded;
using testing::Random;

TEST(LayerNorm, ForwardKnownRow) {
  // Row [1 2 3 4]: mean 2.5, biased variance 1.25, rstd = 1/sqrt(1.25) (eps 0).
  const std::vector<float> x = {1, 2, 3, 4}, gamma = {1, 1, 2, 2}, beta = {0, 0, 0, 1};
  Guarded y(4), mean(1), rstd(1);
  ASSERT_TRUE(LayerNormForward(Cpu(), LayerNormForwardArgs{.rows = 1,
                                                           .cols = 4,
                                                           .eps = 0.0f,
                                                           .x = x.data(),
                                                           .gamma = gamma.data(),
                                                           .beta = beta.data(),
                                                           .y = y.data(),
                                                           .mean = mean.data(),
                                                           .rstd = rstd.data()})
                  .ok());
  const float r = 1.0f / std::sqrt(1.25f);
  EXPECT_FLOAT_EQ(mean[0], 2.5f);
  EXPECT_FLOAT_EQ(rstd[0], r);
  EXPECT_FLOAT_EQ(y[0], -1.5f * r);
  EXPECT_FLOAT_EQ(y[1], -0.5f * r);
  EXPECT_FLOAT_EQ(y[2], 2 * 0.5f * r);
  EXPECT_FLOAT_EQ(y[3], 2 * 1.5f * r + 1);
  EXPECT_TRUE(y.GuardsIntact() && mean.GuardsIntact() && rstd.GuardsIntact());
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t R = 3, C = 8;
  auto x = Random(R * C, 41, -2, 2), gamma = Random(C, 42, 0.5f, 1.5f), beta = Random(C, 43);
  const auto dy = Random(R * C, 44);
  std::vector<float> mean(R), rstd(R);
  auto forward = [&] {
    std::vector<float> y(R * C);
    EXPECT_TRUE(LayerNormForward(Cpu(), LayerNormForwardArgs{.rows = R,
                                                             .cols = C,
                                                             .eps = 1e-5f,
                                                             .x = x.data(),
                                                             .gamma = gamma.data(),
                                                             .beta = beta.data(),
                                                             .y = y.data(),
                                                             .mean = mean.data(),
                                                             .rstd = rstd.data()})
                    .ok());
    return y;
  };
  forward();
  Guarded dx(R * C), dg(C), db(C);
  ASSERT_TRUE(LayerNormBackward(Cpu(), LayerNormBackwardArgs{.rows = R,
                                                             .cols = C,
                                                             .x = x.data(),
                                                             .gamma = gamma.data(),
                                                             .mean = mean.data(),
                                                             .rstd = rstd.data(),
                                                             .dy = dy.data(),
                                                             .dx = dx.data(),
                                                             .dgamma = dg.data(),
                                                             .dbeta = db.data()})
                  .ok());
  EXPECT_TRUE(dx.GuardsIntact() && dg.GuardsIntact() && db.GuardsIntact());
  ExpectGradient(forward, x, dy, dx.values(), "dx");
  ExpectGradient(forward, gamma, dy, dg.values(), "dgamma");
  ExpectGradient(forward, beta, dy, db.values(), "dbeta");

  // dx only (frozen LayerNorm), in place over dy, accumulate params doubling.
  std::vector<float> inplace = dy;
  ASSERT_TRUE(LayerNormBackward(Cpu(), LayerNormBackwardArgs{.rows = R,
                                                             .cols = C,
                                                             .x = x.data(),
                                                             .gamma = gamma.data(),
                                                             .mean = mean.data(),
                                                             .rstd = rstd.data(),
                                                             .dy = inplace.data(),
                                                             .dx = inplace.data()})
                  .ok());
  EXPECT_TRUE(AllClose(inplace, dx.values(), 0, 0));
  Guarded dg2(dg.values());
  ASSERT_TRUE(LayerNormBackward(Cpu(), LayerNormBackwardArgs{.rows = R,
                                                             .cols = C,
                                                             .x = x.data(),
                                                             .mean = mean.data(),
                                                             .rstd = rstd.data(),
                                                             .dy = dy.data(),
                                                             .dgamma = dg2.data(),
                                                             .accumulate_params = true})
                  .ok());
  for (int64_t j = 0; j < C; ++j) EXPECT_FLOAT_EQ(dg2[j], 2 * dg[j]);
}

TEST(LayerNorm, BackwardWithNoRowsGivesZeroParameterGradients) {
  Guarded dg(3, 7.0f), db(3, 7.0f);
  ASSERT_TRUE(LayerNormBackward(Cpu(),
                                LayerNormBackwardArgs{
                                    .rows = 0, .cols = 3, .dgamma = dg.data(), .dbeta = db.data()})
                  .ok());
  EXPECT_EQ(dg.values(), std::vector<float>(3, 0.0f));
  EXPECT_EQ(db.values(), std::vector<float>(3, 0.0f));
  // Accumulating: nothing to add.
  Guarded acc(3, 7.0f);
  ASSERT_TRUE(
      LayerNormBackward(Cpu(),
                        LayerNormBackwardArgs{
                            .rows = 0, .cols = 3, .dgamma = acc.data(), .accumulate_params = true})
          .ok());
  EXPECT_EQ(acc.values(), std::vector<float>(3, 7.0f));
  EXPECT_TRUE(dg.GuardsIntact() && db.GuardsIntact() && acc.GuardsIntact());
}

TEST(LayerNorm, RejectsBadArguments) {
  std::vector<float> x(8), g(4), y(8), m(2);
  EXPECT_EQ(LayerNormForward(
                Cpu(), LayerNormForwardArgs{.rows = 2, .cols = 4, .x = x.data(), .y = y.data()})
                .code(),
            absl::StatusCode::kInvalidArgument);  // no gamma
  EXPECT_EQ(LayerNormForward(Cpu(), LayerNormForwardArgs{.rows = 2,
                                                         .cols = 4,
                                                         .x = x.data(),
                                                         .gamma = g.data(),
                                                         .y = y.data(),
                                                         .mean = m.data()})
                .code(),
            absl::StatusCode::kInvalidArgument);  // mean without rstd
  EXPECT_EQ(
      LayerNormBackward(Cpu(), LayerNormBackwardArgs{.rows = 2, .cols = 4, .dy = y.data()}).code(),
      absl::StatusCode::kInvalidArgument);  // nothing requested
}

}  // namespace
}  // namespace fedlora::kernels
