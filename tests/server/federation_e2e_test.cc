// End to end over loopback: one server, several SDK clients in threads, real gRPC, real store.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "aggregation/robust.h"
#include "aggregation/server_optimizer.h"
#include "client/health_check.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/base/device.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::DeterministicTrainer;
using testing::ExpectedAdapter;
using testing::SameBits;
using testing::TempDir;
using testing::TestClientOptions;
using testing::TestRunConfig;
using testing::TestServerOptions;

// GET /metrics from the server's Prometheus endpoint.
std::string ScrapeMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(FederationE2eTest, FourClientsThreeRoundsGiveTheDirectlyComputedAdapter) {
  TempDir dir;
  constexpr int kClients = 4;
  constexpr int kRounds = 3;
  auto server =
      Server::Create(TestServerOptions(dir.path()), TestRunConfig(kRounds, kClients, kClients),
                     testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();

  std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
  for (int c = 0; c < kClients; ++c) trainers.push_back(std::make_unique<DeterministicTrainer>(c));
  // Each site reports a device of its own (ClientCapabilities), which ListClients shows below.
  const std::vector<absl::StatusOr<RunSummary>> results =
      testing::RunClientsUntilDone(address, trainers, [](ClientOptions& o) {
        o.device_name = "GPU of " + o.client_id;
        o.has_cuda = o.client_id == "site-1";
      });

  const std::vector<UpdateTensor> expected = ExpectedAdapter({0, 1, 2, 3}, kRounds);
  EXPECT_TRUE(SameBits((*server)->coordinator().global_adapter(), expected));
  for (int c = 0; c < kClients; ++c) {
    ASSERT_TRUE(results[c].ok()) << "client " << c << ": " << results[c].status();
    EXPECT_EQ(results[c]->tasks_completed, kRounds);
    EXPECT_EQ(results[c]->final_round, static_cast<uint64_t>(kRounds));
    EXPECT_EQ(trainers[c]->rounds_seen, (std::vector<uint64_t>{1, 2, 3}));
    EXPECT_TRUE(SameBits(results[c]->final_adapter, expected)) << "client " << c;
  }
  EXPECT_TRUE((*server)->coordinator().finished());
  EXPECT_EQ((*server)->metrics().updates_accepted.load(), kClients * kRounds);
  EXPECT_EQ((*server)->metrics().rounds_committed.load(), kRounds);

  const std::string scrape = ScrapeMetrics((*server)->metrics_port());
  EXPECT_THAT(scrape, ::testing::HasSubstr(" 200 OK"));
  EXPECT_THAT(scrape, ::testing::HasSubstr("fedlora_updates_accepted_total 12\n"));
  EXPECT_THAT(scrape, ::testing::HasSubstr("fedlora_rounds_committed_total 3\n"));
  int64_t adapter_elements = 0;
  for (const UpdateTensor& t : testing::InitialAdapter())
    adapter_elements += static_cast<int64_t>(t.values.size());
  EXPECT_THAT(scrape, ::testing::HasSubstr(absl::StrCat("fedlora_update_fp32_bytes_total ",
                                                        12 * 4 * adapter_elements, "\n")));

  // The admin view agrees: three committed rounds of four clients each.
  testing::RawClient admin(address, "operator");
  v1::GetStatusRequest req;
  v1::GetStatusResponse status;
  auto ctx = admin.Context();
  ASSERT_TRUE(admin.admin()->GetStatus(ctx.get(), req, &status).ok());
  EXPECT_EQ(status.phase(), v1::ROUND_PHASE_FINISHED);
  ASSERT_EQ(status.history_size(), kRounds);
  for (const v1::RoundSummary& r : status.history()) {
    EXPECT_EQ(r.clients_selected(), 4u);
    EXPECT_EQ(r.updates_accepted(), 4u);
    // Four sealed fp32 updates: the values plus the format's header, table and the seal's bytes.
    EXPECT_EQ(r.update_fp32_bytes(), static_cast<uint64_t>(4 * 4 * adapter_elements));
    EXPECT_GT(r.upload_bytes(), r.update_fp32_bytes());
    EXPECT_LT(r.upload_bytes(), r.update_fp32_bytes() + 4 * 4096);
    // Without a downlink codec each of the four clients downloads the whole adapter once.
    EXPECT_EQ(r.download_bytes(), 4 * status.global_adapter().total_bytes())
        << "round " << r.round();
    EXPECT_EQ(r.download_full_bytes(), r.download_bytes()) << "round " << r.round();
    // Every selected client delivered; the test trainer reports train_loss_last 0.5.
    EXPECT_EQ(r.clients_dropped(), 0u);
    EXPECT_EQ(r.examples(), static_cast<uint64_t>(testing::ExamplesOf(0) + testing::ExamplesOf(1) +
                                                  testing::ExamplesOf(2) + testing::ExamplesOf(3)));
    EXPECT_DOUBLE_EQ(r.mean_train_loss(), 0.5) << "round " << r.round();
  }
  EXPECT_EQ(status.global_adapter().sha256(), (*server)->coordinator().global_adapter_sha256());

  v1::ListClientsRequest list_req;
  list_req.set_include_inactive(true);
  v1::ListClientsResponse clients;
  auto ctx2 = admin.Context();
  ASSERT_TRUE(admin.admin()->ListClients(ctx2.get(), list_req, &clients).ok());
  ASSERT_EQ(clients.clients_size(), kClients);
  for (const v1::ClientInfo& c : clients.clients()) {
    EXPECT_EQ(c.rounds_participated(), 3u) << c.client_id();
    EXPECT_EQ(c.device_name(), "GPU of " + c.client_id());
    EXPECT_EQ(c.has_cuda(), c.client_id() == "site-1") << c.client_id();
    EXPECT_EQ(c.cert_fingerprint(), "") << "plaintext: no certificate";
  }
}

TEST(FederationE2eTest, LastRoundCommitsTheMeanOfTheLastRoundsAdapters) {
  // Four rounds, average_last_rounds 3: rounds 1 to 3 commit their aggregates as they are (and
  // clients train from them), round 4 commits mean(A2, A3, A4) of the directly computed aggregates.
  TempDir dir;
  constexpr int kClients = 2;
  constexpr int kRounds = 4;
  v1::RunConfig config = TestRunConfig(kRounds, kClients, kClients);
  config.mutable_aggregation()->set_average_last_rounds(3);
  auto server = Server::Create(TestServerOptions(dir.path()), config, testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
  for (int c = 0; c < kClients; ++c) trainers.push_back(std::make_unique<DeterministicTrainer>(c));
  const std::vector<absl::StatusOr<RunSummary>> results =
      testing::RunClientsUntilDone((*server)->address(), trainers);

  const std::vector<UpdateTensor> last = ExpectedAdapter({0, 1}, 4);
  const std::vector<UpdateTensor> expected =
      testing::TailAverage({ExpectedAdapter({0, 1}, 2), ExpectedAdapter({0, 1}, 3), last});
  ASSERT_FALSE(SameBits(expected, last)) << "the test needs rounds whose adapters differ";
  EXPECT_TRUE(SameBits((*server)->coordinator().global_adapter(), expected));
  for (int c = 0; c < kClients; ++c) {
    ASSERT_TRUE(results[c].ok()) << "client " << c << ": " << results[c].status();
    EXPECT_TRUE(SameBits(results[c]->final_adapter, expected)) << "client " << c;
  }
}

// gpu_aggregation_test.cc runs a federation with the sums on the GPU; without one, such a server
// does not start, and says why.
TEST(FederationE2eTest, AggregationOnCudaWithoutAGpuIsRefused) {
  if (kernels::CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  TempDir dir;
  ServerOptions options = TestServerOptions(dir.path());
  options.aggregation_device = Device::kCuda;
  auto server = Server::Create(options, TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
  EXPECT_THAT(std::string(server.status().message()),
              ::testing::HasSubstr("aggregation_device is cuda"));
}

TEST(FederationE2eTest, HealthServiceReportsServingAfterRestore) {
  TempDir dir;
  auto server = Server::Create(TestServerOptions(dir.path()), TestRunConfig(1, 1, 1),
                               testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  // grpc.health.v1.Health/Check with an empty request (the overall server status): the response
  // is `status: SERVING` = field 1, varint 1, i.e. bytes 08 01.
  grpc::GenericStub generic(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::ByteBuffer request;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  grpc::CompletionQueue cq;
  auto call = generic.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

// ServerOptions::health_address: a plaintext port that answers grpc.health.v1 with the main port's
// statuses, serves no other RPC, and closes with the server.
TEST(FederationE2eTest, HealthPortMirrorsTheServerAndServesNothingElse) {
  TempDir dir;
  ServerOptions o = TestServerOptions(dir.path());
  o.health_address = "127.0.0.1:0";
  auto server = Server::Create(o, TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_NE((*server)->health_port(), 0);
  ASSERT_NE((*server)->health_port(), (*server)->port());
  auto health = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->health_port()),
                                    grpc::InsecureChannelCredentials());
  for (const char* name : {"", "fedlora.v1.Federation", "fedlora.v1.Admin"}) {
    auto status = CheckHealth(health, name, 5000);
    ASSERT_TRUE(status.ok()) << name << ": " << status.status();
    EXPECT_EQ(*status, HealthStatus::kServing) << name;
  }
  auto unknown = CheckHealth(health, "fedlora.v1.Nope", 5000);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  // The main port agrees.
  auto main_port = CheckHealth(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()), "", 5000);
  ASSERT_TRUE(main_port.ok()) << main_port.status();
  EXPECT_EQ(*main_port, HealthStatus::kServing);
  // Nothing but health: a Federation call on the health port is UNIMPLEMENTED.
  auto stub = v1::Federation::NewStub(health);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HeartbeatResponse response;
  EXPECT_EQ(stub->Heartbeat(&ctx, v1::HeartbeatRequest(), &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  (*server)->Shutdown();
  auto gone = CheckHealth(health, "", 2000);
  EXPECT_FALSE(gone.ok() && *gone == HealthStatus::kServing);
}

TEST(FederationE2eTest, HealthAddressInUseIsUnavailable) {
  TempDir dir1;
  TempDir dir2;
  auto first = Server::Create(TestServerOptions(dir1.path()), TestRunConfig(1, 1, 1),
                              testing::InitialAdapter());
  ASSERT_TRUE(first.ok()) << first.status();
  ServerOptions o = TestServerOptions(dir2.path());
  o.health_address = (*first)->address();
  auto second = Server::Create(o, TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), ::testing::HasSubstr("cannot serve health"));
}

TEST(FederationE2eTest, ListenAddressInUseIsUnavailable) {
  TempDir dir1;
  TempDir dir2;
  auto first = Server::Create(TestServerOptions(dir1.path()), TestRunConfig(1, 1, 1),
                              testing::InitialAdapter());
  ASSERT_TRUE(first.ok()) << first.status();
  ServerOptions o = TestServerOptions(dir2.path());
  o.listen_address = (*first)->address();
  auto second = Server::Create(o, TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

// A site that sends its honest delta scaled by 1000 (model replacement).
class ScalingTrainer : public DeterministicTrainer {
 public:
  using DeterministicTrainer::DeterministicTrainer;
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override {
    FEDLORA_ASSIGN_OR_RETURN(TrainResult r, DeterministicTrainer::Train(task, global));
    for (NamedTensor& t : r.delta)
      for (float& x : t.values) x *= 1000.0f;
    return r;
  }
};

// The adapter after `rounds` rounds of `rule` over sites 0..n-1, site n-1 scaled by 1000, computed
// directly with RobustAggregator and the plain server step. The server adds the updates by upload
// id, not by site; the rules do not depend on the order.
std::vector<UpdateTensor> ExpectedRobust(const RobustOptions& rule, int n, int rounds) {
  std::vector<UpdateTensor> global = testing::InitialAdapter();
  auto opt = ServerOptimizer::Create({}, SpecFromUpdate(global));
  EXPECT_TRUE(opt.ok()) << opt.status();
  for (int r = 1; r <= rounds; ++r) {
    auto a = RobustAggregator::Create(SpecFromUpdate(global), rule);
    EXPECT_TRUE(a.ok()) << a.status();
    for (int c = 0; c < n; ++c) {
      std::vector<KeptTensor> kept;
      for (UpdateTensor& t : testing::DeltaFor(c, static_cast<uint64_t>(r), global)) {
        if (c == n - 1)
          for (float& x : t.values) x *= 1000.0f;
        kept.push_back({t.name, t.shape, true, {}, std::move(t.values)});
      }
      EXPECT_TRUE((*a)->Add(std::move(kept), 1).ok());
    }
    auto delta = (*a)->Finish();
    EXPECT_TRUE(delta.ok()) << delta.status();
    EXPECT_TRUE(opt->Step(*delta, global).ok());
  }
  return global;
}

TEST(FederationE2eTest, RobustStrategiesKeepAScalingSiteOut) {
  // One site of n scales its delta by 1000: FedAvg's mean follows it, each robust rule commits what
  // RobustAggregator computes from the same updates, and stays within the honest deltas' range.
  struct Case {
    v1::AggregationConfig::Strategy strategy;
    RobustOptions rule;
    int n;
  };
  const std::vector<Case> cases = {
      {v1::AggregationConfig::MEDIAN, {RobustRule::kMedian}, 5},
      {v1::AggregationConfig::TRIMMED_MEAN, {RobustRule::kTrimmedMean, 0.2}, 5},
      {v1::AggregationConfig::KRUM, {RobustRule::kKrum, 0, 1}, 5},
      {v1::AggregationConfig::MULTI_KRUM, {RobustRule::kMultiKrum, 0, 1, 3}, 5},
      {v1::AggregationConfig::BULYAN, {RobustRule::kBulyan, 0, 1}, 7},
  };
  constexpr int kRounds = 2;
  for (const Case& c : cases) {
    SCOPED_TRACE(v1::AggregationConfig::Strategy_Name(c.strategy));
    TempDir dir;
    v1::RunConfig config = TestRunConfig(kRounds, c.n, c.n);
    v1::AggregationConfig* a = config.mutable_aggregation();
    a->set_strategy(c.strategy);
    a->set_weight_by_examples(false);
    if (c.rule.trim_fraction > 0) a->set_trim_fraction(c.rule.trim_fraction);
    if (c.rule.byzantine > 0) a->set_krum_byzantine_clients(c.rule.byzantine);
    if (c.rule.multi_krum_keep > 0) a->set_multi_krum_keep(c.rule.multi_krum_keep);
    auto server = Server::Create(TestServerOptions(dir.path()), config, testing::InitialAdapter());
    ASSERT_TRUE(server.ok()) << server.status();
    std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
    for (int i = 0; i + 1 < c.n; ++i) trainers.push_back(std::make_unique<DeterministicTrainer>(i));
    trainers.push_back(std::make_unique<ScalingTrainer>(c.n - 1));
    for (const auto& r : testing::RunClientsUntilDone((*server)->address(), trainers))
      ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*server)->coordinator().finished());

    const std::vector<UpdateTensor> committed = (*server)->coordinator().global_adapter();
    EXPECT_TRUE(SameBits(committed, ExpectedRobust(c.rule, c.n, kRounds)));
    // Each honest delta value is in [-6, 6] / 1024, so two rounds move a value by at most 12/1024.
    // The attacker's 6000/1024 a round would move FedAvg's mean by up to 1200/1024 a round.
    const std::vector<UpdateTensor> initial = testing::InitialAdapter();
    float moved = 0;
    for (size_t t = 0; t < committed.size(); ++t)
      for (size_t i = 0; i < committed[t].values.size(); ++i)
        moved = std::max(moved, std::fabs(committed[t].values[i] - initial[t].values[i]));
    EXPECT_LE(moved, 12.0f / 1024 + 1e-6f);
  }
}

TEST(FederationE2eTest, SettingsTheServerCannotRunAreRefusedAtStart) {
  // A robust rule below its bound on the round's updates, or beside secure aggregation (which
  // would hand it only the mean): refused before the store is opened, though the config was built
  // in code.
  for (int which = 0; which < 2; ++which) {
    TempDir dir;
    v1::RunConfig config = TestRunConfig(1, 4, 4);
    config.mutable_aggregation()->set_weight_by_examples(false);
    if (which == 0) {
      config.mutable_aggregation()->set_strategy(v1::AggregationConfig::KRUM);
      config.mutable_aggregation()->set_krum_byzantine_clients(1);
    } else {
      config.mutable_aggregation()->set_strategy(v1::AggregationConfig::MEDIAN);
      config.mutable_aggregation()->set_max_update_norm(1);
      config.mutable_privacy()->set_secure_aggregation(true);
    }
    auto server = Server::Create(TestServerOptions(dir.path()), config, testing::InitialAdapter());
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
    EXPECT_NE(server.status().message().find(which == 0 ? "must be >= 2f + 3 = 5"
                                                        : "which privacy.secure_aggregation hides"),
              std::string::npos)
        << server.status();
    EXPECT_FALSE(std::filesystem::exists(dir.path() + "/fedlora.db"));
  }
  // The same for every setting the server does not carry out.
  {
    TempDir dir;
    v1::RunConfig config = TestRunConfig(1, 1, 1);
    config.mutable_privacy()->mutable_dp()->set_mode(v1::DifferentialPrivacyConfig::LOCAL);
    auto server = Server::Create(TestServerOptions(dir.path()), config, testing::InitialAdapter());
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(server.status().code(), absl::StatusCode::kUnimplemented) << server.status();
    EXPECT_NE(server.status().message().find("privacy.dp.mode LOCAL is not implemented yet"),
              std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(dir.path() + "/fedlora.db"));
  }
  // And for privacy settings the server cannot carry out as given (a config built in code skips
  // ValidateRunConfig): secure aggregation without a bound on the updates.
  TempDir dir;
  v1::RunConfig config = TestRunConfig(1, 3, 3);
  config.mutable_privacy()->set_secure_aggregation(true);
  config.mutable_aggregation()->set_weight_by_examples(false);
  auto server = Server::Create(TestServerOptions(dir.path()), config, testing::InitialAdapter());
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  EXPECT_NE(server.status().message().find("needs a bound on every update"), std::string::npos)
      << server.status();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/fedlora.db"));
}

// Records what it was given; fails on round 2 to show that evaluation never blocks a commit.
class FakeEvaluator : public Evaluator {
 public:
  absl::StatusOr<std::map<std::string, double>> Evaluate(
      uint64_t round, const std::vector<UpdateTensor>& adapter) override {
    seen.push_back(adapter);
    if (round == 2) return absl::UnavailableError("evaluation GPU busy");
    return std::map<std::string, double>{
        {"eval_loss", 0.5 * round}, {"eval_accuracy", 0.25 * round}, {"macro_f1", 0.1}};
  }
  void Skipped(uint64_t round) override { skipped.push_back(round); }
  std::vector<std::vector<UpdateTensor>> seen;
  std::vector<uint64_t> skipped;
};

// Runs `config` to its end with one deterministic client (site-0); the server stays up for
// inspection. Fails the test (and returns null) when the server or the client cannot run.
std::unique_ptr<Server> RunWithOneClient(const TempDir& dir, const v1::RunConfig& config,
                                         Evaluator* evaluator, DeterministicTrainer& trainer) {
  auto server =
      Server::Create(TestServerOptions(dir.path()), config, testing::InitialAdapter(), evaluator);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  auto client = Client::Create(TestClientOptions((*server)->address(), "site-0"), &trainer);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  absl::Status done = (*client)->RunUntilDone().status();
  EXPECT_TRUE(done.ok()) << done;
  return *std::move(server);
}

TEST(FederationE2eTest, EvaluatorSeesEachNewAdapterAndItsMetricsAreRecorded) {
  TempDir dir;
  FakeEvaluator evaluator;
  DeterministicTrainer trainer(0);
  std::unique_ptr<Server> server =
      RunWithOneClient(dir, TestRunConfig(3, 1, 1), &evaluator, trainer);
  ASSERT_NE(server, nullptr);
  ASSERT_EQ(evaluator.seen.size(), 3u);
  for (int r = 1; r <= 3; ++r)
    EXPECT_TRUE(SameBits(evaluator.seen[r - 1], ExpectedAdapter({0}, r))) << "round " << r;
  auto status = server->coordinator().GetStatus(v1::GetStatusRequest());
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->history_size(), 3);
  EXPECT_DOUBLE_EQ(status->history(0).eval_loss(), 0.5);
  EXPECT_DOUBLE_EQ(status->history(0).eval_accuracy(), 0.25);
  EXPECT_DOUBLE_EQ(status->history(0).eval_metrics().at("macro_f1"), 0.1);
  EXPECT_FALSE(
      status->history(1).has_eval_loss());  // the failed evaluation: committed without metrics
  EXPECT_DOUBLE_EQ(status->history(2).eval_accuracy(), 0.75);
  EXPECT_TRUE(evaluator.skipped.empty());
}

TEST(FederationE2eTest, EvalEveryRoundsSkipsRoundsButAlwaysEvaluatesTheLast) {
  TempDir dir;
  FakeEvaluator evaluator;
  v1::RunConfig config = TestRunConfig(5, 1, 1);
  config.mutable_data()->set_eval_every_rounds(2);
  DeterministicTrainer trainer(0);
  ASSERT_NE(RunWithOneClient(dir, config, &evaluator, trainer), nullptr);
  // Rounds 2 and 4 by the period, 5 because it is the last.
  ASSERT_EQ(evaluator.seen.size(), 3u);
  EXPECT_TRUE(SameBits(evaluator.seen[0], ExpectedAdapter({0}, 2)));
  EXPECT_TRUE(SameBits(evaluator.seen[2], ExpectedAdapter({0}, 5)));
  EXPECT_EQ(evaluator.skipped, (std::vector<uint64_t>{1, 3}));
}

TEST(FederationE2eTest, RoundScheduleSetsEachRoundsLearningRate) {
  TempDir dir;
  v1::RunConfig config = TestRunConfig(4, 1, 1);
  config.mutable_training()->set_learning_rate(0.01);
  config.mutable_training()->set_round_schedule(v1::TrainingConfig::COSINE);
  DeterministicTrainer trainer(0);
  ASSERT_NE(RunWithOneClient(dir, config, nullptr, trainer), nullptr);
  // Cosine over 4 rounds, taken at the start of each: 0.01 * (1 + cos(pi * k / 4)) / 2, k = 0..3.
  ASSERT_EQ(trainer.learning_rates_seen.size(), 4u);
  const double want[] = {0.01, 0.01 * (1 + std::sqrt(0.5)) / 2, 0.005,
                         0.01 * (1 - std::sqrt(0.5)) / 2};
  for (int k = 0; k < 4; ++k)
    EXPECT_NEAR(trainer.learning_rates_seen[k], want[k], 1e-12) << "round " << k + 1;
}

}  // namespace
}  // namespace fedlora
