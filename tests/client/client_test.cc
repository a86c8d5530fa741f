// The client SDK against a real loopback server: option checks, retries and their limits, Stop(),
// and a trainer failure that skips one task without ending the run.
#include "fedlora/client.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;
using testing::DeterministicTrainer;
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
  EXPECT_THAT(std::string(Client::Create(o, &trainer).status().message()), HasSubstr("exclude each other"));
  o.insecure = false;
  EXPECT_THAT(std::string(Client::Create(o, &trainer).status().message()), HasSubstr("root_ca_file, cert_file and key_file"));
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
  auto result = (*client)->RunUntilDone();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("gave up after 3 attempts"));
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
  absl::StatusOr<TrainResult> Train(const TrainTask& task, const std::vector<NamedTensor>& global) override {
    if (calls_++ == 0) return absl::InternalError("GPU fell off the bus");
    return inner_.Train(task, global);
  }
  int calls_ = 0;
  DeterministicTrainer inner_{0};
};

TEST(ClientTest, TrainerFailureSkipsTheTaskAndTheClientTakesItAgain) {
  TempDir dir;
  auto server = Server::Create(testing::TestServerOptions(dir.path()), testing::TestRunConfig(2, 1, 1),
                               testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  FlakyTrainer trainer;
  auto client = Client::Create(testing::TestClientOptions((*server)->address(), "site-0"), &trainer);
  ASSERT_TRUE(client.ok());
  auto result = (*client)->RunUntilDone();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tasks_failed, 1);
  EXPECT_EQ(result->tasks_completed, 2);
  EXPECT_EQ(trainer.calls_, 3);
  // Still selected for round 1, the client got the same task again: the result is as if nothing
  // had failed.
  EXPECT_TRUE(testing::SameBits(testing::ToUpdate(result->final_adapter), testing::ExpectedAdapter({0}, 2)));
}

}  // namespace
}  // namespace fedlora
