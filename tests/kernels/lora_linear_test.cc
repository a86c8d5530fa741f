#include "kernels/lora_linear.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/dropout.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::AllClose;
using testing::Cpu;
using testing::ExpectGradient;
using testing::Guarded;
using testing::Random;

struct LoraCase {
  int64_t R = 5, I = 7, O = 6, r = 3;
  float scaling = 2.0f;  // alpha / r with alpha = 6
  DropoutSpec dropout;
  std::vector<float> x, w, b, A, B;
  LoraCase(DropoutSpec d) : dropout(d) {
    x = Random(R * I, 31);
    w = Random(O * I, 32);
    b = Random(O, 33);
    A = Random(r * I, 34);
    B = Random(O * r, 35);
  }
  LoraLinearForwardArgs Fwd(float* y, float* h, std::vector<float>& ws) {
    LoraLinearForwardArgs f{.rows = R,
                            .in_features = I,
                            .out_features = O,
                            .rank = r,
                            .x = x.data(),
                            .w = WeightPtr::F32(w.data()),
                            .bias = b.data(),
                            .lora_a = A.data(),
                            .lora_b = B.data(),
                            .scaling = scaling,
                            .dropout = dropout,
                            .y = y,
                            .h = h};
    ws.assign(LoraLinearWorkspaceBytes(f) / 4 + 1, 0.0f);
    f.workspace = ws.data();
    f.workspace_bytes = ws.size() * 4;
    return f;
  }
  std::vector<float> Forward() {
    std::vector<float> y(R * O), h(R * r), ws;
    EXPECT_TRUE(LoraLinearForward(Cpu(), Fwd(y.data(), h.data(), ws)).ok());
    return y;
  }
};

TEST(LoraLinear, ForwardMatchesFormula) {
  for (float p : {0.0f, 0.4f}) {
    LoraCase c(DropoutSpec{.p = p, .seed = 7, .offset = 100});
    // Reference in double: xd from the Dropout op (its own test pins the mask).
    std::vector<float> xd(c.x.size());
    ASSERT_TRUE(Dropout(Cpu(), DropoutArgs{.n = static_cast<int64_t>(xd.size()),
                                           .spec = c.dropout,
                                           .x = c.x.data(),
                                           .out = xd.data()})
                    .ok());
    std::vector<float> want(c.R * c.O), want_h(c.R * c.r);
    for (int64_t t = 0; t < c.R; ++t) {
      for (int64_t k = 0; k < c.r; ++k) {
        double s = 0;
        for (int64_t i = 0; i < c.I; ++i) s += double(xd[t * c.I + i]) * c.A[k * c.I + i];
        want_h[t * c.r + k] = static_cast<float>(s);
      }
      for (int64_t o = 0; o < c.O; ++o) {
        double s = c.b[o];
        for (int64_t i = 0; i < c.I; ++i) s += double(c.x[t * c.I + i]) * c.w[o * c.I + i];
        for (int64_t k = 0; k < c.r; ++k)
          s += c.scaling * double(want_h[t * c.r + k]) * c.B[o * c.r + k];
        want[t * c.O + o] = static_cast<float>(s);
      }
    }
    Guarded y(c.R * c.O), h(c.R * c.r);
    std::vector<float> ws;
    ASSERT_TRUE(LoraLinearForward(Cpu(), c.Fwd(y.data(), h.data(), ws)).ok());
    // fp32 sums of ~10 O(1) products: 1e-5.
    EXPECT_TRUE(AllClose(y.values(), want, 1e-5, 1e-5)) << "p=" << p;
    EXPECT_TRUE(AllClose(h.values(), want_h, 1e-5, 1e-5)) << "p=" << p;
    EXPECT_TRUE(y.GuardsIntact() && h.GuardsIntact());
  }
}

TEST(LoraLinear, BackwardMatchesFiniteDifferences) {
  for (float p : {0.0f, 0.3f}) {
    LoraCase c(DropoutSpec{.p = p, .seed = 99, .offset = 12});
    std::vector<float> y(c.R * c.O), h(c.R * c.r), fws;
    ASSERT_TRUE(LoraLinearForward(Cpu(), c.Fwd(y.data(), h.data(), fws)).ok());
    const auto dy = Random(c.R * c.O, 36);
    Guarded dx(c.R * c.I), da(c.r * c.I), db(c.O * c.r);
    LoraLinearBackwardArgs bw{.rows = c.R,
                              .in_features = c.I,
                              .out_features = c.O,
                              .rank = c.r,
                              .x = c.x.data(),
                              .w = WeightPtr::F32(c.w.data()),
                              .lora_a = c.A.data(),
                              .lora_b = c.B.data(),
                              .scaling = c.scaling,
                              .dropout = c.dropout,
                              .h = h.data(),
                              .dy = dy.data(),
                              .dx = dx.data(),
                              .da = da.data(),
                              .db = db.data()};
    std::vector<float> ws(LoraLinearWorkspaceBytes(bw) / 4);
    EXPECT_EQ(LoraLinearBackward(Cpu(), bw).code(),
              absl::StatusCode::kInvalidArgument);  // no workspace
    bw.workspace = ws.data();
    bw.workspace_bytes = ws.size() * 4;
    ASSERT_TRUE(LoraLinearBackward(Cpu(), bw).ok());
    EXPECT_TRUE(dx.GuardsIntact() && da.GuardsIntact() && db.GuardsIntact());
    auto fwd = [&] { return c.Forward(); };
    const std::string tag = "p=" + std::to_string(p) + " ";
    ExpectGradient(fwd, c.x, dy, dx.values(), tag + "dx");
    ExpectGradient(fwd, c.A, dy, da.values(), tag + "dA");
    ExpectGradient(fwd, c.B, dy, db.values(), tag + "dB");

    // Accumulation doubles every gradient.
    Guarded dx2(dx.values()), da2(da.values()), db2(db.values());
    bw.dx = dx2.data();
    bw.da = da2.data();
    bw.db = db2.data();
    bw.accumulate_dx = bw.accumulate_params = true;
    ASSERT_TRUE(LoraLinearBackward(Cpu(), bw).ok());
    EXPECT_TRUE(AllClose(
        dx2.values(),
        [&] {
          auto v = dx.values();
          for (auto& e : v) e *= 2;
          return v;
        }(),
        1e-6, 1e-6));
    EXPECT_TRUE(AllClose(
        da2.values(),
        [&] {
          auto v = da.values();
          for (auto& e : v) e *= 2;
          return v;
        }(),
        1e-6, 1e-6));
    EXPECT_TRUE(AllClose(
        db2.values(),
        [&] {
          auto v = db.values();
          for (auto& e : v) e *= 2;
          return v;
        }(),
        1e-6, 1e-6));
  }
}

TEST(LoraLinear, FlopCountAtBertBase) {
  // 2*1024*768*768 = 1.208e9 frozen + 2 * 2*1024*768*8 = 2.5e7 adapter.
  EXPECT_DOUBLE_EQ(LoraLinearForwardFlops(1024, 768, 768, 8),
                   2.0 * 1024 * 768 * 768 + 4.0 * 1024 * 768 * 8);
  EXPECT_DOUBLE_EQ(LoraLinearBackwardFlops(1024, 768, 768, 8),
                   2.0 * 1024 * 768 * 768 + 8.0 * 1024 * 768 * 8);
}

TEST(LoraLinear, RejectsBadArguments) {
  LoraCase c(DropoutSpec{});
  std::vector<float> y(c.R * c.O), h(c.R * c.r), ws;
  auto f = c.Fwd(y.data(), h.data(), ws);
  f.rank = 0;
  EXPECT_EQ(LoraLinearForward(Cpu(), f).code(), absl::StatusCode::kInvalidArgument);
  f = c.Fwd(y.data(), h.data(), ws);
  f.h = nullptr;
  EXPECT_EQ(LoraLinearForward(Cpu(), f).code(), absl::StatusCode::kInvalidArgument);
  f = c.Fwd(y.data(), h.data(), ws);
  f.dropout.p = 1.0f;
  EXPECT_EQ(LoraLinearForward(Cpu(), f).code(), absl::StatusCode::kInvalidArgument);
  f = c.Fwd(y.data(), h.data(), ws);
  f.w = WeightPtr{};
  EXPECT_EQ(LoraLinearForward(Cpu(), f).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora::kernels
