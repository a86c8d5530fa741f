// Shared pieces of the server integration tests: a small run config, a tiny adapter, a Trainer whose
// deltas are a known function of (client, round), the reference aggregation computed directly with
// the aggregation library, and raw-protocol helpers for tests that play a hostile client.
#pragma once

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "aggregation/fedavg.h"
#include "aggregation/server_optimizer.h"
#include "compression/codec.h"
#include "config/config_io.h"
#include "config/federated_tensors.h"
#include "core/sha256.h"
#include "crypto/sealed_update.h"
#include "fedlora/client.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/admin.grpc.pb.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "gtest/gtest.h"
#include "proto/wire.h"
#include "server/evaluator.h"
#include "server/options.h"

namespace fedlora::testing {

// Polls `done` every 10 ms until it holds or `timeout_ms` passes; its last answer.
inline bool WaitFor(const std::function<bool()>& done, int64_t timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// A fresh directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fedlora_rpc_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The adapter every test federates: three small tensors (sorted by name, the server's canonical
// order), initial values a fixed function of the index.
inline std::vector<UpdateTensor> InitialAdapter() {
  // 16x64 + 64x16 + 3x64 = 2240 values: ~9 KB encoded, so 1 KiB chunks give ~9 chunks per upload.
  std::vector<UpdateTensor> a = {{"layer.0.query.lora_A.weight", {16, 64}, {}},
                                 {"layer.0.query.lora_B.weight", {64, 16}, {}},
                                 {"classifier.weight", {3, 64}, {}}};
  for (UpdateTensor& t : a) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    t.values.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      t.values[i] = 0.01f * static_cast<float>((i * 37 + t.name.size()) % 17) - 0.08f;
  }
  std::sort(a.begin(), a.end(),
            [](const UpdateTensor& x, const UpdateTensor& y) { return x.name < y.name; });
  return a;
}

// The delta client `client` sends in round `round`: small integers times 2^-10, so every value is
// exact in fp32 and the expected aggregate is easy to reason about.
inline float DeltaValue(int client, uint64_t round, const std::string& name, int64_t i) {
  const int64_t k =
      (client * 31 + static_cast<int64_t>(round) * 7 + static_cast<int64_t>(name.size()) * 3 + i) %
          13 -
      6;
  return static_cast<float>(k) / 1024.0f;
}
inline int64_t ExamplesOf(int client) { return 10 + 3 * client; }

inline std::vector<NamedTensor> DeltaFor(int client, uint64_t round,
                                         const std::vector<NamedTensor>& global) {
  std::vector<NamedTensor> delta;
  for (const NamedTensor& g : global) {
    NamedTensor d{g.name, g.shape, std::vector<float>(g.values.size())};
    for (size_t i = 0; i < d.values.size(); ++i)
      d.values[i] = DeltaValue(client, round, g.name, static_cast<int64_t>(i));
    delta.push_back(std::move(d));
  }
  return delta;
}

class DeterministicTrainer : public ClientTrainer {
 public:
  explicit DeterministicTrainer(int client) : client_(client) {}
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override {
    TrainResult r;
    r.delta = DeltaFor(client_, task.round, global);
    r.num_examples = ExamplesOf(client_);
    r.steps = 1;
    r.examples_processed = r.num_examples;
    r.train_loss_first = 1.0;
    r.train_loss_last = 0.5;
    rounds_seen.push_back(task.round);
    learning_rates_seen.push_back(task.learning_rate);
    return r;
  }
  std::vector<uint64_t> rounds_seen;
  std::vector<double> learning_rates_seen;

 private:
  int client_;
};

// The global adapter after `rounds` rounds in which every client in `clients` contributed, computed
// directly with StreamingFedAvg + ServerOptimizer (what the server must reproduce bit for bit).
// `round_numbers` lists the round numbers whose deltas were aggregated, in order (an abandoned
// round leaves a gap). `optimizer` is the server optimizer of the run (default: plain FedAvg).
inline std::vector<UpdateTensor> ExpectedAdapter(const std::vector<int>& clients,
                                                 const std::vector<int>& round_numbers,
                                                 const ServerOptimizerOptions& optimizer = {}) {
  std::vector<UpdateTensor> global = InitialAdapter();
  auto opt = ServerOptimizer::Create(optimizer, SpecFromUpdate(global));
  EXPECT_TRUE(opt.ok()) << opt.status();
  for (int r : round_numbers) {
    auto avg = StreamingFedAvg::Create(SpecFromUpdate(global));
    EXPECT_TRUE(avg.ok());
    for (int c : clients) {
      EXPECT_TRUE(avg->Add(DeltaFor(c, static_cast<uint64_t>(r), global), ExamplesOf(c)).ok());
    }
    auto mean = avg->Finish();
    EXPECT_TRUE(mean.ok());
    EXPECT_TRUE(opt->Step(*mean, global).ok());
  }
  return global;
}
inline std::vector<UpdateTensor> ExpectedAdapter(const std::vector<int>& clients, int rounds,
                                                 const ServerOptimizerOptions& optimizer = {}) {
  std::vector<int> numbers;
  for (int r = 1; r <= rounds; ++r) numbers.push_back(r);
  return ExpectedAdapter(clients, numbers, optimizer);
}

// What aggregation.average_last_rounds makes the last round commit: the unweighted mean of
// `adapters`, with the exact accumulator the server uses for every mean.
inline std::vector<UpdateTensor> TailAverage(
    const std::vector<std::vector<UpdateTensor>>& adapters) {
  auto mean = StreamingFedAvg::Create(SpecFromUpdate(adapters.back()));
  EXPECT_TRUE(mean.ok()) << mean.status();
  for (const auto& a : adapters) EXPECT_TRUE(mean->Add(a, 1).ok());
  auto out = mean->Finish();
  EXPECT_TRUE(out.ok()) << out.status();
  return *out;
}

// Bitwise equality of two adapters (names, shapes, and the bits of every value).
inline ::testing::AssertionResult SameBits(const std::vector<UpdateTensor>& a,
                                           const std::vector<UpdateTensor>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " tensors";
  for (size_t t = 0; t < a.size(); ++t) {
    if (a[t].name != b[t].name || a[t].shape != b[t].shape ||
        a[t].values.size() != b[t].values.size()) {
      return ::testing::AssertionFailure()
             << "tensor " << t << " differs in name/shape: " << a[t].name << " vs " << b[t].name;
    }
    if (std::memcmp(a[t].values.data(), b[t].values.data(), a[t].values.size() * sizeof(float)) !=
        0) {
      for (size_t i = 0; i < a[t].values.size(); ++i) {
        if (std::memcmp(&a[t].values[i], &b[t].values[i], sizeof(float)) != 0) {
          return ::testing::AssertionFailure()
                 << a[t].name << "[" << i << "]: " << a[t].values[i] << " vs " << b[t].values[i];
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// A run config for tests: `rounds` rounds of `clients` clients, no over-selection, fast timings.
// Server learning rate of the adaptive-strategy runs of the crash test.
inline constexpr double kTestAdaptiveServerLr = 0.05;
// The bound on a client's claimed example count in test runs: far above ExamplesOf, so that the
// tests' updates weigh their claimed counts.
inline constexpr uint64_t kTestMaxExamples = 1000;

inline v1::RunConfig TestRunConfig(int rounds, int clients, int min_clients) {
  v1::RunConfig config;
  config.set_run_id("test-run");
  config.set_seed(7);
  config.mutable_model()->set_path("unused");
  config.set_rounds(rounds);
  config.mutable_selection()->set_clients_per_round(clients);
  config.mutable_selection()->set_over_selection(1.0);
  config.mutable_selection()->set_min_clients(min_clients);
  config.mutable_selection()->set_heartbeat_interval_seconds(1);
  config.mutable_aggregation()->set_max_examples_per_client(kTestMaxExamples);
  ApplyRunConfigDefaults(&config);
  return config;
}

inline ServerOptions TestServerOptions(const std::string& data_dir) {
  ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.insecure = true;  // loopback plaintext; the TLS tests clear it
  o.metrics_address = "127.0.0.1:0";
  o.data_dir = data_dir;
  o.round_deadline_ms = 30'000;
  o.retry_after_ms = 1000;
  o.selection_window_ms = 300;
  o.heartbeat_interval_ms = 1000;  // TestRunConfig's heartbeat_interval_seconds
  o.heartbeat_timeout_ms = 30'000;
  o.tick_ms = 20;
  o.chunk_bytes = 1024;  // small chunks so that even the tiny test update spans ~9 of them
  o.max_upload_chunk_bytes = 1024;
  o.upload_sync_bytes = 1024;  // every chunk durable: the resume tests count on it
  return o;
}

inline ClientOptions TestClientOptions(const std::string& address, const std::string& id) {
  ClientOptions o;
  o.server_address = address;
  o.client_id = id;
  o.insecure = true;  // loopback plaintext; the TLS tests clear it
  o.wait_for_task_seconds = 5;
  o.retry.initial_backoff_ms = 50;
  o.retry.max_backoff_ms = 500;
  o.retry.max_attempts = 60;
  return o;
}

// Runs one SDK client per trainer, "site-<i>", each in its own thread, until the run ends or the
// client gives up; their results in trainer order. `tweak` may adjust each client's options.
inline std::vector<absl::StatusOr<RunSummary>> RunClientsUntilDone(
    const std::string& address, const std::vector<std::unique_ptr<DeterministicTrainer>>& trainers,
    const std::function<void(ClientOptions&)>& tweak = nullptr) {
  std::vector<absl::StatusOr<RunSummary>> results(trainers.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t c = 0; c < trainers.size(); ++c) {
    threads.emplace_back([&, c] {
      ClientOptions options = TestClientOptions(address, "site-" + std::to_string(c));
      if (tweak) tweak(options);
      auto client = Client::Create(options, trainers[c].get());
      results[c] =
          client.ok() ? (*client)->RunUntilDone() : absl::StatusOr<RunSummary>(client.status());
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// --- Raw protocol: a client that speaks the wire format directly (to misbehave on purpose). ----

class RawClient {
 public:
  RawClient(const std::string& address, std::string id) : id_(std::move(id)) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    args.SetMaxReceiveMessageSize(64 << 20);
    auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Federation::NewStub(channel);
    admin_ = v1::Admin::NewStub(channel);
  }

  std::unique_ptr<grpc::ClientContext> Context(int64_t deadline_ms = 10'000) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
    ctx->AddMetadata(kClientIdMetadataKey, id_);
    if (!session_.empty()) ctx->AddMetadata(kSessionMetadataKey, session_);
    return ctx;
  }

  grpc::Status Join() {
    v1::JoinRequest req;
    req.set_protocol_version(kProtocolVersion);
    v1::JoinResponse resp;
    auto ctx = Context();
    grpc::Status s = stub_->Join(ctx.get(), req, &resp);
    session_ = resp.session_token();
    join_ = resp;
    return s;
  }

  grpc::Status WaitForTask(v1::WaitForTaskResponse* resp, uint32_t max_wait_s = 5) {
    v1::WaitForTaskRequest req;
    req.set_max_wait_seconds(max_wait_s);
    auto ctx = Context(int64_t{max_wait_s} * 1000 + 5000);
    return stub_->WaitForTask(ctx.get(), req, resp);
  }

  // Polls WaitForTask until a task arrives (or `attempts` answers without one).
  bool GetTask(v1::TrainTask* task, int attempts = 20) {
    for (int i = 0; i < attempts; ++i) {
      v1::WaitForTaskResponse resp;
      if (!WaitForTask(&resp, 2).ok()) continue;
      if (resp.has_task()) {
        *task = resp.task();
        return true;
      }
    }
    return false;
  }

  // The header for uploading `plain` (an encoded update) for `task`, sealed as an honest client
  // would: to the round's aggregation key, for this run, round, client, upload id and weight. Upload and
  // UploadAll given the same `plain` then send the sealed bytes (tests keep handling plaintext).
  // `num_examples` < 0: what an honest client claims (1 under secure aggregation or DP, else 10).
  // The manifest lists the adapter's federated tensors (config/federated_tensors.h).
  v1::UploadHeader Header(const v1::TrainTask& task, const std::string& plain,
                          const std::string& upload_id, int64_t num_examples = -1) {
    if (num_examples < 0) num_examples = HidesPerClientStatistics(join_.run_config()) ? 1 : 10;
    const crypto::UpdatePlace place{join_.run_config().run_id(), task.round(), join_.client_id(),
                                    upload_id, static_cast<uint64_t>(num_examples)};
    auto sealed = crypto::SealUpdateBlob(task.aggregation_key().public_key(), place, plain);
    EXPECT_TRUE(sealed.ok()) << sealed.status();
    const std::string blob = sealed.ok() ? sealed->blob : plain;
    sealed_[SealedKey(upload_id, plain)] = blob;
    v1::UploadHeader h;
    h.set_upload_id(upload_id);
    h.set_round(task.round());
    h.set_task_id(task.task_id());
    h.set_num_examples(static_cast<uint64_t>(num_examples));
    v1::EncryptionSpec* e = h.mutable_encryption();
    e->set_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
    if (sealed.ok()) e->set_ephemeral_public_key(sealed->ephemeral_public_key);
    e->set_server_key_id(task.aggregation_key().key_id());
    h.set_base_adapter_sha256(task.global_adapter().sha256());
    v1::AdapterManifest* m = h.mutable_manifest();
    for (const v1::TensorSpec& t : task.global_adapter().tensors()) {
      if (IsFederated(t.name(), join_.run_config())) *m->add_tensors() = t;  // lora.freeze_a
    }
    const uint32_t chunk = join_.limits().chunk_size_bytes();
    m->set_total_bytes(blob.size());
    m->set_sha256(Sha256Hex(blob));
    m->set_chunk_size_bytes(chunk);
    m->set_num_chunks(static_cast<uint32_t>((blob.size() + chunk - 1) / chunk));
    m->set_round(task.round());
    return h;
  }

  // Sends the header and chunks [first, last) of `blob`, then closes. `mutate` may alter each
  // chunk message before it is sent (hostile tests).
  grpc::Status Upload(const v1::UploadHeader& header, const std::string& plain, uint32_t first,
                      uint32_t last, v1::UploadAck* ack,
                      const std::function<void(v1::UploadData*)>& mutate = nullptr) {
    const std::string& blob = Wire(header.upload_id(), plain);
    auto ctx = Context(30'000);
    auto writer = stub_->UploadUpdate(ctx.get(), ack);
    v1::UploadChunk msg;
    *msg.mutable_header() = header;
    msg.mutable_header()->set_start_chunk(first);
    bool ok = writer->Write(msg);
    const uint64_t chunk = header.manifest().chunk_size_bytes();
    for (uint32_t i = first; ok && i < last; ++i) {
      msg.Clear();
      v1::UploadData* d = msg.mutable_data();
      d->set_chunk_index(i);
      d->set_offset_bytes(i * chunk);
      d->set_data(blob.substr(i * chunk, chunk));
      d->set_sha256(Sha256Hex(d->data()));
      if (mutate) mutate(d);
      ok = writer->Write(msg);
    }
    if (ok) writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status UploadAll(const v1::UploadHeader& header, const std::string& plain,
                         v1::UploadAck* ack) {
    return Upload(header, plain, 0, header.manifest().num_chunks(), ack);
  }

  // Points `header`'s manifest at `bytes` (size, hash, chunks), for tests that send altered bytes.
  static void Reframe(v1::UploadHeader* header, const std::string& bytes) {
    v1::AdapterManifest* m = header->mutable_manifest();
    const uint64_t chunk = m->chunk_size_bytes();
    m->set_total_bytes(bytes.size());
    m->set_sha256(Sha256Hex(bytes));
    m->set_num_chunks(static_cast<uint32_t>((bytes.size() + chunk - 1) / chunk));
  }

  grpc::Status ReportMetrics(const v1::MetricsReport& report) {
    v1::MetricsAck ack;
    auto ctx = Context();
    return stub_->ReportMetrics(ctx.get(), report, &ack);
  }

  // Drops the sealed blobs Header kept (benchmarks that seal large updates round after round).
  void ForgetSealed() { sealed_.clear(); }

  // The bytes Upload sends for `plain` under `upload_id`: what Header sealed, or `plain` itself
  // when no header sealed it (a test that sends raw bytes on purpose).
  const std::string& Wire(const std::string& upload_id, const std::string& plain) const {
    auto it = sealed_.find(SealedKey(upload_id, plain));
    return it == sealed_.end() ? plain : it->second;
  }

  grpc::Status Status(const std::string& upload_id, v1::UploadStatusResponse* resp) {
    v1::UploadStatusRequest req;
    req.set_upload_id(upload_id);
    auto ctx = Context();
    return stub_->GetUploadStatus(ctx.get(), req, resp);
  }

  // Downloads and parses a global adapter.
  grpc::Status Download(const std::string& sha, uint32_t start_chunk,
                        std::vector<v1::DownloadChunk>* chunks) {
    v1::DownloadRequest req;
    req.set_adapter_sha256(sha);
    req.set_start_chunk(start_chunk);
    auto ctx = Context(30'000);
    auto reader = stub_->DownloadAdapter(ctx.get(), req);
    v1::DownloadChunk c;
    while (reader->Read(&c)) chunks->push_back(c);
    return reader->Finish();
  }

  v1::Federation::Stub* stub() { return stub_.get(); }
  v1::Admin::Stub* admin() { return admin_.get(); }
  // Admin.GetStatus, expected to succeed.
  v1::GetStatusResponse RunStatus() {
    v1::GetStatusRequest req;
    v1::GetStatusResponse resp;
    auto ctx = Context(5000);
    grpc::Status s = admin()->GetStatus(ctx.get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  const v1::JoinResponse& join() const { return join_; }
  void set_session(std::string s) { session_ = std::move(s); }
  const std::string& session() const { return session_; }

 private:
  static std::string SealedKey(const std::string& upload_id, const std::string& plain) {
    return upload_id + "/" + Sha256Hex(plain);
  }

  std::string id_;
  std::string session_;
  v1::JoinResponse join_;
  std::map<std::string, std::string> sealed_;  // SealedKey -> the sealed blob Header made
  std::unique_ptr<v1::Federation::Stub> stub_;
  std::unique_ptr<v1::Admin::Stub> admin_;
};

// The encoded update client `client` would send for `task` (raw fp32 codec).
inline std::string EncodedDeltaFor(int client, const v1::TrainTask& task,
                                   const std::vector<UpdateTensor>& global) {
  std::vector<UpdateTensor> u;
  for (const UpdateTensor& g : global) {
    UpdateTensor d{g.name, g.shape, std::vector<float>(g.values.size())};
    for (size_t i = 0; i < d.values.size(); ++i)
      d.values[i] = DeltaValue(client, task.round(), g.name, static_cast<int64_t>(i));
    u.push_back(std::move(d));
  }
  auto enc = EncodeUpdate(u, CodecOptions{});
  EXPECT_TRUE(enc.ok()) << enc.status();
  return enc.ok() ? *enc : std::string();
}

// An evaluator whose Evaluate blocks until Open() (or 30 s, so that a broken test cannot hang):
// it holds a round after its updates are aggregated, before it commits.
class GateEvaluator : public Evaluator {
 public:
  absl::StatusOr<std::map<std::string, double>> Evaluate(
      uint64_t, const std::vector<UpdateTensor>&) override {
    std::unique_lock<std::mutex> lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(30), [this] { return open_; });
    return std::map<std::string, double>{{"eval_loss", 0.5}};
  }
  bool WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [this] { return entered_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false;
  bool open_ = false;
};

}  // namespace fedlora::testing
