#include "core/did_you_mean.h"

#include "gtest/gtest.h"

namespace fedlora {
namespace {

TEST(DidYouMeanTest, EditDistanceCountsEachEditOnceIgnoringCase) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("FedAvg", "FEDAVG"), 0u);
  EXPECT_EQ(EditDistance("clients_per_rund", "clients_per_round"), 1u);  // a deletion
  EXPECT_EQ(EditDistance("FEDAVGG", "FEDAVG"), 1u);                      // an insertion
  EXPECT_EQ(EditDistance("rnak", "rank"), 1u);                           // a swap
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

TEST(DidYouMeanTest, OnlyACloseNameIsSuggested) {
  const std::vector<std::string> fields = {"clients_per_round", "over_selection", "min_clients"};
  EXPECT_EQ(NearestName("clients_per_rund", fields), "clients_per_round");
  EXPECT_EQ(NearestName("min_client", fields), "min_clients");
  EXPECT_EQ(NearestName("rounds", fields), std::nullopt);
  EXPECT_EQ(NearestName("ab", {"xy"}), std::nullopt);  // two edits of two letters is no typo
  EXPECT_EQ(NearestName("sdg", {"adamw", "lamb", "sgd"}), "sgd");
  EXPECT_EQ(NearestName("anything", {}), std::nullopt);
}

}  // namespace
}  // namespace fedlora
