// The client SDK against a real loopback server: option checks, retries and their limits, Stop(),
// a trainer failure that skips one task without ending the run, and one that ends it (the site
// cannot train: it leaves at once, and the server shows it FAILED).
#include "fedlora/client.h"

#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::DeterministicTrainer;
using ::testing::HasSubstr;
using testing::TempDir;

// A port nothing listens on: bound, then closed.
std::string DeadAddress() {
  TempDir dir;
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.metrics_address = "";
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  EXPECT_TRUE(server.ok());
  std::string address = (*server)->address();
  (*server)->Shutdown();
  return address;
}

TEST(ClientTest, CreateRejectsIncompleteOptions) {
  DeterministicTrainer trainer(0);
  ClientOptions o;
  EXPECT_EQ(Client::Create(o, &trainer).status().code(), absl::StatusCode::kInvalidArgument);
  o.server_address = "127.0.0.1:1";
  // Plaintext needs --insecure, even on loopback; and never to another host.
  auto plain = Client::Create(o, &trainer);
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plain.status().message()), HasSubstr("--insecure"));
  o.insecure = true;
  auto no_id = Client::Create(o, &trainer);
  EXPECT_EQ(no_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_id.status().message()), HasSubstr("client_id"));
  o.client_id = "site";
  EXPECT_TRUE(Client::Create(o, &trainer).ok());
  o.server_address = "192.0.2.1:50051";
  auto remote = Client::Create(o, &trainer);
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(remote.status().message()), HasSubstr("is not a loopback address"));
  o.server_address = "127.0.0.1:1";
  EXPECT_EQ(Client::Create(o, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  // TLS: all three files, no --insecure beside it, and the files must exist.
  o.tls.root_ca_file = "/nonexistent/ca.pem";
  EXPECT_THAT(std::string(Client::Create(o, &trainer).status().message()),
              HasSubstr("exclude each other"));
  o.insecure = false;
  EXPECT_THAT(std::string(Client::Create(o, &trainer).status().message()),
              HasSubstr("root_ca_file, cert_file and key_file"));
  o.tls.cert_file = "/nonexistent/site.pem";
  o.tls.key_file = "/nonexistent/site.key";
  EXPECT_EQ(Client::Create(o, &trainer).status().code(), absl::StatusCode::kNotFound);
  o.tls = {};
  o.insecure = true;
  o.retry.max_attempts = 0;
  EXPECT_EQ(Client::Create(o, &trainer).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientTest, GivesUpAfterMaxAttemptsWithTheLastError) {
  DeterministicTrainer trainer(0);
  ClientOptions o = testing::TestClientOptions(DeadAddress(), "site");
  o.retry.max_attempts = 3;
  o.retry.initial_backoff_ms = 10;
  auto client = Client::Create(o, &trainer);
  ASSERT_TRUE(client.ok());
  ::testing::internal::CaptureStderr();
  auto result = (*client)->RunUntilDone();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("gave up after 3 attempts"));
  // Not silent while it tries: the first failure is said at once, with what comes next.
  EXPECT_THAT(log, HasSubstr("Join to " + o.server_address + " failed (UNAVAILABLE"));
  EXPECT_THAT(log, HasSubstr("trying again, 2 more times over about 1 s"));
}

TEST(ClientTest, StopInterruptsBackoff) {
  DeterministicTrainer trainer(0);
  ClientOptions o = testing::TestClientOptions(DeadAddress(), "site");
  o.retry.max_attempts = 1000;
  o.retry.initial_backoff_ms = 5000;  // without Stop() this would take hours
  o.retry.max_backoff_ms = 5000;
  auto client = Client::Create(o, &trainer);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<RunSummary> result = absl::UnknownError("not run");
  const auto start = std::chrono::steady_clock::now();
  std::thread t([&] { result = (*client)->RunUntilDone(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (*client)->Stop();
  t.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

// Fails its first task, then behaves like DeterministicTrainer.
class FlakyTrainer : public ClientTrainer {
 public:
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override {
    if (calls_++ == 0) return absl::InternalError("GPU fell off the bus");
    return inner_.Train(task, global);
  }
  int calls_ = 0;
  DeterministicTrainer inner_{0};
};

TEST(ClientTest, TrainerFailureSkipsTheTaskAndTheClientTakesItAgain) {
  TempDir dir;
  auto server = Server::Create(testing::TestServerOptions(dir.path()),
                               testing::TestRunConfig(2, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  FlakyTrainer trainer;
  auto client =
      Client::Create(testing::TestClientOptions((*server)->address(), "site-0"), &trainer);
  ASSERT_TRUE(client.ok());
  auto result = (*client)->RunUntilDone();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tasks_failed, 1);
  EXPECT_EQ(result->tasks_completed, 2);
  EXPECT_EQ(trainer.calls_, 3);
  // Still selected for round 1, the client got the same task again: the result is as if nothing
  // had failed.
  EXPECT_TRUE(testing::SameBits(result->final_adapter, testing::ExpectedAdapter({0}, 2)));
}

// Fails every task with `error`.
class BrokenTrainer : public ClientTrainer {
 public:
  explicit BrokenTrainer(absl::Status error) : error_(std::move(error)) {}
  absl::StatusOr<TrainResult> Train(const TrainTask&, const std::vector<NamedTensor>&) override {
    ++calls_;
    return error_;
  }
  std::atomic<int> calls_{0};

 private:
  absl::Status error_;
};

v1::ClientInfo InfoOf(Server& server, const std::string& id) {
  v1::ListClientsRequest all;
  all.set_include_inactive(true);
  auto list = server.coordinator().ListClients(all);
  EXPECT_TRUE(list.ok()) << list.status();
  for (const v1::ClientInfo& c : list->clients()) {
    if (c.client_id() == id) return c;
  }
  ADD_FAILURE() << "no client " << id;
  return {};
}

TEST(ClientTest, APermanentTrainerErrorEndsTheClientAndTheServerShowsTheSiteFailed) {
  TempDir dir;
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.round_deadline_ms = 600'000;  // the round must not wait for it
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  // What a classification run's client says of a decoder checkpoint, or of a broken JSONL.
  BrokenTrainer trainer(absl::FailedPreconditionError("site.jsonl:3: not a JSON object"));
  auto client =
      Client::Create(testing::TestClientOptions((*server)->address(), "site-0"), &trainer);
  ASSERT_TRUE(client.ok());
  const auto start = std::chrono::steady_clock::now();
  auto result = (*client)->RunUntilDone();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("site.jsonl:3: not a JSON object"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("FAILED"));
  EXPECT_EQ(trainer.calls_.load(), 1);  // tried once, not in a loop
  // The server shows the site failed, with its error, and does not wait out the deadline for it.
  const v1::ClientInfo info = InfoOf(**server, "site-0");
  EXPECT_EQ(info.state(), v1::CLIENT_STATE_FAILED);
  EXPECT_THAT(info.failure(), HasSubstr("site.jsonl:3: not a JSON object"));
  EXPECT_TRUE(
      testing::WaitFor([&] { return (*server)->metrics().rounds_abandoned.load() >= 1; }, 5000));
  EXPECT_EQ((*server)->metrics().clients_failed.load(), 1);
  EXPECT_THAT((*server)->MetricsText(), HasSubstr("fedlora_clients_failed_total 1"));
}

// Reports 3 of 8 steps, then waits (at most 10 s) until the server shows them before it finishes.
class ProgressTrainer : public ClientTrainer {
 public:
  std::function<bool()> server_shows;
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override {
    if (task.report_progress) task.report_progress(3, 8);
    shown_ = testing::WaitFor(server_shows, 10'000);
    return inner_.Train(task, global);
  }
  std::atomic<bool> shown_{false};

 private:
  DeterministicTrainer inner_{0};
};

TEST(ClientTest, TheTrainersStepsReachTheServerInTheHeartbeats) {
  TempDir dir;
  auto server = Server::Create(testing::TestServerOptions(dir.path()),
                               testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  ProgressTrainer trainer;
  trainer.server_shows = [&] {
    const v1::ClientInfo info = InfoOf(**server, "site-0");
    return !info.current_task_id().empty() && info.steps_done() == 3 && info.steps_total() == 8;
  };
  auto client =
      Client::Create(testing::TestClientOptions((*server)->address(), "site-0"), &trainer);
  ASSERT_TRUE(client.ok());
  auto result = (*client)->RunUntilDone();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(trainer.shown_.load());
  EXPECT_EQ(InfoOf(**server, "site-0").steps_total(), 0u);  // no task, no progress
}

// Its data cannot be read: Prepare says so before any task.
class UnpreparedTrainer : public DeterministicTrainer {
 public:
  UnpreparedTrainer() : DeterministicTrainer(0) {}
  absl::Status Prepare(const std::string& run_config_json) override {
    run_config_json_ = run_config_json;
    return absl::NotFoundError("site.jsonl: cannot open");
  }
  std::string run_config_json_;
};

TEST(ClientTest, ASiteThatCannotPrepareLeavesBeforeAnyTask) {
  TempDir dir;
  auto server = Server::Create(testing::TestServerOptions(dir.path()),
                               testing::TestRunConfig(1, 2, 2), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  UnpreparedTrainer trainer;
  auto client =
      Client::Create(testing::TestClientOptions((*server)->address(), "site-0"), &trainer);
  ASSERT_TRUE(client.ok());
  auto result = (*client)->RunUntilDone();  // the round needs two sites: no task could come
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("site.jsonl: cannot open"));
  EXPECT_THAT(trainer.run_config_json_,
              HasSubstr("\"test-run\""));  // the run's config, as tasks carry it
  EXPECT_TRUE(trainer.rounds_seen.empty());
  EXPECT_EQ(InfoOf(**server, "site-0").state(), v1::CLIENT_STATE_FAILED);
}

TEST(ClientTest, TheOtherSitesUpdatesCommitWithoutWaitingForAFailedSite) {
  TempDir dir;
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.round_deadline_ms = 600'000;
  auto server = Server::Create(o, testing::TestRunConfig(1, 2, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  BrokenTrainer broken(absl::InvalidArgumentError("model.gguf is a decoder; the run classifies"));
  DeterministicTrainer good(1);
  absl::StatusOr<RunSummary> failed = absl::UnknownError("not run"),
                             done = absl::UnknownError("not run");
  const auto start = std::chrono::steady_clock::now();
  std::thread a([&] {
    auto c = Client::Create(testing::TestClientOptions((*server)->address(), "site-0"), &broken);
    failed = c.ok() ? (*c)->RunUntilDone() : absl::StatusOr<RunSummary>(c.status());
  });
  std::thread b([&] {
    auto c = Client::Create(testing::TestClientOptions((*server)->address(), "site-1"), &good);
    done = c.ok() ? (*c)->RunUntilDone() : absl::StatusOr<RunSummary>(c.status());
  });
  a.join();
  b.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(broken.calls_.load(), 1);
  EXPECT_TRUE(testing::SameBits(done->final_adapter, testing::ExpectedAdapter({1}, 1)));
  EXPECT_EQ(InfoOf(**server, "site-0").state(), v1::CLIENT_STATE_FAILED);
}

TEST(ClientTest, ATransientTrainerErrorIsTriedAgainWithBackoffAndBounded) {
  TempDir dir;
  auto server = Server::Create(testing::TestServerOptions(dir.path()),
                               testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  BrokenTrainer trainer(absl::ResourceExhaustedError("out of GPU memory"));
  ClientOptions options = testing::TestClientOptions((*server)->address(), "site-0");
  options.retry.max_attempts = 4;
  options.retry.initial_backoff_ms = 100;
  options.retry.multiplier = 2.0;
  options.retry.jitter = 0.0;
  auto client = Client::Create(options, &trainer);
  ASSERT_TRUE(client.ok());
  const auto start = std::chrono::steady_clock::now();
  auto result = (*client)->RunUntilDone();
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("4 tasks in a row failed"));
  EXPECT_EQ(trainer.calls_.load(), 4);
  EXPECT_GE(took, std::chrono::milliseconds(100 + 200 + 400));  // waited between the tries
  EXPECT_EQ(InfoOf(**server, "site-0").state(), v1::CLIENT_STATE_FAILED);
}

}  // namespace
}  // namespace fedlora
