// Client sampling: reproducible, a subset of the right size, and fair.
#include "server/selection.h"

#include <algorithm>
#include <map>

#include "gtest/gtest.h"

namespace fedlora {
namespace {

std::set<std::string> Candidates(int n) {
  std::set<std::string> c;
  for (int i = 0; i < n; ++i) c.insert("site-" + std::to_string(i));
  return c;
}

TEST(SelectionTest, ASortedSubsetOfTheQuota) {
  const std::set<std::string> c = Candidates(10);
  const std::vector<std::string> chosen = SampleClients(7, 1, c, 4);
  ASSERT_EQ(chosen.size(), 4u);
  EXPECT_TRUE(std::is_sorted(chosen.begin(), chosen.end()));
  EXPECT_EQ(std::adjacent_find(chosen.begin(), chosen.end()), chosen.end());
  for (const std::string& id : chosen) EXPECT_EQ(c.count(id), 1u) << id;
  // Fewer candidates than the quota: all of them. No quota: none.
  EXPECT_EQ(SampleClients(7, 1, Candidates(3), 4).size(), 3u);
  EXPECT_TRUE(SampleClients(7, 1, c, 0).empty());
  EXPECT_TRUE(SampleClients(7, 1, {}, 4).empty());
}

TEST(SelectionTest, AFunctionOfSeedRoundAndCandidatesOnly) {
  const std::set<std::string> c = Candidates(20);
  EXPECT_EQ(SampleClients(7, 3, c, 5), SampleClients(7, 3, c, 5));
  // Other rounds and other seeds choose otherwise (at least sometimes).
  int differ_by_round = 0, differ_by_seed = 0;
  for (int r = 1; r <= 20; ++r) {
    differ_by_round += SampleClients(7, r, c, 5) != SampleClients(7, r + 1, c, 5) ? 1 : 0;
    differ_by_seed += SampleClients(7, r, c, 5) != SampleClients(8, r, c, 5) ? 1 : 0;
  }
  EXPECT_GE(differ_by_round, 15);
  EXPECT_GE(differ_by_seed, 15);
}

TEST(SelectionTest, EveryCandidateIsEquallyLikely) {
  // 10 candidates, 3 chosen per round over 3000 rounds: 900 expected each; a fair sampler stays
  // within +-15% (about 5 standard deviations).
  const std::set<std::string> c = Candidates(10);
  std::map<std::string, int> times;
  for (int r = 1; r <= 3000; ++r) {
    for (const std::string& id : SampleClients(42, r, c, 3)) ++times[id];
  }
  ASSERT_EQ(times.size(), 10u);
  for (const auto& [id, n] : times) {
    EXPECT_GT(n, 765) << id;
    EXPECT_LT(n, 1035) << id;
  }
}

}  // namespace
}  // namespace fedlora
