#include "train/schedule.h"

#include "gtest/gtest.h"

namespace fedlora {
namespace {

LearningRateSchedule Make(const char* name, float lr, int64_t warmup, int64_t total) {
  auto s = MakeSchedule(name, {.base_lr = lr, .warmup_steps = warmup, .total_steps = total});
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Values are exact: every expected value below is base * (a ratio of small integers) and the
// implementation computes in double before one rounding to float.
TEST(Schedule, LinearWarmupThenDecay) {
  const auto s = Make("linear", 1.0f, 4, 12);
  EXPECT_EQ(s.LearningRateAt(0), 0.0f);
  EXPECT_EQ(s.LearningRateAt(1), 0.25f);
  EXPECT_EQ(s.LearningRateAt(3), 0.75f);
  EXPECT_EQ(s.LearningRateAt(4), 1.0f);     // end of warmup: peak
  EXPECT_EQ(s.LearningRateAt(8), 0.5f);     // half way through the decay
  EXPECT_EQ(s.LearningRateAt(11), 0.125f);  // last step of the run
  EXPECT_EQ(s.LearningRateAt(12), 0.0f);
  EXPECT_EQ(s.LearningRateAt(100), 0.0f);  // past the end: stays 0
  EXPECT_EQ(s.LearningRateAt(-3), 0.0f);
}

TEST(Schedule, LinearWithoutWarmupStartsAtPeak) {
  const auto s = Make("linear", 2.0f, 0, 8);
  EXPECT_EQ(s.LearningRateAt(0), 2.0f);
  EXPECT_EQ(s.LearningRateAt(4), 1.0f);
  EXPECT_EQ(s.LearningRateAt(8), 0.0f);
}

TEST(Schedule, CosineWarmupThenHalfCosine) {
  const auto s = Make("cosine", 1.0f, 2, 6);
  EXPECT_EQ(s.LearningRateAt(1), 0.5f);
  EXPECT_EQ(s.LearningRateAt(2), 1.0f);
  EXPECT_FLOAT_EQ(s.LearningRateAt(3), 0.5f * (1.0f + std::sqrt(0.5f)));  // cos(pi/4)
  EXPECT_FLOAT_EQ(s.LearningRateAt(4), 0.5f);                             // cos(pi/2) = 0
  EXPECT_NEAR(s.LearningRateAt(6), 0.0f, 1e-12);
  EXPECT_NEAR(s.LearningRateAt(50), 0.0f, 1e-12);
}

TEST(Schedule, ConstantHonoursWarmup) {
  const auto s = Make("constant", 0.5f, 2, 0);
  EXPECT_EQ(s.LearningRateAt(0), 0.0f);
  EXPECT_EQ(s.LearningRateAt(1), 0.25f);
  EXPECT_EQ(s.LearningRateAt(2), 0.5f);
  EXPECT_EQ(s.LearningRateAt(1000000), 0.5f);
}

TEST(Schedule, RejectsBadSettings) {
  EXPECT_EQ(MakeSchedule("step", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MakeSchedule("linear", {.base_lr = 1, .warmup_steps = 0, .total_steps = 0}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MakeSchedule("cosine", {.base_lr = 1, .warmup_steps = 5, .total_steps = 4}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSchedule("constant", {.base_lr = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MakeSchedule("LINEAR", {.base_lr = 1, .warmup_steps = 4, .total_steps = 4}).ok());
}

}  // namespace
}  // namespace fedlora
