#include "train/optim.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

Param MakeParam(std::string name, std::vector<int64_t> shape, std::vector<float> value) {
  Param p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.grad.assign(value.size(), 0.0f);
  p.value = std::move(value);
  return p;
}

// AdamW, lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, on a [1, 2] weight:
//   step 1, g = (0.5, -1):  p *= 0.999 -> (0.999, -1.998); m = (0.05, -0.1); v = (2.5e-4, 1e-3)
//     m_hat = (0.5, -1), v_hat = (0.25, 1) -> update ~ (1, -1) -> p = (0.899000002, -1.898000001)
//   step 2, g = (0.1, 0.2): m = (0.055, -0.07), v = (2.5975e-4, 1.039e-3), bc1 = 0.19,
//     bc2 = 0.001999 -> p = (0.81779690638, -1.84499939399)
// (the same values torch.optim.AdamW gives in float64). The fp32 implementation matches to
// 1e-6: each value is O(1) and a handful of fp32 roundings contribute ~1e-7 each.
TEST(AdamW, MatchesHandComputedTwoStepTrace) {
  OptimizerOptions opt;
  opt.weight_decay = 0.01f;
  auto adamw = MakeOptimizer("adamw", opt);
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  std::vector<Param> params = {MakeParam("w", {1, 2}, {1.0f, -2.0f})};
  params[0].grad = {0.5f, -1.0f};
  ASSERT_TRUE((*adamw)->Step(params, 0.1f).ok());
  EXPECT_NEAR(params[0].value[0], 0.899000002, 1e-6);
  EXPECT_NEAR(params[0].value[1], -1.898000001, 1e-6);
  params[0].grad = {0.1f, 0.2f};
  ASSERT_TRUE((*adamw)->Step(params, 0.1f).ok());
  EXPECT_NEAR(params[0].value[0], 0.8177969063826516, 1e-6);
  EXPECT_NEAR(params[0].value[1], -1.8449993939894944, 1e-6);
  EXPECT_EQ((*adamw)->step_count(), 2);
}

TEST(AdamW, OneDimParamsSkipWeightDecayUnlessAsked) {
  // Step 1 with g = 0.5 moves p by lr * ~1 = 0.1; decay would take another lr * wd * p = 0.001.
  for (bool decay_1d : {false, true}) {
    OptimizerOptions opt;
    opt.weight_decay = 0.01f;
    opt.decay_one_dim_params = decay_1d;
    AdamW adamw(opt);
    std::vector<Param> params = {MakeParam("classifier.bias", {1}, {1.0f})};
    params[0].grad = {0.5f};
    ASSERT_TRUE(adamw.Step(params, 0.1f).ok());
    EXPECT_NEAR(params[0].value[0], decay_1d ? 0.899 : 0.9, 1e-6) << "decay_1d=" << decay_1d;
  }
}

TEST(Lamb, TrustRatioIsWeightNormOverUpdateNorm) {
  // p = (3, 4), ||p|| = 5. First step: m_hat = g, v_hat = g^2, so r = g / (|g| + eps) = (1, -1)
  // up to eps = 1e-6; u = r + 0.1 * p = (1.3, -0.6); trust = 5 / sqrt(2.05) = 3.49215148.
  OptimizerOptions opt;
  opt.weight_decay = 0.1f;
  Lamb lamb(opt);
  std::vector<Param> params = {MakeParam("w", {1, 2}, {3.0f, 4.0f})};
  params[0].grad = {1.0f, -1.0f};
  ASSERT_TRUE(lamb.Step(params, 0.01f).ok());
  // eps perturbs r by 1e-6 relative, so 1e-5 is a safe relative bound on the ratio.
  EXPECT_NEAR(lamb.last_trust_ratio("w"), 3.4921514788, 3.5e-5);
  EXPECT_NEAR(params[0].value[0], 3.0 - 0.01 * 3.4921514788 * 1.3, 1e-5);
  EXPECT_NEAR(params[0].value[1], 4.0 - 0.01 * 3.4921514788 * -0.6, 1e-5);
}

TEST(Lamb, ZeroWeightGetsTrustOne) {
  // A freshly initialised LoRA B is all zeros: trust must be 1 or B would never move.
  Lamb lamb(OptimizerOptions{});
  std::vector<Param> params = {MakeParam("lora_B", {2, 1}, {0.0f, 0.0f})};
  params[0].grad = {2.0f, -4.0f};
  ASSERT_TRUE(lamb.Step(params, 0.1f).ok());
  EXPECT_FLOAT_EQ(lamb.last_trust_ratio("lora_B"), 1.0f);
  EXPECT_NEAR(params[0].value[0], -0.1, 1e-6);
  EXPECT_NEAR(params[0].value[1], 0.1, 1e-6);
}

TEST(ClipGradNorm, ScalesToExactlyMaxNorm) {
  std::vector<Param> params = {MakeParam("a", {2}, {0, 0}), MakeParam("b", {1}, {0})};
  params[0].grad = {3.0f, 4.0f};
  params[1].grad = {12.0f};  // global norm sqrt(9 + 16 + 144) = 13
  EXPECT_FLOAT_EQ(ClipGradNorm(params, 6.5f), 13.0f);
  // Scale 0.5 is exact in binary floating point, so the results are exact too.
  EXPECT_EQ(params[0].grad, (std::vector<float>{1.5f, 2.0f}));
  EXPECT_EQ(params[1].grad, (std::vector<float>{6.0f}));
  EXPECT_FLOAT_EQ(GlobalGradNorm(params), 6.5f);
}

TEST(ClipGradNorm, LeavesSmallDisabledAndNonFiniteAlone) {
  std::vector<Param> params = {MakeParam("a", {2}, {0, 0})};
  params[0].grad = {3.0f, 4.0f};
  EXPECT_FLOAT_EQ(ClipGradNorm(params, 5.0f), 5.0f);  // at the bound: untouched
  EXPECT_FLOAT_EQ(ClipGradNorm(params, 0.0f), 5.0f);  // disabled
  EXPECT_EQ(params[0].grad, (std::vector<float>{3.0f, 4.0f}));
  params[0].grad = {NAN, 1.0f};
  EXPECT_TRUE(std::isnan(ClipGradNorm(params, 1.0f)));
  EXPECT_EQ(params[0].grad[1], 1.0f);
}

// f(p) = 0.5 * sum a_i (p_i - c_i)^2 with condition number 100; grad = a_i (p_i - c_i).
double RunQuadratic(Optimizer& optimizer, int steps, float lr) {
  const std::vector<float> a = {1.0f, 10.0f, 100.0f}, c = {1.0f, -2.0f, 0.5f};
  std::vector<Param> params = {MakeParam("w", {1, 3}, {4.0f, 3.0f, -2.0f})};
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < 3; ++i) params[0].grad[i] = a[i] * (params[0].value[i] - c[i]);
    // Linear decay to 0 so that the sign-like Adam/LAMB steps settle instead of oscillating.
    const float step_lr = lr * static_cast<float>(steps - t) / steps;
    EXPECT_TRUE(optimizer.Step(params, step_lr).ok());
  }
  double err = 0.0;
  for (int i = 0; i < 3; ++i)
    err = std::max(err, std::abs(static_cast<double>(params[0].value[i]) - c[i]));
  return err;
}

TEST(Optimizers, ConvergeOnIllConditionedQuadratic) {
  // Initial error is up to 5; each optimizer must get within 1e-2 of the minimum.
  AdamW adamw(OptimizerOptions{});
  EXPECT_LT(RunQuadratic(adamw, 2000, 0.05f), 1e-2);
  Lamb lamb(OptimizerOptions{});
  EXPECT_LT(RunQuadratic(lamb, 2000, 0.02f), 1e-2);
  OptimizerOptions momentum;
  momentum.momentum = 0.9f;
  Sgd sgd(momentum);
  EXPECT_LT(RunQuadratic(sgd, 2000, 0.001f), 1e-2);
}

TEST(Optimizers, ExportImportResumesBitIdentically) {
  auto run = [](Optimizer& opt, std::vector<Param>& params, int from, int to) {
    for (int t = from; t < to; ++t) {
      for (size_t i = 0; i < params[0].value.size(); ++i)
        params[0].grad[i] = std::sin(1.0f + t + i) * 0.3f;
      ASSERT_TRUE(opt.Step(params, 0.01f).ok());
    }
  };
  for (const char* name : {"adamw", "lamb", "sgd"}) {
    OptimizerOptions opt;
    opt.weight_decay = 0.05f;
    opt.beta1 = 0.8f;
    opt.momentum = 0.7f;
    std::vector<Param> straight = {MakeParam("w", {2, 2}, {0.5f, -0.25f, 1.0f, 2.0f})};
    auto a = MakeOptimizer(name, opt);
    ASSERT_TRUE(a.ok());
    run(**a, straight, 0, 5);

    std::vector<Param> resumed = {MakeParam("w", {2, 2}, {0.5f, -0.25f, 1.0f, 2.0f})};
    auto b = MakeOptimizer(name, opt);
    run(**b, resumed, 0, 2);
    const OptimizerState state = (*b)->ExportState();
    EXPECT_EQ(state.step, 2);
    auto c = MakeOptimizer(name, opt);
    ASSERT_TRUE((*c)->ImportState(state).ok()) << name;
    run(**c, resumed, 2, 5);
    EXPECT_EQ(straight[0].value, resumed[0].value) << name;
  }
}

TEST(Optimizers, RejectBadInputWithoutChangingAnything) {
  AdamW adamw(OptimizerOptions{});
  std::vector<Param> params = {MakeParam("w", {1, 2}, {1.0f, 2.0f})};
  params[0].grad = {1.0f};
  absl::Status s = adamw.Step(params, 0.1f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("w"));
  EXPECT_EQ(adamw.step_count(), 0);
  params[0].grad = {1.0f, 1.0f};
  EXPECT_EQ(adamw.Step(params, -1.0f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(adamw.Step(params, NAN).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(params[0].value, (std::vector<float>{1.0f, 2.0f}));

  ASSERT_TRUE(adamw.Step(params, 0.1f).ok());
  params[0].shape = {2, 1};
  EXPECT_EQ(adamw.Step(params, 0.1f).code(), absl::StatusCode::kInvalidArgument);

  OptimizerState foreign;
  foreign.optimizer = "lamb";
  EXPECT_EQ(adamw.ImportState(foreign).code(), absl::StatusCode::kInvalidArgument);
  OptimizerState bad_slot{"adamw", 1, {{"w.momentum", {1}, {0.0f}}}};
  EXPECT_EQ(adamw.ImportState(bad_slot).code(), absl::StatusCode::kInvalidArgument);
  OptimizerState missing_slot{"adamw", 1, {{"w.exp_avg", {1}, {0.0f}}}};
  EXPECT_EQ(adamw.ImportState(missing_slot).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeOptimizer, NamesAndOptionChecks) {
  EXPECT_EQ((*MakeOptimizer("AdamW", {}))->name(), "adamw");
  EXPECT_EQ((*MakeOptimizer("lamb", {}))->name(), "lamb");
  EXPECT_EQ((*MakeOptimizer("sgd", {}))->name(), "sgd");
  auto unknown = MakeOptimizer("adagrad", {});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), testing::HasSubstr("adagrad"));
  OptimizerOptions bad;
  bad.beta2 = 1.0f;
  EXPECT_EQ(MakeOptimizer("adamw", bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.weight_decay = -0.1f;
  EXPECT_EQ(MakeOptimizer("adamw", bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.momentum = 1.0f;
  auto momentum = MakeOptimizer("sgd", bad);
  EXPECT_EQ(momentum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(momentum.status().message()), testing::HasSubstr("momentum"));
}

TEST(Sgd, MomentumIsItsOwnOptionAndBeta1IsIgnored) {
  // p = 1, g = 1 each step, lr 0.1. Momentum 0.5: buf 1 then 1.5, so p = 0.9 then 0.75. Plain SGD
  // (the default) gives 0.9 then 0.8 whatever beta1 says: beta1 belongs to Adam and LAMB.
  auto run = [](const OptimizerOptions& o) {
    std::vector<Param> params = {MakeParam("w", {1}, {1.0f})};
    auto opt = MakeOptimizer("sgd", o);
    EXPECT_TRUE(opt.ok());
    for (int t = 0; t < 2; ++t) {
      params[0].grad = {1.0f};
      EXPECT_TRUE((*opt)->Step(params, 0.1f).ok());
    }
    return params[0].value[0];
  };
  OptimizerOptions heavy;
  heavy.momentum = 0.5f;
  EXPECT_FLOAT_EQ(run(heavy), 0.75f);
  OptimizerOptions plain;
  plain.beta1 = 0.9f;
  EXPECT_FLOAT_EQ(run(plain), 0.8f);
}

}  // namespace
}  // namespace fedlora
