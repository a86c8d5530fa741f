#include "kernels/reduce.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;
using testing::Guarded;

TEST(Reduce, SumSquaresOfIntegersIsExact) {
  // sum_{k=1}^{n} k^2 = n (n + 1) (2n + 1) / 6; n = 1000 -> 333,833,500 (exact in fp32? no: it
  // needs 29 bits; the double accumulation rounds once, to the nearest fp32).
  const int64_t n = 1000;
  std::vector<float> x(n);
  for (int64_t k = 0; k < n; ++k) x[k] = static_cast<float>(k + 1);
  float r = -1;
  ASSERT_TRUE(SumSquares(Cpu(), SumSquaresArgs{.n = n, .x = x.data(), .result = &r}).ok());
  EXPECT_EQ(r, static_cast<float>(333833500.0));
  // Accumulate across two tensors.
  const std::vector<float> y = {3, 4};
  float acc = 0;
  ASSERT_TRUE(SumSquares(Cpu(), SumSquaresArgs{.n = 2, .x = y.data(), .result = &acc}).ok());
  ASSERT_TRUE(
      SumSquares(Cpu(), SumSquaresArgs{.n = 2, .x = y.data(), .result = &acc, .accumulate = true})
          .ok());
  EXPECT_EQ(acc, 50.0f);
  // Independent of the thread count.
  ThreadPool one(1), three(3);
  float r1 = 0, r3 = 0;
  const auto big = testing::Random(100003, 91);
  ASSERT_TRUE(SumSquares(ExecContext{.pool = &one},
                         SumSquaresArgs{.n = 100003, .x = big.data(), .result = &r1})
                  .ok());
  ASSERT_TRUE(SumSquares(ExecContext{.pool = &three},
                         SumSquaresArgs{.n = 100003, .x = big.data(), .result = &r3})
                  .ok());
  EXPECT_EQ(r1, r3);
}

// One call for several tensors gives the bits of SumSquares on each in turn.
TEST(Reduce, SumSquaresManyIsSumSquaresPerTensorInTurn) {
  const std::vector<std::vector<float>> xs = {
      testing::Random(1000, 1), {}, testing::Random(7, 2), testing::Random(70001, 3)};
  std::vector<const float*> ptrs;
  std::vector<int64_t> ns;
  for (const auto& x : xs) {
    ptrs.push_back(x.data());
    ns.push_back(static_cast<int64_t>(x.size()));
  }
  for (bool accumulate : {false, true}) {
    float want = 2.5f, got = 2.5f;
    for (size_t t = 0; t < xs.size(); ++t) {
      ASSERT_TRUE(SumSquares(Cpu(), SumSquaresArgs{.n = ns[t],
                                                   .x = xs[t].data(),
                                                   .result = &want,
                                                   .accumulate = t > 0 || accumulate})
                      .ok());
    }
    ASSERT_TRUE(SumSquaresMany(Cpu(), SumSquaresManyArgs{.tensors = 4,
                                                         .x = ptrs.data(),
                                                         .n = ns.data(),
                                                         .result = &got,
                                                         .accumulate = accumulate})
                    .ok());
    EXPECT_EQ(got, want) << accumulate;
  }
  float none = 9.0f;
  ASSERT_TRUE(SumSquaresMany(Cpu(), SumSquaresManyArgs{.tensors = 0, .result = &none}).ok());
  EXPECT_EQ(none, 0.0f);
  const int64_t negative = -1;
  EXPECT_EQ(SumSquaresMany(
                Cpu(),
                SumSquaresManyArgs{.tensors = 1, .x = ptrs.data(), .n = &negative, .result = &none})
                .code(),
            absl::StatusCode::kInvalidArgument);
  const float* null_x = nullptr;
  EXPECT_EQ(
      SumSquaresMany(
          Cpu(), SumSquaresManyArgs{.tensors = 1, .x = &null_x, .n = ns.data(), .result = &none})
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(Reduce, ScaleAndColumnSum) {
  Guarded x(std::vector<float>{1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(Scale(Cpu(), ScaleArgs{.n = 6, .alpha = -2.0f, .x = x.data()}).ok());
  EXPECT_EQ(x.values(), (std::vector<float>{-2, -4, -6, -8, -10, -12}));
  EXPECT_TRUE(x.GuardsIntact());
  // x as [3, 2]: column sums -18, -24; accumulate onto {1, 1}.
  Guarded out(std::vector<float>{1, 1});
  ASSERT_TRUE(
      ColumnSum(
          Cpu(),
          ColumnSumArgs{.rows = 3, .cols = 2, .x = x.data(), .out = out.data(), .accumulate = true})
          .ok());
  EXPECT_EQ(out.values(), (std::vector<float>{-17, -23}));
  EXPECT_TRUE(out.GuardsIntact());
  // Wide enough to span several column blocks.
  const int64_t R = 7, C = 600;
  std::vector<float> m(R * C);
  for (int64_t i = 0; i < R * C; ++i) m[i] = static_cast<float>(i % C);
  Guarded cs(C);
  ASSERT_TRUE(
      ColumnSum(Cpu(), ColumnSumArgs{.rows = R, .cols = C, .x = m.data(), .out = cs.data()}).ok());
  for (int64_t j = 0; j < C; ++j) ASSERT_EQ(cs[j], 7.0f * j);
  EXPECT_TRUE(cs.GuardsIntact());
}

TEST(Elementwise, BiasAddAndAdd) {
  Guarded y(std::vector<float>{1, 1, 1, 1, 1, 1});
  const std::vector<float> b = {1, 2, 3};
  ASSERT_TRUE(
      BiasAdd(Cpu(), BiasAddArgs{.rows = 2, .cols = 3, .bias = b.data(), .y = y.data()}).ok());
  EXPECT_EQ(y.values(), (std::vector<float>{2, 3, 4, 2, 3, 4}));
  ASSERT_TRUE(
      BiasAdd(
          Cpu(),
          BiasAddArgs{.rows = 2, .cols = 3, .bias = b.data(), .y = y.data(), .accumulate = false})
          .ok());
  EXPECT_EQ(y.values(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_TRUE(y.GuardsIntact());
  const std::vector<float> a = {1, 2, 3}, c = {10, 20, 30};
  Guarded out(3);
  ASSERT_TRUE(
      Add(Cpu(), AddArgs{.n = 3, .a = a.data(), .b = c.data(), .alpha = 0.5f, .out = out.data()})
          .ok());
  EXPECT_EQ(out.values(), (std::vector<float>{6, 12, 18}));
  EXPECT_TRUE(out.GuardsIntact());
  EXPECT_EQ(Add(Cpu(), AddArgs{.n = 3, .a = a.data(), .out = out.data()}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora::kernels
