#include "kernels/cross_entropy.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;
using testing::Guarded;
using testing::Random;

TEST(CrossEntropy, KnownLossesMatchPyTorch) {
  // torch.nn.functional.cross_entropy in float64 on these logits: labels {2, -100} -> 0.40760596444438,
  // labels {0, 1} -> 1.75310912655625.
  const std::vector<float> logits = {1, 2, 3, 0, 0, 0};
  Guarded loss(1), dl(6);
  std::vector<int32_t> labels = {2, kIgnoreIndex};
  ASSERT_TRUE(SoftmaxCrossEntropy(Cpu(), CrossEntropyArgs{.batch = 2,
                                                          .classes = 3,
                                                          .logits = logits.data(),
                                                          .labels = labels.data(),
                                                          .loss = loss.data(),
                                                          .dlogits = dl.data()})
                  .ok());
  EXPECT_NEAR(loss[0], 0.4076059644443804, 1e-6);
  // Ignored row: zero gradient. Valid row: softmax - onehot, N = 1.
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(dl[0], std::exp(1.0) / z, 1e-6);
  EXPECT_NEAR(dl[2], std::exp(3.0) / z - 1.0, 1e-6);
  for (int j = 3; j < 6; ++j) EXPECT_EQ(dl[j], 0.0f);
  EXPECT_TRUE(loss.GuardsIntact() && dl.GuardsIntact());
  labels = {0, 1};
  ASSERT_TRUE(SoftmaxCrossEntropy(Cpu(), CrossEntropyArgs{.batch = 2,
                                                          .classes = 3,
                                                          .logits = logits.data(),
                                                          .labels = labels.data(),
                                                          .loss = loss.data()})
                  .ok());
  EXPECT_NEAR(loss[0], 1.7531091265562453, 1e-6);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t B = 4, C = 5;
  auto logits = Random(B * C, 81, -2, 2);
  const std::vector<int32_t> labels = {3, 0, kIgnoreIndex, 4};
  std::vector<float> dl(B * C);
  float loss = 0;
  ASSERT_TRUE(SoftmaxCrossEntropy(Cpu(), CrossEntropyArgs{.batch = B,
                                                          .classes = C,
                                                          .logits = logits.data(),
                                                          .labels = labels.data(),
                                                          .loss = &loss,
                                                          .dlogits = dl.data(),
                                                          .loss_scale = 0.5f})
                  .ok());
  auto forward = [&] {
    float l = 0;
    EXPECT_TRUE(SoftmaxCrossEntropy(Cpu(), CrossEntropyArgs{.batch = B,
                                                            .classes = C,
                                                            .logits = logits.data(),
                                                            .labels = labels.data(),
                                                            .loss = &l})
                    .ok());
    return std::vector<float>{l};
  };
  testing::ExpectGradient(forward, logits, {0.5f}, dl,
                          "dlogits");  // loss_scale 0.5 == projection weight
}

TEST(CrossEntropy, InPlaceAllIgnoredAndBadLabels) {
  std::vector<float> logits = {1, 2, 3, 4};
  std::vector<int32_t> labels = {kIgnoreIndex, kIgnoreIndex};
  float loss = -1;
  ASSERT_TRUE(SoftmaxCrossEntropy(Cpu(), CrossEntropyArgs{.batch = 2,
                                                          .classes = 2,
                                                          .logits = logits.data(),
                                                          .labels = labels.data(),
                                                          .loss = &loss,
                                                          .dlogits = logits.data()})
                  .ok());
  EXPECT_EQ(loss, 0.0f);
  EXPECT_EQ(logits, (std::vector<float>{0, 0, 0, 0}));
  labels = {0, 2};
  EXPECT_EQ(SoftmaxCrossEntropy(Cpu(), CrossEntropyArgs{.batch = 2,
                                                        .classes = 2,
                                                        .logits = logits.data(),
                                                        .labels = labels.data(),
                                                        .loss = &loss})
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora::kernels
