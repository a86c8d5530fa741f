#include "train/partition.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fedlora {
namespace {

// 1000 examples over 4 labels with sizes 400/300/200/100, in a fixed interleaved order.
std::vector<int> SkewedLabels() {
  std::vector<int> labels;
  const int sizes[4] = {400, 300, 200, 100};
  for (int c = 0; c < 4; ++c) labels.insert(labels.end(), sizes[c], c);
  Rng rng(99);
  rng.Shuffle(labels);
  return labels;
}

// Every index in [0, n) appears exactly once over all clients; no client is empty.
void ExpectExactCoverage(const Partition& p, int64_t n) {
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (const auto& client : p.client_indices) {
    EXPECT_FALSE(client.empty());
    EXPECT_TRUE(std::is_sorted(client.begin(), client.end()));
    for (int64_t i : client) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, n);
      ++seen[static_cast<size_t>(i)];
    }
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << "index " << i;
}

// Fraction of a client's examples in its most common label.
double TopLabelShare(const std::vector<int64_t>& hist) {
  const int64_t total = std::accumulate(hist.begin(), hist.end(), int64_t{0});
  return static_cast<double>(*std::max_element(hist.begin(), hist.end())) /
         static_cast<double>(total);
}

TEST(Partition, EverySchemeCoversExactlyOnce) {
  const std::vector<int> labels = SkewedLabels();
  for (PartitionScheme scheme :
       {PartitionScheme::kIid, PartitionScheme::kDirichlet, PartitionScheme::kLabelShards}) {
    PartitionOptions opts;
    opts.scheme = scheme;
    opts.num_clients = 10;
    opts.dirichlet_alpha = 0.1;
    opts.shards_per_client = 2;
    opts.seed = 5;
    auto p = PartitionByLabel(labels, 4, opts);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->num_clients(), 10);
    SCOPED_TRACE(std::string(PartitionSchemeName(scheme)));
    ExpectExactCoverage(*p, static_cast<int64_t>(labels.size()));
  }
}

TEST(Partition, DeterministicForASeedAndDifferentAcrossSeeds) {
  const std::vector<int> labels = SkewedLabels();
  PartitionOptions opts;
  opts.scheme = PartitionScheme::kDirichlet;
  opts.num_clients = 8;
  opts.seed = 11;
  auto a = PartitionByLabel(labels, 4, opts);
  auto b = PartitionByLabel(labels, 4, opts);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->client_indices, b->client_indices);
  opts.seed = 12;
  auto c = PartitionByLabel(labels, 4, opts);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->client_indices, c->client_indices);
}

TEST(Partition, IidSizesDifferByAtMostOneAndHistogramsAreNearUniform) {
  const std::vector<int> labels = SkewedLabels();
  PartitionOptions opts;
  opts.num_clients = 7;
  opts.seed = 3;
  auto p = PartitionByLabel(labels, 4, opts);
  ASSERT_TRUE(p.ok());
  const auto sizes = p->Sizes();
  EXPECT_LE(
      *std::max_element(sizes.begin(), sizes.end()) - *std::min_element(sizes.begin(), sizes.end()),
      1);
  // Each client holds ~143 examples drawn without replacement; label 0 is 40% of the data, so
  // its count is about binomial with mean 57 and sd ~5.9. A 5 sd band fails by chance with
  // p < 1e-6 per cell, yet a label-sorted split would give counts of 0 or 143.
  const auto hist = LabelHistograms(*p, labels, 4);
  const double share[4] = {0.4, 0.3, 0.2, 0.1};
  for (size_t c = 0; c < hist.size(); ++c) {
    for (int y = 0; y < 4; ++y) {
      const double expected = share[y] * static_cast<double>(sizes[c]);
      const double sd = std::sqrt(static_cast<double>(sizes[c]) * share[y] * (1 - share[y]));
      EXPECT_NEAR(static_cast<double>(hist[c][static_cast<size_t>(y)]), expected, 5 * sd)
          << "client " << c << " label " << y;
    }
  }
}

TEST(Partition, SmallAlphaIsSkewedLargeAlphaIsNot) {
  const std::vector<int> labels = SkewedLabels();
  auto mean_top_share = [&](double alpha) {
    PartitionOptions opts;
    opts.scheme = PartitionScheme::kDirichlet;
    opts.num_clients = 10;
    opts.dirichlet_alpha = alpha;
    opts.seed = 21;
    auto p = PartitionByLabel(labels, 4, opts);
    EXPECT_TRUE(p.ok()) << p.status();
    const auto hist = LabelHistograms(*p, labels, 4);
    double sum = 0;
    for (const auto& h : hist) sum += TopLabelShare(h);
    return sum / static_cast<double>(hist.size());
  };
  // Measured: alpha 0.05 makes nearly every client single-label (mean top share > 0.9); alpha 1000
  // gives the global mix, where the top label (label 0) is 40% of the data.
  const double skewed = mean_top_share(0.05);
  const double iidish = mean_top_share(1000.0);
  EXPECT_GT(skewed, 0.85);
  EXPECT_LT(iidish, 0.5);
  EXPECT_GT(iidish, 0.35);
}

TEST(Partition, TinyAlphaStillGivesEveryClientAnExample) {
  // 12 examples, 12 clients, alpha 0.001: the draw puts nearly everything on one client per label,
  // so the fix-up must hand one example to each empty client.
  std::vector<int> labels = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
  PartitionOptions opts;
  opts.scheme = PartitionScheme::kDirichlet;
  opts.num_clients = 12;
  opts.dirichlet_alpha = 0.001;
  auto p = PartitionByLabel(labels, 2, opts);
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectExactCoverage(*p, 12);
  for (int64_t s : p->Sizes()) EXPECT_EQ(s, 1);
}

TEST(Partition, ShardsGiveExactlyKLabelsPerClient) {
  const std::vector<int> labels = SkewedLabels();
  for (int k : {1, 2, 3}) {
    PartitionOptions opts;
    opts.scheme = PartitionScheme::kLabelShards;
    opts.num_clients = 6;
    opts.shards_per_client = k;
    opts.seed = 8;
    auto p = PartitionByLabel(labels, 4, opts);
    ASSERT_TRUE(p.ok()) << p.status();
    ExpectExactCoverage(*p, static_cast<int64_t>(labels.size()));
    for (const auto& h : LabelHistograms(*p, labels, 4)) {
      EXPECT_EQ(std::count_if(h.begin(), h.end(), [](int64_t x) { return x > 0; }), k);
    }
  }
}

TEST(Partition, ByKeyKeepsEachKeyOnOneClient) {
  std::vector<std::string> keys;
  for (int i = 0; i < 50; ++i) keys.push_back("site" + std::to_string(i % 7));
  auto p = PartitionByKey(keys, 3, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectExactCoverage(*p, 50);
  std::set<std::string> owned_before;
  for (const auto& client : p->client_indices) {
    std::set<std::string> mine;
    for (int64_t i : client) mine.insert(keys[static_cast<size_t>(i)]);
    for (const auto& k : mine) EXPECT_TRUE(owned_before.insert(k).second) << k << " on two clients";
  }
  EXPECT_EQ(owned_before.size(), 7u);
  // 7 keys over 3 clients round-robin: 3, 2, 2 keys.
  auto again = PartitionByKey(keys, 3, 4);
  EXPECT_EQ(again->client_indices, p->client_indices);
  EXPECT_FALSE(PartitionByKey(keys, 8, 4).ok());  // 7 keys cannot serve 8 clients
}

TEST(Partition, Errors) {
  const std::vector<int> labels = {0, 1, 0, 1};
  PartitionOptions opts;
  opts.num_clients = 0;
  EXPECT_EQ(PartitionByLabel(labels, 2, opts).status().code(), absl::StatusCode::kInvalidArgument);
  opts.num_clients = 5;
  auto too_many = PartitionByLabel(labels, 2, opts);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_many.status().message()).find("only 4 examples"), std::string::npos);
  opts.num_clients = 2;
  opts.scheme = PartitionScheme::kDirichlet;
  for (double alpha : {0.0, -1.0, std::nan("")}) {
    opts.dirichlet_alpha = alpha;
    EXPECT_EQ(PartitionByLabel(labels, 2, opts).status().code(), absl::StatusCode::kInvalidArgument)
        << alpha;
  }
  opts.scheme = PartitionScheme::kIid;
  EXPECT_FALSE(PartitionByLabel(std::vector<int>{0, 2}, 2, opts).ok());  // label out of range
  opts.scheme = PartitionScheme::kLabelShards;
  opts.shards_per_client = 3;  // only 2 labels present
  EXPECT_FALSE(PartitionByLabel(labels, 2, opts).ok());
  opts.shards_per_client = 0;
  EXPECT_FALSE(PartitionByLabel(labels, 2, opts).ok());
  EXPECT_TRUE(ParsePartitionScheme("Dirichlet").ok());
  EXPECT_FALSE(ParsePartitionScheme("zipf").ok());
}

TEST(Gamma, MomentsMatchForSmallAndLargeShapes) {
  // Gamma(a, 1) has mean a and variance a. With 200k draws the standard error of the mean is
  // sqrt(a / 200k); 6 standard errors keep the test stable, while a wrong boost (shape < 1) or
  // wrong d/c constants shift the mean by far more.
  for (double a : {0.3, 1.0, 2.5, 9.0}) {
    Rng rng(1234, static_cast<uint64_t>(a * 10));
    const int n = 200000;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; ++i) {
      const double x = SampleGamma(rng, a);
      ASSERT_GE(x, 0.0);
      sum += x;
      sum2 += x * x;
    }
    const double mean = sum / n;
    const double var = sum2 / n - mean * mean;
    EXPECT_NEAR(mean, a, 6 * std::sqrt(a / n)) << "shape " << a;
    EXPECT_NEAR(var, a, 0.05 * a + 0.01) << "shape " << a;
  }
  Rng rng(1);
  EXPECT_TRUE(std::isnan(SampleGamma(rng, 0.0)));
  const auto p = SampleDirichlet(rng, 5, 1e-3);
  EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
}

}  // namespace
}  // namespace fedlora
