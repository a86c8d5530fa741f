// Retention of old rounds (server.retain_rounds): over a 50-round run the store's size on disk stays
// within a stated bound of its size after round 10, a restart after round 50 resumes and commits
// the right adapter, and without retention the store grows by about an adapter per round (so the
// measurement measures something). DP's epsilon survives pruning, and a downlink-codec run with
// retention keeps its clients training.
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "server/server.h"
#include "server/store.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::DeterministicTrainer;
using testing::SameBits;
using testing::TempDir;
using testing::WaitFor;

// 2 x 32 x 256 = 16,384 values: a 64 KiB adapter, so that one kept round is plainly visible.
std::vector<UpdateTensor> BigAdapter() {
  std::vector<UpdateTensor> a = {{"a.lora_A.weight", {32, 256}, {}},
                                 {"a.lora_B.weight", {256, 32}, {}}};
  for (UpdateTensor& t : a) {
    t.values.resize(32 * 256);
    for (size_t i = 0; i < t.values.size(); ++i)
      t.values[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  }
  return a;
}

// ExpectedAdapter (federation_test_util.h) for BigAdapter and plain FedAvg.
std::vector<UpdateTensor> ExpectedBig(const std::vector<int>& clients, int rounds) {
  std::vector<UpdateTensor> global = BigAdapter();
  auto opt = ServerOptimizer::Create({}, SpecFromUpdate(global));
  EXPECT_TRUE(opt.ok());
  for (int r = 1; r <= rounds; ++r) {
    auto avg = StreamingFedAvg::Create(SpecFromUpdate(global));
    for (int c : clients) {
      EXPECT_TRUE(
          avg->Add(testing::DeltaFor(c, static_cast<uint64_t>(r), global), testing::ExamplesOf(c))
              .ok());
    }
    auto mean = avg->Finish();
    EXPECT_TRUE(opt->Step(*mean, global).ok());
  }
  return global;
}

// Bytes of every regular file under `dir` (what `du --apparent-size` counts).
int64_t DirBytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) total += static_cast<int64_t>(it->file_size(ec));
  }
  return total;
}

// Holds training at round `gate` until Open(): the server then sits with round gate - 1 committed.
class GatedTrainer : public DeterministicTrainer {
 public:
  GatedTrainer(int client, uint64_t gate) : DeterministicTrainer(client), gate_(gate) {}
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_ || task.round != gate_; });
    lock.unlock();
    return DeterministicTrainer::Train(task, global);
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  const uint64_t gate_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class RetentionTest : public ::testing::Test {
 protected:
  void Start(const v1::RunConfig& config, int64_t retain) {
    ServerOptions o = testing::TestServerOptions(dir_.path());
    o.retain_rounds = retain;
    o.chunk_bytes = 64 << 10;
    o.max_upload_chunk_bytes = 64 << 10;
    o.upload_sync_bytes = 1 << 20;
    auto server = Server::Create(o, config, BigAdapter());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  // Runs clients site-0 and site-1 until the run ends; returns whether both finished.
  bool RunClients(const std::vector<std::unique_ptr<DeterministicTrainer>>& trainers) {
    bool ok = true;
    for (const auto& r : testing::RunClientsUntilDone(server_->address(), trainers)) {
      EXPECT_TRUE(r.ok()) << r.status();
      ok = ok && r.ok();
    }
    return ok;
  }

  // A `rounds`-round run of two clients, measured after round 10 and after round `rounds`
  // (once housekeeping has applied retention there).
  void RunAndMeasure(int rounds, int64_t retain, int64_t* after10, int64_t* after_last) {
    Start(testing::TestRunConfig(rounds, 2, 2), retain);
    std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
    for (int c = 0; c < 2; ++c) trainers.push_back(std::make_unique<GatedTrainer>(c, 11));
    std::thread clients([&] { RunClients(trainers); });
    const int64_t keep10 = retain > 0 ? 10 - retain + 1 : 0;
    const Coordinator& co = server_->coordinator();
    EXPECT_TRUE(WaitFor(
        [&] { return co.rounds_committed() >= 10 && co.retained_from_round() >= keep10; }, 30'000));
    *after10 = DirBytes(dir_.path());
    for (auto& t : trainers) static_cast<GatedTrainer*>(t.get())->Open();
    clients.join();
    EXPECT_EQ(co.rounds_committed(), rounds);
    const int64_t keep_last = retain > 0 ? rounds - retain + 1 : 0;
    EXPECT_TRUE(WaitFor([&] { return co.retained_from_round() >= keep_last; }, 30'000));
    *after_last = DirBytes(dir_.path());
  }

  TempDir dir_;
  std::unique_ptr<Server> server_;
};

constexpr int64_t kAdapterBytes = 2 * 32 * 256 * 4;

TEST_F(RetentionTest, StoreSizeStaysBoundedOver50RoundsAndARestartResumes) {
  int64_t after10 = 0, after50 = 0;
  RunAndMeasure(50, /*retain=*/3, &after10, &after50);
  // The bound: 4 adapters. Rows of the 40 rounds between (round, uploads, selections, metrics:
  // about 2 KB a round) and a WAL of the last few transactions fit in it; 40 kept adapters would not.
  EXPECT_LE(after50, after10 + 4 * kAdapterBytes)
      << "after round 10: " << after10 << ", after round 50: " << after50;
  std::cout << "store bytes with retain_rounds 3: after round 10 " << after10 << ", after round 50 "
            << after50 << "\n";
  // Pruned rounds keep their rows (DP accounting, exactly-once counting) but name no blob.
  server_->Shutdown();
  server_.reset();
  {
    auto store = Store::Open(dir_.path() + "/fedlora.db");
    ASSERT_TRUE(store.ok()) << store.status();
    auto rounds = (*store)->ListRounds("test-run");
    ASSERT_TRUE(rounds.ok());
    ASSERT_EQ(rounds->size(), 50u);
    for (const RoundRecord& r : *rounds) {
      EXPECT_EQ(r.state, RoundState::kCommitted);
      EXPECT_EQ(r.result_adapter_hash.empty(), r.round < 48) << "round " << r.round;
      EXPECT_FALSE(r.metrics_json.empty()) << "round " << r.round;
    }
    auto uploads = (*store)->ListAcceptedUploads("test-run", 1);
    ASSERT_TRUE(uploads.ok());
    EXPECT_EQ(uploads->size(), 2u);
  }
  // A restart resumes from the kept adapter and commits two more rounds exactly.
  Start(testing::TestRunConfig(52, 2, 2), 3);
  EXPECT_EQ(server_->coordinator().rounds_committed(), 50);
  std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
  for (int c = 0; c < 2; ++c) trainers.push_back(std::make_unique<DeterministicTrainer>(c));
  ASSERT_TRUE(RunClients(trainers));
  EXPECT_EQ(server_->coordinator().rounds_committed(), 52);
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedBig({0, 1}, 52)));
  server_->Shutdown();
}

TEST_F(RetentionTest, WithoutRetentionTheStoreGrowsByAnAdapterARound) {
  int64_t after10 = 0, after50 = 0;
  RunAndMeasure(50, /*retain=*/0, &after10, &after50);
  std::cout << "store bytes with retain_rounds 0: after round 10 " << after10 << ", after round 50 "
            << after50 << "\n";
  EXPECT_GE(after50, after10 + 40 * kAdapterBytes);
  server_->Shutdown();
}

TEST_F(RetentionTest, PruningKeepsTheDpEpsilonAcrossARestart) {
  v1::RunConfig config = testing::TestRunConfig(6, 2, 2);
  auto* dp = config.mutable_privacy()->mutable_dp();
  dp->set_enabled(true);
  dp->set_noise_multiplier(1.0);
  dp->set_clip_norm(1.0);
  config.mutable_aggregation()->clear_weight_by_examples();
  config.mutable_server()->set_retain_rounds(1);
  ApplyRunConfigDefaults(&config);
  // The setting reaches the server's options (and defaults to 10 when unset).
  EXPECT_EQ(ServerOptionsFromRunConfig(config).retain_rounds, 1);
  EXPECT_EQ(ServerOptionsFromRunConfig(testing::TestRunConfig(1, 1, 1)).retain_rounds, 10);
  Start(config, ServerOptionsFromRunConfig(config).retain_rounds);
  std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
  for (int c = 0; c < 2; ++c) trainers.push_back(std::make_unique<DeterministicTrainer>(c));
  ASSERT_TRUE(RunClients(trainers));
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().retained_from_round() >= 6; }, 30'000));
  const std::optional<double> before = server_->coordinator().dp_epsilon();
  ASSERT_TRUE(before.has_value());
  EXPECT_GT(*before, 0.0);
  server_->Shutdown();
  server_.reset();
  Start(config, 1);
  EXPECT_EQ(server_->coordinator().rounds_committed(), 6);
  const std::optional<double> after = server_->coordinator().dp_epsilon();
  ASSERT_TRUE(after.has_value());
  EXPECT_DOUBLE_EQ(*after, *before) << "epsilon changed when rounds 1-5 lost their blobs";
  server_->Shutdown();
}

TEST_F(RetentionTest, ADownlinkRunWithRetentionKeepsItsClientsTraining) {
  v1::RunConfig config = testing::TestRunConfig(8, 2, 2);
  v1::CodecStage* quant = config.mutable_downlink_codec()->add_stages();
  quant->set_id(v1::CodecStage::QUANT);
  quant->set_version(1);
  quant->mutable_quant()->set_bits(8);
  quant->mutable_quant()->set_block_size(256);
  quant->mutable_quant()->set_stochastic(false);
  Start(config, /*retain=*/1);
  // Three clients for two places a round: a client sits rounds out and comes back holding an
  // adapter whose delta steps may be gone; it must get what it needs (the chain or the full one).
  std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
  for (int c = 0; c < 3; ++c) trainers.push_back(std::make_unique<DeterministicTrainer>(c));
  ASSERT_TRUE(RunClients(trainers));
  EXPECT_EQ(server_->coordinator().rounds_committed(), 8);
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().retained_from_round() >= 8; }, 30'000));
  server_->Shutdown();
  server_.reset();
  // The kept chain and adapters are enough for a restart too.
  Start(config, 1);
  EXPECT_EQ(server_->coordinator().rounds_committed(), 8);
  server_->Shutdown();
}

}  // namespace
}  // namespace fedlora
