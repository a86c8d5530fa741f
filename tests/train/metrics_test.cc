#include "train/metrics.h"

#include <cmath>

#include "gtest/gtest.h"

namespace fedlora {
namespace {

// y_true = [0,0,1,1,2,2,2], y_pred = [0,1,1,1,2,0,3] over 5 classes. scikit-learn 1.2:
// f1_score(average=None) = [0.5, 0.8, 0.5, 0.0] for the classes {0,1,2,3} present;
// f1_score(average="macro") = 0.45 (class 4, in neither list, is not averaged).
TEST(Metrics, MacroF1MatchesSklearnDefault) {
  MetricsAccumulator acc(5);
  const int32_t truth[] = {0, 0, 1, 1, 2, 2, 2}, pred[] = {0, 1, 1, 1, 2, 0, 3};
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(acc.AddPrediction(truth[i], pred[i], 0.0).ok());
  const ClassificationMetrics m = acc.Result();
  EXPECT_EQ(m.count, 7);
  EXPECT_DOUBLE_EQ(m.accuracy, 4.0 / 7.0);
  EXPECT_DOUBLE_EQ(m.macro_f1, 0.45);
  ASSERT_EQ(m.f1_per_class.size(), 5u);
  EXPECT_DOUBLE_EQ(m.f1_per_class[0], 0.5);
  EXPECT_DOUBLE_EQ(m.f1_per_class[1], 0.8);
  EXPECT_DOUBLE_EQ(m.f1_per_class[2], 0.5);
  EXPECT_DOUBLE_EQ(m.f1_per_class[3], 0.0);  // predicted once, never true: zero_division=0
  EXPECT_DOUBLE_EQ(m.f1_per_class[4], 0.0);
  EXPECT_EQ(m.confusion[0], (std::vector<int64_t>{1, 1, 0, 0, 0}));
  EXPECT_EQ(m.confusion[2], (std::vector<int64_t>{1, 0, 1, 1, 0}));
}

TEST(Metrics, LossAndPredictionsFromLogits) {
  MetricsAccumulator acc(3);
  // Row 0: uniform logits -> loss ln 3, argmax tie goes to class 0 (label 0: correct).
  // Row 1: logits (0, ln 4, 0) -> p(label 1) = 4/6 -> loss ln 1.5, predicted 1 (correct).
  // Row 2: logits (2, 0, 0), label 2 -> loss = ln(e^2 + 2) - 0, predicted 0 (wrong).
  const std::vector<float> logits = {1, 1, 1, 0, std::log(4.0f), 0, 2, 0, 0};
  const std::vector<int32_t> labels = {0, 1, 2};
  ASSERT_TRUE(acc.AddLogits(logits, labels).ok());
  const ClassificationMetrics m = acc.Result();
  const double expected = (std::log(3.0) + std::log(1.5) + std::log(std::exp(2.0) + 2.0)) / 3.0;
  EXPECT_NEAR(m.loss, expected, 1e-6);  // fp32 logits: ln 4 carries ~1e-7 rounding
  EXPECT_DOUBLE_EQ(m.accuracy, 2.0 / 3.0);
  // Class 0: tp 1, support 1, predicted 2 -> 2/3. Class 1: 1. Class 2: 0.
  EXPECT_DOUBLE_EQ(m.macro_f1, (2.0 / 3.0 + 1.0 + 0.0) / 3.0);
}

TEST(Metrics, MergeEqualsOneAccumulator) {
  MetricsAccumulator a(2), b(2), all(2);
  ASSERT_TRUE(a.AddPrediction(0, 0, 0.5).ok());
  ASSERT_TRUE(b.AddPrediction(1, 0, 1.5).ok());
  ASSERT_TRUE(all.AddPrediction(0, 0, 0.5).ok());
  ASSERT_TRUE(all.AddPrediction(1, 0, 1.5).ok());
  ASSERT_TRUE(a.Merge(b).ok());
  EXPECT_EQ(a.Result().confusion, all.Result().confusion);
  EXPECT_DOUBLE_EQ(a.Result().loss, 1.0);
  EXPECT_EQ(a.Merge(MetricsAccumulator(3)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Metrics, RejectsBadInputAndHandlesEmpty) {
  MetricsAccumulator acc(2);
  const std::vector<float> logits = {0, 1, 1, 0};
  EXPECT_EQ(acc.AddLogits(logits, std::vector<int32_t>{0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.AddLogits(logits, std::vector<int32_t>{0, 2}).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<float> nan_logits = {0, NAN, 1, 0};
  EXPECT_EQ(acc.AddLogits(nan_logits, std::vector<int32_t>{0, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.AddPrediction(-1, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  const ClassificationMetrics m = acc.Result();  // nothing was added by the failed calls
  EXPECT_EQ(m.count, 0);
  EXPECT_EQ(m.macro_f1, 0.0);
  EXPECT_EQ(m.ToJson(), "{\"count\":0,\"loss\":0,\"accuracy\":0,\"macro_f1\":0}");
}

}  // namespace
}  // namespace fedlora
