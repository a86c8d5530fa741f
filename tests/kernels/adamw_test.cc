#include "kernels/adamw.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;

TEST(AdamW, ThreeStepsMatchTorchOptimAdamW) {
  // torch 1.13: p = [0.5, -1, 2] (float32), AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-8,
  // weight_decay=0.01), grads below, three opt.step() calls.
  std::vector<float> p = {0.5f, -1.0f, 2.0f}, m(3, 0.0f), v(3, 0.0f);
  const std::vector<std::vector<float>> grads = {
      {0.1f, 0.2f, -0.3f}, {0.5f, -0.5f, 0.0f}, {-1.0f, 0.25f, 2.0f}};
  const std::vector<std::vector<float>> want = {
      {0.3995000123977661f, -1.0989999771118164f, 2.0980000495910645f},
      {0.31299588084220886f, -1.0536794662475586f, 2.162907838821411f},
      {0.3393765687942505f, -1.0485352277755737f, 2.1052448749542236f}};
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(AdamWStep(Cpu(), AdamWArgs{.n = 3,
                                           .param = p.data(),
                                           .grad = grads[step - 1].data(),
                                           .m = m.data(),
                                           .v = v.data(),
                                           .lr = 0.1f,
                                           .weight_decay = 0.01f,
                                           .step = step})
                    .ok());
    // A few ulp: torch fuses some multiply-adds differently (addcmul, addcdiv).
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(p[i], want[step - 1][i], 2e-7) << "step " << step << " i " << i;
  }
}

TEST(AdamW, GradScaleEqualsPreScaledGradient) {
  std::vector<float> p1 = {1, 2}, p2 = p1, m1(2), v1(2), m2(2), v2(2);
  const std::vector<float> g = {0.4f, -0.8f}, g_half = {0.2f, -0.4f};
  ASSERT_TRUE(AdamWStep(Cpu(), AdamWArgs{.n = 2,
                                         .param = p1.data(),
                                         .grad = g.data(),
                                         .m = m1.data(),
                                         .v = v1.data(),
                                         .grad_scale = 0.5f})
                  .ok());
  ASSERT_TRUE(
      AdamWStep(
          Cpu(),
          AdamWArgs{
              .n = 2, .param = p2.data(), .grad = g_half.data(), .m = m2.data(), .v = v2.data()})
          .ok());
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
}

TEST(AdamW, RejectsBadHyperparameters) {
  std::vector<float> p(2), g(2), m(2), v(2);
  AdamWArgs a{.n = 2, .param = p.data(), .grad = g.data(), .m = m.data(), .v = v.data()};
  a.step = 0;
  EXPECT_EQ(AdamWStep(Cpu(), a).code(), absl::StatusCode::kInvalidArgument);
  a.step = 1;
  a.beta2 = 1.0f;
  EXPECT_EQ(AdamWStep(Cpu(), a).code(), absl::StatusCode::kInvalidArgument);
  a.beta2 = 0.999f;
  a.m = nullptr;
  EXPECT_EQ(AdamWStep(Cpu(), a).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora::kernels
