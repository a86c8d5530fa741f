// The client SDK's ClientImpl: sessions, polling, one task's download, training, encoding, sealing,
// upload and secure aggregation. Over 600 lines, not split yet: issue 37 splits RunTask along the
// SDK transport / LoRA workload seam, and a split before it would be redone there.
#include "fedlora/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "client/rpc_status.h"
#include "client/secure_update.h"
#include "compression/codec.h"
#include "compression/downlink.h"
#include "compression/error_feedback.h"
#include "compression/update_io.h"
#include "config/config_io.h"
#include "core/file.h"
#include "core/logging.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/version.h"
#include "crypto/envelope.h"
#include "crypto/grpc_log.h"
#include "crypto/key_signature.h"
#include "crypto/random.h"
#include "crypto/sealed_update.h"
#include "crypto/secagg.h"
#include "crypto/tls.h"
#include "crypto/tls_probe.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "kernels/backend.h"
#include "proto/address.h"
#include "proto/wire.h"

namespace fedlora {
namespace {

using Ms = std::chrono::milliseconds;

std::chrono::system_clock::time_point DeadlineIn(int64_t ms) {
  return std::chrono::system_clock::now() + Ms(ms);
}

// Transient: worth retrying the same operation after a pause.
bool IsTransient(const absl::Status& s) {
  // DataLoss: a chunk corrupted on the way; the upload resumes after the last durable chunk.
  // Cancelled: the call reached a server in its shutdown grace (gRPC cancels what is left); the
  // restarted server answers the retry. (Retry checks Stopped() first, so a client that stopped
  // itself does not come here.)
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsAborted(s) ||
         absl::IsDataLoss(s) || absl::IsUnknown(s) || absl::IsCancelled(s);
}

// What a task's error means to RunUntilDone, carried as a payload of the status RunTask returns:
// "local", the site cannot train (its data, model or settings do not fit the run): trying again
// gives the same error, so the client leaves with it; "server", the server cancelled the task: the
// next WaitForTask has the answer. Without the payload the error may pass (a GPU blip, a network
// cut beyond the retries): the client waits and takes the task again, max_attempts in a row.
constexpr char kTaskFailureUrl[] = "fedlora.dev/client/task-failure";

absl::Status WithFailureKind(absl::Status s, absl::string_view kind) {
  s.SetPayload(kTaskFailureUrl, absl::Cord(kind));
  return s;
}

bool IsFailureKind(const absl::Status& s, absl::string_view kind) {
  const auto p = s.GetPayload(kTaskFailureUrl);
  return p.has_value() && *p == kind;
}

// A trainer's error that trying again cannot fix: the site's own files or settings are wrong.
// Unavailable, ResourceExhausted, Internal and the like may pass.
bool IsPermanentTrainerError(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) || absl::IsNotFound(s) ||
         absl::IsUnimplemented(s) || absl::IsPermissionDenied(s) || absl::IsOutOfRange(s) ||
         absl::IsDataLoss(s) || absl::IsAlreadyExists(s);
}

// The global adapter as the SDK's public tensor type.
absl::StatusOr<std::vector<NamedTensor>> ParseAdapter(const std::string& bytes) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> tensors, AdapterFromSafetensors(bytes));
  std::vector<NamedTensor> out;
  out.reserve(tensors.size());
  for (UpdateTensor& t : tensors)
    out.push_back({std::move(t.name), std::move(t.shape), std::move(t.values)});
  return out;
}

class ClientImpl final : public Client {
 public:
  ClientImpl(ClientOptions options, ClientTrainer* trainer, std::shared_ptr<grpc::Channel> channel,
             std::optional<crypto::AggregationKeyTrust> key_trust, crypto::TlsProbeOptions probe)
      : options_(std::move(options)),
        trainer_(trainer),
        channel_(channel),
        stub_(v1::Federation::NewStub(channel)),
        rng_(std::random_device{}()),
        key_trust_(std::move(key_trust)),
        probe_(std::move(probe)) {}

  absl::StatusOr<RunSummary> RunUntilDone() override;
  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
  }

 private:
  // A context with the identity/session metadata and a deadline.
  std::unique_ptr<grpc::ClientContext> Context(int64_t deadline_ms) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(DeadlineIn(deadline_ms));
    if (!options_.tls.enabled()) ctx->AddMetadata(kClientIdMetadataKey, options_.client_id);
    if (!session_.empty()) ctx->AddMetadata(kSessionMetadataKey, session_);
    return ctx;
  }

  // For logs: the identity the server gave (under TLS, the certificate's), else the configured one.
  const std::string& Who() const {
    return join_.client_id().empty() ? options_.client_id : join_.client_id();
  }
  // Ends the session; with an error, the server records the site as failed with it.
  void Leave(const absl::Status& error);
  // Leave(error), and the error RunUntilDone returns for it.
  absl::Status LeaveFailed(const absl::Status& error);
  // Joins (retried) and lets the trainer check the run (ClientTrainer::Prepare): a site that
  // cannot take part leaves at once.
  absl::Status JoinAndPrepare();

  bool Stopped() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }
  // Sleeps up to `ms`; returns false when Stop() interrupted it.
  bool SleepFor(int64_t ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return !cv_.wait_for(lock, Ms(ms), [this] { return stop_; });
  }
  // The pauses of one operation's retries, without jitter.
  int64_t RetryBudgetMs() const {
    const RetryPolicy& p = options_.retry;
    double total = 0, ms = static_cast<double>(p.initial_backoff_ms);
    for (int i = 1; i < p.max_attempts;
         ++i, ms = std::min(ms * p.multiplier, static_cast<double>(p.max_backoff_ms))) {
      total += std::min(ms, static_cast<double>(p.max_backoff_ms));
    }
    return static_cast<int64_t>(total);
  }
  int64_t Backoff(int attempt) {
    const RetryPolicy& p = options_.retry;
    double ms = static_cast<double>(p.initial_backoff_ms);
    for (int i = 1; i < attempt && ms < p.max_backoff_ms; ++i) ms *= p.multiplier;
    ms = std::min(ms, static_cast<double>(p.max_backoff_ms));
    std::uniform_real_distribution<double> jitter(1.0 - p.jitter, 1.0 + p.jitter);
    return static_cast<int64_t>(ms * jitter(rng_));
  }

  // Runs `call` until it succeeds, fails permanently, or max_attempts are used. A lost session
  // (Unauthenticated) is re-joined once per attempt. With `busy_is_transient`, ResourceExhausted is
  // tried again too (a cap on calls open at once, not a quota spent).
  template <class F>
  absl::Status Retry(const char* what, F&& call, bool busy_is_transient = false) {
    absl::Status last;
    for (int attempt = 1; attempt <= options_.retry.max_attempts; ++attempt) {
      if (Stopped()) return absl::CancelledError("client stopped");
      last = call();
      if (last.ok()) return last;
      // A connection that fails for a TLS reason (a certificate, plaintext against TLS) fails so on
      // every try: a handshake of our own says why, and the error is not retried.
      if (absl::IsUnavailable(last) && channel_->GetState(false) != GRPC_CHANNEL_READY) {
        absl::Status why = crypto::ExplainConnectionFailure(last, probe_);
        if (!absl::IsUnavailable(why)) return Annotate(why, what);
      }
      if (absl::IsUnauthenticated(last) && joined_) {
        FEDLORA_LOG(INFO) << Who() << ": session lost (" << last << "); joining again";
        absl::Status j = JoinOnce();
        if (!j.ok() && !IsTransient(j)) return j;
        continue;
      }
      const bool transient =
          IsTransient(last) || (busy_is_transient && absl::IsResourceExhausted(last));
      if (!transient || Stopped()) return last;
      if (attempt == 1) {
        FEDLORA_LOG(WARNING) << Who() << ": " << what << " to " << options_.server_address
                             << " failed (" << last << "); trying again, "
                             << options_.retry.max_attempts - 1 << " more times over about "
                             << (RetryBudgetMs() + 999) / 1000 << " s";
      } else {
        FEDLORA_LOG(DEBUG) << what << " attempt " << attempt << " failed: " << last;
      }
      if (attempt < options_.retry.max_attempts && !SleepFor(Backoff(attempt))) {
        return absl::CancelledError("client stopped");
      }
    }
    return Annotate(
        last, absl::StrCat(what, ": gave up after ", options_.retry.max_attempts, " attempts"));
  }

  absl::Status JoinOnce() {
    v1::JoinRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_client_version(options_.client_version.empty() ? FEDLORA_VERSION
                                                               : options_.client_version);
    request.mutable_capabilities()->set_device_name(options_.device_name);
    request.mutable_capabilities()->set_has_cuda(options_.has_cuda);
    request.mutable_capabilities()->add_encryption_schemes(
        v1::EncryptionSpec::X25519_HKDF_AES256GCM);
    v1::JoinResponse response;
    session_.clear();
    auto ctx = Context(options_.call_deadline_ms);
    FEDLORA_RETURN_IF_ERROR(FromGrpcStatus(stub_->Join(ctx.get(), request, &response)));
    if (response.protocol_version() != kProtocolVersion) {
      return absl::FailedPreconditionError(absl::StrCat("server speaks protocol ",
                                                        response.protocol_version(),
                                                        ", this client ", kProtocolVersion));
    }
    session_ = response.session_token();
    joined_ = true;
    join_ = response;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Download(const v1::AdapterManifest& manifest);
  // The task's global adapter (a safetensors image): the held one when it is that, else rebuilt
  // from the task's delta chain, else downloaded. Becomes the held adapter.
  absl::StatusOr<std::string> FetchGlobalAdapter(const v1::TrainTask& task);
  // The held adapter with the chain's deltas applied; DataLoss when it does not hash to `target`.
  absl::StatusOr<std::string> RebuildFromDeltas(const v1::AdapterDeltaChain& chain,
                                                const v1::AdapterManifest& target);
  // Loads the held adapter from state_dir, at the start of a run (a missing or unreadable file: the
  // one in memory, if any, stays).
  void LoadHeldAdapter();
  std::string HeldAdapterPath() const { return options_.state_dir + "/global_adapter.safetensors"; }
  absl::Status Upload(const v1::TrainTask& task, const std::string& blob,
                      const std::vector<NamedTensor>& delta, int64_t num_examples,
                      const std::string& upload_id, const std::string& ephemeral_public_key);
  // `chunk_sha256` holds each chunk's hex digest, computed once for all attempts.
  absl::Status UploadAttempt(const v1::UploadHeader& header, const std::string& blob,
                             const std::vector<std::string>& chunk_sha256, bool* accepted);
  // One task: returns OK when the update was accepted; a non-transient error means "give it up".
  absl::Status RunTask(const v1::TrainTask& task);
  // Secure aggregation: one SecureAggregation call (retried), and a step: `request` sent, then
  // polled until the answer is not "ask again" or `until` passes (DeadlineExceeded).
  absl::StatusOr<v1::SecureAggregationResponse> SecAggCall(
      const v1::SecureAggregationRequest& request);
  absl::StatusOr<v1::SecureAggregationResponse> SecAggStep(
      v1::SecureAggregationRequest request, std::chrono::steady_clock::time_point until);
  // The error-feedback residual of this run: loaded from state_dir the first time, or empty.
  absl::StatusOr<ErrorFeedback*> Feedback();
  std::string FeedbackPath() const { return options_.state_dir + "/error_feedback.safetensors"; }
  // Where the update's top-k and quantization stages run: the GPU (made at the first update) when
  // the site trains on one, else null (the host).
  absl::StatusOr<kernels::Backend*> EncodeBackend();

  const ClientOptions options_;
  ClientTrainer* const trainer_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Federation::Stub> stub_;
  std::mt19937_64 rng_;
  // With TLS: whose signature a round's aggregation key must carry (crypto/key_signature.h).
  const std::optional<crypto::AggregationKeyTrust> key_trust_;
  const crypto::TlsProbeOptions probe_;  // the channel's address, CA, certificate and key
  std::string session_;
  bool joined_ = false;
  v1::JoinResponse join_;
  std::optional<ErrorFeedback> feedback_;
  std::shared_ptr<kernels::Backend> encode_backend_;  // EncodeBackend's, once made
  std::string feedback_run_;                          // the run id feedback_ belongs to
  // The last global adapter this client obtained, and its SHA-256 (empty: none).
  std::string held_adapter_;
  std::string held_sha256_;
  int64_t adapters_downloaded_ = 0, adapters_rebuilt_ = 0, adapters_reused_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

void ClientImpl::LoadHeldAdapter() {
  if (options_.state_dir.empty()) return;
  absl::StatusOr<std::string> bytes = ReadFileToString(HeldAdapterPath());
  if (!bytes.ok()) return;  // none yet, or unreadable: the next task downloads the adapter whole
  held_sha256_ = Sha256Hex(*bytes);
  held_adapter_ = *std::move(bytes);
}

absl::StatusOr<std::string> ClientImpl::RebuildFromDeltas(const v1::AdapterDeltaChain& chain,
                                                          const v1::AdapterManifest& target) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> adapter,
                           AdapterFromSafetensors(held_adapter_));
  DecodeLimits limits;
  limits.max_elements = 0;
  for (const UpdateTensor& t : adapter)
    limits.max_elements += static_cast<int64_t>(t.values.size());
  limits.max_decoded_bytes = std::max<int64_t>(limits.max_elements * 8, 1 << 20);
  limits.max_tensors = static_cast<int64_t>(adapter.size());
  for (const v1::AdapterManifest& m : chain.deltas()) {
    FEDLORA_ASSIGN_OR_RETURN(std::string blob, Download(m));
    FEDLORA_RETURN_IF_ERROR_CTX(ApplyDownlinkDelta(adapter, blob, limits),
                                absl::StrCat("downlink delta ", m.sha256().substr(0, 16)));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string rebuilt, AdapterToSafetensors(adapter));
  if (Sha256Hex(rebuilt) != target.sha256()) {
    return absl::DataLossError(absl::StrCat("the adapter rebuilt from ", chain.deltas_size(),
                                            " downlink deltas does not hash to ",
                                            target.sha256().substr(0, 16)));
  }
  return rebuilt;
}

absl::StatusOr<std::string> ClientImpl::FetchGlobalAdapter(const v1::TrainTask& task) {
  const v1::AdapterManifest& target = task.global_adapter();
  if (!held_sha256_.empty() && held_sha256_ == target.sha256()) {
    ++adapters_reused_;
    return held_adapter_;
  }
  std::optional<std::string> blob;
  if (task.has_global_delta() && !held_sha256_.empty() &&
      task.global_delta().base_sha256() == held_sha256_) {
    absl::StatusOr<std::string> rebuilt = RebuildFromDeltas(task.global_delta(), target);
    if (rebuilt.ok()) {
      ++adapters_rebuilt_;
      blob = *std::move(rebuilt);
    } else {
      if (absl::IsCancelled(rebuilt.status()) && Stopped()) return rebuilt.status();
      FEDLORA_LOG(WARNING) << Who() << ": " << rebuilt.status()
                           << "; downloading the adapter whole";
    }
  }
  if (!blob.has_value()) {
    FEDLORA_ASSIGN_OR_RETURN(blob, Download(target));
    ++adapters_downloaded_;
  }
  held_adapter_ = *blob;
  held_sha256_ = target.sha256();
  if (!options_.state_dir.empty()) {
    absl::Status saved = WriteFileAtomically(HeldAdapterPath(), held_adapter_);
    if (!saved.ok()) {
      FEDLORA_LOG(WARNING) << Who() << ": keeping the global adapter: " << saved;
    }
  }
  return *std::move(blob);
}

absl::StatusOr<std::string> ClientImpl::Download(const v1::AdapterManifest& manifest) {
  std::string blob;
  // The manifest comes from the server, but a client never trusts a size enough to allocate it
  // blindly: reserve at most 1 GiB up front, and refuse a stream that outgrows its manifest.
  blob.reserve(static_cast<size_t>(std::min<uint64_t>(manifest.total_bytes(), uint64_t{1} << 30)));
  uint32_t next = 0;
  Sha256 whole;  // the digest of `blob`, fed as verified chunks arrive
  FEDLORA_RETURN_IF_ERROR(Retry(
      "DownloadAdapter",
      [&]() -> absl::Status {
        v1::DownloadRequest request;
        request.set_adapter_sha256(manifest.sha256());
        request.set_start_chunk(next);  // resume after the chunks already held
        auto ctx = Context(options_.transfer_deadline_ms);
        std::unique_ptr<grpc::ClientReader<v1::DownloadChunk>> reader =
            stub_->DownloadAdapter(ctx.get(), request);
        v1::DownloadChunk chunk;
        while (reader->Read(&chunk)) {
          if (chunk.chunk_index() != next || chunk.offset_bytes() != blob.size()) {
            ctx->TryCancel();
            reader->Finish();
            return absl::DataLossError(absl::StrCat("download: got chunk ", chunk.chunk_index(),
                                                    " at offset ", chunk.offset_bytes(),
                                                    ", expected chunk ", next));
          }
          if (blob.size() + chunk.data().size() > manifest.total_bytes()) {
            ctx->TryCancel();
            reader->Finish();
            return absl::DataLossError(absl::StrCat("download: more than the manifest's ",
                                                    manifest.total_bytes(), " bytes"));
          }
          // One pass for the chunk's own digest and the blob's; the blob's moves on only if it
          // matches.
          Sha256 advanced = whole;
          const Sha256DigestBytes own = advanced.UpdateAndDigest(chunk.data());
          if (ToHex(own) != chunk.sha256()) {
            ctx->TryCancel();
            reader->Finish();
            // Transient by nature (corruption on the way): retry from this chunk.
            return absl::AbortedError(
                absl::StrCat("download: chunk ", next, " does not match its SHA-256"));
          }
          whole = advanced;
          blob += chunk.data();
          ++next;
        }
        return FromGrpcStatus(reader->Finish());
      },
      /*busy_is_transient=*/true));  // the server frees our last stream's slot when it sees it end
  const Sha256DigestBytes digest = whole.Final();
  if (blob.size() != manifest.total_bytes() || ToHex(digest) != manifest.sha256()) {
    return absl::DataLossError(
        absl::StrCat("downloaded adapter (", blob.size(), " bytes) does not match its manifest (",
                     manifest.total_bytes(), " bytes, ", manifest.sha256(), ")"));
  }
  return blob;
}

absl::Status ClientImpl::UploadAttempt(const v1::UploadHeader& base, const std::string& blob,
                                       const std::vector<std::string>& chunk_sha256,
                                       bool* accepted) {
  *accepted = false;
  // Where to start: what the server already holds durably.
  v1::UploadStatusRequest status_request;
  status_request.set_upload_id(base.upload_id());
  v1::UploadStatusResponse status;
  {
    auto ctx = Context(options_.call_deadline_ms);
    FEDLORA_RETURN_IF_ERROR(
        FromGrpcStatus(stub_->GetUploadStatus(ctx.get(), status_request, &status)));
  }
  if (status.state() == v1::UPLOAD_STATE_ACCEPTED) {
    *accepted = true;
    return absl::OkStatus();
  }
  if (status.state() == v1::UPLOAD_STATE_REJECTED) {
    return absl::FailedPreconditionError(absl::StrCat("update was rejected: ", status.reason()));
  }
  const uint32_t start =
      status.state() == v1::UPLOAD_STATE_IN_PROGRESS ? status.chunks_acknowledged() : 0;
  v1::UploadHeader header = base;
  header.set_start_chunk(start);
  auto ctx = Context(options_.transfer_deadline_ms);
  v1::UploadAck ack;
  std::unique_ptr<grpc::ClientWriter<v1::UploadChunk>> writer =
      stub_->UploadUpdate(ctx.get(), &ack);
  v1::UploadChunk message;
  *message.mutable_header() = header;
  bool ok = writer->Write(message);
  const uint64_t chunk = header.manifest().chunk_size_bytes();
  for (uint32_t i = start; ok && i < header.manifest().num_chunks(); ++i) {
    message.Clear();
    v1::UploadData* data = message.mutable_data();
    data->set_chunk_index(i);
    data->set_offset_bytes(i * chunk);
    data->set_data(blob.substr(i * chunk, chunk));
    data->set_sha256(chunk_sha256[i]);
    ok = writer->Write(message);
  }
  if (ok) writer->WritesDone();
  FEDLORA_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  if (ack.state() == v1::UPLOAD_STATE_ACCEPTED) {
    *accepted = true;
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat("upload stream ended at chunk ",
                                             ack.chunks_acknowledged(), " of ",
                                             header.manifest().num_chunks(), "; resuming"));
}

absl::Status ClientImpl::Upload(const v1::TrainTask& task, const std::string& blob,
                                const std::vector<NamedTensor>& delta, int64_t num_examples,
                                const std::string& upload_id,
                                const std::string& ephemeral_public_key) {
  v1::UploadHeader header;
  header.set_upload_id(upload_id);
  header.set_round(task.round());
  header.set_task_id(task.task_id());
  header.set_num_examples(static_cast<uint64_t>(num_examples));
  *header.mutable_codec() = task.codec();
  v1::EncryptionSpec* encryption = header.mutable_encryption();
  encryption->set_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
  encryption->set_ephemeral_public_key(ephemeral_public_key);
  encryption->set_server_key_id(task.aggregation_key().key_id());
  header.set_base_adapter_sha256(task.global_adapter().sha256());
  v1::AdapterManifest* m = header.mutable_manifest();
  for (const NamedTensor& t : delta) {
    v1::TensorSpec* spec = m->add_tensors();
    spec->set_name(t.name);
    spec->set_dtype("F32");
    for (int64_t d : t.shape) spec->add_shape(d);
  }
  const uint32_t chunk = join_.limits().chunk_size_bytes() > 0 ? join_.limits().chunk_size_bytes()
                                                               : kDefaultChunkSizeBytes;
  m->set_total_bytes(blob.size());
  // The blob's digest and every chunk's in one pass over the bytes.
  std::vector<std::string> chunk_sha256;
  Sha256 whole;
  for (size_t off = 0; off < blob.size(); off += chunk) {
    const Sha256DigestBytes d = whole.UpdateAndDigest(std::string_view(blob).substr(off, chunk));
    chunk_sha256.push_back(ToHex(d));
  }
  const Sha256DigestBytes digest = whole.Final();
  m->set_sha256(ToHex(digest));
  m->set_chunk_size_bytes(chunk);
  m->set_num_chunks(static_cast<uint32_t>((blob.size() + chunk - 1) / chunk));
  m->set_round(task.round());
  return Retry("UploadUpdate", [&]() -> absl::Status {
    bool accepted = false;
    FEDLORA_RETURN_IF_ERROR(UploadAttempt(header, blob, chunk_sha256, &accepted));
    return accepted ? absl::OkStatus() : absl::UnavailableError("upload not accepted yet");
  });
}

absl::StatusOr<v1::SecureAggregationResponse> ClientImpl::SecAggCall(
    const v1::SecureAggregationRequest& request) {
  v1::SecureAggregationResponse response;
  FEDLORA_RETURN_IF_ERROR(Retry("SecureAggregation", [&] {
    auto ctx = Context(options_.call_deadline_ms);
    return FromGrpcStatus(stub_->SecureAggregation(ctx.get(), request, &response));
  }));
  return response;
}

absl::StatusOr<v1::SecureAggregationResponse> ClientImpl::SecAggStep(
    v1::SecureAggregationRequest request, std::chrono::steady_clock::time_point until) {
  while (true) {
    FEDLORA_ASSIGN_OR_RETURN(v1::SecureAggregationResponse response, SecAggCall(request));
    if (!response.has_retry_after_ms()) return response;
    if (std::chrono::steady_clock::now() >= until) {
      return absl::DeadlineExceededError(
          absl::StrCat("round ", request.round(), ": secure aggregation did not move on"));
    }
    request.set_poll(true);  // the message was taken: from now on only ask
    if (!SleepFor(std::max<int64_t>(20, response.retry_after_ms())))
      return absl::CancelledError("client stopped");
  }
}

absl::Status ClientImpl::RunTask(const v1::TrainTask& task) {
  // Checked before any work: this client uploads sealed updates only.
  if (task.encryption_scheme() != v1::EncryptionSpec::X25519_HKDF_AES256GCM ||
      task.aggregation_key().public_key().size() != crypto::kX25519KeyBytes) {
    return absl::FailedPreconditionError(
        "the server offers no X25519_HKDF_AES256GCM aggregation key; this client uploads sealed "
        "updates only");
  }
  if (task.aggregation_key().key_id() !=
      crypto::AggregationKeyId(task.aggregation_key().public_key())) {
    return absl::FailedPreconditionError(absl::StrCat("the task's aggregation key id '",
                                                      task.aggregation_key().key_id().substr(0, 80),
                                                      "' does not name its key"));
  }
  if (key_trust_.has_value()) {
    // Over TLS the key must be the server's own, whatever terminated the TLS connection.
    const v1::AggregationKey& k = task.aggregation_key();
    FEDLORA_RETURN_IF_ERROR_CTX(
        crypto::VerifyAggregationKey(*key_trust_, k.signer_certificate_pem(), k.signature(),
                                     join_.run_config().run_id(), task.round(), k.public_key()),
        "refusing to seal an update to this round's key");
  }
  const auto t0 = std::chrono::steady_clock::now();
  // Secure aggregation's key steps (crypto/secagg.h) come first, with every client of the round:
  // advertise fresh keys, share the secrets, and receive the neighbours' shares for the mask.
  std::optional<crypto::SecAggClient> secagg;
  v1::SecAggMaskedInputRequest masked_request;
  v1::SecureAggregationRequest secagg_base;
  const auto secagg_until =
      t0 + std::chrono::seconds(task.deadline_seconds()) + std::chrono::minutes(2);
  if (task.has_secure_aggregation()) {
    const v1::SecureAggregationTask& sa = task.secure_aggregation();
    FEDLORA_ASSIGN_OR_RETURN(crypto::SecAggClient c,
                             crypto::SecAggClient::Create(sa.params(), sa.client_index()));
    secagg.emplace(std::move(c));
    secagg_base.set_round(task.round());
    secagg_base.set_task_id(task.task_id());
    v1::SecureAggregationRequest request = secagg_base;
    FEDLORA_ASSIGN_OR_RETURN(*request.mutable_advertise_keys(), secagg->AdvertiseKeys());
    FEDLORA_ASSIGN_OR_RETURN(v1::SecureAggregationResponse response,
                             SecAggStep(request, secagg_until));
    if (!response.has_share_keys()) {
      return absl::FailedPreconditionError(
          absl::StrCat("round ", task.round(), ": secure aggregation: ", response.done()));
    }
    request = secagg_base;
    FEDLORA_ASSIGN_OR_RETURN(*request.mutable_share_keys(),
                             secagg->ShareKeys(response.share_keys()));
    FEDLORA_ASSIGN_OR_RETURN(response, SecAggStep(request, secagg_until));
    if (!response.has_masked_input()) {
      return absl::FailedPreconditionError(
          absl::StrCat("round ", task.round(), ": secure aggregation: ", response.done()));
    }
    masked_request = response.masked_input();
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string blob, FetchGlobalAdapter(task));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<NamedTensor> global, ParseAdapter(blob));
  const auto t1 = std::chrono::steady_clock::now();

  TrainTask t;
  t.round = task.round();
  t.task_id = task.task_id();
  t.seed = task.seed();
  t.local_epochs = task.training().has_local_epochs() ? task.training().local_epochs() : 0;
  t.local_steps = task.training().has_local_steps() ? task.training().local_steps() : 0;
  if (t.local_epochs == 0 && t.local_steps == 0) t.local_epochs = 1;
  t.batch_size = task.training().batch_size();
  t.learning_rate = task.training().learning_rate();
  t.proximal_mu = task.proximal_mu();
  t.deadline_seconds = task.deadline_seconds();
  t.run_config_json = RunConfigToJson(join_.run_config());

  // Heartbeats while training, so the server knows the client is alive and can cancel the task,
  // with the trainer's step counts where the run lets the server see them.
  const bool hide_statistics = HidesPerClientStatistics(join_.run_config());
  std::atomic<int64_t> steps_done{0};
  std::atomic<int64_t> steps_total{0};
  t.report_progress = [&steps_done, &steps_total](int64_t done, int64_t total) {
    steps_total.store(total);
    steps_done.store(done);
  };
  std::atomic<bool> cancelled{false};
  std::mutex hb_mu;
  std::condition_variable hb_cv;
  bool hb_stop = false;
  const int64_t hb_ms = std::max<int64_t>(
      1000, int64_t{1000} * join_.run_config().selection().heartbeat_interval_seconds());
  std::thread heartbeat([&] {
    std::unique_lock<std::mutex> lock(hb_mu);
    while (!hb_cv.wait_for(lock, Ms(hb_ms), [&] { return hb_stop; })) {
      lock.unlock();
      v1::HeartbeatRequest request;
      request.set_task_id(task.task_id());
      request.set_state(v1::CLIENT_STATE_TRAINING);
      if (!hide_statistics) {
        request.set_steps_done(static_cast<uint64_t>(std::max<int64_t>(0, steps_done.load())));
        request.set_steps_total(static_cast<uint64_t>(std::max<int64_t>(0, steps_total.load())));
      }
      v1::HeartbeatResponse response;
      auto ctx = Context(options_.call_deadline_ms);
      if (stub_->Heartbeat(ctx.get(), request, &response).ok() &&
          response.action() == v1::HeartbeatResponse::CANCEL_TASK) {
        cancelled.store(true);
      }
      lock.lock();
    }
  });
  absl::StatusOr<TrainResult> result = trainer_->Train(t, global);
  {
    std::lock_guard<std::mutex> lock(hb_mu);
    hb_stop = true;
  }
  hb_cv.notify_all();
  heartbeat.join();
  const auto t2 = std::chrono::steady_clock::now();
  if (cancelled.load()) {
    return WithFailureKind(absl::FailedPreconditionError(absl::StrCat(
                               "task ", task.task_id(), " was cancelled by the server")),
                           "server");
  }
  if (!result.ok()) {
    absl::Status s = Annotate(result.status(), "trainer");
    return IsPermanentTrainerError(s) ? WithFailureKind(std::move(s), "local") : s;
  }
  if (result->num_examples < 1) {
    return WithFailureKind(absl::InvalidArgumentError("trainer returned num_examples < 1"),
                           "local");
  }
  // Under secure aggregation or DP the server learns nothing of this site's data size or loss.
  const int64_t claimed_examples = hide_statistics ? 1 : result->num_examples;

  std::vector<UpdateTensor> update;
  ErrorFeedback* feedback = nullptr;
  CodecOptions codec;
  if (!secagg.has_value()) {
    update.reserve(result->delta.size());
    for (const NamedTensor& n : result->delta) update.push_back({n.name, n.shape, n.values});
    FEDLORA_ASSIGN_OR_RETURN(codec, CodecOptionsFromSpec(task.codec()));
    codec.seed = task.seed();  // random-k indices and stochastic rounding: reproducible per task
    if (codec.error_feedback) {
      FEDLORA_ASSIGN_OR_RETURN(feedback, Feedback());
    }
  }
  // One upload id per task attempt: every retry and resume reuses it, so the server counts it once.
  FEDLORA_ASSIGN_OR_RETURN(const std::string random_id, crypto::RandomHex(16));
  const std::string upload_id = absl::StrCat("u-", random_id);
  // Sealed to the run's aggregation key, for this run, round, identity and upload only.
  crypto::SealedBlob sealed;
  {
    std::string encoded;
    if (secagg.has_value()) {
      // The masked fixed-point vector is the update (SecAgg+ step 2).
      FEDLORA_ASSIGN_OR_RETURN(std::vector<uint64_t> input,
                               EncodeSecureUpdate(result->delta, task.secure_aggregation()));
      FEDLORA_ASSIGN_OR_RETURN(v1::SecAggMaskedInputResponse masked,
                               secagg->MaskedInput(masked_request, input));
      encoded = std::move(*masked.mutable_masked_input());
    } else {
      // Low-rank factorisation has no GPU path: such a codec encodes on the host.
      kernels::Backend* device = nullptr;
      if (codec.sparsifier != Sparsifier::kLowRank) {
        FEDLORA_ASSIGN_OR_RETURN(device, EncodeBackend());
      }
      absl::StatusOr<std::string> wire = feedback != nullptr
                                             ? feedback->Encode(update, codec, device)
                                             : EncodeUpdate(update, codec, device);
      if (!wire.ok()) {
        absl::Status e =
            Annotate(wire.status(),
                     device != nullptr ? "encoding the update on the GPU" : "encoding the update");
        // The trainer's delta does not match the adapter's names or shapes: it will not next time
        // either.
        return absl::IsInvalidArgument(e) ? WithFailureKind(std::move(e), "local") : e;
      }
      encoded = *std::move(wire);
    }
    std::vector<UpdateTensor>().swap(update);
    const crypto::UpdatePlace place{join_.run_config().run_id(), task.round(), join_.client_id(),
                                    upload_id, static_cast<uint64_t>(claimed_examples)};
    FEDLORA_ASSIGN_OR_RETURN(
        sealed, crypto::SealUpdateBlob(task.aggregation_key().public_key(), place, encoded));
  }
  const auto t3 = std::chrono::steady_clock::now();
  FEDLORA_RETURN_IF_ERROR(Upload(task, sealed.blob, result->delta, claimed_examples, upload_id,
                                 sealed.ephemeral_public_key));
  if (secagg.has_value()) {
    // Step 3: once the uploads close, reveal the neighbours' shares the server needs to unmask the
    // sum.
    v1::SecureAggregationRequest poll = secagg_base;
    poll.set_poll(true);
    absl::StatusOr<v1::SecureAggregationResponse> response = SecAggStep(poll, secagg_until);
    if (response.ok() && response->has_unmasking()) {
      v1::SecureAggregationRequest request = secagg_base;
      absl::StatusOr<v1::SecAggUnmaskingResponse> shares = secagg->Unmask(response->unmasking());
      if (shares.ok()) {
        *request.mutable_unmasking() = *std::move(shares);
        response = SecAggCall(request);
      } else {
        response = shares.status();  // an inconsistent request: refused, nothing revealed
      }
    }
    if (!response.ok()) {
      FEDLORA_LOG(WARNING) << Who() << ": round " << task.round()
                           << ": unmasking: " << response.status();
    }
  }
  const auto t4 = std::chrono::steady_clock::now();
  if (feedback != nullptr) {  // accepted: what was not sent waits for the next update
    feedback->Commit();
    if (!options_.state_dir.empty()) {
      if (absl::Status st = feedback->Save(FeedbackPath(), feedback_run_); !st.ok()) {
        FEDLORA_LOG(ERROR) << Who()
                           << ": the error-feedback residual was not saved (a restart loses "
                           << "it): " << st;
      }
    }
  }

  if (hide_statistics) return absl::OkStatus();  // no metrics report: the server refuses one
  auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  v1::MetricsReport report;
  report.set_round(task.round());
  report.set_task_id(task.task_id());
  report.set_train_loss_first(result->train_loss_first);
  report.set_train_loss_last(result->train_loss_last);
  report.set_examples_processed(static_cast<uint64_t>(result->examples_processed));
  report.set_steps(static_cast<uint64_t>(result->steps));
  report.set_download_seconds(seconds(t0, t1));
  report.set_train_seconds(seconds(t1, t2));
  report.set_encode_seconds(seconds(t2, t3));
  report.set_upload_seconds(seconds(t3, t4));
  for (const auto& [k, v] : result->metrics) (*report.mutable_extra())[k] = v;
  absl::Status s = Retry("ReportMetrics", [&] {
    v1::MetricsAck ack;
    auto ctx = Context(options_.call_deadline_ms);
    return FromGrpcStatus(stub_->ReportMetrics(ctx.get(), report, &ack));
  });
  // Metrics are informative: a refusal does not undo the accepted update.
  if (!s.ok()) {
    FEDLORA_LOG(WARNING) << Who() << ": metrics for round " << task.round() << ": " << s;
  }
  return absl::OkStatus();
}

absl::StatusOr<kernels::Backend*> ClientImpl::EncodeBackend() {
  if (!options_.has_cuda) return nullptr;
  if (encode_backend_ == nullptr) {
    FEDLORA_ASSIGN_OR_RETURN(encode_backend_, kernels::Backend::Create(Device::kCuda));
  }
  return encode_backend_.get();
}

absl::StatusOr<ErrorFeedback*> ClientImpl::Feedback() {
  const std::string& run = join_.run_config().run_id();
  if (feedback_ && feedback_run_ == run) return &*feedback_;
  feedback_run_ = run;
  if (options_.state_dir.empty()) {
    FEDLORA_LOG(WARNING) << Who()
                         << ": the run's codec keeps an error-feedback residual; without a "
                         << "state directory it lives in memory only and a restart loses it";
    feedback_.emplace();
  } else {
    FEDLORA_ASSIGN_OR_RETURN(ErrorFeedback loaded, ErrorFeedback::Load(FeedbackPath(), run));
    feedback_ = std::move(loaded);
  }
  return &*feedback_;
}

absl::StatusOr<RunSummary> ClientImpl::RunUntilDone() {
  RunSummary summary;
  int failed_in_a_row = 0;  // tasks, the transient errors of RunTask
  LoadHeldAdapter();
  FEDLORA_RETURN_IF_ERROR(JoinAndPrepare());
  std::string waiting_for;  // the last "retry later" reason logged
  while (true) {
    if (Stopped()) return absl::CancelledError("client stopped");
    v1::WaitForTaskResponse response;
    FEDLORA_RETURN_IF_ERROR(Retry("WaitForTask", [&] {
      v1::WaitForTaskRequest request;
      request.set_max_wait_seconds(static_cast<uint32_t>(options_.wait_for_task_seconds));
      request.set_held_adapter_sha256(held_sha256_);
      auto ctx = Context(options_.wait_for_task_seconds * 1000 + 10'000);
      return FromGrpcStatus(stub_->WaitForTask(ctx.get(), request, &response));
    }));
    if (response.has_run_finished() &&
        response.run_finished().reason() == v1::RunFinished::FAILED) {
      return absl::AbortedError(absl::StrCat(
          "the server stopped the run after round ", response.run_finished().final_round(),
          " on a failure it could not get past (see the server's log)"));
    }
    if (response.has_run_finished()) {
      summary.final_round = response.run_finished().final_round();
      summary.adapters_downloaded = adapters_downloaded_;
      summary.adapters_rebuilt = adapters_rebuilt_;
      summary.adapters_reused = adapters_reused_;
      summary.final_adapter_sha256 = response.run_finished().final_adapter().sha256();
      if (options_.download_final_adapter) {
        FEDLORA_ASSIGN_OR_RETURN(std::string blob,
                                 Download(response.run_finished().final_adapter()));
        FEDLORA_ASSIGN_OR_RETURN(summary.final_adapter, ParseAdapter(blob));
      }
      break;
    }
    if (response.has_retry_later()) {
      if (response.retry_later().reason() != waiting_for) {
        waiting_for = response.retry_later().reason();
        FEDLORA_LOG(INFO) << Who() << ": " << waiting_for.substr(0, 200);
      }
      const int64_t ms =
          int64_t{1000} * std::max<uint32_t>(1, response.retry_later().retry_after_seconds());
      if (!SleepFor(ms)) return absl::CancelledError("client stopped");
      continue;
    }
    if (!response.has_task()) return absl::InternalError("WaitForTask answered with no outcome");
    absl::Status s = RunTask(response.task());
    if (s.ok()) {
      ++summary.tasks_completed;
      failed_in_a_row = 0;
    } else {
      if (absl::IsCancelled(s) && Stopped()) return s;
      ++summary.tasks_failed;
      if (IsFailureKind(s, "server")) {
        FEDLORA_LOG(INFO) << Who() << ": " << s.message();
        continue;
      }
      // The server hands a selected site its task again at once: wait before taking it, and stop
      // after max_attempts failures in a row.
      ++failed_in_a_row;
      if (IsFailureKind(s, "local") || failed_in_a_row >= options_.retry.max_attempts) {
        if (!IsFailureKind(s, "local")) {
          s = Annotate(s, absl::StrCat(failed_in_a_row, " tasks in a row failed; the last"));
        }
        return LeaveFailed(s);
      }
      const int64_t wait_ms = Backoff(failed_in_a_row);
      FEDLORA_LOG(WARNING) << Who() << ": task " << response.task().task_id()
                           << " given up (taken again in " << (wait_ms + 999) / 1000
                           << " s): " << s;
      if (!SleepFor(wait_ms)) return absl::CancelledError("client stopped");
    }
    if (options_.max_tasks > 0 && summary.tasks_completed >= options_.max_tasks) break;
  }
  Leave(absl::OkStatus());
  return summary;
}

absl::Status ClientImpl::JoinAndPrepare() {
  FEDLORA_RETURN_IF_ERROR(Retry("Join", [&] { return JoinOnce(); }));
  FEDLORA_LOG(INFO) << Who() << ": joined run '" << join_.run_config().run_id() << "' at "
                    << options_.server_address
                    << (join_.current_round() > 0
                            ? absl::StrCat(" (round ", join_.current_round(), " in progress)")
                            : "");
  absl::Status s = trainer_->Prepare(RunConfigToJson(join_.run_config()));
  if (s.ok()) return s;
  s = Annotate(s, "trainer");
  if (IsPermanentTrainerError(s)) return LeaveFailed(s);
  // It may pass (a busy GPU): the first task tries again, under the task's rules.
  FEDLORA_LOG(WARNING) << Who() << ": " << s;
  return absl::OkStatus();
}

absl::Status ClientImpl::LeaveFailed(const absl::Status& error) {
  Leave(error);
  return absl::Status(
      error.code(), absl::StrCat("this site cannot take part in run '", join_.run_config().run_id(),
                                 "': ", error.message(),
                                 " (it left the run; the server shows it as "
                                 "FAILED until it joins again)"));
}

void ClientImpl::Leave(const absl::Status& error) {
  v1::LeaveRequest leave;
  leave.set_reason(error.ok() ? "finished" : "failed");
  if (!error.ok()) {
    leave.set_error(absl::StrCat(absl::StatusCodeToString(error.code()), ": ", error.message())
                        .substr(0, 1024));
  }
  v1::LeaveResponse left;
  auto ctx = Context(options_.call_deadline_ms);
  absl::Status s = FromGrpcStatus(stub_->Leave(ctx.get(), leave, &left));
  // Best effort: without it the server times the session out and gives the task to another site.
  if (!s.ok() && !error.ok()) {
    FEDLORA_LOG(WARNING) << Who() << ": telling the server of the failure: " << s;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options,
                                                       ClientTrainer* trainer) {
  if (trainer == nullptr) return absl::InvalidArgumentError("Client::Create: trainer is null");
  if (options.server_address.empty())
    return absl::InvalidArgumentError("ClientOptions.server_address is empty");
  if (options.retry.max_attempts < 1)
    return absl::InvalidArgumentError("RetryPolicy.max_attempts must be >= 1");
  crypto::RouteGrpcLogs();  // gRPC's lines in this log; the handshake failures the probe explains
                            // at DEBUG
  std::shared_ptr<grpc::ChannelCredentials> creds;
  std::optional<crypto::AggregationKeyTrust> key_trust;
  crypto::TlsProbeOptions probe;
  probe.address = options.server_address;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // Keepalive pings every 30 s (the server tolerates one per 10 s): keeps NAT bindings open during
  // long local training.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  if (options.tls.enabled()) {
    if (options.insecure)
      return absl::InvalidArgumentError("ClientOptions.insecure and TLS exclude each other");
    if (options.tls.root_ca_file.empty() || options.tls.cert_file.empty() ||
        options.tls.key_file.empty()) {
      return absl::InvalidArgumentError(
          "TLS needs root_ca_file, cert_file and key_file: the server identifies clients by their "
          "certificate");
    }
    // Checked up front: the files parse, the root is a CA, the key belongs to the certificate.
    FEDLORA_ASSIGN_OR_RETURN(
        creds, crypto::ClientChannelCredentials(options.tls.root_ca_file, options.tls.cert_file,
                                                options.tls.key_file));
    if (!options.tls.server_name_override.empty()) {
      args.SetSslTargetNameOverride(options.tls.server_name_override);
    }
    crypto::AggregationKeyTrust trust;
    FEDLORA_ASSIGN_OR_RETURN(trust.root_ca_pem, ReadFileToString(options.tls.root_ca_file));
    uint32_t port = 0;
    if (!options.tls.server_name_override.empty()) {
      trust.expected_host = options.tls.server_name_override;
    } else if (!SplitHostPort(options.server_address, &trust.expected_host, &port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("server address '", options.server_address, "' is not host:port"));
    }
    trust.pin_sha256_hex = options.tls.server_key_pin;
    if (!trust.pin_sha256_hex.empty() &&
        (trust.pin_sha256_hex.size() != 64 ||
         trust.pin_sha256_hex.find_first_not_of("0123456789abcdef") != std::string::npos)) {
      return absl::InvalidArgumentError(
          "ClientTlsOptions.server_key_pin must be 64 lowercase hex digits (a SHA-256)");
    }
    probe.root_ca_pem = trust.root_ca_pem;
    FEDLORA_ASSIGN_OR_RETURN(probe.cert_pem, ReadFileToString(options.tls.cert_file));
    FEDLORA_ASSIGN_OR_RETURN(probe.key_pem, ReadFileToString(options.tls.key_file));
    probe.server_name = options.tls.server_name_override;
    probe.ca_label = absl::StrCat("the CA file ", options.tls.root_ca_file);
    probe.cert_label = absl::StrCat("this site's certificate ", options.tls.cert_file);
    key_trust = std::move(trust);
  } else {
    FEDLORA_RETURN_IF_ERROR(
        CheckPlaintextAllowed(options.server_address, options.insecure, "server address"));
    if (options.client_id.empty()) {
      return absl::InvalidArgumentError("ClientOptions.client_id is required without TLS");
    }
    creds = grpc::InsecureChannelCredentials();
  }
  auto channel = grpc::CreateCustomChannel(options.server_address, creds, args);
  return std::unique_ptr<Client>(new ClientImpl(std::move(options), trainer, std::move(channel),
                                                std::move(key_trust), std::move(probe)));
}

}  // namespace fedlora
