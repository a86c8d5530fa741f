// Every CPU kernel that sums across ParallelFor chunks gives the same bits at every pool width: the
// simulator (sim/simulator.h) changes a client's width between kernels as other clients start and
// finish, and promises results that do not depend on it. The GEMM's own check is in gemm_test.cc.
#include <cstring>
#include <functional>
#include <vector>

#include "core/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cross_entropy.h"
#include "kernels/layernorm.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Random;

// Runs `op` on a 3-thread pool at widths 1, 2 and 3; its outputs must agree bit for bit.
void ExpectSameBitsAtWidths123(const char* what,
                               const std::function<std::vector<float>(const ExecContext&)>& op) {
  ThreadPool pool(3);
  pool.SetWidth(1);
  const std::vector<float> want = op(ExecContext{.pool = &pool});
  for (int width : {2, 3}) {
    pool.SetWidth(width);
    const std::vector<float> got = op(ExecContext{.pool = &pool});
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << what << " at width " << width;
  }
}

TEST(ThreadInvariance, LayerNormBackward) {
  for (int64_t cols : {384, 576, 1536}) {
    const int64_t rows = 1024;
    const auto x = Random(rows * cols, 1), gamma = Random(cols, 2), dy = Random(rows * cols, 3);
    const auto dgamma0 = Random(cols, 4), dbeta0 = Random(cols, 5);
    ExpectSameBitsAtWidths123("LayerNormBackward", [&](const ExecContext& ctx) {
      std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx(rows * cols), dgamma = dgamma0,
                                                                                  dbeta = dbeta0;
      EXPECT_TRUE(LayerNormForward(ctx, {.rows = rows,
                                         .cols = cols,
                                         .x = x.data(),
                                         .gamma = gamma.data(),
                                         .y = y.data(),
                                         .mean = mean.data(),
                                         .rstd = rstd.data()})
                      .ok());
      EXPECT_TRUE(LayerNormBackward(ctx, {.rows = rows,
                                          .cols = cols,
                                          .x = x.data(),
                                          .gamma = gamma.data(),
                                          .mean = mean.data(),
                                          .rstd = rstd.data(),
                                          .dy = dy.data(),
                                          .dx = dx.data(),
                                          .dgamma = dgamma.data(),
                                          .dbeta = dbeta.data(),
                                          .accumulate_params = true})
                      .ok());
      std::vector<float> out = y;
      for (const auto* v : {&mean, &rstd, &dx, &dgamma, &dbeta})
        out.insert(out.end(), v->begin(), v->end());
      return out;
    });
  }
}

TEST(ThreadInvariance, RmsNormBackward) {
  const int64_t rows = 1024, cols = 576;
  const auto x = Random(rows * cols, 6), gamma = Random(cols, 7), dy = Random(rows * cols, 8);
  ExpectSameBitsAtWidths123("RmsNormBackward", [&](const ExecContext& ctx) {
    std::vector<float> y(rows * cols), rstd(rows), dx(rows * cols), dgamma(cols);
    EXPECT_TRUE(RmsNormForward(ctx, {.rows = rows,
                                     .cols = cols,
                                     .x = x.data(),
                                     .gamma = gamma.data(),
                                     .y = y.data(),
                                     .rstd = rstd.data()})
                    .ok());
    EXPECT_TRUE(RmsNormBackward(ctx, {.rows = rows,
                                      .cols = cols,
                                      .x = x.data(),
                                      .gamma = gamma.data(),
                                      .rstd = rstd.data(),
                                      .dy = dy.data(),
                                      .dx = dx.data(),
                                      .dgamma = dgamma.data()})
                    .ok());
    std::vector<float> out = y;
    for (const auto* v : {&rstd, &dx, &dgamma}) out.insert(out.end(), v->begin(), v->end());
    return out;
  });
}

TEST(ThreadInvariance, ColumnSumAndSumSquares) {
  const int64_t rows = 1024, cols = 1536;
  const auto x = Random(rows * cols, 9);
  ExpectSameBitsAtWidths123("ColumnSum", [&](const ExecContext& ctx) {
    std::vector<float> out(cols);
    EXPECT_TRUE(
        ColumnSum(ctx, {.rows = rows, .cols = cols, .x = x.data(), .out = out.data()}).ok());
    return out;
  });
  for (int64_t n : {int64_t{1000}, int64_t{100003}, rows * cols}) {
    ExpectSameBitsAtWidths123("SumSquares", [&](const ExecContext& ctx) {
      std::vector<float> out = {0.25f};
      EXPECT_TRUE(
          SumSquares(ctx, {.n = n, .x = x.data(), .result = out.data(), .accumulate = true}).ok());
      return out;
    });
  }
}

TEST(ThreadInvariance, SoftmaxCrossEntropy) {
  for (const auto& shape : {std::pair<int64_t, int64_t>{16, 8}, {1024, 4096}}) {
    // Plain locals, not a structured binding: clang 14 (the sanitize preset) cannot capture one.
    const int64_t batch = shape.first, classes = shape.second;
    const auto logits = Random(batch * classes, 10, -4.0f, 4.0f);
    std::vector<int32_t> labels(batch);
    for (int64_t b = 0; b < batch; ++b)
      labels[b] = b % 7 == 3 ? kIgnoreIndex : static_cast<int32_t>((b * 31) % classes);
    ExpectSameBitsAtWidths123("SoftmaxCrossEntropy", [&](const ExecContext& ctx) {
      std::vector<float> out(1 + batch * classes);
      EXPECT_TRUE(SoftmaxCrossEntropy(ctx, {.batch = batch,
                                            .classes = classes,
                                            .logits = logits.data(),
                                            .labels = labels.data(),
                                            .loss = out.data(),
                                            .dlogits = out.data() + 1})
                      .ok());
      return out;
    });
  }
}

}  // namespace
}  // namespace fedlora::kernels
