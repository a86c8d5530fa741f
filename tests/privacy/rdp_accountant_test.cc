#include "privacy/rdp_accountant.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora::privacy {
namespace {

using ::testing::HasSubstr;

constexpr double kRelTol = 1e-6;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double Epsilon(double noise, double rate, uint64_t steps, double delta) {
  RdpAccountant accountant;
  EXPECT_TRUE(accountant.AddSteps(noise, rate, steps).ok());
  auto spent = accountant.GetEpsilon(delta);
  EXPECT_TRUE(spent.ok()) << spent.status();
  return spent.ok() ? spent->epsilon : kNaN;
}

TEST(RdpAccountant, DefaultOrdersAreOpacusDefaultAlphas) {
  const std::vector<double> orders = DefaultRdpOrders();
  ASSERT_EQ(orders.size(), 99u + 52u);
  EXPECT_DOUBLE_EQ(orders.front(), 1.1);
  EXPECT_EQ(orders[8], 1.9);
  EXPECT_EQ(orders[9], 2.0);
  EXPECT_DOUBLE_EQ(orders[98], 10.9);
  EXPECT_EQ(orders[99], 12.0);
  EXPECT_EQ(orders.back(), 63.0);
}

TEST(RdpAccountant, MatchesOpacusOwnTest) {
  // Opacus's tests/accountants_test.py (test_rdp_accountant): sigma 1.5, q 0.04, 90 epochs.
  const double eps = Epsilon(1.5, 0.04, static_cast<uint64_t>(90 / 0.04), 1e-5);
  EXPECT_NEAR(eps, 7.32911117143, 7.32911117143 * kRelTol);
}

struct GridPoint {
  double noise, rate;
  uint64_t steps;
  double delta, epsilon, order;
};

// From Opacus 1.5.2's opacus/accountants/analysis/rdp.py (loaded standalone with importlib, numpy 1.24,
// scipy 1.10): get_privacy_spent(orders=A, rdp=compute_rdp(q=rate, noise_multiplier=noise, steps=steps,
// orders=A), delta=delta) with A = DEFAULT_ALPHAS; the values are its repr()s.
constexpr GridPoint kGrid[] = {
    {0.5, 0.001, 1, 1e-05, 2.835610328605305, 4.4},
    {0.5, 0.01, 100, 1e-05, 8.030725352808414, 2.5},
    {0.5, 0.1, 10, 0.001, 9.618601480693918, 1.9},
    {0.7, 0.05, 1000, 1e-06, 28.98453238589484, 1.9},
    {0.8, 0.2, 50, 1e-05, 16.921099168696664, 2.1},
    {1.0, 0.001, 10000, 1e-05, 0.7876595344277287, 13.0},
    {1.0, 0.01, 1000, 1e-07, 2.764672618111986, 8.1},
    {1.0, 0.5, 1, 1e-05, 3.8935758781414105, 5.4},
    {1.1, 0.1, 100, 1e-05, 6.613704345072375, 3.6},
    {1.2, 0.03, 3000, 0.0001, 7.818345789073984, 3.2},
    {1.5, 0.002, 5000, 1e-06, 0.5248937162758586, 27.0},
    {1.5, 0.25, 20, 0.001, 3.304176665520913, 3.9},
    {2.0, 0.004, 10000, 1e-07, 1.0808293963193563, 24.0},
    {2.0, 0.1, 500, 1e-05, 6.034322441891099, 4.4},
    {2.0, 1.0, 10, 1e-05, 8.079406222420491, 3.9},
    {2.5, 0.75, 3, 1e-06, 2.838346415653509, 8.7},
    {3.0, 0.05, 2000, 1e-05, 3.5466027892094796, 6.5},
    {3.0, 0.9, 100, 1e-07, 20.765797417250464, 2.8},
    {4.0, 0.3, 1000, 1e-05, 13.572056234374687, 2.9},
    {4.0, 0.02, 10000, 0.001, 1.5811720586110156, 7.1},
    {5.0, 0.001, 1, 1e-07, 0.1771454784858229, 63.0},
    {5.0, 0.1, 10000, 1e-06, 11.8690457137671, 3.5},
    {5.0, 1.0, 1000, 1e-05, 48.80169282486775, 1.7},
    {0.6, 1.0, 1, 0.0001, 7.701650919768202, 3.4},
};

TEST(RdpAccountant, MatchesOpacusOnAGrid) {
  for (const GridPoint& p : kGrid) {
    SCOPED_TRACE(testing::Message() << "noise " << p.noise << " rate " << p.rate << " steps "
                                    << p.steps << " delta " << p.delta);
    RdpAccountant accountant;
    ASSERT_TRUE(accountant.AddSteps(p.noise, p.rate, p.steps).ok());
    auto spent = accountant.GetEpsilon(p.delta);
    ASSERT_TRUE(spent.ok()) << spent.status();
    EXPECT_NEAR(spent->epsilon, p.epsilon, p.epsilon * kRelTol);
    EXPECT_EQ(spent->order, p.order);
  }
}

TEST(SubsampledGaussianRdp, MatchesOpacusAtSingleOrders) {
  // Opacus 1.5.2 rdp._compute_rdp(q, sigma, alpha), integer and fractional alpha.
  struct Case {
    double q, sigma, alpha, rdp;
  };
  const Case cases[] = {
      {0.01, 0.5, 1.5, 0.0026298912082652675}, {0.001, 5.0, 2.5, 5.1014521792088395e-08},
      {0.3, 1.0, 32.0, 14.757189363276536},    {0.5, 1.0, 1.1, 0.15613047568420288},
      {0.2, 0.7, 7.0, 5.265202031598199},      {0.0001, 10.0, 10.5, 5.276383057782343e-10},
      {0.9, 3.0, 63.0, 3.3930552156843685},    {0.05, 2.0, 1.25, 0.0004388760120985163},
      {0.35, 0.67, 1.1, 0.21779425635441255},  // erfc underflows in the series: the asymptotic log erfc
  };
  for (const Case& c : cases) {
    auto rdp = SubsampledGaussianRdp(c.q, c.sigma, c.alpha);
    ASSERT_TRUE(rdp.ok()) << rdp.status();
    EXPECT_NEAR(*rdp, c.rdp, c.rdp * kRelTol)
        << "q " << c.q << " sigma " << c.sigma << " alpha " << c.alpha;
  }
}

TEST(RdpAccountant, MixedStepsAndCustomOrdersMatchOpacus) {
  // Opacus 1.5.2: the sum of two compute_rdp curves, then get_privacy_spent.
  RdpAccountant mixed;
  ASSERT_TRUE(mixed.AddSteps(1.0, 0.01, 500).ok());
  ASSERT_TRUE(mixed.AddSteps(2.0, 0.1, 100).ok());
  auto spent = mixed.GetEpsilon(1e-5);
  ASSERT_TRUE(spent.ok());
  EXPECT_NEAR(spent->epsilon, 2.954381113376966, 2.954381113376966 * kRelTol);
  EXPECT_EQ(spent->order, 6.9);

  RdpAccountant custom({2, 4, 8, 16, 32});  // integer orders only
  ASSERT_TRUE(custom.AddSteps(1.3, 0.02, 700).ok());
  spent = custom.GetEpsilon(1e-6);
  ASSERT_TRUE(spent.ok());
  EXPECT_NEAR(spent->epsilon, 2.5795901202812432, 2.5795901202812432 * kRelTol);
  EXPECT_EQ(spent->order, 8.0);
}

TEST(RdpAccountant, RateZeroHasZeroRdp) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.AddSteps(1.0, 0.0, 10).ok());
  for (double r : accountant.rdp()) EXPECT_EQ(r, 0.0);
  // Opacus 1.5.2 for q = 0: the conversion of an all-zero curve.
  auto spent = accountant.GetEpsilon(1e-5);
  ASSERT_TRUE(spent.ok());
  EXPECT_NEAR(spent->epsilon, 0.10286725121127971, 0.10286725121127971 * kRelTol);
  EXPECT_EQ(spent->order, 63.0);
}

TEST(RdpAccountant, RateOneIsTheGaussianMechanism) {
  // Full participation: RDP of the Gaussian mechanism, alpha / (2 sigma^2) per step.
  const double sigma = 1.7;
  const uint64_t steps = 12;
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.AddSteps(sigma, 1.0, steps).ok());
  for (size_t k = 0; k < accountant.orders().size(); ++k) {
    const double a = accountant.orders()[k];
    EXPECT_NEAR(accountant.rdp()[k], steps * a / (2 * sigma * sigma), 1e-12 * a);
  }
  // And the conversion by hand: min over alpha of rdp - (log delta + log alpha) / (alpha - 1) + log(1 - 1/alpha).
  const double delta = 1e-6;
  double want = kInf;
  for (double a : DefaultRdpOrders()) {
    want = std::min(want, steps * a / (2 * sigma * sigma) -
                              (std::log(delta) + std::log(a)) / (a - 1) + std::log((a - 1) / a));
  }
  auto spent = accountant.GetEpsilon(delta);
  ASSERT_TRUE(spent.ok());
  EXPECT_NEAR(spent->epsilon, want, 1e-12 * want);
}

TEST(SubsampledGaussianRdp, VanishingNoiseIsInfinite) {
  // Opacus returns inf for sigma == 0 but raises or never returns for sigma this small; the terms of
  // A_alpha overflow (sigma^2 is subnormal, then 0), so the RDP is inf.
  for (double sigma : {1e-160, 1e-170}) {
    for (double order : {1.5, 2.0, 40.0}) {
      auto rdp = SubsampledGaussianRdp(0.1, sigma, order);
      ASSERT_TRUE(rdp.ok()) << rdp.status();
      EXPECT_EQ(*rdp, kInf) << sigma << " " << order;
    }
  }
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.AddSteps(1e-160, 0.1, 1).ok());
  auto spent = accountant.GetEpsilon(1e-5);
  ASSERT_TRUE(spent.ok());
  EXPECT_EQ(spent->epsilon, kInf);
}

TEST(RdpAccountant, CompositionIsAdditive) {
  RdpAccountant split, whole;
  ASSERT_TRUE(split.AddSteps(1.1, 0.05, 300).ok());
  ASSERT_TRUE(split.AddSteps(1.1, 0.05, 700).ok());
  ASSERT_TRUE(whole.AddSteps(1.1, 0.05, 1000).ok());
  for (size_t k = 0; k < whole.rdp().size(); ++k) {
    EXPECT_NEAR(split.rdp()[k], whole.rdp()[k], 1e-12 * whole.rdp()[k]);
  }
  auto a = split.GetEpsilon(1e-5), b = whole.GetEpsilon(1e-5);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(a->epsilon, b->epsilon, 1e-12 * b->epsilon);
}

TEST(RdpAccountant, MoreStepsCostMoreAndMoreNoiseLess) {
  double last = 0;
  for (uint64_t steps : {1, 10, 100, 1000, 10000}) {
    const double eps = Epsilon(1.0, 0.01, steps, 1e-5);
    EXPECT_GT(eps, last) << steps;
    last = eps;
  }
  last = kInf;
  for (double noise : {0.5, 1.0, 2.0, 4.0, 8.0}) {
    const double eps = Epsilon(noise, 0.01, 100, 1e-5);
    EXPECT_LT(eps, last) << noise;
    last = eps;
  }
}

TEST(RdpAccountant, NoStepsIsZero) {
  RdpAccountant accountant;
  auto spent = accountant.GetEpsilon(1e-5);
  ASSERT_TRUE(spent.ok());
  EXPECT_EQ(spent->epsilon, 0.0);
  EXPECT_EQ(spent->order, 0.0);
  ASSERT_TRUE(accountant.AddSteps(1.0, 0.1, 0).ok());
  spent = accountant.GetEpsilon(1e-5);
  ASSERT_TRUE(spent.ok());
  EXPECT_EQ(spent->epsilon, 0.0);
}

void ExpectInvalid(const absl::Status& status, const std::string& name, const std::string& value) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(name));
  EXPECT_THAT(std::string(status.message()), HasSubstr(value));
}

TEST(RdpAccountant, RefusesBadInputAndStaysUnchanged) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.AddSteps(1.0, 0.1, 5).ok());
  const std::vector<double> before = accountant.rdp();
  ExpectInvalid(accountant.AddSteps(0.0, 0.1, 1), "noise_multiplier", "0");
  ExpectInvalid(accountant.AddSteps(-1.5, 0.1, 1), "noise_multiplier", "-1.5");
  ExpectInvalid(accountant.AddSteps(kInf, 0.1, 1), "noise_multiplier", "inf");
  ExpectInvalid(accountant.AddSteps(kNaN, 0.1, 1), "noise_multiplier", "nan");
  ExpectInvalid(accountant.AddSteps(1.0, -0.25, 1), "sampling_rate", "-0.25");
  ExpectInvalid(accountant.AddSteps(1.0, 1.5, 1), "sampling_rate", "1.5");
  ExpectInvalid(accountant.AddSteps(1.0, kNaN, 1), "sampling_rate", "nan");
  ExpectInvalid(accountant.AddSteps(1.0, 2.0, 0), "sampling_rate", "2");
  EXPECT_EQ(accountant.rdp(), before);
  for (double delta : {0.0, 1.0, -0.5, 2.5, kNaN}) {
    ExpectInvalid(accountant.GetEpsilon(delta).status(), "delta", "");
  }
  ExpectInvalid(accountant.GetEpsilon(-0.5).status(), "delta", "-0.5");

  RdpAccountant bad_order({2.0, 1.0});
  ExpectInvalid(bad_order.AddSteps(1.0, 0.1, 1), "order", "1");
  EXPECT_EQ(bad_order.rdp(), std::vector<double>({0.0, 0.0}));
  for (double order : {1.0, 0.5, -3.0, kNaN, kInf}) {
    ExpectInvalid(SubsampledGaussianRdp(0.1, 1.0, order).status(), "order", "");
  }
  ExpectInvalid(SubsampledGaussianRdp(0.1, 0.0, 2.0).status(), "noise_multiplier", "0");
  ExpectInvalid(SubsampledGaussianRdp(1.01, 1.0, 2.0).status(), "sampling_rate", "1.01");
}

TEST(EpsilonFromRdp, RefusesBadInput) {
  ExpectInvalid(EpsilonFromRdp({2, 3}, {0.1}, 1e-5).status(), "same size", "2 and 1");
  ExpectInvalid(EpsilonFromRdp({2, 3}, {0.1, 0.2}, 0).status(), "delta", "0");
  ExpectInvalid(EpsilonFromRdp({2, 0.9}, {0.1, 0.2}, 1e-5).status(), "order", "0.9");
  ExpectInvalid(EpsilonFromRdp({}, {}, 1e-5).status(), "orders", "empty");
}

TEST(EpsilonFromRdp, NanHandlingAsOpacus) {
  // np.nanargmin skips NaN; all NaN gives (inf, nan).
  auto spent = EpsilonFromRdp({2, 3, 4}, {kNaN, 0.5, kNaN}, 1e-5);
  ASSERT_TRUE(spent.ok());
  EXPECT_EQ(spent->order, 3.0);
  EXPECT_DOUBLE_EQ(spent->epsilon, 0.5 - (std::log(1e-5) + std::log(3.0)) / 2 + std::log(2.0 / 3));
  spent = EpsilonFromRdp({2, 3}, {kNaN, kNaN}, 1e-5);
  ASSERT_TRUE(spent.ok());
  EXPECT_EQ(spent->epsilon, kInf);
  EXPECT_TRUE(std::isnan(spent->order));
  spent = EpsilonFromRdp({2, 3}, {kNaN, kInf}, 1e-5);  // nanargmin reads NaN as inf: the first wins
  ASSERT_TRUE(spent.ok());
  EXPECT_TRUE(std::isnan(spent->epsilon));
  EXPECT_EQ(spent->order, 2.0);
  spent = EpsilonFromRdp({2, 3}, {kInf, kInf}, 1e-5);  // no privacy at any order
  ASSERT_TRUE(spent.ok());
  EXPECT_EQ(spent->epsilon, kInf);
  EXPECT_EQ(spent->order, 2.0);
}

}  // namespace
}  // namespace fedlora::privacy
