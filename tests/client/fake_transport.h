// An in-memory federation behind the SDK's Transport (client/transport.h), for tests that need no
// server: plaintext identity, one task per round, the global adapter served in chunks, uploads
// checked against their manifest, opened with the round's private key and decoded as the server
// would. Heartbeats are counted and answered with `heartbeat_seconds`. No secure aggregation
// (Unimplemented). Every method is thread-safe (the SDK heartbeats from a second thread).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/transport.h"
#include "compression/codec.h"
#include "compression/update_io.h"
#include "core/sha256.h"
#include "core/strings.h"
#include "crypto/envelope.h"
#include "crypto/sealed_update.h"
#include "proto/wire.h"

namespace fedlora::testing {

// A ClientTrainer that is a plain function: what a site with its own training code writes.
class FunctionTrainer : public ClientTrainer {
 public:
  using Fn =
      std::function<absl::StatusOr<TrainResult>(const TrainTask&, const std::vector<NamedTensor>&)>;
  explicit FunctionTrainer(Fn fn) : fn_(std::move(fn)) {}
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override {
    return fn_(task, global);
  }

 private:
  Fn fn_;
};

class FakeFederation {
 public:
  static constexpr char kRunId[] = "fake-run";
  static constexpr char kClientId[] = "site-0";
  static constexpr uint32_t kChunkBytes = 1024;

  // `rounds` rounds, each one task for the one client, from `adapter`.
  FakeFederation(int rounds, std::vector<UpdateTensor> adapter) : rounds_(rounds) {
    key_ = *crypto::GenerateX25519KeyPair();
    global_ = Serve(*AdapterToSafetensors(adapter));
  }

  // Settings, before the client runs.
  uint64_t max_update_bytes = 0;             // ServerLimits.max_update_bytes; 0: none sent
  uint32_t heartbeat_seconds = 10;           // HeartbeatResponse.next_heartbeat_seconds
  uint32_t config_heartbeat_seconds = 3600;  // run_config.selection.heartbeat_interval_seconds

  std::unique_ptr<Transport> NewTransport();

  // What the client did.
  struct Received {
    uint64_t round = 0;
    uint64_t num_examples = 0;
    std::vector<UpdateTensor> update;  // decoded
  };
  std::vector<Received> uploads() {
    std::lock_guard<std::mutex> lock(mu_);
    return uploads_;
  }
  int upload_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return upload_calls_;
  }
  v1::ClientCapabilities capabilities() {
    std::lock_guard<std::mutex> lock(mu_);
    return capabilities_;
  }
  std::vector<std::string> leave_errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return leave_errors_;
  }
  // Waits up to `timeout` until `n` heartbeats arrived; the count.
  int WaitForHeartbeats(int n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return heartbeats_ >= n; });
    return heartbeats_;
  }

  // --- The calls, as FakeTransport forwards them ---
  absl::Status Join(const v1::JoinRequest& request, v1::JoinResponse* response) {
    std::lock_guard<std::mutex> lock(mu_);
    capabilities_ = request.capabilities();
    response->set_protocol_version(kProtocolVersion);
    response->set_client_id(kClientId);
    response->set_session_token("session-1");
    response->mutable_run_config()->set_run_id(kRunId);
    response->mutable_run_config()->set_rounds(static_cast<uint32_t>(rounds_));
    response->mutable_run_config()->mutable_selection()->set_heartbeat_interval_seconds(
        config_heartbeat_seconds);
    if (max_update_bytes > 0) response->mutable_limits()->set_max_update_bytes(max_update_bytes);
    response->mutable_limits()->set_chunk_size_bytes(kChunkBytes);
    return absl::OkStatus();
  }

  absl::Status WaitForTask(v1::WaitForTaskResponse* response) {
    std::lock_guard<std::mutex> lock(mu_);
    if (round_ >= static_cast<uint64_t>(rounds_) || leave_errors_.size() > 0) {
      v1::RunFinished* f = response->mutable_run_finished();
      f->set_reason(v1::RunFinished::COMPLETED);
      f->set_final_round(round_);
      *f->mutable_final_adapter() = global_;
      return absl::OkStatus();
    }
    v1::TrainTask* t = response->mutable_task();
    t->set_round(round_ + 1);
    t->set_task_id(absl::StrCat("task-", round_ + 1));
    t->set_seed(11);
    t->mutable_training()->set_local_steps(2);
    t->mutable_training()->set_batch_size(4);
    t->set_deadline_seconds(60);
    t->set_encryption_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
    t->mutable_aggregation_key()->set_public_key(key_.public_key);
    t->mutable_aggregation_key()->set_key_id(crypto::AggregationKeyId(key_.public_key));
    *t->mutable_global_adapter() = global_;
    return absl::OkStatus();
  }

  absl::Status Heartbeat(v1::HeartbeatResponse* response) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++heartbeats_;
    }
    cv_.notify_all();
    response->set_action(v1::HeartbeatResponse::CONTINUE);
    response->set_next_heartbeat_seconds(heartbeat_seconds);
    return absl::OkStatus();
  }

  absl::Status Download(const v1::DownloadRequest& request,
                        absl::FunctionRef<absl::Status(const v1::DownloadChunk&)> on_chunk) {
    std::string blob;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blobs_.find(request.adapter_sha256());
      if (it == blobs_.end()) return absl::NotFoundError("no such adapter");
      blob = it->second;
    }
    for (size_t i = request.start_chunk(); i * kChunkBytes < blob.size(); ++i) {
      v1::DownloadChunk chunk;
      chunk.set_chunk_index(static_cast<uint32_t>(i));
      chunk.set_offset_bytes(i * kChunkBytes);
      chunk.set_data(blob.substr(i * kChunkBytes, kChunkBytes));
      chunk.set_sha256(Sha256Hex(chunk.data()));
      if (absl::Status s = on_chunk(chunk); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Upload(const v1::UploadChunk& first, absl::FunctionRef<bool(v1::UploadChunk*)> next,
                      v1::UploadAck* ack) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++upload_calls_;
    }
    const v1::UploadHeader& h = first.header();
    std::string blob;
    v1::UploadChunk message;
    while (next(&message)) blob += message.data().data();
    if (blob.size() != h.manifest().total_bytes() || Sha256Hex(blob) != h.manifest().sha256()) {
      return absl::InvalidArgumentError("the upload does not match its manifest");
    }
    const crypto::UpdatePlace place{kRunId, h.round(), kClientId, h.upload_id(), h.num_examples()};
    absl::StatusOr<std::string> encoded = crypto::OpenUpdateBlob(key_.private_key, place, blob);
    if (!encoded.ok()) return encoded.status();
    absl::StatusOr<std::vector<UpdateTensor>> update = DecodeUpdate(*encoded, DecodeLimits{});
    if (!update.ok()) return update.status();
    std::lock_guard<std::mutex> lock(mu_);
    uploads_.push_back({h.round(), h.num_examples(), *std::move(update)});
    round_ = h.round();
    ack->set_upload_id(h.upload_id());
    ack->set_state(v1::UPLOAD_STATE_ACCEPTED);
    return absl::OkStatus();
  }

  void Leave(const v1::LeaveRequest& request) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!request.error().empty()) leave_errors_.push_back(request.error());
  }

 private:
  v1::AdapterManifest Serve(const std::string& blob) {
    v1::AdapterManifest m;
    m.set_sha256(Sha256Hex(blob));
    m.set_total_bytes(blob.size());
    m.set_chunk_size_bytes(kChunkBytes);
    m.set_num_chunks(static_cast<uint32_t>((blob.size() + kChunkBytes - 1) / kChunkBytes));
    blobs_[m.sha256()] = blob;
    return m;
  }

  const int rounds_;
  crypto::X25519KeyPair key_;
  v1::AdapterManifest global_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> blobs_;  // by SHA-256
  uint64_t round_ = 0;                        // the last round with an accepted upload
  int heartbeats_ = 0;
  int upload_calls_ = 0;
  std::vector<Received> uploads_;
  std::vector<std::string> leave_errors_;
  v1::ClientCapabilities capabilities_;
};

class FakeTransport final : public Transport {
 public:
  explicit FakeTransport(FakeFederation& federation) : f_(federation) {}
  absl::Status Join(const CallMeta&, const v1::JoinRequest& request,
                    v1::JoinResponse* response) override {
    return f_.Join(request, response);
  }
  absl::Status WaitForTask(const CallMeta&, const v1::WaitForTaskRequest&,
                           v1::WaitForTaskResponse* response) override {
    return f_.WaitForTask(response);
  }
  absl::Status Heartbeat(const CallMeta&, const v1::HeartbeatRequest&,
                         v1::HeartbeatResponse* response) override {
    return f_.Heartbeat(response);
  }
  absl::Status DownloadAdapter(
      const CallMeta&, const v1::DownloadRequest& request,
      absl::FunctionRef<absl::Status(const v1::DownloadChunk&)> on_chunk) override {
    return f_.Download(request, on_chunk);
  }
  absl::Status GetUploadStatus(const CallMeta&, const v1::UploadStatusRequest& request,
                               v1::UploadStatusResponse* response) override {
    response->set_upload_id(request.upload_id());
    response->set_state(v1::UPLOAD_STATE_UNKNOWN);
    return absl::OkStatus();
  }
  absl::Status UploadUpdate(const CallMeta&, const v1::UploadChunk& header,
                            absl::FunctionRef<bool(v1::UploadChunk*)> next,
                            v1::UploadAck* ack) override {
    return f_.Upload(header, next, ack);
  }
  absl::Status SecureAggregation(const CallMeta&, const v1::SecureAggregationRequest&,
                                 v1::SecureAggregationResponse*) override {
    return absl::UnimplementedError("the fake federation has no secure aggregation");
  }
  absl::Status ReportMetrics(const CallMeta&, const v1::MetricsReport&, v1::MetricsAck*) override {
    return absl::OkStatus();
  }
  absl::Status Leave(const CallMeta&, const v1::LeaveRequest& request,
                     v1::LeaveResponse*) override {
    f_.Leave(request);
    return absl::OkStatus();
  }

 private:
  FakeFederation& f_;
};

inline std::unique_ptr<Transport> FakeFederation::NewTransport() {
  return std::make_unique<FakeTransport>(*this);
}

// Client options for the fake: plaintext identity, quick retries.
inline ClientOptions FakeClientOptions() {
  ClientOptions o;
  o.server_address = "fake-federation:0";
  o.client_id = FakeFederation::kClientId;
  o.insecure = true;
  o.retry.max_attempts = 3;
  o.retry.initial_backoff_ms = 10;
  o.download_final_adapter = false;
  return o;
}

}  // namespace fedlora::testing
