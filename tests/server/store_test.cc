#include "server/store.h"

#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Hash(std::string_view s) { return Sha256Hex(s); }

UploadRecord Upload(const std::string& id, const std::string& client, int64_t round = 1,
                    const std::string& task = "task-1", int64_t examples = 10) {
  UploadRecord u;
  u.upload_id = id;
  u.run_id = "run";
  u.round = round;
  u.client_id = client;
  u.task_id = task;
  u.num_examples = examples;
  u.blob_hash = Hash(id);
  u.bytes = 1234;
  u.chunks_received = 2;
  return u;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "store_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/fedlora.db";
    Reopen();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  StoreOptions Options() {
    StoreOptions o;
    o.clock = [this] { return now_ms_.load(); };
    return o;
  }
  void Reopen(StoreOptions options) {
    store_.reset();
    auto s = Store::Open(path_, std::move(options));
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  void Reopen() { Reopen(Options()); }

  // A run with round 1 open for training.
  void StartTraining() {
    ASSERT_TRUE(store_->CreateRun("run", R"({"rounds": 3})").ok());
    ASSERT_TRUE(store_->BeginRound("run", 1, Hash("init"), 5000).ok());
    ASSERT_TRUE(store_->SetRoundState("run", 1, RoundState::kTraining).ok());
  }

  std::string dir_, path_;
  std::atomic<int64_t> now_ms_{1000};
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, ReopenKeepsEverything) {
  EXPECT_EQ(store_->SchemaVersion().value(), Store::kSchemaVersion);
  StartTraining();
  ASSERT_TRUE(store_->RecordSelection("run", 1, {"c2", "c1"}, 9000).ok());
  ASSERT_TRUE(store_->UpsertClient("c1", "fp1").ok());
  ASSERT_TRUE(store_->RecordAccepted(Upload("u1", "c1")).ok());
  ASSERT_TRUE(store_->RecordMetric({"run", 1, "c1", "train/loss", 0.25}).ok());

  Reopen();
  EXPECT_EQ(store_->SchemaVersion().value(), Store::kSchemaVersion);
  auto run = store_->GetRun("run");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->config_json, R"({"rounds": 3})");
  EXPECT_EQ(run->created_unix_ms, 1000);
  auto round = store_->GetRound("run", 1);
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->state, RoundState::kTraining);
  EXPECT_EQ(round->deadline_unix_ms, 9000);
  EXPECT_EQ(round->global_adapter_hash, Hash("init"));
  EXPECT_THAT(round->selected_clients, ElementsAre("c1", "c2"));
  EXPECT_TRUE(store_->IsSelected("run", 1, "c2").value());
  EXPECT_FALSE(store_->IsSelected("run", 1, "c3").value());
  auto up = store_->GetUpload("u1");
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->state, UploadState::kAccepted);
  EXPECT_EQ(up->blob_hash, Hash("u1"));
  EXPECT_EQ(up->num_examples, 10);
  EXPECT_EQ(up->bytes, 1234);
  EXPECT_EQ(up->chunks_received, 2);
  EXPECT_EQ(store_->GetClient("c1").value().cert_fingerprint, "fp1");
  auto metrics = store_->ListMetrics("run", 1);
  ASSERT_TRUE(metrics.ok());
  ASSERT_EQ(metrics->size(), 1u);
  EXPECT_EQ((*metrics)[0].key, "train/loss");
  EXPECT_EQ((*metrics)[0].value, 0.25);
  // The database really is in WAL mode (the -wal file exists while a connection is open).
  EXPECT_TRUE(std::filesystem::exists(path_ + "-wal"));
}

TEST_F(StoreTest, RunAndRoundErrors) {
  EXPECT_EQ(store_->GetRun("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->BeginRound("nope", 1, "", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->CreateRun("", "{}").code(), absl::StatusCode::kInvalidArgument);
  StartTraining();
  auto dup = store_->CreateRun("run", "{}");
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists) << dup;
  EXPECT_THAT(std::string(dup.message()),
              HasSubstr("UNIQUE constraint failed: runs.run_id"));  // SQLite's text
  EXPECT_EQ(store_->BeginRound("run", 1, "", 0).status().code(), absl::StatusCode::kAlreadyExists);
  auto open = store_->BeginRound("run", 2, "", 0).status();
  EXPECT_EQ(open.code(), absl::StatusCode::kFailedPrecondition) << open;
  EXPECT_THAT(std::string(open.message()), HasSubstr("round 1 of run 'run' is still training"));
  EXPECT_EQ(store_->GetRound("run", 7).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->BeginRound("run", 0, "", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, RoundLifeCycleIsEnforced) {
  StartTraining();
  EXPECT_EQ(store_->SetRoundState("run", 1, RoundState::kCommitted).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->SetRoundState("run", 1, RoundState::kSelecting).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store_->SetRoundState("run", 1, RoundState::kTraining).ok());  // no-op
  EXPECT_EQ(store_->CommitRound("run", 1, Hash("r1"), "{}", {}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_->SetRoundState("run", 1, RoundState::kAggregating).ok());
  EXPECT_EQ(store_->RecordSelection("run", 1, {"late"}, 0).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_->CommitRound("run", 1, Hash("r1"), R"({"acc": 0.9})", {}).ok());
  auto t = store_->SetRoundState("run", 1, RoundState::kAbandoned);
  EXPECT_EQ(t.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(t.message()), HasSubstr("cannot go from committed to abandoned"));
  EXPECT_EQ(store_->CommitRound("run", 1, Hash("r1"), "{}", {}).code(),
            absl::StatusCode::kFailedPrecondition);

  // Round numbers only grow; abandoned rounds are final too.
  ASSERT_TRUE(store_->BeginRound("run", 2, Hash("r1"), 0).ok());
  ASSERT_TRUE(store_->SetRoundState("run", 2, RoundState::kAbandoned).ok());
  EXPECT_EQ(store_->SetRoundState("run", 2, RoundState::kTraining).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->BeginRound("run", 1, "", 0).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(store_->BeginRound("run", 5, Hash("r1"), 0).ok());
  auto rounds = store_->ListRounds("run");
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 3u);
  EXPECT_EQ((*rounds)[0].state, RoundState::kCommitted);
  EXPECT_EQ((*rounds)[0].result_adapter_hash, Hash("r1"));
  EXPECT_EQ((*rounds)[0].metrics_json, R"({"acc": 0.9})");
  EXPECT_EQ((*rounds)[1].state, RoundState::kAbandoned);
  EXPECT_EQ((*rounds)[2].round, 5);
  EXPECT_EQ(store_->BeginRound("run", 4, "", 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(StoreTest, UploadsAreIdempotentAndCountedOnce) {
  StartTraining();
  ASSERT_TRUE(store_->RecordAccepted(Upload("u1", "c1")).ok());
  // Replay of the same upload_id: AlreadyExists, nothing changes.
  auto replay = store_->RecordAccepted(Upload("u1", "c1"));
  EXPECT_EQ(replay.code(), absl::StatusCode::kAlreadyExists) << replay;
  EXPECT_THAT(std::string(replay.message()), HasSubstr("upload 'u1' was already accepted"));
  // A retry of the same task under a new upload_id: AlreadyExists too, not counted twice.
  auto retry = store_->RecordAccepted(Upload("u1-retry", "c1"));
  EXPECT_EQ(retry.code(), absl::StatusCode::kAlreadyExists) << retry;
  EXPECT_THAT(std::string(retry.message()), HasSubstr("already has accepted upload 'u1'"));
  EXPECT_EQ(store_->CountAccepted("run", 1).value(), 1);
  // Someone else's upload_id: refused.
  auto hijack = store_->RecordAccepted(Upload("u1", "c2"));
  EXPECT_EQ(hijack.code(), absl::StatusCode::kFailedPrecondition) << hijack;
  EXPECT_THAT(std::string(hijack.message()), HasSubstr("is bound to client 'c1'"));
  // Validation.
  UploadRecord bad = Upload("u9", "c9");
  bad.num_examples = 0;
  EXPECT_EQ(store_->RecordAccepted(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = Upload("u9", "c9");
  bad.blob_hash = "xyz";
  EXPECT_EQ(store_->RecordAccepted(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->RecordAccepted(Upload("u9", "c9", /*round=*/2)).code(),
            absl::StatusCode::kNotFound);

  // Once the round aggregates, no more uploads.
  ASSERT_TRUE(store_->SetRoundState("run", 1, RoundState::kAggregating).ok());
  auto late = store_->RecordAccepted(Upload("u2", "c2"));
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(store_->RecordAccepted(Upload("u1", "c1")).code(),
            absl::StatusCode::kAlreadyExists);  // still acked
  EXPECT_EQ(store_->CountAccepted("run", 1).value(), 1);
}

TEST_F(StoreTest, ResumableUploadRecords) {
  StartTraining();
  auto begun = store_->BeginUpload(Upload("u1", "c1"));
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_EQ(begun->state, UploadState::kReceiving);
  EXPECT_EQ(begun->bytes, 0);
  EXPECT_EQ(begun->blob_hash, "");
  ASSERT_TRUE(store_->RecordUploadProgress("u1", 3, 3 << 20).ok());
  // Resume (e.g. after a reconnect or a restart) returns the durable progress.
  Reopen();
  auto resumed = store_->BeginUpload(Upload("u1", "c1"));
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->chunks_received, 3);
  EXPECT_EQ(resumed->bytes, 3 << 20);
  EXPECT_EQ(store_->BeginUpload(Upload("u1", "c2")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->ListReceivingUploads("run", 1).value().size(), 1u);
  EXPECT_EQ(store_->CountAccepted("run", 1).value(), 0);

  ASSERT_TRUE(store_->RecordAccepted(Upload("u1", "c1")).ok());
  EXPECT_EQ(store_->ListReceivingUploads("run", 1).value().size(), 0u);
  EXPECT_EQ(store_->RecordUploadProgress("u1", 4, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->RecordUploadProgress("nope", 4, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->BeginUpload(Upload("u1", "c1")).value().state, UploadState::kAccepted);
}

TEST_F(StoreTest, DeferredCommitsAreVisibleAndBecomeDurableTogether) {
  StartTraining();
  // Eight streams, as in the ingest benchmark: each begins and accepts with deferred tickets and
  // then waits; the waits share WAL fsyncs (group commit) and all succeed.
  constexpr int kUploads = 8;
  std::vector<std::thread> threads;
  std::atomic<int> durable{0};
  for (int i = 0; i < kUploads; ++i) {
    threads.emplace_back([&, i] {
      const UploadRecord u = Upload("up-" + std::to_string(i), "client-" + std::to_string(i));
      DurabilityTicket begun, accepted;
      if (!store_->BeginUpload(u, &begun).ok() || begun.seq == 0) return;
      if (!store_->RecordAccepted(u, &accepted).ok() || accepted.seq <= begun.seq) return;
      // Committed before durable: a reader already sees the row.
      if (store_->GetUpload(u.upload_id).value().state != UploadState::kAccepted) return;
      if (store_->WaitDurable(accepted).ok()) ++durable;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(durable.load(), kUploads);
  EXPECT_EQ(store_->CountAccepted("run", 1).value(), kUploads);
  EXPECT_TRUE(store_->WaitDurable(DurabilityTicket{}).ok());  // ticket 0: nothing to wait for
  EXPECT_TRUE(store_->SyncCommitted().ok());

  // A deferred progress record still has the usual checks.
  DurabilityTicket ticket;
  EXPECT_TRUE(absl::IsNotFound(store_->RecordUploadProgress("nope", 1, 1, &ticket)));
  EXPECT_EQ(ticket.seq, 0u);  // nothing committed, nothing to wait for

  Reopen();
  EXPECT_EQ(store_->CountAccepted("run", 1).value(), kUploads);
}

TEST_F(StoreTest, AcceptedUploadsListInCanonicalBytewiseOrder) {
  StartTraining();
  for (const char* id : {"u-c", "u-a", "u-B", "u-b", "u-aa"}) {
    ASSERT_TRUE(store_->RecordAccepted(Upload(id, std::string("client-") + id)).ok()) << id;
  }
  auto list = store_->ListAcceptedUploads("run", 1);
  ASSERT_TRUE(list.ok());
  std::vector<std::string> ids;
  for (const UploadRecord& u : *list) ids.push_back(u.upload_id);
  EXPECT_THAT(ids, ElementsAre("u-B", "u-a", "u-aa", "u-b", "u-c"));  // memcmp: 'B' < 'a'
}

TEST_F(StoreTest, AFailedFsyncIsFinal) {
  // The first WAL fsync after this flag is set fails; every later one would succeed. Durability
  // must never be reported again: the kernel may have dropped the pages it could not write.
  auto fail_next = std::make_shared<std::atomic<bool>>(false);
  StoreOptions o = Options();
  o.fault_hook = [fail_next](std::string_view step) {
    return step == "WalSyncer:fsync" && fail_next->exchange(false)
               ? absl::InternalError("injected: EIO")
               : absl::OkStatus();
  };
  Reopen(o);
  ASSERT_TRUE(store_->CreateRun("run", "{}").ok());  // durable: the fsync succeeded
  fail_next->store(true);
  DurabilityTicket first;
  ASSERT_TRUE(store_->BeginRound("run", 1, Hash("init"), 5000, &first).ok());
  const absl::Status failed = store_->WaitDurable(first);
  EXPECT_TRUE(absl::IsDataLoss(failed)) << failed;
  EXPECT_THAT(std::string(failed.message()), HasSubstr("no longer durable"));
  EXPECT_FALSE(fail_next->load());  // consumed: the next fsync would succeed
  DurabilityTicket second;
  ASSERT_TRUE(store_->SetRoundState("run", 1, RoundState::kTraining, &second).ok());
  EXPECT_TRUE(absl::IsDataLoss(store_->WaitDurable(second)));
  EXPECT_TRUE(absl::IsDataLoss(store_->SyncCommitted()));
}

TEST_F(StoreTest, CommitRoundIsAtomic) {
  StartTraining();
  ASSERT_TRUE(store_->SetRoundState("run", 1, RoundState::kAggregating).ok());
  const std::vector<MetricRecord> metrics = {{"run", 1, "", "eval/accuracy", 0.75},
                                             {"run", 1, "c1", "loss", 0.5}};

  // 1. Injected failure after the round row was updated: everything is rolled back.
  StoreOptions failing = Options();
  failing.fault_hook = [](std::string_view step) {
    return step == "CommitRound:after_round_update" ? absl::InternalError("injected: disk on fire")
                                                    : absl::OkStatus();
  };
  Reopen(failing);
  auto s = store_->CommitRound("run", 1, Hash("new"), "{}", metrics);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("disk on fire"));
  auto round = store_->GetRound("run", 1);
  EXPECT_EQ(round->state, RoundState::kAggregating);
  EXPECT_EQ(round->result_adapter_hash, "");
  EXPECT_TRUE(store_->ListMetrics("run", 1).value().empty());

  // 2. A real SQL failure in the middle (the second metric violates the primary key): rolled back.
  Reopen();
  auto dup = store_->CommitRound("run", 1, Hash("new"), "{}", {metrics[0], metrics[0]});
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists) << dup;
  EXPECT_EQ(store_->GetRound("run", 1)->state, RoundState::kAggregating);
  EXPECT_TRUE(store_->ListMetrics("run", 1).value().empty());
  EXPECT_EQ(store_->CommitRound("run", 1, Hash("new"), "{}", {{"run", 2, "", "k", 1.0}}).code(),
            absl::StatusCode::kInvalidArgument);

  // 3. Then it commits, metrics and all.
  ASSERT_TRUE(store_->CommitRound("run", 1, Hash("new"), R"({"a":1})", metrics).ok());
  EXPECT_EQ(store_->GetRound("run", 1)->state, RoundState::kCommitted);
  EXPECT_EQ(store_->ListMetrics("run", 1).value().size(), 2u);
}

// Runs `child` in a forked process that must die by SIGKILL; returns once it has.
void RunAndExpectSigkill(const std::function<void()>& child) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    child();
    ::_exit(3);  // reaching here means the child did not get killed where it should have
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited normally with " << WEXITSTATUS(status);
  ASSERT_EQ(WTERMSIG(status), SIGKILL);
}

TEST_F(StoreTest, AcknowledgedUploadSurvivesSigkillRightAfterRecordAccepted) {
  StartTraining();
  store_.reset();  // the child opens its own connection; none is shared across fork
  const std::string path = path_;
  RunAndExpectSigkill([&] {
    auto child_store = Store::Open(path);
    if (!child_store.ok()) ::_exit(1);
    if (!(*child_store)->RecordAccepted(Upload("acked", "c1")).ok()) ::_exit(2);
    ::kill(::getpid(), SIGKILL);  // the acknowledgement would go out here
  });
  Reopen();
  auto u = store_->GetUpload("acked");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->state, UploadState::kAccepted);
  EXPECT_EQ(u->blob_hash, Hash("acked"));
  EXPECT_EQ(store_->CountAccepted("run", 1).value(), 1);
}

TEST_F(StoreTest, SigkillInsideCommitRoundLeavesTheRoundUncommitted) {
  StartTraining();
  ASSERT_TRUE(store_->RecordAccepted(Upload("u1", "c1")).ok());
  ASSERT_TRUE(store_->SetRoundState("run", 1, RoundState::kAggregating).ok());
  store_.reset();
  const std::string path = path_;
  RunAndExpectSigkill([&] {
    StoreOptions o;
    o.fault_hook = [](std::string_view step) {
      if (step == "CommitRound:before_commit")
        ::kill(::getpid(), SIGKILL);  // every row written, no COMMIT
      return absl::OkStatus();
    };
    auto child_store = Store::Open(path, o);
    if (!child_store.ok()) ::_exit(1);
    (void)(*child_store)->CommitRound("run", 1, Hash("new"), "{}", {{"run", 1, "", "k", 1.0}});
  });
  Reopen();
  auto st = store_->LoadLatestState("run");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_FALSE(st->last_committed.has_value());
  ASSERT_TRUE(st->open_round.has_value());
  EXPECT_EQ(st->open_round->state, RoundState::kAggregating);
  EXPECT_TRUE(store_->ListMetrics("run", 1).value().empty());
  // The recovered server redoes the aggregation and commits.
  ASSERT_TRUE(store_->CommitRound("run", 1, Hash("new"), "{}", {}).ok());
}

TEST_F(StoreTest, RecoveryPicksUpAnInterruptedRound) {
  StartTraining();
  ASSERT_TRUE(store_->RecordAccepted(Upload("r1-u", "c1")).ok());
  ASSERT_TRUE(store_->SetRoundState("run", 1, RoundState::kAggregating).ok());
  ASSERT_TRUE(store_->CommitRound("run", 1, Hash("global-1"), "{}", {}).ok());
  ASSERT_TRUE(store_->BeginRound("run", 2, Hash("global-1"), 7000).ok());
  ASSERT_TRUE(store_->RecordSelection("run", 2, {"c1", "c2", "c3"}, 8000).ok());
  ASSERT_TRUE(store_->SetRoundState("run", 2, RoundState::kTraining).ok());
  ASSERT_TRUE(store_->RecordAccepted(Upload("u-z", "c2", 2)).ok());
  ASSERT_TRUE(store_->RecordAccepted(Upload("u-a", "c1", 2)).ok());
  ASSERT_TRUE(store_->BeginUpload(Upload("u-m", "c3", 2)).ok());
  ASSERT_TRUE(store_->RecordUploadProgress("u-m", 1, 4096).ok());

  Reopen();  // "restart"
  auto st = store_->LoadLatestState("run");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->run.run_id, "run");
  ASSERT_TRUE(st->last_committed.has_value());
  EXPECT_EQ(st->last_committed->round, 1);
  EXPECT_EQ(st->last_committed->result_adapter_hash, Hash("global-1"));
  ASSERT_TRUE(st->open_round.has_value());
  EXPECT_EQ(st->open_round->round, 2);
  EXPECT_EQ(st->open_round->state, RoundState::kTraining);
  EXPECT_EQ(st->open_round->deadline_unix_ms, 8000);
  EXPECT_THAT(st->open_round->selected_clients, ElementsAre("c1", "c2", "c3"));
  ASSERT_EQ(st->accepted_uploads.size(), 2u);
  EXPECT_EQ(st->accepted_uploads[0].upload_id, "u-a");
  EXPECT_EQ(st->accepted_uploads[1].upload_id, "u-z");
  ASSERT_EQ(st->receiving_uploads.size(), 1u);
  EXPECT_EQ(st->receiving_uploads[0].bytes, 4096);
  EXPECT_EQ(st->next_round, 3);

  // A fresh run: nothing to resume.
  ASSERT_TRUE(store_->CreateRun("fresh", "{}").ok());
  auto fresh = store_->LoadLatestState("fresh");
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(fresh->last_committed.has_value());
  EXPECT_FALSE(fresh->open_round.has_value());
  EXPECT_EQ(fresh->next_round, 1);
  EXPECT_EQ(store_->LoadLatestState("nope").status().code(), absl::StatusCode::kNotFound);

  // Every blob a row still needs, for garbage collection: the adapters, and the sealed updates of
  // the open round only (round 1's update r1-u went with its commit).
  auto refs = store_->ReferencedBlobHashes();
  ASSERT_TRUE(refs.ok());
  EXPECT_EQ(*refs, (absl::flat_hash_set<std::string>{Hash("init"), Hash("global-1"), Hash("u-z"),
                                                     Hash("u-a")}));
}

TEST_F(StoreTest, ClientsAndMetrics) {
  auto c = store_->UpsertClient("c1", "fp-old");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state, ClientState::kActive);
  EXPECT_EQ(c->first_seen_unix_ms, 1000);
  ASSERT_TRUE(store_->SetClientState("c1", ClientState::kBlocked).ok());
  now_ms_ = 2000;
  c = store_->UpsertClient("c1", "fp-new");  // certificate rotated
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cert_fingerprint, "fp-new");
  EXPECT_EQ(c->state, ClientState::kBlocked);  // kept
  EXPECT_EQ(c->first_seen_unix_ms, 1000);
  EXPECT_EQ(c->last_seen_unix_ms, 2000);
  EXPECT_EQ(store_->SetClientState("ghost", ClientState::kActive).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetClient("ghost").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store_->UpsertClient("a0", "fp").ok());
  EXPECT_EQ(store_->ListClients().value().front().client_id, "a0");

  EXPECT_EQ(store_->RecordMetric({"nope", 1, "", "k", 1.0}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store_->CreateRun("run", "{}").ok());
  ASSERT_TRUE(store_->RecordMetric({"run", 1, "", "eval/acc", 0.5}).ok());
  ASSERT_TRUE(store_->RecordMetric({"run", 1, "c1", "eval/acc", 0.25}).ok());
  EXPECT_EQ(store_->RecordMetric({"run", 1, "", "eval/acc", 0.6}).code(),
            absl::StatusCode::kAlreadyExists);
  auto m = store_->ListMetrics("run", 1);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].client_id, "");
  EXPECT_EQ((*m)[1].client_id, "c1");
}

TEST_F(StoreTest, SchemaNewerThanTheBinaryIsRefused) {
  store_.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto s = Store::Open(path_);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("schema version 99 is newer"));
}

TEST_F(StoreTest, LockedDatabaseIsUnavailableAfterTheBusyTimeout) {
  StartTraining();
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr),
            SQLITE_OK);  // holds the write lock
  StoreOptions o = Options();
  o.busy_timeout_ms = 50;
  Reopen(o);
  auto s = store_->RecordAccepted(Upload("u1", "c1"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("database is locked"));
  sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(other);
  EXPECT_TRUE(store_->RecordAccepted(Upload("u1", "c1")).ok());  // and works once the lock is gone
}

TEST_F(StoreTest, NotADatabaseIsDataLoss) {
  store_.reset();
  std::filesystem::remove(path_ + "-wal");
  std::filesystem::remove(path_ + "-shm");
  {
    FILE* f = std::fopen(path_.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string junk(8192, 'j');
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
  }
  auto s = Store::Open(path_);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
}

}  // namespace
}  // namespace fedlora
