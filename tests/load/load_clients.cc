// The raw-protocol load clients (LoadClient in load_internal.h): join, long-poll, download, train
// a fixed delta, seal, upload, report; heartbeats unless the prober sends them.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "compression/codec.h"
#include "core/sha256.h"
#include "proto/wire.h"
#include "tests/load/load_internal.h"

namespace fedlora::load {

bool LoadClient::Join() {
  while (!shared_->Stopped()) {
    v1::JoinRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_client_version("load-harness");
    request.mutable_capabilities()->set_device_name("cpu");
    v1::JoinResponse response;
    {
      absl::MutexLock lock(&mu_);
      session_.clear();
      PublishLocked();
    }
    auto ctx = Context(10'000);
    if (stub_->Join(ctx.get(), request, &response).ok()) {
      join_ = response;
      absl::MutexLock lock(&mu_);
      session_ = response.session_token();
      PublishLocked();
      return true;
    }
    Sleep(100);
  }
  return false;
}

bool LoadClient::Download(const v1::AdapterManifest& m, std::string* out) {
  uint32_t next = 0;
  uint64_t bytes = 0;
  for (int attempt = 0; attempt < 5 && !shared_->Stopped(); ++attempt) {
    v1::DownloadRequest request;
    request.set_adapter_sha256(m.sha256());
    request.set_start_chunk(next);
    auto ctx = Context(120'000);
    const auto t0 = Steady::now();
    auto reader = stub_->DownloadAdapter(ctx.get(), request);
    v1::DownloadChunk chunk;
    bool in_order = true;
    while (reader->Read(&chunk)) {
      if (chunk.chunk_index() != next) {
        in_order = false;
        ctx->TryCancel();
        break;
      }
      bytes += chunk.data().size();
      if (out != nullptr) out->append(chunk.data());
      ++next;
    }
    const grpc::Status s = reader->Finish();
    Record(main_samples, kDownload, t0,
           in_order ? s : grpc::Status(grpc::StatusCode::DATA_LOSS, "out of order"));
    if (!in_order) {
      problem = absl::StrCat(id_, ": download chunk ", chunk.chunk_index(), " arrived where ", next,
                             " was due");
      return false;
    }
    if (s.ok() && next == m.num_chunks()) return bytes == m.total_bytes();
    OnError(s);
  }
  return false;
}

v1::UploadAck LoadClient::Upload(const v1::TrainTask& task, const crypto::SealedBlob& sealed,
                                 const std::string& upload_id) {
  const std::string& blob = sealed.blob;
  const uint32_t chunk =
      join_.limits().chunk_size_bytes() > 0 ? join_.limits().chunk_size_bytes() : (1u << 20);
  v1::UploadHeader header;
  header.set_upload_id(upload_id);
  header.set_round(task.round());
  header.set_task_id(task.task_id());
  header.set_num_examples(kExamples);
  *header.mutable_codec() = task.codec();
  v1::EncryptionSpec* e = header.mutable_encryption();
  e->set_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
  e->set_ephemeral_public_key(sealed.ephemeral_public_key);
  e->set_server_key_id(task.aggregation_key().key_id());
  header.set_base_adapter_sha256(task.global_adapter().sha256());
  v1::AdapterManifest* m = header.mutable_manifest();
  for (const v1::TensorSpec& t : task.global_adapter().tensors()) *m->add_tensors() = t;
  std::vector<std::string> chunk_sha;
  Sha256 whole;
  for (size_t off = 0; off < blob.size(); off += chunk) {
    chunk_sha.push_back(ToHex(whole.UpdateAndDigest(std::string_view(blob).substr(off, chunk))));
  }
  m->set_total_bytes(blob.size());
  m->set_sha256(ToHex(whole.Final()));
  m->set_chunk_size_bytes(chunk);
  m->set_num_chunks(static_cast<uint32_t>(chunk_sha.size()));
  m->set_round(task.round());
  for (int attempt = 0; attempt < 5 && !shared_->Stopped(); ++attempt) {
    uint32_t start = 0;
    if (attempt > 0) {
      v1::UploadStatusRequest request;
      request.set_upload_id(upload_id);
      v1::UploadStatusResponse status;
      auto ctx = Context(10'000);
      const grpc::Status s = stub_->GetUploadStatus(ctx.get(), request, &status);
      if (!s.ok()) {
        OnError(s);
        continue;
      }
      if (status.state() == v1::UPLOAD_STATE_ACCEPTED ||
          status.state() == v1::UPLOAD_STATE_REJECTED) {
        v1::UploadAck ack;
        ack.set_state(status.state());
        ack.set_reason(status.reason());
        return ack;
      }
      if (status.state() == v1::UPLOAD_STATE_IN_PROGRESS) start = status.chunks_acknowledged();
    }
    header.set_start_chunk(start);
    v1::UploadAck ack;
    auto ctx = Context(120'000);
    const auto t0 = Steady::now();
    auto writer = stub_->UploadUpdate(ctx.get(), &ack);
    v1::UploadChunk message;
    *message.mutable_header() = header;
    bool ok = writer->Write(message);
    for (uint32_t i = start; ok && i < chunk_sha.size(); ++i) {
      message.Clear();
      v1::UploadData* d = message.mutable_data();
      d->set_chunk_index(i);
      d->set_offset_bytes(uint64_t{i} * chunk);
      d->set_data(blob.substr(size_t{i} * chunk, chunk));
      d->set_sha256(chunk_sha[i]);
      ok = writer->Write(message);
    }
    if (ok) writer->WritesDone();
    const grpc::Status s = writer->Finish();
    Record(main_samples, kUpload, t0, s);
    if (s.ok() &&
        (ack.state() == v1::UPLOAD_STATE_ACCEPTED || ack.state() == v1::UPLOAD_STATE_REJECTED))
      return ack;
    if (!s.ok()) OnError(s);
  }
  return v1::UploadAck();
}

void LoadClient::RunTask(const v1::TrainTask& task) {
  const uint64_t r = task.round();
  RoundEvents& ev = rounds[r];
  if (ev.task_ms < 0) ev.task_ms = shared_->NowMs();
  {
    absl::MutexLock lock(&mu_);
    task_id_ = task.task_id();
    task_round_ = r;
    PublishLocked();
  }
  auto drop_task = [&] {
    absl::MutexLock lock(&mu_);
    task_id_.clear();
    PublishLocked();
  };
  if (!Download(task.global_adapter(), nullptr)) {
    if (problem.empty()) problem = absl::StrCat(id_, ": round ", r, " adapter download failed");
    drop_task();
    return;
  }
  if (ev.downloaded_ms < 0) ev.downloaded_ms = shared_->NowMs();
  // "Training": the shared delta with this client's last value.
  const std::string upload_id = absl::StrCat("load-", index_, "-r", r);
  absl::StatusOr<crypto::SealedBlob> sealed;
  {
    std::string plain = shared_->encoded;
    const float last = kDelta + PatchOf(index_, shared_->options.clients);
    std::memcpy(plain.data() + plain.size() - sizeof(float), &last, sizeof(float));
    const crypto::UpdatePlace place{join_.run_config().run_id(), r, join_.client_id(), upload_id,
                                    kExamples};
    sealed = crypto::SealUpdateBlob(task.aggregation_key().public_key(), place, plain);
  }
  if (!sealed.ok()) {
    problem = absl::StrCat(id_, ": sealing: ", sealed.status().ToString());
    drop_task();
    return;
  }
  if (index_ == 0) {
    absl::MutexLock lock(&shared_->mu);
    shared_->upload_bytes = static_cast<int64_t>(sealed->blob.size());
  }
  const v1::UploadAck ack = Upload(task, *sealed, upload_id);
  drop_task();
  if (ack.state() != v1::UPLOAD_STATE_ACCEPTED) {
    if (problem.empty()) {
      problem = absl::StrCat(id_, ": round ", r, " update not accepted (state ", ack.state(), " ",
                             ack.reason(), ")");
    }
    return;
  }
  if (ev.accepted_ms < 0) ev.accepted_ms = shared_->NowMs();
  ++(ack.duplicate() ? ev.duplicates : ev.accepted);
  v1::MetricsReport report;
  report.set_round(r);
  report.set_task_id(task.task_id());
  report.set_train_loss_first(1.0);
  report.set_train_loss_last(0.5);
  report.set_examples_processed(kExamples);
  report.set_steps(1);
  v1::MetricsAck metrics_ack;
  auto ctx = Context(10'000);
  const grpc::Status s = stub_->ReportMetrics(ctx.get(), report, &metrics_ack);
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) OnError(s);
}

void LoadClient::CheckFinalAdapter(const v1::RunFinished& finished) {
  std::string bytes;
  std::string problem_text;
  bool exact = false;
  if (!Download(finished.final_adapter(), &bytes)) {
    problem_text = "final adapter download failed";
  } else if (Sha256Hex(bytes) != finished.final_adapter().sha256()) {
    problem_text = "final adapter does not match its manifest's SHA-256";
  } else {
    absl::StatusOr<std::vector<UpdateTensor>> got = AdapterFromSafetensors(bytes);
    if (!got.ok()) {
      problem_text = absl::StrCat("final adapter: ", got.status().ToString());
    } else {
      const float steps = static_cast<float>(finished.final_round());
      exact = got->size() == shared_->initial.size();
      for (size_t t = 0; exact && t < got->size(); ++t) {
        const UpdateTensor& g = (*got)[t];
        const UpdateTensor& i = shared_->initial[t];
        exact = g.name == i.name && g.values.size() == i.values.size();
        for (size_t k = 0; exact && k < g.values.size(); ++k) {
          const float want = i.values[k] + steps * kDelta;
          if (std::memcmp(&g.values[k], &want, sizeof(float)) != 0) {
            exact = false;
            problem_text =
                absl::StrCat("final adapter ", g.name, "[", k, "] = ", g.values[k], ", expected ",
                             want, " (initial + ", finished.final_round(), " x delta)");
          }
        }
      }
      if (!exact && problem_text.empty())
        problem_text = "final adapter's tensors differ from the initial adapter's";
    }
  }
  absl::MutexLock lock(&shared_->mu);
  shared_->adapter_exact = exact;
  shared_->adapter_problem = exact ? std::string() : problem_text;
  shared_->adapter_bytes = static_cast<int64_t>(bytes.size());
}

void LoadClient::RunMain() {
  if (Join()) {
    if (shared_->joined.fetch_add(1) + 1 == shared_->options.clients) {
      shared_->all_joined_us.store(static_cast<int64_t>(shared_->NowMs() * 1000));
    }
    while (!shared_->Stopped()) {
      v1::WaitForTaskRequest request;
      request.set_max_wait_seconds(static_cast<uint32_t>(shared_->options.wait_for_task_s));
      v1::WaitForTaskResponse response;
      auto ctx = Context(int64_t{1000} * shared_->options.wait_for_task_s + 10'000);
      const auto t0 = Steady::now();
      const grpc::Status s = stub_->WaitForTask(ctx.get(), request, &response);
      Record(main_samples, kWaitLong, t0, s);
      if (!s.ok()) {
        OnError(s);
        continue;
      }
      if (response.has_run_finished()) {
        finished = true;
        if (index_ == 0) CheckFinalAdapter(response.run_finished());
        break;
      }
      if (response.has_retry_later()) {
        Sleep(int64_t{1000} * std::max<uint32_t>(1, response.retry_later().retry_after_seconds()));
        continue;
      }
      if (response.has_task()) RunTask(response.task());
    }
  } else {
    problem = absl::StrCat(id_, ": could not join");
  }
  if (!finished && problem.empty())
    problem = absl::StrCat(id_, ": stopped before the run finished");
  shared_->done.fetch_add(1);
  absl::MutexLock lock(&mu_);
  done_ = true;
  if (ProbeSlot() >= 0) shared_->probes->MarkDone(ProbeSlot());
}

void LoadClient::RunHeartbeats() {
  if (ProbeSlot() >= 0) return;  // the prober heartbeats for this client
  const LoadOptions& o = shared_->options;
  const auto interval = std::chrono::milliseconds(int64_t{1000} * o.heartbeat_interval_s);
  // Spread over the interval, as clients that started at different times would be.
  auto next = Steady::now() + interval * index_ / std::max(1, o.clients);
  const bool probe = o.probe_every > 0 && index_ % o.probe_every == 0;
  while (true) {
    std::string session, task_id;
    uint64_t task_round = 0;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time wake = absl::Now() + absl::FromChrono(next - Steady::now());
      mu_.AwaitWithDeadline(absl::Condition(&done_), wake);
      if (done_) return;
      session = session_;
      task_id = task_id_;
      task_round = task_round_;
    }
    next += interval;
    if (next < Steady::now()) next = Steady::now() + interval;  // a slow call: skip, do not burst
    if (session.empty() || shared_->Stopped()) continue;
    if (!o.idle_heartbeats && task_id.empty()) continue;
    v1::HeartbeatRequest request;
    request.set_task_id(task_id);
    request.set_state(task_id.empty() ? v1::CLIENT_STATE_IDLE : v1::CLIENT_STATE_TRAINING);
    v1::HeartbeatResponse response;
    auto ctx = Context(10'000);
    const auto t0 = Steady::now();
    const grpc::Status s = stub_->Heartbeat(ctx.get(), request, &response);
    Record(hb_samples, kHeartbeat, t0, s);
    if (s.ok() && response.action() == v1::HeartbeatResponse::CANCEL_TASK && !task_id.empty()) {
      cancels.push_back({task_round, task_id});
    }
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) ++hb_unauthenticated;
    if (probe) {
      v1::WaitForTaskRequest wait;
      wait.set_max_wait_seconds(0);
      v1::WaitForTaskResponse answer;
      auto wctx = Context(10'000);
      const auto w0 = Steady::now();
      const grpc::Status ws = stub_->WaitForTask(wctx.get(), wait, &answer);
      Record(hb_samples, kWaitProbe, w0, ws);
      if (ws.error_code() == grpc::StatusCode::UNAUTHENTICATED) ++hb_unauthenticated;
      v1::HeartbeatResponse sink_response;
      grpc::ClientContext sctx;
      sctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      const auto b0 = Steady::now();
      Record(hb_samples, kBaseline, b0, sink_->Heartbeat(&sctx, request, &sink_response));
    }
  }
}

}  // namespace fedlora::load
