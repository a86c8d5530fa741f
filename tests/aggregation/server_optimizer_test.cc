#include "aggregation/server_optimizer.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

std::vector<UpdateTensor> Global() { return {{"a", {2}, {1.0f, 2.0f}}, {"b", {1}, {-1.0f}}}; }
std::vector<TensorSpec> Spec() { return SpecFromUpdate(Global()); }

ServerOptimizer Make(const ServerOptimizerOptions& o) {
  auto opt = ServerOptimizer::Create(o, Spec());
  EXPECT_TRUE(opt.ok()) << opt.status();
  return *std::move(opt);
}

TEST(ServerOptimizerTest, SgdAddsScaledDeltaMatchedByName) {
  ServerOptimizer opt = Make({.kind = ServerOptimizerKind::kSgd, .learning_rate = 2.0});
  EXPECT_FALSE(opt.stateful());
  std::vector<UpdateTensor> global = Global();
  // Delta tensors in another order: matched by name.
  ASSERT_TRUE(opt.Step({{"b", {1}, {0.25f}}, {"a", {2}, {0.5f, -1.0f}}}, global).ok());
  EXPECT_EQ(global[0].values, (std::vector<float>{2.0f, 0.0f}));
  EXPECT_EQ(global[1].values, (std::vector<float>{-0.5f}));
  EXPECT_EQ(opt.steps(), 1);
}

TEST(ServerOptimizerTest, RefusedStepsChangeNothing) {
  ServerOptimizer opt = Make({.kind = ServerOptimizerKind::kAdam, .learning_rate = 4.0});
  std::vector<UpdateTensor> global = Global();
  const std::vector<UpdateTensor> good = {{"a", {2}, {0.5f, 0.0f}}, {"b", {1}, {1.0f}}};
  ASSERT_TRUE(opt.Step(good, global).ok());
  auto saved_state = opt.SaveState();
  ASSERT_TRUE(saved_state.ok());
  const std::vector<UpdateTensor> saved = global;
  const float inf = std::numeric_limits<float>::infinity();
  auto expect_refused = [&](const std::vector<UpdateTensor>& d, const char* needle) {
    absl::Status s = opt.Step(d, global);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(needle));
    EXPECT_EQ(global[0].values, saved[0].values);
    EXPECT_EQ(global[1].values, saved[1].values);
    EXPECT_EQ(opt.steps(), 1);
    EXPECT_EQ(*opt.SaveState(), *saved_state);
  };
  expect_refused({{"a", {2}, {0.5f, -1.0f}}}, "delta has 1 tensors");
  expect_refused({{"b", {1}, {0.25f}}, {"c", {2}, {0.5f, -1.0f}}},
                 "delta tensor 'c' is not in the adapter");
  expect_refused({{"b", {1}, {0.25f}}, {"a", {1, 2}, {0.5f, -1.0f}}},
                 "tensor 'a' does not have the adapter's shape");
  expect_refused({{"b", {1}, {0.25f}}, {"b", {1}, {0.25f}}}, "repeats tensor 'b'");
  // The first tensor is fine, the second is not finite: nothing is applied.
  expect_refused({{"a", {2}, {0.5f, 0.0f}}, {"b", {1}, {inf}}}, "'b' value 0 is not finite");
  // A result that overflows fp32.
  ServerOptimizer sgd = Make({.learning_rate = 4.0});
  std::vector<UpdateTensor> big = {{"a", {2}, {std::numeric_limits<float>::max(), 0.0f}},
                                   {"b", {1}, {0.0f}}};
  absl::Status s =
      sgd.Step({{"a", {2}, {std::numeric_limits<float>::max(), 0.0f}}, {"b", {1}, {0.0f}}}, big);
  EXPECT_THAT(std::string(s.message()), HasSubstr("would not be finite"));
  EXPECT_EQ(big[0].values[0], std::numeric_limits<float>::max());
}

TEST(ServerOptimizerTest, MomentumAccumulatesDeltas) {
  ServerOptimizer opt =
      Make({.kind = ServerOptimizerKind::kSgd, .learning_rate = 0.5, .momentum = 0.75});
  EXPECT_TRUE(opt.stateful());
  std::vector<UpdateTensor> global = Global();
  const std::vector<UpdateTensor> d = {{"a", {2}, {1.0f, -2.0f}}, {"b", {1}, {4.0f}}};
  ASSERT_TRUE(opt.Step(d, global).ok());  // m = d; x += 0.5 d
  ASSERT_TRUE(opt.Step(d, global).ok());  // m = 1.75 d; x += 0.875 d
  // x = x0 + 1.375 d, every value exact in binary.
  EXPECT_EQ(global[0].values, (std::vector<float>{1.0f + 1.375f, 2.0f - 2.75f}));
  EXPECT_EQ(global[1].values, (std::vector<float>{-1.0f + 5.5f}));
}

// One coordinate followed through three steps of the update rules, written out independently here.
double Reference(ServerOptimizerKind kind, double x, const std::vector<double>& deltas, double lr,
                 double b1, double b2, double tau) {
  double m = 0, v = kind == ServerOptimizerKind::kAdam ? 0.0 : tau * tau;
  int t = 0;
  for (double d : deltas) {
    ++t;
    m = b1 * m + (1 - b1) * d;
    if (kind == ServerOptimizerKind::kAdam) {
      v = b2 * v + (1 - b2) * d * d;
      const double m_hat = m / (1 - std::pow(b1, t));
      const double v_hat = v / (1 - std::pow(b2, t));
      // Kingma & Ba's epsilon sits outside the corrected root: m_hat / (sqrt(v_hat) + tau / sqrt(1 - b2^t)).
      x += lr * m_hat / (std::sqrt(v_hat) + tau / std::sqrt(1 - std::pow(b2, t)));
    } else if (kind == ServerOptimizerKind::kYogi) {
      v -= (1 - b2) * d * d * (v > d * d ? 1 : -1);
      x += lr * m / (std::sqrt(v) + tau);
    } else {
      v += d * d;
      x += lr * m / (std::sqrt(v) + tau);
    }
    x = static_cast<float>(x);  // the global adapter is fp32 between rounds
  }
  return x;
}

TEST(ServerOptimizerTest, AdaptiveKindsFollowTheirUpdateRules) {
  const std::vector<std::vector<double>> deltas = {{0.02, -0.01}, {0.03, 0.005}, {-0.01, 0.002}};
  for (ServerOptimizerKind kind :
       {ServerOptimizerKind::kAdam, ServerOptimizerKind::kYogi, ServerOptimizerKind::kAdagrad}) {
    SCOPED_TRACE(ServerOptimizerName(kind));
    ServerOptimizer opt =
        Make({.kind = kind, .learning_rate = 0.01, .beta1 = 0.9, .beta2 = 0.99, .tau = 1e-3});
    EXPECT_TRUE(opt.stateful());
    std::vector<UpdateTensor> global = Global();
    for (const auto& d : deltas) {
      ASSERT_TRUE(opt.Step({{"a", {2}, {static_cast<float>(d[0]), static_cast<float>(d[1])}},
                            {"b", {1}, {0.0f}}},
                           global)
                      .ok());
    }
    for (int i = 0; i < 2; ++i) {
      std::vector<double> coord;
      for (const auto& d : deltas) coord.push_back(static_cast<float>(d[i]));
      const double want = Reference(kind, Global()[0].values[i], coord, 0.01, 0.9, 0.99, 1e-3);
      EXPECT_NEAR(global[0].values[i], want, 1e-6) << "coordinate " << i;
    }
    // A zero delta moves nothing (m and v stay 0 / tau^2).
    EXPECT_EQ(global[1].values[0], -1.0f);
  }
  // Adam's first step is about lr * sign(delta) whatever the delta's scale.
  ServerOptimizer adam =
      Make({.kind = ServerOptimizerKind::kAdam, .learning_rate = 0.01, .tau = 1e-9});
  std::vector<UpdateTensor> global = Global();
  ASSERT_TRUE(adam.Step({{"a", {2}, {1e-4f, -50.0f}}, {"b", {1}, {0.0f}}}, global).ok());
  EXPECT_NEAR(global[0].values[0], 1.0 + 0.01, 1e-6);
  EXPECT_NEAR(global[0].values[1], 2.0 - 0.01, 1e-6);
}

TEST(ServerOptimizerTest, SavedStateContinuesBitIdentically) {
  for (ServerOptimizerKind kind :
       {ServerOptimizerKind::kAdam, ServerOptimizerKind::kYogi, ServerOptimizerKind::kSgd}) {
    SCOPED_TRACE(ServerOptimizerName(kind));
    const ServerOptimizerOptions o{.kind = kind,
                                   .learning_rate = 0.1,
                                   .momentum = kind == ServerOptimizerKind::kSgd ? 0.9 : 0.0};
    ServerOptimizer a = Make(o);
    std::vector<UpdateTensor> xa = Global();
    const std::vector<UpdateTensor> d1 = {{"a", {2}, {0.3f, -0.7f}}, {"b", {1}, {0.1f}}};
    const std::vector<UpdateTensor> d2 = {{"a", {2}, {-0.2f, 0.4f}}, {"b", {1}, {0.9f}}};
    ASSERT_TRUE(a.Step(d1, xa).ok());
    auto state = a.SaveState();
    ASSERT_TRUE(state.ok()) << state.status();
    ServerOptimizer b = Make(o);
    ASSERT_TRUE(b.LoadState(*state).ok());
    EXPECT_EQ(b.steps(), 1);
    std::vector<UpdateTensor> xb = xa;
    ASSERT_TRUE(a.Step(d2, xa).ok());
    ASSERT_TRUE(b.Step(d2, xb).ok());
    for (size_t t = 0; t < xa.size(); ++t) EXPECT_EQ(xa[t].values, xb[t].values);
    // A fresh optimizer (no state loaded) would have stepped differently.
    ServerOptimizer fresh = Make(o);
    std::vector<UpdateTensor> xf = Global();
    ASSERT_TRUE(fresh.Step(d1, xf).ok());
    ServerOptimizer fresh2 = Make(o);
    ASSERT_TRUE(fresh2.Step(d2, xf).ok());
    EXPECT_NE(xf[0].values, xa[0].values);
  }
}

TEST(ServerOptimizerTest, LoadStateRefusesForeignOrDamagedState) {
  ServerOptimizer adam = Make({.kind = ServerOptimizerKind::kAdam});
  ServerOptimizer yogi = Make({.kind = ServerOptimizerKind::kYogi});
  auto adam_state = adam.SaveState();
  ASSERT_TRUE(adam_state.ok());
  absl::Status s = yogi.LoadState(*adam_state);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("saved by optimizer 'adam'"));
  EXPECT_EQ(yogi.LoadState("not a safetensors file").code(), absl::StatusCode::kDataLoss);
  // Another adapter spec.
  auto other =
      ServerOptimizer::Create({.kind = ServerOptimizerKind::kAdam}, {{"a", {3}}, {"b", {1}}});
  ASSERT_TRUE(other.ok());
  s = other->LoadState(*adam_state);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not match the adapter"));
}

// Found by fuzz/fuzz_state_files.cc: a saved step count of INT64_MAX loaded, and the next Step's
// count (steps + 1) overflowed int64.
TEST(ServerOptimizerTest, LoadStateRefusesAStepCountWithNoNextStep) {
  auto state = [](const std::string& steps) {
    auto bytes = SerializeSafetensors(
        {}, {{"fedlora.server_optimizer", "sgd"}, {"fedlora.server_steps", steps}});
    EXPECT_TRUE(bytes.ok());
    return bytes.ok() ? *bytes : std::string();
  };
  ServerOptimizer opt = Make({.kind = ServerOptimizerKind::kSgd});
  const absl::Status s = opt.LoadState(state(absl::StrCat(std::numeric_limits<int64_t>::max())));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("leaves no next step"));
  EXPECT_EQ(opt.steps(), 0);
  // One below still loads, and steps to the top.
  ASSERT_TRUE(opt.LoadState(state(absl::StrCat(std::numeric_limits<int64_t>::max() - 1))).ok());
  std::vector<UpdateTensor> x = Global();
  ASSERT_TRUE(opt.Step(Global(), x).ok());
  EXPECT_EQ(opt.steps(), std::numeric_limits<int64_t>::max());
}

TEST(ServerOptimizerTest, CreateRefusesBadOptions) {
  auto code = [](ServerOptimizerOptions o) { return ServerOptimizer::Create(o, Spec()).status(); };
  EXPECT_THAT(std::string(code({.learning_rate = 0}).message()), HasSubstr("learning_rate 0"));
  EXPECT_THAT(std::string(code({.learning_rate = std::nan("")}).message()),
              HasSubstr("learning_rate"));
  EXPECT_THAT(std::string(code({.momentum = 1.0}).message()),
              HasSubstr("momentum 1 is not in [0, 1)"));
  EXPECT_THAT(std::string(code({.beta1 = -0.1}).message()), HasSubstr("beta1"));
  EXPECT_THAT(std::string(code({.beta2 = 1.5}).message()), HasSubstr("beta2"));
  EXPECT_THAT(std::string(code({.tau = 0}).message()), HasSubstr("tau"));
  EXPECT_EQ(ServerOptimizer::Create({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ServerOptimizer::Create({}, {{"a", {1}}, {"a", {1}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
