// The robust rules on hand-checked inputs: every expected value below is worked out in the comment
// beside it, from the rule's definition (aggregation/robust.h), not by the code under test.
#include "aggregation/robust.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

std::vector<TensorSpec> Spec(int64_t n) { return {{"w", {n}}}; }

std::vector<KeptTensor> Dense(std::vector<float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return {{"w", {n}, true, {}, std::move(values)}};
}

std::unique_ptr<RobustAggregator> Make(RobustOptions o, int64_t n) {
  absl::StatusOr<std::unique_ptr<RobustAggregator>> a = RobustAggregator::Create(Spec(n), o);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *std::move(a) : nullptr;
}

// Adds each row and returns the aggregate's values.
std::vector<float> Aggregate(RobustOptions o, const std::vector<std::vector<float>>& rows) {
  std::unique_ptr<RobustAggregator> a = Make(o, static_cast<int64_t>(rows[0].size()));
  for (const std::vector<float>& r : rows) EXPECT_TRUE(a->Add(Dense(r), 1).ok());
  absl::StatusOr<std::vector<UpdateTensor>> out = a->Finish();
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0].values : std::vector<float>();
}

TEST(RobustTest, MedianPerCoordinate) {
  // Columns of the odd case: {1, 2, 100} -> 2, {10, 20, -5} -> 10, {-1, -2, 0} -> -1.
  EXPECT_EQ(Aggregate({RobustRule::kMedian}, {{1, 10, -1}, {2, 20, -2}, {100, -5, 0}}),
            (std::vector<float>{2, 10, -1}));
  // With a fourth row {3, 0, 7}: sorted columns {1, 2, 3, 100} -> 2.5, {-5, 0, 10, 20} -> 5,
  // {-2, -1, 0, 7} -> -0.5 (the mean of the two middle values).
  EXPECT_EQ(Aggregate({RobustRule::kMedian}, {{1, 10, -1}, {2, 20, -2}, {100, -5, 0}, {3, 0, 7}}),
            (std::vector<float>{2.5f, 5, -0.5f}));
}

TEST(RobustTest, TrimmedMeanDropsFloorOfTheFractionAtEachEnd) {
  // n = 5, trim_fraction 0.2: one value dropped at each end. Column 0 {1, 2, 3, 4, 1000} -> the
  // mean of {2, 3, 4} = 3; column 1 {-7, 0, 1, 2, -1000} -> the mean of {-7, 0, 1} = -2.
  EXPECT_EQ(
      Aggregate({RobustRule::kTrimmedMean, 0.2}, {{1, -7}, {2, 0}, {3, 1}, {4, 2}, {1000, -1000}}),
      (std::vector<float>{3, -2}));
  // n = 9, trim_fraction 0.25: floor(2.25) = 2 at each end; {1..9} -> the mean of {3..7} = 5.
  EXPECT_EQ(
      Aggregate({RobustRule::kTrimmedMean, 0.25}, {{9}, {1}, {8}, {2}, {7}, {3}, {6}, {4}, {5}}),
      (std::vector<float>{5}));
}

TEST(RobustTest, KrumScoresAreTheSumsOfTheNearestSquaredDistances) {
  // Points 0, 1, 2, 3, 100 with 2 neighbours: 0 -> 1 + 4 = 5; 1 -> 1 + 1 = 2; 2 -> 1 + 1 = 2;
  // 3 -> 1 + 4 = 5; 100 -> 97^2 + 98^2 = 9409 + 9604 = 19013.
  const std::vector<std::vector<float>> p = {{0}, {1}, {2}, {3}, {100}};
  std::vector<const std::vector<float>*> rows;
  for (const auto& r : p) rows.push_back(&r);
  EXPECT_EQ(KrumScores(rows, 2), (std::vector<double>{5, 2, 2, 5, 19013}));
  // In two dimensions: (0, 0), (3, 4), (6, 8) with one neighbour: 25, 25, 25.
  const std::vector<std::vector<float>> q = {{0, 0}, {3, 4}, {6, 8}};
  rows.clear();
  for (const auto& r : q) rows.push_back(&r);
  EXPECT_EQ(KrumScores(rows, 1), (std::vector<double>{25, 25, 25}));
}

TEST(RobustTest, KrumPicksTheBestScoredUpdateAndMultiKrumAveragesTheBest) {
  // Scores of 0, 1, 2, 3, 100 (f = 1, n - f - 2 = 2 neighbours): 5, 2, 2, 5, 19013. Krum: the
  // smaller of the two best, 1. Multi-Krum keeping 3: 1, 2 and 0 (the smaller of the two 5s) -> 1.
  // Multi-Krum by default keeps n - f = 4: 0, 1, 2, 3 -> 1.5.
  const std::vector<std::vector<float>> p = {{0}, {1}, {2}, {3}, {100}};
  EXPECT_EQ(Aggregate({RobustRule::kKrum, 0, 1}, p), (std::vector<float>{1}));
  EXPECT_EQ(Aggregate({RobustRule::kMultiKrum, 0, 1, 3}, p), (std::vector<float>{1}));
  EXPECT_EQ(Aggregate({RobustRule::kMultiKrum, 0, 1}, p), (std::vector<float>{1.5f}));
  // Krum returns the picked update itself, every coordinate of it: (2, -3) is nearest the rest.
  EXPECT_EQ(Aggregate({RobustRule::kKrum, 0, 1}, {{0, -1}, {2, -3}, {3, -3}, {1, -4}, {50, 50}}),
            (std::vector<float>{2, -3}));
}

TEST(RobustTest, BulyanPicksByRepeatedKrumThenAveragesAroundTheMedian) {
  // n = 7, f = 1: theta = 5 picks, beta = 3. Points 0, 1, 2, 3, 4 and two attackers at 1000.
  //   7 left, 4 neighbours: 0 -> 30, 1 -> 15, 2 -> 10, 3 -> 15, 4 -> 30, 1000s huge: pick 2.
  //   6 left, 3 neighbours: 0 -> 26, 1 -> 14, 3 -> 14, 4 -> 26: pick 1 (the smaller of equals).
  //   5 left, 2 neighbours: 0 -> 25, 3 -> 10, 4 -> 17, each 1000 -> 0 + 996^2: pick 3.
  //   4 left, 1 neighbour: 0 -> 16, 4 -> 16, each 1000 -> 0: pick a 1000.
  //   3 left, 1 neighbour: 0 -> 16, 4 -> 16, 1000 -> 996^2: pick 0.
  // Picks {0, 1, 2, 3, 1000}: median 2, the 3 values closest to it {1, 2, 3}, mean 2.
  EXPECT_EQ(Aggregate({RobustRule::kBulyan, 0, 1}, {{0}, {1}, {2}, {3}, {4}, {1000}, {1000}}),
            (std::vector<float>{2}));
}

TEST(RobustTest, ResultsDoNotDependOnTheOrderOfTheUpdates) {
  std::vector<std::vector<float>> rows = {{0.5f, -1, 3},   {0.25f, 2, -1}, {4, 0.75f, 2},
                                          {-3, 1, 0.125f}, {9, 9, 9},      {0.375f, 0.5f, 1.5f},
                                          {-8, -8, 30}};
  for (RobustOptions o :
       {RobustOptions{RobustRule::kMedian}, RobustOptions{RobustRule::kTrimmedMean, 0.3},
        RobustOptions{RobustRule::kKrum, 0, 1}, RobustOptions{RobustRule::kMultiKrum, 0, 1, 3},
        RobustOptions{RobustRule::kBulyan, 0, 1}}) {
    const std::vector<float> first = Aggregate(o, rows);
    std::vector<std::vector<float>> reversed(rows.rbegin(), rows.rend());
    std::rotate(reversed.begin(), reversed.begin() + 2, reversed.end());
    EXPECT_EQ(Aggregate(o, reversed), first) << static_cast<int>(o.rule);
  }
}

TEST(RobustTest, TooFewUpdatesForTheBoundAreRefusedAtFinish) {
  struct Case {
    RobustOptions o;
    int n;
    const char* message;
  };
  for (const Case& c :
       {Case{{RobustRule::kKrum, 0, 1},
             4,
             "krum needs at least 5 updates with f = 1; the round has 4"},
        Case{{RobustRule::kMultiKrum, 0, 1, 5}, 5, "multi_krum needs at least 6 updates"},
        Case{{RobustRule::kBulyan, 0, 2}, 10, "bulyan needs at least 11 updates with f = 2"},
        Case{{RobustRule::kTrimmedMean, 0.2},
             4,
             "trimmed_mean needs at least 5 updates (trim_fraction 0.2 trims none of fewer)"}}) {
    std::unique_ptr<RobustAggregator> a = Make(c.o, 1);
    for (int i = 0; i < c.n; ++i) ASSERT_TRUE(a->Add(Dense({static_cast<float>(i)}), 1).ok());
    absl::StatusOr<std::vector<UpdateTensor>> out = a->Finish();
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(out.status().message(), HasSubstr(c.message));
  }
  EXPECT_EQ(Make({RobustRule::kMedian}, 1)->Finish().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RobustMinUpdates({RobustRule::kMedian}), 1);
  EXPECT_EQ(RobustMinUpdates({RobustRule::kTrimmedMean, 0.1}), 10);  // floor(0.1 x 10) = 1
  EXPECT_EQ(RobustMinUpdates({RobustRule::kTrimmedMean, 0.3}),
            4);  // floor(0.9) = 0, floor(1.2) = 1
  EXPECT_EQ(RobustMinUpdates({RobustRule::kKrum, 0, 2}), 7);
  EXPECT_EQ(RobustMinUpdates({RobustRule::kMultiKrum, 0, 1, 6}), 7);
  EXPECT_EQ(RobustMinUpdates({RobustRule::kBulyan, 0, 1}), 7);
}

TEST(RobustTest, SparseUpdatesAreTheirKeptEntriesInZeros) {
  std::unique_ptr<RobustAggregator> a = Make({RobustRule::kMedian}, 4);
  // (5, 0, 0, -1), (1, 2, 3, 4) and (0, 0, 7, 0): medians 1, 0, 3, 0.
  ASSERT_TRUE(a->Add({{"w", {4}, false, {0, 3}, {5, -1}}}, 1).ok());
  ASSERT_TRUE(a->Add(Dense({1, 2, 3, 4}), 1).ok());
  ASSERT_TRUE(a->Add({{"w", {4}, false, {2}, {7}}}, 1).ok());
  EXPECT_EQ(a->held_bytes(), 3 * 4 * 4);
  absl::StatusOr<std::vector<UpdateTensor>> out = a->Finish();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].values, (std::vector<float>{1, 0, 3, 0}));
  EXPECT_EQ((*out)[0].shape, (std::vector<int64_t>{4}));
}

TEST(RobustTest, BadUpdatesAndOptionsAreRefusedAndNotHeld) {
  std::unique_ptr<RobustAggregator> a = Make({RobustRule::kMedian}, 2);
  struct Bad {
    std::vector<KeptTensor> update;
    int64_t weight;
    const char* message;
  };
  const std::vector<Bad> bad = {
      {Dense({1, 2}), 3, "weight 3: robust statistics weigh every update the same"},
      {Dense({1, NAN}), 1, "tensor 'w' value 1 is not finite"},
      {Dense({1, 2, 3}), 1, "tensor 'w' has shape [3], the global adapter has [2]"},
      {{{"v", {2}, true, {}, {1, 2}}}, 1, "update tensor 'v' is not in the global adapter"},
      {{}, 1, "update has 0 tensors, the global adapter has 1"},
      {{{"w", {2}, false, {1, 1}, {1, 2}}}, 1, "kept index 1 (1) is not in [2, 2)"},
      {{{"w", {2}, false, {0}, {1, 2}}}, 1, "has 2 values for 1 indices"},
  };
  for (const Bad& b : bad) {
    absl::Status s = a->Add(b.update, b.weight);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.message;
    EXPECT_THAT(s.message(), HasSubstr(b.message));
  }
  EXPECT_EQ(a->num_updates(), 0);
  EXPECT_EQ(a->held_bytes(), 0);
  EXPECT_EQ(RobustAggregator::Create(Spec(1), {RobustRule::kTrimmedMean, 0.5}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RobustAggregator::Create(Spec(1), {RobustRule::kTrimmedMean, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RobustAggregator::Create(Spec(1), {RobustRule::kBulyan, 0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RobustAggregator::Create({}, {RobustRule::kMedian}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      RobustAggregator::Create({{"w", {1}}, {"w", {2}}}, {RobustRule::kMedian}).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
