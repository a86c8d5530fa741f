// A site with its own training code: a plain function as the ClientTrainer, over the SDK's
// transport alone. This target links fedlora::client and nothing of model/ or train/ (its CMake
// DEPS; tests/client/CMakeLists.txt also refuses to configure if fedlora::client's link closure
// reaches them), and runs whole rounds against the in-memory federation: the update the fake
// opens with the round's key and decodes is the function's delta, value for value.
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/fake_transport.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using testing::FakeClientOptions;
using testing::FakeFederation;
using testing::FunctionTrainer;

std::vector<UpdateTensor> SmallAdapter() {
  return {{"layer.0.lora_A.weight", {2, 3}, {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f}},
          {"layer.0.lora_B.weight", {3, 2}, {1.0f, 2.0f, 3.0f, -1.0f, -2.0f, -3.0f}}};
}

TEST(CustomTrainerTest, AFunctionTrainsEveryRoundOverTheTransportAlone) {
  FakeFederation federation(/*rounds=*/2, SmallAdapter());
  std::vector<std::vector<NamedTensor>> seen;  // the global adapter of each task
  std::vector<uint64_t> rounds;
  FunctionTrainer trainer(
      [&](const TrainTask& task,
          const std::vector<NamedTensor>& global) -> absl::StatusOr<TrainResult> {
        seen.push_back(global);
        rounds.push_back(task.round);
        TrainResult result;
        for (const NamedTensor& t : global) {
          NamedTensor d{t.name, t.shape, std::vector<float>(t.values.size())};
          for (size_t i = 0; i < d.values.size(); ++i)
            d.values[i] = 0.125f * static_cast<float>(i + 1) * static_cast<float>(task.round);
          result.delta.push_back(std::move(d));
        }
        result.num_examples = 7;
        result.steps = task.local_steps;
        return result;
      });
  auto client = NewClientOverTransport(FakeClientOptions(), &trainer, federation.NewTransport());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<RunSummary> summary = (*client)->RunUntilDone();
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->tasks_completed, 2);
  EXPECT_EQ(summary->tasks_failed, 0);
  EXPECT_EQ(summary->final_round, 2u);
  EXPECT_EQ(summary->adapters_downloaded, 1);  // the second task's adapter is the one held
  EXPECT_EQ(summary->adapters_reused, 1);
  EXPECT_THAT(rounds, ElementsAre(1u, 2u));

  // The trainer saw the served adapter as it was written.
  const std::vector<UpdateTensor> adapter = SmallAdapter();
  ASSERT_EQ(seen.size(), 2u);
  for (const std::vector<NamedTensor>& global : seen) {
    ASSERT_EQ(global.size(), adapter.size());
    for (size_t t = 0; t < adapter.size(); ++t) {
      EXPECT_EQ(global[t].name, adapter[t].name);
      EXPECT_EQ(global[t].shape, adapter[t].shape);
      EXPECT_EQ(global[t].values, adapter[t].values);
    }
  }
  // What the federation opened and decoded is the function's delta (fp32, no codec stage).
  const std::vector<FakeFederation::Received> uploads = federation.uploads();
  ASSERT_EQ(uploads.size(), 2u);
  for (const FakeFederation::Received& u : uploads) {
    EXPECT_EQ(u.num_examples, 7u);
    ASSERT_EQ(u.update.size(), 2u);
    for (const UpdateTensor& t : u.update) {
      for (size_t i = 0; i < t.values.size(); ++i) {
        EXPECT_EQ(t.values[i], 0.125f * static_cast<float>(i + 1) * static_cast<float>(u.round))
            << t.name << "[" << i << "] of round " << u.round;
      }
    }
  }
  EXPECT_TRUE(federation.leave_errors().empty());
}

TEST(CustomTrainerTest, AFunctionThatCannotTrainEndsTheRunWithItsError) {
  FakeFederation federation(/*rounds=*/1, SmallAdapter());
  FunctionTrainer trainer(
      [](const TrainTask&, const std::vector<NamedTensor>&) -> absl::StatusOr<TrainResult> {
        return absl::NotFoundError("site.csv: cannot open");
      });
  auto client = NewClientOverTransport(FakeClientOptions(), &trainer, federation.NewTransport());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<RunSummary> summary = (*client)->RunUntilDone();
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(summary.status().message()), ::testing::HasSubstr("site.csv"));
  ASSERT_EQ(federation.leave_errors().size(), 1u);  // the server is told, with the error
  EXPECT_THAT(federation.leave_errors()[0], ::testing::HasSubstr("site.csv: cannot open"));
  EXPECT_EQ(federation.upload_calls(), 0);
}

}  // namespace
}  // namespace fedlora
