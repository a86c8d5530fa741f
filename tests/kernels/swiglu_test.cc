#include "kernels/swiglu.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;
using testing::ExpectGradient;
using testing::Random;

constexpr int64_t kN = 203;

std::vector<float> Forward(const std::vector<float>& gate, const std::vector<float>& up) {
  std::vector<float> y(kN);
  EXPECT_TRUE(
      SwiGluForward(Cpu(), {.n = kN, .gate = gate.data(), .up = up.data(), .y = y.data()}).ok());
  return y;
}

TEST(SwiGlu, ForwardMatchesDefinition) {
  auto gate = Random(kN, 1, -8.0f, 8.0f);
  gate[0] = -100.0f;  // silu underflows to -0
  gate[1] = 100.0f;   // silu(x) = x
  const auto up = Random(kN, 2, -2.0f, 2.0f);
  const auto y = Forward(gate, up);
  for (int64_t i = 0; i < kN; ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(y[i], want, 2e-6 * std::max(1.0, std::abs(want))) << i;
  }
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  auto gate = Random(kN, 3, -4.0f, 4.0f);
  auto up = Random(kN, 4);
  const auto dy = Random(kN, 5);
  std::vector<float> dgate(kN), dup(kN);
  ASSERT_TRUE(SwiGluBackward(Cpu(), {.n = kN,
                                     .gate = gate.data(),
                                     .up = up.data(),
                                     .dy = dy.data(),
                                     .dgate = dgate.data(),
                                     .dup = dup.data()})
                  .ok());
  auto fwd = [&] { return Forward(gate, up); };
  ExpectGradient(fwd, gate, dy, dgate, "dgate");
  ExpectGradient(fwd, up, dy, dup, "dup");
  // In place over the saved tensors gives the same gradients.
  std::vector<float> g2 = gate, u2 = up;
  ASSERT_TRUE(SwiGluBackward(Cpu(), {.n = kN,
                                     .gate = g2.data(),
                                     .up = u2.data(),
                                     .dy = dy.data(),
                                     .dgate = g2.data(),
                                     .dup = u2.data()})
                  .ok());
  EXPECT_EQ(g2, dgate);
  EXPECT_EQ(u2, dup);
}

TEST(SwiGlu, RejectsNullPointers) {
  std::vector<float> a(kN);
  EXPECT_EQ(SwiGluForward(Cpu(), {.n = kN, .gate = a.data(), .y = a.data()}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SwiGluBackward(Cpu(), {.n = kN, .gate = a.data(), .up = a.data(), .dy = a.data()}).code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora::kernels
