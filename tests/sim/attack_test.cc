// The simulator's attacks (sim/attacks.h) on small inputs checked by hand, and the board on which
// a round's malicious clients wait for its honest deltas (sim/attack_board.h).
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <thread>

#include "core/rng.h"
#include "gtest/gtest.h"
#include "sim/attack_board.h"
#include "sim/attacks.h"

namespace fedlora::sim {
namespace {

using Vectors = std::vector<std::vector<float>>;

TEST(AttacksTest, NormalQuantileMatchesTheTable) {
  // Reference values: Python's statistics.NormalDist().inv_cdf.
  EXPECT_NEAR(NormalQuantile(0.5), 0.0, 1e-15);
  EXPECT_NEAR(NormalQuantile(0.975), 1.9599639845400536, 1e-12);
  EXPECT_NEAR(NormalQuantile(0.8), 0.8416212335729144, 1e-12);
  EXPECT_NEAR(NormalQuantile(0.1), -1.2815515655446008, 1e-12);
  EXPECT_EQ(NormalQuantile(0.0), -INFINITY);
  EXPECT_EQ(NormalQuantile(1.0), INFINITY);
}

TEST(AttacksTest, LittleIsEnoughZFollowsAlgorithmOne) {
  // s = floor(n/2 + 1) - f, z = Phi^-1((n - s) / n).
  EXPECT_NEAR(LittleIsEnoughZ(5, 1), 0.2533471031357998, 1e-12);    // s = 2, Phi^-1(0.6)
  EXPECT_NEAR(LittleIsEnoughZ(5, 2), 0.8416212335729144, 1e-12);    // s = 1, Phi^-1(0.8)
  EXPECT_NEAR(LittleIsEnoughZ(50, 24), 1.7506860712521695, 1e-12);  // s = 2, Phi^-1(0.96)
  EXPECT_EQ(LittleIsEnoughZ(10, 1), 0.0);                           // s = 5: (n - s) / n = 1/2
  EXPECT_NEAR(LittleIsEnoughZ(4, 3), 0.6744897501960817, 1e-12);    // s = 0 taken as 1: 3/4
  EXPECT_EQ(LittleIsEnoughZ(1, 1), 0.0);
}

// Three points of the plane: mean (4/3, 4/3); each coordinate holds 0, 4, 0, so its sample
// variance is ((4/3)^2 * 2 + (8/3)^2) / 2 = 48/9 and its standard deviation 4 / sqrt(3).
const Vectors kTriangle = {{0, 0}, {4, 0}, {0, 4}};
const double kTriangleStd = 4 / std::sqrt(3.0);

TEST(AttacksTest, MeanAndStddevPerCoordinate) {
  const CoordinateStats s = MeanAndStddev(kTriangle);
  ASSERT_EQ(s.mean.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_NEAR(s.mean[k], 4.0 / 3, 1e-12);
    EXPECT_NEAR(s.stddev[k], kTriangleStd, 1e-12);
  }
  const CoordinateStats one = MeanAndStddev({{1.5f, -2}});
  EXPECT_EQ(one.mean, (std::vector<double>{1.5, -2}));
  EXPECT_EQ(one.stddev, (std::vector<double>{0, 0}));
}

TEST(AttacksTest, LittleIsEnoughIsTheMeanMinusZStddevs) {
  const std::vector<float> forged = LittleIsEnough(MeanAndStddev(kTriangle), 1.0);
  ASSERT_EQ(forged.size(), 2u);
  EXPECT_NEAR(forged[0], 4.0 / 3 - kTriangleStd, 1e-6);  // -0.97607
  EXPECT_NEAR(forged[1], 4.0 / 3 - kTriangleStd, 1e-6);
}

TEST(AttacksTest, MinMaxGoesAsFarAsTheLargestHonestDistance) {
  // The triangle: the largest distance is |(4,0) - (0,4)|^2 = 32. With t = 4/3 - gamma * std the
  // forgery is (t, t), farthest from (4, 0) and (0, 4): (t - 4)^2 + t^2 <= 32 gives
  // t >= 2 - 2 sqrt(3), so gamma = (4/3 - 2 + 2 sqrt(3)) / (4 / sqrt(3)) = 3/2 - 1 / (2 sqrt(3)).
  const MinMaxForgery tri = MinMax(kTriangle, MeanAndStddev(kTriangle));
  const double gamma = 1.5 - 1 / (2 * std::sqrt(3.0));  // 1.21132
  EXPECT_LE(tri.gamma, gamma);
  EXPECT_GT(tri.gamma, gamma - 2e-5);
  EXPECT_NEAR(tri.forged[0], 2 - 2 * std::sqrt(3.0), 1e-4);  // -1.4641
  EXPECT_EQ(tri.forged[0], tri.forged[1]);
  // On a line, two points 0 and 2: mean 1, std sqrt(2), largest distance 2; the forgery
  // 1 - gamma sqrt(2) may go 2 from the point 2: gamma = 1 / sqrt(2), the forgery the point 0.
  const Vectors line = {{0}, {2}};
  const MinMaxForgery two = MinMax(line, MeanAndStddev(line));
  EXPECT_NEAR(two.gamma, 1 / std::sqrt(2.0), 2e-5);
  EXPECT_NEAR(two.forged[0], 0.0, 3e-5);
  // Equal deltas have no spread: the forgery is the delta.
  const Vectors same = {{1, 2}, {1, 2}};
  EXPECT_EQ(MinMax(same, MeanAndStddev(same)).forged, (std::vector<float>{1, 2}));
}

TEST(AttacksTest, MinMaxFindsTheLargestFeasibleGammaOnRandomUpdates) {
  // ||mu - g_i - gamma sigma||^2 <= D^2 is a quadratic in gamma: a gamma^2 - 2 b_i gamma + c_i <=
  // D^2 with a = |sigma|^2, b_i = <mu - g_i, sigma>, c_i = |mu - g_i|^2, so the largest feasible
  // gamma is min_i (b_i + sqrt(b_i^2 - a (c_i - D^2))) / a. Computed here from the definitions.
  Rng rng(7);
  for (int trial = 0; trial < 5; ++trial) {
    const size_t n = 3 + trial, d = 12;
    Vectors g(n, std::vector<float>(d));
    for (auto& v : g)
      for (float& x : v) x = static_cast<float>(rng.Normal());
    std::vector<double> mu(d, 0), sigma(d, 0);
    for (size_t k = 0; k < d; ++k) {
      for (const auto& v : g) mu[k] += v[k] / static_cast<double>(n);
      for (const auto& v : g) sigma[k] += (v[k] - mu[k]) * (v[k] - mu[k]);
      sigma[k] = std::sqrt(sigma[k] / static_cast<double>(n - 1));
    }
    double d2 = 0, a = 0, expected = INFINITY;
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        double s = 0;
        for (size_t k = 0; k < d; ++k) s += (g[i][k] - g[j][k]) * (g[i][k] - g[j][k]);
        d2 = std::max(d2, s);
      }
    }
    for (size_t k = 0; k < d; ++k) a += sigma[k] * sigma[k];
    for (const auto& v : g) {
      double b = 0, c = 0;
      for (size_t k = 0; k < d; ++k) {
        b += (mu[k] - v[k]) * sigma[k];
        c += (mu[k] - v[k]) * (mu[k] - v[k]);
      }
      expected = std::min(expected, (b + std::sqrt(b * b - a * (c - d2))) / a);
    }
    const MinMaxForgery m = MinMax(g, MeanAndStddev(g));
    EXPECT_LE(m.gamma, expected + 1e-9) << "trial " << trial;
    EXPECT_GT(m.gamma, std::min(expected, 20.0) - 2e-5) << "trial " << trial;
  }
}

std::vector<NamedTensor> Delta(std::vector<float> a, std::vector<float> b) {
  return {NamedTensor{"a", {static_cast<int64_t>(a.size())}, std::move(a)},
          NamedTensor{"b", {1, static_cast<int64_t>(b.size())}, std::move(b)}};
}

v1::SimulationAttack Attack(v1::SimulationAttack::Kind kind) {
  v1::SimulationAttack a;
  a.set_kind(kind);
  return a;
}

TEST(AttacksTest, ForgeFromRoundKeepsNamesAndShapes) {
  // Five clients' deltas of one value per tensor: a = 0, 1, 2, 3, 4 (mean 2, sample std
  // sqrt(10 / 4)), b = 2 everywhere (std 0). LIE with f = 2 of n = 5: z = Phi^-1(0.8).
  ClientDeltas honest;
  for (int c = 0; c < 5; ++c) honest[c] = Delta({static_cast<float>(c)}, {2});
  auto lie = ForgeFromRound(Attack(v1::SimulationAttack::LITTLE_IS_ENOUGH), honest, 5, 2);
  ASSERT_TRUE(lie.ok()) << lie.status();
  ASSERT_EQ(lie->size(), 2u);
  EXPECT_EQ((*lie)[0].name, "a");
  EXPECT_EQ((*lie)[1].shape, (std::vector<int64_t>{1, 1}));
  EXPECT_NEAR((*lie)[0].values[0], 2 - 0.8416212335729144 * std::sqrt(2.5), 1e-6);
  EXPECT_EQ((*lie)[1].values[0], 2.0f);
  // scale overrides z.
  v1::SimulationAttack z3 = Attack(v1::SimulationAttack::LITTLE_IS_ENOUGH);
  z3.set_scale(3);
  auto lie3 = ForgeFromRound(z3, honest, 5, 2);
  ASSERT_TRUE(lie3.ok());
  EXPECT_NEAR((*lie3)[0].values[0], 2 - 3 * std::sqrt(2.5), 1e-6);
  // Min-max: the farthest delta is 4 from the mean's side; the forgery may reach 4 from it.
  auto mm = ForgeFromRound(Attack(v1::SimulationAttack::MIN_MAX), honest, 5, 2);
  ASSERT_TRUE(mm.ok());
  EXPECT_NEAR((*mm)[0].values[0], 0.0, 1e-4);  // 2 - gamma std, at distance 4 from 4
  EXPECT_EQ((*mm)[1].values[0], 2.0f);
}

TEST(AttacksTest, ForgeFromRoundRefusesWhatItCannotForge) {
  ClientDeltas honest;
  honest[0] = Delta({1}, {2});
  honest[1] = Delta({1, 2}, {2});  // another size
  const auto kind = Attack(v1::SimulationAttack::MIN_MAX);
  EXPECT_EQ(ForgeFromRound(kind, honest, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  honest[1] = Delta({1}, {2});
  honest[1][1].name = "c";
  EXPECT_EQ(ForgeFromRound(kind, honest, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ForgeFromRound(kind, {}, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ForgeFromRound(Attack(v1::SimulationAttack::SIGN_FLIP), {{0, Delta({1}, {2})}}, 1, 1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

v1::RunConfig Malicious(uint32_t clients, v1::SimulationAttack::Kind kind, double scale = 0) {
  v1::RunConfig c;
  c.mutable_simulation()->set_malicious_clients(clients);
  c.mutable_simulation()->mutable_attack()->set_kind(kind);
  if (scale > 0) c.mutable_simulation()->mutable_attack()->set_scale(scale);
  return c;
}

TEST(AttacksTest, ForgeUpdateForgesOnlyFromTheOwnDelta) {
  const v1::RunConfig flip = Malicious(1, v1::SimulationAttack::SIGN_FLIP, 2);
  std::vector<NamedTensor> d = Delta({1, -3}, {0.5});
  EXPECT_TRUE(ForgeUpdate(flip, 1, 0, d));
  EXPECT_EQ(d[0].values, (std::vector<float>{-2, 6}));
  EXPECT_EQ(d[1].values, (std::vector<float>{-1}));
  EXPECT_FALSE(ForgeUpdate(flip, 1, 1, d));  // honest
  EXPECT_EQ(d[0].values, (std::vector<float>{-2, 6}));
  // An unset scale is the kind's default (a config built in code has no defaults applied).
  std::vector<NamedTensor> e = Delta({1, -3}, {0.5});
  EXPECT_TRUE(ForgeUpdate(Malicious(1, v1::SimulationAttack::SIGN_FLIP), 1, 0, e));
  EXPECT_EQ(e[0].values, (std::vector<float>{-1, 3}));
  EXPECT_TRUE(ForgeUpdate(Malicious(1, v1::SimulationAttack::SCALE), 1, 0, e));
  EXPECT_EQ(e[1].values, (std::vector<float>{-500}));
  const v1::RunConfig lie = Malicious(1, v1::SimulationAttack::LITTLE_IS_ENOUGH);
  EXPECT_FALSE(ForgeUpdate(lie, 1, 0, d));  // the board's
  EXPECT_TRUE(AttackReadsTheRound(lie));
  EXPECT_FALSE(AttackReadsTheRound(flip));
}

// A board whose rounds all have the cohort `trainers`, `ms_left` before their deadline (nullopt:
// the round is closed).
AttackBoard::CohortOf FixedCohort(std::optional<std::set<int>> trainers, int64_t ms_left) {
  return [=](uint64_t) -> std::optional<AttackBoard::Cohort> {
    if (!trainers.has_value()) return std::nullopt;
    return AttackBoard::Cohort{.trainers = *trainers, .ms_left = ms_left};
  };
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

TEST(AttackBoardTest, TheAttackersWaitForEveryHonestDeltaAndSendOneForgery) {
  // Clients 0 and 1 malicious, 2 and 3 honest; LIE with z = 1 over the four honest deltas
  // a = 1, 2, 6, 3 (client order): mean 3, sample std sqrt((4 + 1 + 9 + 0) / 3).
  const v1::RunConfig config = Malicious(2, v1::SimulationAttack::LITTLE_IS_ENOUGH, 1.0);
  AttackBoard board(config, FixedCohort(std::set<int>{0, 1, 2, 3}, 60'000));
  std::vector<std::vector<NamedTensor>> sent = {Delta({1}, {5}), Delta({2}, {5}), Delta({6}, {5}),
                                                Delta({3}, {5})};
  std::vector<absl::Status> status(4);
  std::vector<std::thread> attackers;
  for (int c : {0, 1}) attackers.emplace_back([&, c] { status[c] = board.Apply(1, c, sent[c]); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(sent[0][0].values[0], 1.0f);  // still waiting for the honest ones
  for (int c : {2, 3}) status[c] = board.Apply(1, c, sent[c]);
  for (auto& t : attackers) t.join();
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
  const float forged = static_cast<float>(3 - std::sqrt(14.0 / 3));
  EXPECT_NEAR(sent[0][0].values[0], forged, 1e-6);
  EXPECT_EQ(sent[0][0].values, sent[1][0].values);  // one forgery for all
  EXPECT_EQ(sent[0][1].values[0], 5.0f);
  EXPECT_EQ(sent[2][0].values[0], 6.0f);  // the honest clients send what they trained
  EXPECT_EQ(sent[3][0].values[0], 3.0f);
  // The honest deltas are freed once the forgery is made, the round when the next one starts.
  EXPECT_EQ(board.deltas_held(), 0u);
  EXPECT_EQ(board.rounds_held(), 1u);
  std::vector<NamedTensor> next = Delta({1}, {1});
  ASSERT_TRUE(board.Apply(2, 2, next).ok());
  EXPECT_EQ(board.rounds_held(), 1u);
  EXPECT_EQ(board.deltas_held(), 1u);
}

TEST(AttackBoardTest, HonestClientsPublishOnlyInRoundsWithAnAttacker) {
  const v1::RunConfig config = Malicious(1, v1::SimulationAttack::MIN_MAX);
  AttackBoard board(config, FixedCohort(std::set<int>{1, 2}, 60'000));  // client 0 not selected
  std::vector<NamedTensor> d = Delta({1}, {2});
  ASSERT_TRUE(board.Apply(1, 1, d).ok());
  EXPECT_EQ(board.deltas_held(), 0u);
  EXPECT_EQ(d[0].values[0], 1.0f);
}

TEST(AttackBoardTest, TheWaitEndsBeforeTheDeadlineWithWhatWasPublished) {
  // Client 2 never publishes: the attacker stops waiting at 3/4 of the 400 ms left and forges
  // from clients 0 and 1 (a = 0 and 2: mean 1, std sqrt(2); z = 1).
  const v1::RunConfig config = Malicious(1, v1::SimulationAttack::LITTLE_IS_ENOUGH, 1.0);
  AttackBoard board(config, FixedCohort(std::set<int>{0, 1, 2}, 400));
  std::vector<NamedTensor> honest = Delta({2}, {0});
  ASSERT_TRUE(board.Apply(1, 1, honest).ok());
  std::vector<NamedTensor> d = Delta({0}, {0});
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(board.Apply(1, 0, d).ok());
  EXPECT_GE(Seconds(t0), 0.29);
  EXPECT_LT(Seconds(t0), 5.0);
  EXPECT_NEAR(d[0].values[0], 1 - std::sqrt(2.0), 1e-6);
  // A round already closed: the attacker forges from its own delta at once (no spread: itself).
  AttackBoard closed(config, FixedCohort(std::nullopt, 0));
  std::vector<NamedTensor> own = Delta({7}, {8});
  ASSERT_TRUE(closed.Apply(1, 0, own).ok());
  EXPECT_EQ(own[0].values[0], 7.0f);
}

TEST(AttackBoardTest, StopEndsTheWait) {
  const v1::RunConfig config = Malicious(1, v1::SimulationAttack::MIN_MAX);
  AttackBoard board(config, FixedCohort(std::set<int>{0, 1}, 600'000));
  std::vector<NamedTensor> d = Delta({0}, {0});
  absl::Status waited;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread attacker([&] { waited = board.Apply(1, 0, d); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  board.Stop();
  attacker.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
  EXPECT_LT(Seconds(t0), 5.0);
}

}  // namespace
}  // namespace fedlora::sim
