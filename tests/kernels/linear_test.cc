#include "kernels/linear.h"

#include <cstring>
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

TEST(Linear, ForwardSmallIntegersExact) {
  // x [2,3], W [2,3], b [2]: y = x W^T + b
  const std::vector<float> x = {1, 2, 3, 4, 5, 6}, w = {1, 0, -1, 2, 1, 0}, b = {10, 20};
  Guarded y(4);
  ASSERT_TRUE(LinearForward(Cpu(), LinearForwardArgs{.rows = 2,
                                                     .in_features = 3,
                                                     .out_features = 2,
                                                     .x = x.data(),
                                                     .w = WeightPtr::F32(w.data()),
                                                     .bias = b.data(),
                                                     .y = y.data()})
                  .ok());
  EXPECT_EQ(y.values(), (std::vector<float>{8, 24, 8, 33}));
  EXPECT_TRUE(y.GuardsIntact());
  // accumulate: y += x W^T + b
  ASSERT_TRUE(LinearForward(Cpu(), LinearForwardArgs{.rows = 2,
                                                     .in_features = 3,
                                                     .out_features = 2,
                                                     .x = x.data(),
                                                     .w = WeightPtr::F32(w.data()),
                                                     .bias = b.data(),
                                                     .y = y.data(),
                                                     .accumulate = true})
                  .ok());
  EXPECT_EQ(y.values(), (std::vector<float>{16, 48, 16, 66}));
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int64_t R = 3, I = 5, O = 4;
  auto x = Random(R * I, 11), w = Random(O * I, 12), b = Random(O, 13);
  const auto dy = Random(R * O, 14);
  auto forward = [&] {
    std::vector<float> y(R * O);
    EXPECT_TRUE(LinearForward(Cpu(), LinearForwardArgs{.rows = R,
                                                       .in_features = I,
                                                       .out_features = O,
                                                       .x = x.data(),
                                                       .w = WeightPtr::F32(w.data()),
                                                       .bias = b.data(),
                                                       .y = y.data()})
                    .ok());
    return y;
  };
  Guarded dx(R * I), dw(O * I), db(O);
  ASSERT_TRUE(LinearBackward(Cpu(), LinearBackwardArgs{.rows = R,
                                                       .in_features = I,
                                                       .out_features = O,
                                                       .x = x.data(),
                                                       .w = WeightPtr::F32(w.data()),
                                                       .dy = dy.data(),
                                                       .dx = dx.data(),
                                                       .dw = dw.data(),
                                                       .dbias = db.data()})
                  .ok());
  EXPECT_TRUE(dx.GuardsIntact() && dw.GuardsIntact() && db.GuardsIntact());
  ExpectGradient(forward, x, dy, dx.values(), "dx");
  ExpectGradient(forward, w, dy, dw.values(), "dW");
  ExpectGradient(forward, b, dy, db.values(), "db");

  // accumulate_dx / accumulate_params add on top of what is there.
  Guarded dx2(dx.values()), dw2(dw.values()), db2(db.values());
  ASSERT_TRUE(LinearBackward(Cpu(), LinearBackwardArgs{.rows = R,
                                                       .in_features = I,
                                                       .out_features = O,
                                                       .x = x.data(),
                                                       .w = WeightPtr::F32(w.data()),
                                                       .dy = dy.data(),
                                                       .dx = dx2.data(),
                                                       .accumulate_dx = true,
                                                       .dw = dw2.data(),
                                                       .dbias = db2.data(),
                                                       .accumulate_params = true})
                  .ok());
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx2[i], 2 * dx[i]);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 2 * dw[i]);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_FLOAT_EQ(db2[i], 2 * db[i]);
}

TEST(Linear, Bf16WeightEqualsWidenedFp32Weight) {
  const int64_t R = 4, I = 6, O = 300;  // O > kGemmBf16PanelRows: two panels
  const auto x = Random(R * I, 21), dy = Random(R * O, 22);
  auto w = Random(O * I, 23);
  std::vector<uint16_t> bits(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &w[i], 4);
    bits[i] = static_cast<uint16_t>(u >> 16);
    u &= 0xffff0000u;
    std::memcpy(&w[i], &u, 4);
  }
  LinearForwardArgs f{.rows = R,
                      .in_features = I,
                      .out_features = O,
                      .x = x.data(),
                      .w = WeightPtr::BF16(bits.data())};
  std::vector<float> ws(LinearWorkspaceBytes(f) / 4);
  ASSERT_GT(ws.size(), 0u);
  Guarded y16(R * O), y32(R * O);
  f.y = y16.data();
  EXPECT_EQ(LinearForward(Cpu(), f).code(), absl::StatusCode::kInvalidArgument);  // no workspace
  f.workspace = ws.data();
  f.workspace_bytes = ws.size() * 4;
  ASSERT_TRUE(LinearForward(Cpu(), f).ok());
  ASSERT_TRUE(LinearForward(Cpu(), LinearForwardArgs{.rows = R,
                                                     .in_features = I,
                                                     .out_features = O,
                                                     .x = x.data(),
                                                     .w = WeightPtr::F32(w.data()),
                                                     .y = y32.data()})
                  .ok());
  // Same values, same per-output-column sums (panels split columns): identical up to BLAS kernel
  // choice for the panel width; 1e-6 covers a different blocking.
  EXPECT_TRUE(AllClose(y16.values(), y32.values(), 1e-6, 1e-6));
  EXPECT_TRUE(y16.GuardsIntact());
  Guarded dx16(R * I), dx32(R * I);
  ASSERT_TRUE(LinearBackward(Cpu(), LinearBackwardArgs{.rows = R,
                                                       .in_features = I,
                                                       .out_features = O,
                                                       .w = WeightPtr::BF16(bits.data()),
                                                       .dy = dy.data(),
                                                       .dx = dx16.data(),
                                                       .workspace = ws.data(),
                                                       .workspace_bytes = ws.size() * 4})
                  .ok());
  ASSERT_TRUE(LinearBackward(Cpu(), LinearBackwardArgs{.rows = R,
                                                       .in_features = I,
                                                       .out_features = O,
                                                       .w = WeightPtr::F32(w.data()),
                                                       .dy = dy.data(),
                                                       .dx = dx32.data()})
                  .ok());
  // dx sums over O = 300 split into two k-panels: fp32 reassociation, ~300 * 6e-8 relative.
  EXPECT_TRUE(AllClose(dx16.values(), dx32.values(), 1e-5, 1e-5));
}

}  // namespace
}  // namespace fedlora::kernels
