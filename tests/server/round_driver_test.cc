// The round driver: aggregation and evaluation run beside the round clock, which keeps answering
// heartbeats, status queries and long polls meanwhile; a round whose aggregation keeps failing is
// given up after its tries (abandoned, or the run stopped), never retried forever.
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/store.h"
#include "server/store_check.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::EncodedDeltaFor;
using testing::GateEvaluator;
using ::testing::HasSubstr;
using testing::InitialAdapter;
using testing::RawClient;
using testing::TempDir;
using testing::WaitFor;

class RoundDriverTest : public ::testing::Test {
 protected:
  void Start(int rounds, int target, int min_clients,
             const std::function<void(ServerOptions&)>& tweak, Evaluator* evaluator = nullptr) {
    ServerOptions o = testing::TestServerOptions(dir_.path());
    if (tweak) tweak(o);
    auto server = Server::Create(o, testing::TestRunConfig(rounds, target, min_clients),
                                 InitialAdapter(), evaluator);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  RawClient& Joined(const std::string& id) {
    auto& c = clients_[id];
    c = std::make_unique<RawClient>(server_->address(), id);
    EXPECT_TRUE(c->Join().ok()) << id;
    return *c;
  }

  // Uploads client 0's honest update for `task`; returns its wire blob's hash.
  std::string UploadHonest(RawClient& c, const v1::TrainTask& task, const std::string& upload_id) {
    const std::string plain = EncodedDeltaFor(0, task, server_->coordinator().global_adapter());
    v1::UploadHeader header = c.Header(task, plain, upload_id);
    v1::UploadAck ack;
    grpc::Status s = c.UploadAll(header, plain, &ack);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(ack.state(), v1::UPLOAD_STATE_ACCEPTED);
    return header.manifest().sha256();
  }

  // Flips one byte of the blob `hash` in the store's blobs/, so that reading it fails its hash check.
  void CorruptBlob(const std::string& hash) {
    const std::filesystem::path path =
        std::filesystem::path(dir_.path()) / "blobs" / hash.substr(0, 2) / hash.substr(2);
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    std::filesystem::permissions(path, std::filesystem::perms::owner_write,
                                 std::filesystem::perm_options::add);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }

  // Puts a directory where the blob `hash` was: reading it fails with an I/O error (EISDIR), which
  // is not corruption, so aggregation fails and is retried.
  void MakeBlobUnreadable(const std::string& hash) {
    const std::filesystem::path path =
        std::filesystem::path(dir_.path()) / "blobs" / hash.substr(0, 2) / hash.substr(2);
    ASSERT_TRUE(std::filesystem::remove(path)) << path;
    ASSERT_TRUE(std::filesystem::create_directory(path)) << path;
  }

  TempDir dir_;
  std::unique_ptr<Server> server_;
  std::map<std::string, std::unique_ptr<RawClient>> clients_;
};

TEST_F(RoundDriverTest, TheClockKeepsRunningWhileARoundIsEvaluated) {
  GateEvaluator evaluator;
  Start(2, 1, 1, {}, &evaluator);
  RawClient& a = Joined("site-a");
  v1::TrainTask task;
  ASSERT_TRUE(a.GetTask(&task));
  // An update refused at validation first: counted as received and rejected in the round's summary.
  std::string bad = EncodedDeltaFor(0, task, InitialAdapter());
  const uint32_t nan = 0x7fc00000u;
  std::memcpy(bad.data() + bad.size() - 4, &nan, 4);
  v1::UploadAck ack;
  EXPECT_EQ(a.UploadAll(a.Header(task, bad, "bad"), bad, &ack).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  UploadHonest(a, task, "good");
  ASSERT_TRUE(evaluator.WaitEntered()) << "round 1 was not evaluated";

  // The evaluation holds: everything else is still answered, and on time.
  v1::HeartbeatRequest hb;
  v1::HeartbeatResponse hb_resp;
  auto ctx = a.Context(2000);
  EXPECT_TRUE(a.stub()->Heartbeat(ctx.get(), hb, &hb_resp).ok());
  EXPECT_EQ(a.RunStatus().phase(), v1::ROUND_PHASE_AGGREGATING);
  // A long poll of a new client ends when its wait does (the driver's tick expires it), well before
  // its own deadline (1 s wait + 5 s).
  RawClient& b = Joined("site-b");
  v1::WaitForTaskResponse wait;
  const auto t0 = std::chrono::steady_clock::now();
  grpc::Status polled = b.WaitForTask(&wait, 1);
  const auto waited_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_TRUE(polled.ok()) << polled.error_message();
  ASSERT_TRUE(wait.has_retry_later());
  EXPECT_THAT(wait.retry_later().reason(), HasSubstr("aggregating"));
  EXPECT_LT(waited_ms, 4000);
  EXPECT_EQ(server_->coordinator().rounds_committed(), 0);

  evaluator.Open();
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().rounds_committed() == 1; }, 10'000));
  const v1::GetStatusResponse status = a.RunStatus();
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).updates_accepted(), 1u);
  EXPECT_EQ(status.history(0).updates_rejected(), 1u);
  EXPECT_EQ(status.history(0).updates_received(), 2u);
  EXPECT_DOUBLE_EQ(status.history(0).eval_loss(), 0.5);
}

// Two clients wanted, one enough at the 2 s deadline: the test makes the one accepted update's
// blob unreadable (or corrupts it) before the round closes.
void ShortRounds(ServerOptions& o) {
  o.round_deadline_ms = 2000;
  o.max_aggregation_attempts = 2;
}

TEST_F(RoundDriverTest, ASitesHeartbeatStepsShowForItsCurrentTaskOnly) {
  Start(1, 1, 1, nullptr);
  RawClient& a = Joined("site-a");
  v1::TrainTask task;
  ASSERT_TRUE(a.GetTask(&task));
  auto info = [&] {
    v1::ListClientsResponse list;
    auto ctx = a.Context();
    EXPECT_TRUE(a.admin()->ListClients(ctx.get(), v1::ListClientsRequest(), &list).ok());
    EXPECT_EQ(list.clients_size(), 1);
    return list.clients_size() == 1 ? list.clients(0) : v1::ClientInfo();
  };
  auto beat = [&](const std::string& task_id, uint64_t done, uint64_t total) {
    v1::HeartbeatRequest hb;
    hb.set_task_id(task_id);
    hb.set_state(v1::CLIENT_STATE_TRAINING);
    hb.set_steps_done(done);
    hb.set_steps_total(total);
    v1::HeartbeatResponse response;
    auto ctx = a.Context();
    EXPECT_TRUE(a.stub()->Heartbeat(ctx.get(), hb, &response).ok());
    return response.action();
  };
  EXPECT_EQ(info().steps_total(), 0u);  // nothing said yet
  EXPECT_EQ(beat(task.task_id(), 12, 40), v1::HeartbeatResponse::CONTINUE);
  v1::ClientInfo c = info();
  EXPECT_EQ(c.current_task_id(), task.task_id());
  EXPECT_EQ(c.steps_done(), 12u);
  EXPECT_EQ(c.steps_total(), 40u);
  // A stale task's heartbeat is cancelled and changes nothing; more steps than planned are capped.
  EXPECT_EQ(beat("r0-stale", 3, 5), v1::HeartbeatResponse::CANCEL_TASK);
  EXPECT_EQ(info().steps_done(), 12u);
  beat(task.task_id(), 90, 40);
  EXPECT_EQ(info().steps_done(), 40u);
}

TEST_F(RoundDriverTest, SelectedCohortNamesTheOpenRoundsClientsAndItsDeadline) {
  // What the simulator's LIE and min-max attackers wait for (sim/attack_board.h).
  Start(2, 1, 1, nullptr);
  const Coordinator& c = server_->coordinator();
  EXPECT_FALSE(c.SelectedCohort(1).has_value());  // selecting: no one chosen yet
  RawClient& a = Joined("site-a");
  v1::TrainTask task;
  ASSERT_TRUE(a.GetTask(&task));
  const int64_t now = c.NowMs();
  const std::optional<Coordinator::Cohort> cohort = c.SelectedCohort(1);
  ASSERT_TRUE(cohort.has_value());
  EXPECT_EQ(cohort->clients, std::vector<std::string>{"site-a"});
  // TestServerOptions' 30 s deadline, counted from the selection, before `now`.
  EXPECT_LE(cohort->deadline_ms, now + 30'000);
  EXPECT_GT(cohort->deadline_ms, now + 25'000);
  EXPECT_FALSE(c.SelectedCohort(2).has_value());
  UploadHonest(a, task, "a1");
  ASSERT_TRUE(WaitFor([&] { return c.rounds_committed() == 1; }, 10'000));
  EXPECT_FALSE(c.SelectedCohort(1).has_value());  // committed
}

TEST_F(RoundDriverTest, ARoundThatCannotBeAggregatedIsAbandonedAfterItsTries) {
  Start(1, 2, 1, ShortRounds);
  RawClient& a = Joined("site-a");
  v1::TrainTask task;
  ASSERT_TRUE(a.GetTask(&task));
  ASSERT_EQ(task.round(), 1u);
  MakeBlobUnreadable(UploadHonest(a, task, "r1"));

  // Two tries (1 s apart), then round 2 opens from the same adapter.
  ASSERT_TRUE(WaitFor([&] { return server_->metrics().rounds_abandoned.load() == 1; }, 15'000));
  EXPECT_EQ(server_->metrics().aggregation_failures.load(), 2);
  EXPECT_EQ(server_->coordinator().rounds_committed(), 0);
  EXPECT_FALSE(server_->coordinator().finished());

  // The run goes on: round 2 commits.
  v1::TrainTask next;
  ASSERT_TRUE(a.GetTask(&next));
  EXPECT_EQ(next.round(), 2u);
  EXPECT_EQ(next.global_adapter().sha256(), task.global_adapter().sha256());
  UploadHonest(a, next, "r2");
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().finished(); }, 10'000));
  EXPECT_EQ(server_->coordinator().rounds_committed(), 1);
  EXPECT_TRUE(server_->coordinator().stopped().ok());

  server_->Shutdown();
  server_.reset();
  auto store = Store::Open(dir_.path() + "/fedlora.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto rounds = (*store)->ListRounds("test-run");
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_EQ((*rounds)[0].state, RoundState::kAbandoned);
  EXPECT_EQ((*rounds)[1].state, RoundState::kCommitted);
}

TEST_F(RoundDriverTest, StopOnAggregationFailureStopsTheRunAndKeepsTheRoundForARestart) {
  Start(1, 2, 1, [](ServerOptions& o) {
    ShortRounds(o);
    o.max_aggregation_attempts = 1;
    o.stop_on_aggregation_failure = true;
  });
  RawClient& a = Joined("site-a");
  v1::TrainTask task;
  ASSERT_TRUE(a.GetTask(&task));
  MakeBlobUnreadable(UploadHonest(a, task, "r1"));
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().finished(); }, 15'000));
  const absl::Status stopped = server_->coordinator().stopped();
  EXPECT_FALSE(stopped.ok());
  EXPECT_THAT(std::string(stopped.message()),
              HasSubstr("round 1 could not be aggregated in 1 tries"));
  EXPECT_EQ(server_->metrics().rounds_abandoned.load(), 0);

  v1::WaitForTaskResponse wait;
  ASSERT_TRUE(a.WaitForTask(&wait, 1).ok());
  ASSERT_TRUE(wait.has_run_finished());
  EXPECT_EQ(wait.run_finished().reason(), v1::RunFinished::FAILED);

  server_->Shutdown();
  server_.reset();
  auto store = Store::Open(dir_.path() + "/fedlora.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto round = (*store)->GetRound("test-run", 1);
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->state, RoundState::kAggregating);
}

// A corrupt accepted update (its client was told ACCEPTED) is left out, counted and logged; the
// round commits with the intact ones when they are enough.
TEST_F(RoundDriverTest, ACorruptAcceptedUpdateIsLeftOutAndTheRoundCommitsWithTheRest) {
  Start(1, 2, 1, ShortRounds);
  RawClient& a = Joined("site-a");
  RawClient& b = Joined("site-b");
  v1::TrainTask ta, tb;
  ASSERT_TRUE(a.GetTask(&ta));
  ASSERT_TRUE(b.GetTask(&tb));
  CorruptBlob(UploadHonest(a, ta, "a1"));
  UploadHonest(b, tb, "b1");
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().finished(); }, 15'000));
  EXPECT_EQ(server_->coordinator().rounds_committed(), 1);
  EXPECT_EQ(server_->metrics().updates_corrupt.load(), 1);
  EXPECT_EQ(server_->metrics().aggregation_failures.load(), 0);
  EXPECT_THAT(server_->metrics().ToPrometheusText(), HasSubstr("fedlora_updates_corrupt_total 1"));
  server_->Shutdown();
  server_.reset();
  auto store = Store::Open(dir_.path() + "/fedlora.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto round = (*store)->GetRound("test-run", 1);
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->state, RoundState::kCommitted);
  EXPECT_THAT(round->metrics_json, HasSubstr("\"updates\":1"));
  EXPECT_THAT(round->metrics_json, HasSubstr("\"updates_corrupt\":1"));
}

// Too few intact updates: the round is abandoned at once with that reason, not retried.
TEST_F(RoundDriverTest, ARoundLeftWithTooFewIntactUpdatesIsAbandonedAtOnce) {
  Start(1, 2, 1, ShortRounds);
  RawClient& a = Joined("site-a");
  v1::TrainTask task;
  ASSERT_TRUE(a.GetTask(&task));
  CorruptBlob(UploadHonest(a, task, "r1"));
  ASSERT_TRUE(WaitFor([&] { return server_->metrics().rounds_abandoned.load() == 1; }, 15'000));
  EXPECT_EQ(server_->metrics().updates_corrupt.load(), 1);
  EXPECT_EQ(server_->metrics().aggregation_failures.load(), 0);
  v1::TrainTask next;
  ASSERT_TRUE(a.GetTask(&next));
  EXPECT_EQ(next.round(), 2u);
  EXPECT_EQ(next.global_adapter().sha256(), task.global_adapter().sha256());
}

// A flipped byte in the latest committed adapter: the server refuses to start with an error naming
// the round, the blob and the commands; after `repair --rewind` it starts from the round before.
TEST_F(RoundDriverTest, ACorruptLatestAdapterStopsTheStartWithTheRepairCommandUntilRewound) {
  Start(2, 1, 1, {});
  RawClient& a = Joined("site-a");
  v1::TrainTask task;
  ASSERT_TRUE(a.GetTask(&task));
  UploadHonest(a, task, "r1");
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().rounds_committed() == 1; }, 10'000));
  const std::string adapter = server_->coordinator().global_adapter_sha256();
  ASSERT_NE(adapter, task.global_adapter().sha256());
  server_->Shutdown();
  server_.reset();
  clients_.clear();
  CorruptBlob(adapter);

  const ServerOptions o = testing::TestServerOptions(dir_.path());
  auto refused = Server::Create(o, testing::TestRunConfig(2, 1, 1), InitialAdapter(), nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsDataLoss(refused.status())) << refused.status();
  const std::string msg(refused.status().message());
  EXPECT_THAT(msg, HasSubstr("round 1's result adapter"));
  EXPECT_THAT(msg, HasSubstr(adapter));
  EXPECT_THAT(msg, HasSubstr("fedlora store verify --store " + dir_.path() + " --run-id test-run"));
  EXPECT_THAT(msg, HasSubstr("fedlora store repair"));
  {
    auto store = Store::Open(dir_.path() + "/fedlora.db");
    ASSERT_TRUE(store.ok());
    auto blobs = BlobStore::Open(dir_.path());
    ASSERT_TRUE(blobs.ok());
    auto repaired = RepairRun(**store, **blobs, "test-run", /*rewind=*/true);
    ASSERT_TRUE(repaired.ok()) << repaired.status();
    EXPECT_EQ(repaired->rewound_to, 0);
  }
  auto server = Server::Create(o, testing::TestRunConfig(2, 1, 1), InitialAdapter(), nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->coordinator().rounds_committed(), 0);
  EXPECT_EQ((*server)->coordinator().global_adapter_sha256(), task.global_adapter().sha256());
  // A second user of the same data directory is refused while this server holds it.
  auto second = Server::Create(o, testing::TestRunConfig(2, 1, 1), InitialAdapter(), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  (*server)->Shutdown();
}

}  // namespace
}  // namespace fedlora
