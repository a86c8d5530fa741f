// Client-level differential privacy on the server (CENTRAL mode): clipping, the noise, adaptive
// clipping, the accountant's durable record, and the privacy budget across a restart. Expected
// epsilons come from Opacus 1.5.2's RDP analysis (opacus/accountants/analysis/rdp.py: compute_rdp
// and get_privacy_spent over its default orders).
#include "server/differential_privacy.h"

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <thread>

#include "crypto/prg.h"
#include "crypto/secagg_fixed_point.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/store.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::EncodedDeltaFor;
using ::testing::HasSubstr;
using testing::InitialAdapter;
using testing::RawClient;
using testing::TempDir;
using testing::WaitFor;

// Opacus: eps(z = 1.0, q = 1, steps, delta 1e-5).
constexpr double kEpsZ1Q1[] = {4.728507067217623, 7.077391578166641, 9.009958991683897};

v1::RunConfig DpConfig(int rounds, int clients, double z, double clip) {
  v1::RunConfig c = testing::TestRunConfig(rounds, clients, 1);
  auto* dp = c.mutable_privacy()->mutable_dp();
  dp->set_enabled(true);
  dp->set_noise_multiplier(z);
  dp->set_clip_norm(clip);
  c.mutable_aggregation()->clear_weight_by_examples();
  ApplyRunConfigDefaults(&c);
  return c;
}

std::vector<UpdateTensor> Zeros(int64_t n) {
  return {{"w", {n}, std::vector<float>(static_cast<size_t>(n), 0.0f)}};
}

double Stddev(const std::vector<float>& v) {
  double sum = 0, sq = 0;
  for (float x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  for (float x : v) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / static_cast<double>(v.size()));
}

ServerDp MakeDp(const v1::RunConfig& c, const std::vector<RoundRecord>& rounds = {}) {
  absl::StatusOr<std::optional<ServerDp>> dp = ServerDp::Create(c, rounds);
  EXPECT_TRUE(dp.ok()) << dp.status();
  EXPECT_TRUE(dp.ok() && dp->has_value());
  return **dp;
}

TEST(ServerDpTest, OffWithoutDpEnabled) {
  auto dp = ServerDp::Create(testing::TestRunConfig(3, 2, 1), {});
  ASSERT_TRUE(dp.ok());
  EXPECT_FALSE(dp->has_value());
}

TEST(ServerDpTest, TheNoiseHasTheConfiguredStddevAndIsFreshForEveryRelease) {
  const v1::RunConfig c = DpConfig(3, 4, 2.0, 1.5);
  ServerDp dp = MakeDp(c);
  std::vector<UpdateTensor> a = Zeros(200'000), b = Zeros(200'000);
  ASSERT_TRUE(dp.Release(a, 4, 4).ok());
  ASSERT_TRUE(dp.Release(b, 4, 4).ok());
  // z * C on the sum of 4 updates: 2.0 * 1.5 / 4 = 0.75 on their mean.
  EXPECT_NEAR(Stddev(a[0].values), 0.75, 0.75 * 0.01);
  // Nothing the server keeps regenerates the noise: the same release drawn twice differs, and so
  // does a second server's with the same config (no key derived from the run or the store).
  EXPECT_NE(a[0].values, b[0].values);
  ServerDp another = MakeDp(c);
  std::vector<UpdateTensor> d = Zeros(200'000);
  ASSERT_TRUE(another.Release(d, 4, 4).ok());
  EXPECT_NE(a[0].values, d[0].values);
  // Noise is centred and roughly Gaussian: about 68% within one standard deviation.
  const double mean = std::accumulate(a[0].values.begin(), a[0].values.end(), 0.0) / 200'000;
  EXPECT_NEAR(mean, 0.0, 0.01);
  const auto within = std::count_if(a[0].values.begin(), a[0].values.end(),
                                    [](float x) { return std::abs(x) < 0.75; });
  EXPECT_NEAR(static_cast<double>(within) / 200'000, 0.6827, 0.005);
}

TEST(ServerDpTest, ClippedUpdatesNeverExceedTheClipNorm) {
  ServerDp dp = MakeDp(DpConfig(3, 2, 1.0, 0.25));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 0.03f);
  int within = 0;
  for (int i = 0; i < 200; ++i) {
    // As the server holds a top-k update: 50 kept entries (the even positions) of 100.
    std::vector<KeptTensor> u = {{"a", {100}, false, {}, std::vector<float>(50)}};
    for (int64_t j = 0; j < 50; ++j) u[0].indices.push_back(2 * j);
    for (float& v : u[0].values) v = normal(rng) * static_cast<float>(1 + i % 3);
    const double before = UpdateNorm(u);
    within += dp.Clip(u) ? 1 : 0;
    EXPECT_LE(UpdateNorm(u), 0.25);
    EXPECT_EQ(before <= 0.25, UpdateNorm(u) == before);
  }
  EXPECT_GT(within, 20);
  EXPECT_LT(within, 180);
}

TEST(ServerDpTest, EpsilonPerRoundMatchesOpacusAtSamplingRateOne) {
  ServerDp dp = MakeDp(DpConfig(5, 3, 1.0, 1.0));
  for (int round = 1; round <= 3; ++round) {
    std::vector<UpdateTensor> mean = Zeros(8);
    absl::StatusOr<DpRound> r = dp.Release(mean, 3, 3);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_DOUBLE_EQ(r->sampling_rate, 1.0);
    EXPECT_NEAR(r->epsilon, kEpsZ1Q1[round - 1], 1e-6 * kEpsZ1Q1[round - 1]);
    ASSERT_TRUE(dp.Commit(*r).ok());
    EXPECT_DOUBLE_EQ(dp.epsilon(), r->epsilon);
  }
}

// The server hands tasks to the first clients that ask: no cohort is a uniform sample of a
// population, so a population size (which would let the accountant claim amplification by
// subsampling: epsilon 0.67 instead of 4.73 for one round at z = 1 with 1000 sites) is refused,
// in the config and by ServerDp itself for a config built in code.
TEST(ServerDpTest, APopulationSizeIsRefusedNotAccountedFor) {
  v1::RunConfig c = DpConfig(5, 2, 1.0, 1.0);
  c.mutable_privacy()->mutable_dp()->set_population_size(1000);
  const absl::Status valid = ValidateRunConfig(c);
  EXPECT_TRUE(absl::IsInvalidArgument(valid)) << valid;
  EXPECT_THAT(valid.message(), HasSubstr("privacy.dp.population_size is refused"));
  auto dp = ServerDp::Create(c, {});
  EXPECT_TRUE(absl::IsInvalidArgument(dp.status())) << dp.status();
}

// Opacus 1.5.2's epsilon at sampling rate 1 (compute_rdp is alpha * steps / (2 z^2) there), with
// get_privacy_spent's conversion over its default orders.
double OpacusEpsilonAtRateOne(double z, int steps, double delta) {
  std::vector<double> orders;
  for (int x = 1; x < 100; ++x) orders.push_back(1 + x / 10.0);
  for (int a = 12; a < 64; ++a) orders.push_back(a);
  double best = std::numeric_limits<double>::infinity();
  for (double a : orders) {
    const double rdp = a * steps / (2 * z * z);
    best = std::min(best, rdp - (std::log(delta) + std::log(a)) / (a - 1) + std::log((a - 1) / a));
  }
  return best;
}

// Secure aggregation's fixed point rounds each value of a clipped update up or down to a step of
// 2^-f: the client's contribution can exceed the clip norm by nearly sqrt(d) steps (340x the clip
// norm for 2-bit levels). The bound holds for every encoding, comes close for an adversarial one,
// and the accountant's noise multiplier is z * C / (C + bound).
TEST(ServerDpTest, UnderSecureAggregationTheSensitivityIncludesTheFixedPointRounding) {
  constexpr double kClip = 1.0;
  constexpr int64_t kD = 4096;
  auto prg = crypto::Prg::Create(std::string(crypto::Prg::kSeedBytes, 's'));
  ASSERT_TRUE(prg.ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  for (uint32_t f : {2u, 4u, 8u, 16u}) {
    const double bound = FixedPointRoundingBound(f, kD);
    EXPECT_DOUBLE_EQ(bound, std::ldexp(1.0, -static_cast<int>(f)) * 64.0);
    double worst = 0;
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> v(kD);
      if (trial < 10) {
        // Spread evenly, every value far below a coarse step: stochastic rounding sends a share of
        // them a whole step away from 0.
        for (float& x : v) x = normal(rng) < 0 ? -1.0f : 1.0f;
      } else {
        for (float& x : v) x = normal(rng);
      }
      double norm = 0;
      for (float x : v) norm += static_cast<double>(x) * x;
      norm = std::sqrt(norm);
      for (float& x : v) x = static_cast<float>(x * kClip / norm);  // clipped to exactly C
      auto encoded = crypto::EncodeSecAggFixedPoint(v, kClip, f, 62, *prg);
      ASSERT_TRUE(encoded.ok()) << encoded.status();
      auto decoded = crypto::DecodeSecAggFixedPointSum(*encoded, f, 62);
      ASSERT_TRUE(decoded.ok());
      double sq = 0;
      for (double x : *decoded) sq += x * x;
      const double contributed = std::sqrt(sq);
      EXPECT_LE(contributed, kClip + bound) << f << " fraction bits, trial " << trial;
      worst = std::max(worst, contributed);
    }
    // What the accountant would have missed: the encoded update exceeds the clip norm, by several
    // times for coarse steps.
    if (f <= 4) {
      EXPECT_GT(worst, 2 * kClip) << f;
    }
    if (f == 16) {
      EXPECT_LT(worst, 1.01 * kClip);
    }
  }
  // The accountant: z * C / (C + bound) per round.
  const v1::RunConfig c = DpConfig(3, 4, 1.0, kClip);
  const double bound = FixedPointRoundingBound(8, kD);  // 0.25
  auto dp = ServerDp::Create(c, {}, 1, 1, bound);
  ASSERT_TRUE(dp.ok() && dp->has_value()) << dp.status();
  std::vector<UpdateTensor> mean = Zeros(8);
  absl::StatusOr<DpRound> r = (*dp)->Release(mean, 4, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->noise_multiplier, 1.0 * kClip / (kClip + 0.25));
  EXPECT_NEAR(r->epsilon, OpacusEpsilonAtRateOne(0.8, 1, 1e-5), 1e-9);
  EXPECT_NEAR(OpacusEpsilonAtRateOne(1.0, 1, 1e-5), kEpsZ1Q1[0], 1e-12);  // the formula is Opacus's
  EXPECT_TRUE(absl::IsInvalidArgument(ServerDp::Create(c, {}, 1, 1, -1).status()));
}

TEST(ServerDpTest, StatusSaysWhatTheAccountantAssumes) {
  const v1::RunConfig c = DpConfig(3, 4, 1.0, 1.0);
  ServerDp plain = MakeDp(c);
  EXPECT_DOUBLE_EQ(plain.sampling_rate(), 1.0);
  EXPECT_DOUBLE_EQ(plain.accounted_noise_multiplier(), 1.0);
  EXPECT_DOUBLE_EQ(plain.sensitivity(), 1.0);
  EXPECT_THAT(plain.Assumptions(), HasSubstr("sampling rate 1 "));
  EXPECT_THAT(plain.Assumptions(), HasSubstr("CENTRAL"));
  EXPECT_THAT(plain.Assumptions(), ::testing::Not(HasSubstr("rounding")));
  // Under secure aggregation's fixed point: the sensitivity grows by the rounding bound and the
  // multiplier the accountant composes shrinks with it.
  auto secagg = ServerDp::Create(c, {}, 1, 1, /*encoding_bound=*/0.25);
  ASSERT_TRUE(secagg.ok() && secagg->has_value()) << secagg.status();
  EXPECT_DOUBLE_EQ((*secagg)->sensitivity(), 1.25);
  EXPECT_DOUBLE_EQ((*secagg)->accounted_noise_multiplier(), 0.8);
  EXPECT_THAT((*secagg)->Assumptions(), HasSubstr("rounding"));
}

TEST(ServerDpTest, AdaptiveClippingFollowsTheNoisyUnclippedFraction) {
  v1::RunConfig c = DpConfig(3, 20, 1.0, 2.0);
  auto* ac = c.mutable_privacy()->mutable_dp()->mutable_adaptive_clipping();
  ac->set_enabled(true);
  ApplyRunConfigDefaults(&c);
  EXPECT_DOUBLE_EQ(ac->target_quantile(), 0.5);
  EXPECT_DOUBLE_EQ(ac->learning_rate(), 0.2);
  EXPECT_DOUBLE_EQ(ac->count_noise_stddev(), 1.0);  // 20 / 20 = 1 > z / 2
  ServerDp dp = MakeDp(c);
  // The count's noise: sigma_b / n = 1 / 20 on the fraction, over many rounds.
  std::vector<double> fractions;
  for (int round = 1; round <= 400; ++round) {
    std::vector<UpdateTensor> mean = Zeros(4);
    absl::StatusOr<DpRound> r = dp.Release(mean, 20, 15);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(r->unclipped_fraction.has_value());
    EXPECT_DOUBLE_EQ(r->next_clip_norm, 2.0 * std::exp(-0.2 * (*r->unclipped_fraction - 0.5)));
    fractions.push_back(*r->unclipped_fraction);
  }
  const double mean = std::accumulate(fractions.begin(), fractions.end(), 0.0) / 400;
  double sq = 0;
  for (double f : fractions) sq += (f - mean) * (f - mean);
  EXPECT_NEAR(mean, 0.75, 0.01);
  EXPECT_NEAR(std::sqrt(sq / 400), 0.05, 0.006);
  // The update's own noise multiplier shrinks to (z^-2 - (2 sigma_b)^-2)^-1/2 = (1 - 1/4)^-1/2.
  std::vector<UpdateTensor> big = Zeros(200'000);
  ASSERT_TRUE(dp.Release(big, 20, 15).ok());
  EXPECT_NEAR(Stddev(big[0].values), std::pow(0.75, -0.5) * 2.0 / 20,
              0.01 * std::pow(0.75, -0.5) * 2.0 / 20);
  // Clip norms move: more than the target quantile within the norm shrinks it.
  std::vector<UpdateTensor> m = Zeros(4);
  absl::StatusOr<DpRound> r = dp.Release(m, 20, 20);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(dp.Commit(*r).ok());
  EXPECT_DOUBLE_EQ(dp.clip_norm(), r->next_clip_norm);
}

TEST(ServerDpTest, TheAccountantIsRestoredFromTheCommittedRounds) {
  const v1::RunConfig c = DpConfig(5, 2, 1.0, 1.0);
  ServerDp dp = MakeDp(c);
  std::vector<RoundRecord> rounds;
  for (int round = 1; round <= 2; ++round) {
    std::vector<UpdateTensor> mean = Zeros(4);
    absl::StatusOr<DpRound> r = dp.Release(mean, 2, 1);
    ASSERT_TRUE(r.ok());
    nlohmann::json metrics = {{"updates", 2}};
    r->AddTo(metrics);
    RoundRecord rec;
    rec.round = round;
    rec.state = RoundState::kCommitted;
    rec.metrics_json = metrics.dump();
    rounds.push_back(rec);
    ASSERT_TRUE(dp.Commit(*r).ok());
  }
  RoundRecord abandoned;
  abandoned.round = 3;
  abandoned.state = RoundState::kAbandoned;
  rounds.push_back(abandoned);  // released nothing: costs nothing
  ServerDp restored = MakeDp(c, rounds);
  EXPECT_NEAR(restored.epsilon(), kEpsZ1Q1[1], 1e-6 * kEpsZ1Q1[1]);
  EXPECT_DOUBLE_EQ(restored.epsilon(), dp.epsilon());

  // A restart with DP switched off: refused, not a silent run on without noise or accounting.
  v1::RunConfig off = c;
  off.mutable_privacy()->mutable_dp()->set_enabled(false);
  auto switched_off = ServerDp::Create(off, rounds);
  EXPECT_TRUE(absl::IsFailedPrecondition(switched_off.status())) << switched_off.status();
  EXPECT_THAT(std::string(switched_off.status().message()),
              HasSubstr("round 1 was committed with differential privacy"));

  // A committed round without a DP record: the run did not always have DP.
  RoundRecord plain;
  plain.round = 4;
  plain.state = RoundState::kCommitted;
  plain.metrics_json = R"({"updates": 2})";
  rounds.push_back(plain);
  auto refused = ServerDp::Create(c, rounds);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("round 4 was committed without differential privacy"));
}

TEST(ServerDpTest, TheBudgetAffordsTheRoundsWhoseEpsilonFits) {
  v1::RunConfig c = DpConfig(10, 2, 1.0, 1.0);
  c.mutable_privacy()->mutable_dp()->set_max_epsilon(kEpsZ1Q1[1] +
                                                     0.01);  // two rounds fit, three do not
  ServerDp dp = MakeDp(c);
  EXPECT_EQ(dp.AffordableRounds(0, 10), 2);
  EXPECT_EQ(dp.AffordableRounds(0, 1), 1);
  c.mutable_privacy()->mutable_dp()->set_max_epsilon(kEpsZ1Q1[0] - 0.01);
  auto none = ServerDp::Create(c, {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("affords no round"));
}

// A federation with DP: one client, z = 1, budget for two of four rounds, a restart in between.
TEST(ServerDpFederationTest, EpsilonIsReportedAndTheBudgetEndsTheRunAcrossARestart) {
  TempDir dir;
  v1::RunConfig config = DpConfig(4, 1, 1.0, 0.05);
  config.mutable_privacy()->mutable_dp()->set_max_epsilon(kEpsZ1Q1[1] + 0.01);
  auto start = [&]() {
    auto server =
        Server::Create(testing::TestServerOptions(dir.path()), config, InitialAdapter(), nullptr);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  };
  std::unique_ptr<Server> server = start();
  ASSERT_NE(server, nullptr);
  auto client = std::make_unique<RawClient>(server->address(), "site-a");
  ASSERT_TRUE(client->Join().ok());
  v1::GetStatusResponse status = client->RunStatus();
  EXPECT_EQ(status.total_rounds(), 2u);  // what the budget affords of the 4 configured
  EXPECT_DOUBLE_EQ(status.dp_epsilon(), 0.0);
  EXPECT_DOUBLE_EQ(status.dp_target_delta(), 1e-5);
  EXPECT_DOUBLE_EQ(status.dp_max_epsilon(), kEpsZ1Q1[1] + 0.01);
  EXPECT_DOUBLE_EQ(status.dp_clip_norm(), 0.05);
  EXPECT_DOUBLE_EQ(status.dp_sampling_rate(), 1.0);
  EXPECT_DOUBLE_EQ(status.dp_noise_multiplier(), 1.0);
  EXPECT_DOUBLE_EQ(status.dp_sensitivity(), 0.05);
  EXPECT_THAT(status.dp_assumptions(), HasSubstr("no amplification"));

  v1::TrainTask task;
  ASSERT_TRUE(client->GetTask(&task));
  const std::vector<UpdateTensor> initial = server->coordinator().global_adapter();
  const std::string plain = EncodedDeltaFor(0, task, initial);
  v1::UploadAck ack;
  // A site's data size and loss stay with it: a claimed example count other than 1 and a metrics
  // report are refused.
  grpc::Status refused =
      client->UploadAll(client->Header(task, plain, "r1-count", 400), plain, &ack);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("size of its data is not disclosed"));
  v1::MetricsReport report;
  report.set_round(task.round());
  report.set_task_id(task.task_id());
  report.set_train_loss_last(0.5);
  refused = client->ReportMetrics(report);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  ASSERT_TRUE(client->UploadAll(client->Header(task, plain, "r1"), plain, &ack).ok());
  ASSERT_TRUE(WaitFor([&] { return server->coordinator().rounds_committed() == 1; }, 10'000));
  status = client->RunStatus();
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_NEAR(status.history(0).dp_epsilon(), kEpsZ1Q1[0], 1e-6 * kEpsZ1Q1[0]);
  EXPECT_NEAR(status.dp_epsilon(), kEpsZ1Q1[0], 1e-6 * kEpsZ1Q1[0]);
  EXPECT_THAT(server->metrics().ToPrometheusText(), HasSubstr("fedlora_dp_epsilon 4.728507\n"));
  // The global adapter moved by the clipped update plus noise of z * C = 0.05 per coordinate.
  const std::vector<UpdateTensor> after = server->coordinator().global_adapter();
  std::vector<float> moved;
  double norm_sq = 0;
  for (size_t t = 0; t < after.size(); ++t) {
    for (size_t i = 0; i < after[t].values.size(); ++i)
      moved.push_back(after[t].values[i] - initial[t].values[i]);
  }
  for (float v : moved) norm_sq += static_cast<double>(v) * v;
  EXPECT_NEAR(Stddev(moved), 0.05, 0.05 * 0.06);  // 2240 draws; the clipped update adds ~0.001
  EXPECT_GT(std::sqrt(norm_sq), 1.0);

  // Restart: the accountant comes back from the store.
  client.reset();
  server->Shutdown();
  server = start();
  ASSERT_NE(server, nullptr);
  client = std::make_unique<RawClient>(server->address(), "site-a");
  ASSERT_TRUE(client->Join().ok());
  status = client->RunStatus();
  EXPECT_NEAR(status.dp_epsilon(), kEpsZ1Q1[0], 1e-6 * kEpsZ1Q1[0]);
  ASSERT_TRUE(client->GetTask(&task));
  EXPECT_EQ(task.round(), 2u);
  const std::string plain2 = EncodedDeltaFor(0, task, server->coordinator().global_adapter());
  ASSERT_TRUE(client->UploadAll(client->Header(task, plain2, "r2"), plain2, &ack).ok());
  ASSERT_TRUE(WaitFor([&] { return server->coordinator().finished(); }, 10'000));
  EXPECT_EQ(server->coordinator().rounds_committed(), 2);
  v1::WaitForTaskResponse done;
  ASSERT_TRUE(client->WaitForTask(&done, 0).ok());
  ASSERT_TRUE(done.has_run_finished());
  EXPECT_EQ(done.run_finished().reason(), v1::RunFinished::PRIVACY_BUDGET_SPENT);
  EXPECT_EQ(done.run_finished().final_round(), 2u);

  // And again: the budget is still spent, no round opens, epsilon is the two rounds'.
  client.reset();
  server->Shutdown();
  server = start();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->coordinator().finished());
  client = std::make_unique<RawClient>(server->address(), "site-a");
  ASSERT_TRUE(client->Join().ok());
  status = client->RunStatus();
  EXPECT_TRUE(status.privacy_budget_spent());
  EXPECT_EQ(status.phase(), v1::ROUND_PHASE_FINISHED);
  EXPECT_NEAR(status.dp_epsilon(), kEpsZ1Q1[1], 1e-6 * kEpsZ1Q1[1]);
  EXPECT_LE(status.dp_epsilon(), status.dp_max_epsilon());
  ASSERT_TRUE(client->WaitForTask(&done, 0).ok());
  ASSERT_TRUE(done.has_run_finished());
  EXPECT_EQ(done.run_finished().reason(), v1::RunFinished::PRIVACY_BUDGET_SPENT);
  client.reset();
  server->Shutdown();
}

}  // namespace
}  // namespace fedlora
