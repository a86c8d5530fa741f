// `fedlora status`'s output: the short view a person reads, and the one JSON document (64-bit
// integers as numbers, zeros printed, clients beside the status).
#include "tools/status_view.h"

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora::tools {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kNow = 1'800'000'000'000;

v1::GetStatusResponse TrainingRun(int committed) {
  v1::GetStatusResponse s;
  s.set_run_id("two-sites");
  s.set_current_round(committed + 1);
  s.set_total_rounds(40);
  s.set_phase(v1::ROUND_PHASE_TRAINING);
  s.set_connected_clients(2);
  s.set_active_tasks(1);
  s.set_updates_accepted_this_round(1);
  s.set_round_start_unix_ms(kNow - 12'000);
  s.mutable_global_adapter()->set_round(committed);
  s.mutable_global_adapter()->set_sha256(std::string(64, 'c'));
  s.mutable_global_adapter()->set_total_bytes(3 << 20);
  for (int i = 1; i <= committed; ++i) {
    v1::RoundSummary* r = s.add_history();
    r->set_round(i);
    r->set_clients_selected(2);
    r->set_updates_accepted(2);
    r->set_examples(96);
    r->set_upload_bytes(120 * 1024);
    r->set_download_bytes(uint64_t{5} << 30);
    r->set_mean_train_loss(2.0 - 0.01 * i);
    r->set_eval_loss(1.5 - 0.01 * i);
    r->set_eval_accuracy(0.5 + 0.01 * i);
    (*r->mutable_eval_metrics())["macro_f1"] = 0.25;
    r->set_committed_unix_ms(kNow - 60'000);
  }
  return s;
}

TEST(StatusViewTest, SaysWhereTheRunIsInAFewLinesAndTheLastRoundsAsATable) {
  const std::string view = StatusView(TrainingRun(12), kNow);
  EXPECT_THAT(
      view, HasSubstr("run two-sites: round 13 of 40, training (started 12 s ago), 1 update in\n"));
  EXPECT_THAT(view, HasSubstr("sites: 2 connected, 1 holding a task\n"));
  EXPECT_THAT(view,
              HasSubstr("last evaluation (round 12): accuracy 0.6200 loss 1.3800 macro_f1 0.25\n"));
  EXPECT_THAT(view, HasSubstr("global adapter: round 12, sha256 cccccccccccccccc, 3.0 MiB\n"));
  // The last ten rounds, the two before them summed up in one line; no tensor list.
  EXPECT_THAT(view, HasSubstr("(2 earlier rounds: --json lists every round)"));
  EXPECT_THAT(view, HasSubstr("\n    3      2/2"));
  EXPECT_THAT(view, Not(HasSubstr("\n    2      2/2")));
  EXPECT_THAT(view, HasSubstr("120.0 KiB"));
  EXPECT_THAT(view, HasSubstr("5.00 GiB"));
  EXPECT_THAT(view, Not(HasSubstr("privacy")));  // no differential privacy: no line for it
  EXPECT_LE(std::count(view.begin(), view.end(), '\n'), 18);
}

TEST(StatusViewTest, AFinishedRunWithPrivacySaysSo) {
  v1::GetStatusResponse s = TrainingRun(3);
  s.set_phase(v1::ROUND_PHASE_FINISHED);
  s.set_current_round(3);
  s.set_total_rounds(3);
  s.set_dp_epsilon(1.25);
  s.set_dp_max_epsilon(4);
  s.set_dp_target_delta(1e-5);
  s.set_dp_clip_norm(0.5);
  const std::string view = StatusView(s, kNow);
  EXPECT_THAT(view, HasSubstr("run two-sites: finished after round 3 of 3\n"));
  EXPECT_THAT(view,
              HasSubstr("privacy: epsilon 1.250 spent of 4.000 at delta 1e-05, clip norm 0.5\n"));
}

TEST(StatusViewTest, ClientsOneLineEachAndAFailedSitesErrorBelowIt) {
  v1::ClientInfo a, b;
  a.set_client_id("site-a");
  a.set_state(v1::CLIENT_STATE_TRAINING);
  a.set_rounds_participated(3);
  a.set_last_seen_unix_ms(kNow - 2'000);
  a.set_current_task_id("r4-abc");
  b.set_client_id("site-b");
  b.set_state(v1::CLIENT_STATE_FAILED);
  b.set_last_seen_unix_ms(kNow - 600'000);
  b.set_failure("INVALID_ARGUMENT: trainer: b.jsonl:3: invalid JSON");
  const std::string view = ClientsView({a, b}, kNow);
  EXPECT_THAT(view, HasSubstr("site-a  training           3         0    2 s ago  r4-abc\n"));
  EXPECT_THAT(view, HasSubstr("site-b  failed             0         0  10 min ago  -\n"
                              "        INVALID_ARGUMENT: trainer: b.jsonl:3: invalid JSON\n"));
}

TEST(StatusViewTest, ASiteTrainingShowsItsSteps) {
  v1::ClientInfo a;
  a.set_client_id("site-a");
  a.set_state(v1::CLIENT_STATE_TRAINING);
  a.set_last_seen_unix_ms(kNow - 1'000);
  a.set_current_task_id("r4-abc");
  a.set_steps_done(12);
  a.set_steps_total(40);
  EXPECT_THAT(ClientsView({a}, kNow), HasSubstr("r4-abc  12/40 steps\n"));
}

TEST(StatusJsonTest, OneDocumentWithNumbersForIntegersAndTheClientsBesideTheStatus) {
  v1::GetStatusResponse s = TrainingRun(2);
  v1::ListClientsResponse list;
  list.add_clients()->set_client_id("site-a");
  absl::StatusOr<std::string> text = StatusJson(s, &list);
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json j =
      nlohmann::json::parse(*text);  // throws (fails the test) unless one document
  EXPECT_EQ(j["run_id"], "two-sites");
  EXPECT_TRUE(j["current_round"].is_number_integer());
  EXPECT_EQ(j["current_round"], 3);
  EXPECT_EQ(j["round_start_unix_ms"], kNow - 12'000);
  EXPECT_EQ(j["history"][1]["download_bytes"], uint64_t{5} << 30);
  EXPECT_EQ(j["phase"], "ROUND_PHASE_TRAINING");
  EXPECT_EQ(j["privacy_budget_spent"], false);  // zeros are printed
  EXPECT_FALSE(j.contains("dp_epsilon"));       // an unset optional field is not
  ASSERT_EQ(j["clients"].size(), 1u);
  EXPECT_EQ(j["clients"][0]["client_id"], "site-a");
  EXPECT_EQ(j["clients"][0]["joined_unix_ms"], 0);
  // Without --list-clients: the status alone.
  absl::StatusOr<std::string> alone = StatusJson(s, nullptr);
  ASSERT_TRUE(alone.ok());
  EXPECT_FALSE(nlohmann::json::parse(*alone).contains("clients"));
}

}  // namespace
}  // namespace fedlora::tools
