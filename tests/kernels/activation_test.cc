#include "kernels/activation.h"

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

TEST(Activation, GeluKnownValues) {
  // 0.5 * x * (1 + erf(x / sqrt(2))) in double (Python math.erf); fp32 erf is good to ~1e-7.
  const std::vector<float> x = {-3, -1, 0, 1, 3};
  const std::vector<double> want = {-0.00404969409489031, -0.15865525393145707, 0.0,
                                    0.8413447460685429, 2.99595030590511};
  Guarded y(x.size());
  ASSERT_TRUE(
      ActivationForward(
          Cpu(),
          ActivationForwardArgs{.kind = Activation::kGelu, .n = 5, .x = x.data(), .y = y.data()})
          .ok());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-6) << x[i];
  EXPECT_TRUE(y.GuardsIntact());
}

TEST(Activation, TanhKnownValues) {
  const std::vector<float> x = {-1, 0, 0.5f};
  Guarded y(3);
  ASSERT_TRUE(
      ActivationForward(
          Cpu(),
          ActivationForwardArgs{.kind = Activation::kTanh, .n = 3, .x = x.data(), .y = y.data()})
          .ok());
  EXPECT_NEAR(y[0], -0.7615941559, 1e-7);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_NEAR(y[2], 0.4621171573, 1e-7);
}

TEST(Activation, BackwardMatchesFiniteDifferences) {
  for (Activation kind : {Activation::kGelu, Activation::kTanh}) {
    const int64_t n = 40;
    auto x = Random(n, 51, -3, 3);
    const auto dy = Random(n, 52);
    auto forward = [&] {
      std::vector<float> y(n);
      EXPECT_TRUE(
          ActivationForward(
              Cpu(), ActivationForwardArgs{.kind = kind, .n = n, .x = x.data(), .y = y.data()})
              .ok());
      return y;
    };
    const auto y = forward();
    Guarded dx(n);
    ASSERT_TRUE(
        ActivationBackward(
            Cpu(), ActivationBackwardArgs{.kind = kind,
                                          .n = n,
                                          .saved = kind == Activation::kGelu ? x.data() : y.data(),
                                          .dy = dy.data(),
                                          .dx = dx.data()})
            .ok());
    EXPECT_TRUE(dx.GuardsIntact());
    ExpectGradient(forward, x, dy, dx.values(), kind == Activation::kGelu ? "gelu dx" : "tanh dx");
  }
}

TEST(Activation, ForwardInPlaceAndAccumulate) {
  std::vector<float> x = {1, 2};
  ASSERT_TRUE(
      ActivationForward(
          Cpu(),
          ActivationForwardArgs{.kind = Activation::kTanh, .n = 2, .x = x.data(), .y = x.data()})
          .ok());
  EXPECT_FLOAT_EQ(x[0], std::tanh(1.0f));
  std::vector<float> dx = {10, 10}, dy = {1, 1}, y = {0.5f, 0};
  ASSERT_TRUE(ActivationBackward(Cpu(), ActivationBackwardArgs{.kind = Activation::kTanh,
                                                               .n = 2,
                                                               .saved = y.data(),
                                                               .dy = dy.data(),
                                                               .dx = dx.data(),
                                                               .accumulate_dx = true})
                  .ok());
  EXPECT_FLOAT_EQ(dx[0], 10.75f);  // 10 + (1 - 0.25)
  EXPECT_FLOAT_EQ(dx[1], 11.0f);
}

}  // namespace
}  // namespace fedlora::kernels
