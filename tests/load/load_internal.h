// The load run's pieces, shared by the files of the load harness (load_harness.h is the API):
//   load_setup.cc    the run (adapter, config, delta) and the two server processes
//   load_clients.cc  the raw-protocol clients
//   load_harness.cc  RunLoad: the processes, the samplers, validation and figures
//   load_report.cc   the report's text
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "compression/update_io.h"
#include "crypto/sealed_update.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "proto/wire.h"
#include "tests/load/load_harness.h"
#include "tests/load/prober.h"

namespace fedlora::load {

// The common delta (every value but the last) and the +-kPatch on the last value: powers of two,
// so that initial + rounds x delta is exact in fp32 and so is every mean the server takes.
inline constexpr float kDelta = 1.0f / 256.0f;
inline constexpr float kPatch = 1.0f / 1024.0f;
inline constexpr int kLayers = 16;
inline constexpr int64_t kHidden = 1024;
inline constexpr int64_t kExamples = 10;  // every client's FedAvg weight

// Client c's offset on the last value: +p, -p alternating; 0 for an odd one out, so the sum is 0.
float PatchOf(int c, int clients);
// The run's adapter (initial values), or with `delta` the common delta; sorted by name.
std::vector<UpdateTensor> LoadAdapter(int64_t kib, bool delta);
v1::RunConfig LoadRunConfig(const LoadOptions& o);

// The server child: writes "<port>\n" (or "0\n") to `fd`, serves until SIGTERM, then writes its
// Prometheus text to <dir>/metrics.txt and exits.
[[noreturn]] void ServeChild(const LoadOptions& o, const std::string& dir,
                             const std::string& log_path, int fd);
// The baseline: a Federation server whose Heartbeat answers CONTINUE at once and that does
// nothing else. Writes "<port>\n" to `fd`, serves until killed.
[[noreturn]] void ServeSink(int fd);
// Reads "<port>\n" from a child's pipe; 0 when it did not come within 60 s.
int ReadPort(int fd);

struct RoundEvents {
  double task_ms = -1, downloaded_ms = -1, accepted_ms = -1;
  int accepted = 0, duplicates = 0;
};

// What every client shares (read-only once the clients start, but for the atomics).
struct Shared {
  LoadOptions options;
  std::string address;
  std::string sink_address;
  Steady::time_point t0;
  Steady::time_point deadline;
  std::string
      encoded;  // the fixed delta, encoded (fp32, no zstd): the last 4 bytes are its last value
  std::atomic<bool> stop{false};
  std::atomic<int> joined{0};
  std::atomic<int> done{0};
  std::atomic<int64_t> all_joined_us{-1};
  std::vector<UpdateTensor> initial;
  ProbeTable* probes = nullptr;  // the prober's table (probe_process), or null
  // Client 0 checks the final adapter.
  absl::Mutex mu;
  std::string adapter_problem ABSL_GUARDED_BY(mu) = "final adapter not checked";
  bool adapter_exact ABSL_GUARDED_BY(mu) = false;
  int64_t adapter_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t upload_bytes ABSL_GUARDED_BY(mu) = 0;

  double NowMs() const {
    return std::chrono::duration<double, std::milli>(Steady::now() - t0).count();
  }
  bool Stopped() const { return stop.load() || Steady::now() > deadline; }
};

class LoadClient {
 public:
  LoadClient(int index, Shared* shared)
      : index_(index),
        id_(absl::StrCat("load-", index)),
        shared_(shared),
        stub_(v1::Federation::NewStub(MakeChannel(shared->address, index))),
        sink_(v1::Federation::NewStub(MakeChannel(shared->sink_address, index))) {}

  void RunMain();
  void RunHeartbeats();

  // Read after both threads are joined.
  std::vector<Sample> main_samples, hb_samples;
  std::map<uint64_t, RoundEvents> rounds;
  std::vector<std::pair<uint64_t, std::string>> cancels;  // (round, task id) answered CANCEL_TASK
  int unauthenticated = 0;                                // main thread
  int hb_unauthenticated = 0;                             // heartbeat thread
  bool finished = false;
  std::string problem;

 private:
  std::unique_ptr<grpc::ClientContext> Context(int64_t deadline_ms) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
    ctx->AddMetadata(kClientIdMetadataKey, id_);
    absl::MutexLock lock(&mu_);
    if (!session_.empty()) ctx->AddMetadata(kSessionMetadataKey, session_);
    return ctx;
  }
  void Record(std::vector<Sample>& v, Rpc rpc, Steady::time_point start,
              const grpc::Status& status) {
    const double s = std::chrono::duration<double, std::milli>(start - shared_->t0).count();
    v.push_back({rpc, s, std::chrono::duration<double, std::milli>(Steady::now() - start).count(),
                 status.ok(), static_cast<int>(status.error_code())});
  }
  // Sleeps up to `ms`, or less when the run stops; false when it stopped.
  bool Sleep(int64_t ms) {
    const auto until = Steady::now() + std::chrono::milliseconds(ms);
    while (Steady::now() < until) {
      if (shared_->Stopped()) return false;
      std::this_thread::sleep_for(
          std::min<Steady::duration>(until - Steady::now(), std::chrono::milliseconds(50)));
    }
    return !shared_->Stopped();
  }
  bool Join();
  // This client's slot in the prober's table, or -1 when it heartbeats from this process.
  int ProbeSlot() const { return shared_->probes != nullptr ? index_ : -1; }
  // Tells the prober the session and the task held.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ProbeSlot() >= 0 &&
        !shared_->probes->Publish(ProbeSlot(), session_, task_id_, task_round_)) {
      problem = absl::StrCat(id_, ": session or task id too long for the prober's table");
    }
  }
  void OnError(const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      ++unauthenticated;
      Join();
    } else {
      Sleep(100);
    }
  }
  void RunTask(const v1::TrainTask& task);
  bool Download(const v1::AdapterManifest& m, std::string* out);
  // The ack's state, or UNSPECIFIED when the upload could not be completed.
  v1::UploadAck Upload(const v1::TrainTask& task, const crypto::SealedBlob& sealed,
                       const std::string& upload_id);
  void CheckFinalAdapter(const v1::RunFinished& finished);

  const int index_;
  const std::string id_;
  Shared* const shared_;
  std::unique_ptr<v1::Federation::Stub> stub_;
  std::unique_ptr<v1::Federation::Stub> sink_;  // the baseline server
  v1::JoinResponse join_;                       // main thread only

  absl::Mutex mu_;
  std::string session_ ABSL_GUARDED_BY(mu_);
  std::string task_id_ ABSL_GUARDED_BY(mu_);  // the task held, until its update is accepted
  uint64_t task_round_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace fedlora::load
