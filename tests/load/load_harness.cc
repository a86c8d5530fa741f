#include "tests/load/load_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "compression/codec.h"
#include "compression/update_io.h"
#include "core/sha256.h"
#include "crypto/sealed_update.h"
#include "fedlora/v1/admin.grpc.pb.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "proto/config_io.h"
#include "proto/wire.h"
#include "server/evaluator.h"
#include "server/server.h"
#include "tests/load/prober.h"

namespace fedlora::load {
namespace {

// The common delta (every value but the last) and the +-kPatch on the last value: powers of two,
// so that initial + rounds x delta is exact in fp32 and so is every mean the server takes.
constexpr float kDelta = 1.0f / 256.0f;
constexpr float kPatch = 1.0f / 1024.0f;
constexpr int kLayers = 16;
constexpr int64_t kHidden = 1024;
constexpr int64_t kExamples = 10;  // every client's FedAvg weight

float InitialValue(int64_t i) { return static_cast<float>((i * 5) % 16 - 8) / 64.0f; }

// Client c's offset on the last value: +p, -p alternating; 0 for an odd one out, so the sum is 0.
float PatchOf(int c, int clients) {
  if (c >= clients - clients % 2) return 0.0f;
  return c % 2 == 0 ? kPatch : -kPatch;
}

// The run's adapter (initial values), or with `delta` the common delta; sorted by name.
std::vector<UpdateTensor> LoadAdapter(int64_t kib, bool delta) {
  const int64_t rank = std::max<int64_t>(1, kib / 128);
  std::vector<UpdateTensor> a;
  for (int l = 0; l < kLayers; ++l) {
    const std::string base = absl::StrCat("base_model.model.layers.", l < 10 ? "0" : "", l, ".self_attn.q_proj");
    a.push_back({base + ".lora_A.weight", {rank, kHidden}, {}});
    a.push_back({base + ".lora_B.weight", {kHidden, rank}, {}});
  }
  for (UpdateTensor& t : a) {
    t.values.resize(static_cast<size_t>(rank * kHidden));
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = delta ? kDelta : InitialValue(static_cast<int64_t>(i));
  }
  std::sort(a.begin(), a.end(), [](const UpdateTensor& x, const UpdateTensor& y) { return x.name < y.name; });
  return a;
}

v1::RunConfig LoadRunConfig(const LoadOptions& o) {
  v1::RunConfig c;
  c.set_run_id("load-run");
  c.set_seed(11);
  c.mutable_model()->set_path("unused");
  c.set_rounds(static_cast<uint32_t>(o.rounds));
  v1::SelectionConfig* s = c.mutable_selection();
  s->set_clients_per_round(static_cast<uint32_t>(o.clients));
  s->set_over_selection(1.0);
  s->set_min_clients(static_cast<uint32_t>(o.clients));
  s->set_heartbeat_interval_seconds(static_cast<uint32_t>(o.heartbeat_interval_s));
  ApplyRunConfigDefaults(&c);
  return c;
}

ServerOptions LoadServerOptions(const LoadOptions& o, const v1::RunConfig& config, const std::string& data_dir) {
  ServerOptions s = ServerOptionsFromRunConfig(config);
  s.listen_address = "127.0.0.1:0";
  s.metrics_address = "127.0.0.1:0";
  s.insecure = true;  // loopback plaintext
  s.data_dir = data_dir;
  s.round_deadline_ms = 300'000;  // never reached: every round closes on its target
  s.retry_after_ms = 1000;
  s.bulk_work_nice = o.server_bulk_work_nice;
  s.heartbeat_interval_ms = int64_t{1000} * o.heartbeat_interval_s;
  s.heartbeat_timeout_ms = o.heartbeat_timeout_ms;
  return s;
}

// Evaluation that takes eval_ms: a CPU burn or a sleep. Reports how long it really took.
class LoadEvaluator final : public Evaluator {
 public:
  LoadEvaluator(int64_t ms, bool burn) : ms_(ms), burn_(burn) {}
  absl::StatusOr<std::map<std::string, double>> Evaluate(uint64_t round, const std::vector<UpdateTensor>&) override {
    const auto t0 = Steady::now();
    const auto until = t0 + std::chrono::milliseconds(ms_);
    if (burn_) {
      volatile double x = 1.0;
      while (Steady::now() < until) {
        for (int i = 0; i < 20000; ++i) x = x * 1.0000001 + 1e-9;
      }
    } else {
      std::this_thread::sleep_until(until);
    }
    const double took = std::chrono::duration<double, std::milli>(Steady::now() - t0).count();
    return std::map<std::string, double>{{"eval_loss", 1.0 / static_cast<double>(round + 1)}, {"eval_ms", took}};
  }

 private:
  int64_t ms_;
  bool burn_;
};

// The server child: writes "<port>\n" (or "0\n") to `fd`, serves until SIGTERM, then writes its
// Prometheus text to <dir>/metrics.txt and exits.
[[noreturn]] void ServeChild(const LoadOptions& o, const std::string& dir, const std::string& log_path, int fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the load run
  const int log = ::open(log_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (log >= 0) dup2(log, STDERR_FILENO);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  LoadEvaluator evaluator(o.eval_ms, o.eval_burn);
  const v1::RunConfig config = LoadRunConfig(o);
  auto server = Server::Create(LoadServerOptions(o, config, dir + "/store"), config, LoadAdapter(o.adapter_kib, false),
                               &evaluator);
  const std::string port = server.ok() ? absl::StrCat((*server)->port(), "\n") : std::string("0\n");
  if (!server.ok()) std::fprintf(stderr, "load server: %s\n", server.status().ToString().c_str());
  (void)!::write(fd, port.data(), port.size());
  ::close(fd);
  if (!server.ok()) _exit(1);
  int sig = 0;
  sigwait(&set, &sig);
  {
    std::ofstream out(dir + "/metrics.txt");
    out << (*server)->MetricsText();
  }
  (*server)->Shutdown();
  _exit(0);
}

// The baseline: a Federation server whose Heartbeat answers CONTINUE at once and that does
// nothing else. Writes "<port>\n" to `fd`, serves until killed.
class SinkService final : public v1::Federation::CallbackService {
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context, const v1::HeartbeatRequest*,
                                      v1::HeartbeatResponse* response) override {
    response->set_action(v1::HeartbeatResponse::CONTINUE);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

[[noreturn]] void ServeSink(int fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  SinkService sink;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&sink);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const std::string text = absl::StrCat(server != nullptr ? port : 0, "\n");
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
  if (server == nullptr) _exit(1);
  server->Wait();
  _exit(0);
}

// Reads "<port>\n" from a child's pipe; 0 when it did not come within 60 s.
int ReadPort(int fd) {
  char buf[32] = {};
  pollfd pfd{fd, POLLIN, 0};
  const bool readable = poll(&pfd, 1, 60'000) == 1 && read(fd, buf, sizeof(buf) - 1) > 0;
  ::close(fd);
  return readable ? std::atoi(buf) : 0;
}

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
  std::string encoded;     // the fixed delta, encoded (fp32, no zstd): the last 4 bytes are its last value
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

  double NowMs() const { return std::chrono::duration<double, std::milli>(Steady::now() - t0).count(); }
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
  void Record(std::vector<Sample>& v, Rpc rpc, Steady::time_point start, const grpc::Status& status) {
    const double s = std::chrono::duration<double, std::milli>(start - shared_->t0).count();
    v.push_back({rpc, s, std::chrono::duration<double, std::milli>(Steady::now() - start).count(), status.ok(),
                 static_cast<int>(status.error_code())});
  }
  // Sleeps up to `ms`, or less when the run stops; false when it stopped.
  bool Sleep(int64_t ms) {
    const auto until = Steady::now() + std::chrono::milliseconds(ms);
    while (Steady::now() < until) {
      if (shared_->Stopped()) return false;
      std::this_thread::sleep_for(std::min<Steady::duration>(until - Steady::now(), std::chrono::milliseconds(50)));
    }
    return !shared_->Stopped();
  }
  bool Join();
  // This client's slot in the prober's table, or -1 when it heartbeats from this process.
  int ProbeSlot() const { return shared_->probes != nullptr ? index_ : -1; }
  // Tells the prober the session and the task held.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ProbeSlot() >= 0 && !shared_->probes->Publish(ProbeSlot(), session_, task_id_, task_round_)) {
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
  v1::UploadAck Upload(const v1::TrainTask& task, const crypto::SealedBlob& sealed, const std::string& upload_id);
  void CheckFinalAdapter(const v1::RunFinished& finished);

  const int index_;
  const std::string id_;
  Shared* const shared_;
  std::unique_ptr<v1::Federation::Stub> stub_;
  std::unique_ptr<v1::Federation::Stub> sink_;  // the baseline server
  v1::JoinResponse join_;  // main thread only

  absl::Mutex mu_;
  std::string session_ ABSL_GUARDED_BY(mu_);
  std::string task_id_ ABSL_GUARDED_BY(mu_);  // the task held, until its update is accepted
  uint64_t task_round_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

bool LoadClient::Join() {
  while (!shared_->Stopped()) {
    v1::JoinRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_client_version("load-harness");
    request.mutable_capabilities()->add_encryption_schemes(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
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
    Record(main_samples, kDownload, t0, in_order ? s : grpc::Status(grpc::StatusCode::DATA_LOSS, "out of order"));
    if (!in_order) {
      problem = absl::StrCat(id_, ": download chunk ", chunk.chunk_index(), " arrived where ", next, " was due");
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
  const uint32_t chunk = join_.limits().chunk_size_bytes() > 0 ? join_.limits().chunk_size_bytes() : (1u << 20);
  v1::UploadHeader header;
  header.set_upload_id(upload_id);
  header.set_round(task.round());
  header.set_task_id(task.task_id());
  header.set_num_examples(kExamples);
  *header.mutable_codec() = task.codec();
  v1::EncryptionSpec* e = header.mutable_encryption();
  e->set_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
  e->set_ephemeral_public_key(sealed.ephemeral_public_key);
  e->set_server_key_id(join_.server_encryption_key_id());
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
      if (status.state() == v1::UPLOAD_STATE_ACCEPTED || status.state() == v1::UPLOAD_STATE_REJECTED) {
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
    if (s.ok() && (ack.state() == v1::UPLOAD_STATE_ACCEPTED || ack.state() == v1::UPLOAD_STATE_REJECTED)) return ack;
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
    const crypto::UpdatePlace place{join_.run_config().run_id(), r, join_.client_id(), upload_id};
    sealed = crypto::SealUpdateBlob(join_.server_encryption_public_key(), place, plain);
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
      problem = absl::StrCat(id_, ": round ", r, " update not accepted (state ", ack.state(), " ", ack.reason(), ")");
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
            problem_text = absl::StrCat("final adapter ", g.name, "[", k, "] = ", g.values[k], ", expected ", want,
                                        " (initial + ", finished.final_round(), " x delta)");
          }
        }
      }
      if (!exact && problem_text.empty()) problem_text = "final adapter's tensors differ from the initial adapter's";
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
  if (!finished && problem.empty()) problem = absl::StrCat(id_, ": stopped before the run finished");
  shared_->done.fetch_add(1);
  absl::MutexLock lock(&mu_);
  done_ = true;
  if (ProbeSlot() >= 0) shared_->probes->MarkDone(ProbeSlot());
}

void LoadClient::RunHeartbeats() {
  const LoadOptions& o = shared_->options;
  const auto interval = std::chrono::milliseconds(int64_t{1000} * o.heartbeat_interval_s);
  // Spread over the interval, as clients that started at different times would be.
  auto next = Steady::now() + interval * index_ / std::max(1, o.clients);
  const bool probe = o.probe_every > 0 && index_ % o.probe_every == 0;
  if (ProbeSlot() >= 0) return;  // the prober heartbeats for this client
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

// /proc/<pid>/status fields (KiB or counts); -1 when missing.
std::map<std::string, int64_t> ProcStatus(pid_t pid) {
  std::map<std::string, int64_t> out;
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    for (const char* key : {"VmRSS:", "VmHWM:", "Threads:"}) {
      if (line.rfind(key, 0) == 0) out[key] = std::atoll(line.c_str() + std::strlen(key));
    }
  }
  return out;
}

int64_t CountFds(pid_t pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int64_t n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

struct AdminPoint {
  double t_ms;
  v1::RoundPhase phase;
  int connected;
};

LatencyStats StatsOf(std::vector<double> v, int64_t errors) {
  LatencyStats s;
  s.count = static_cast<int64_t>(v.size());
  s.errors = errors;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto rank = [&](double q) { return v[static_cast<size_t>(std::max<double>(0, std::ceil(q * v.size()) - 1))]; };
  s.p50_ms = rank(0.50);
  s.p99_ms = rank(0.99);
  s.max_ms = v.back();
  return s;
}

const char* CodeName(int code) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                                 "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "?";
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::map<std::string, int64_t> ParseMetrics(const std::string& path) {
  std::map<std::string, int64_t> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find(' ');
    if (sp != std::string::npos) out[line.substr(0, sp)] = std::atoll(line.c_str() + sp + 1);
  }
  return out;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fedlora_load_XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

const char* PhaseName(Phase p) {
  switch (p) {
    case kBurst:
      return "download burst";
    case kAggregation:
      return "aggregation/evaluation";
    default:
      return "other";
  }
}

const char* RpcName(Rpc r) {
  switch (r) {
    case kHeartbeat:
      return "Heartbeat";
    case kWaitProbe:
      return "WaitForTask(max_wait 0)";
    case kWaitLong:
      return "WaitForTask(long poll)";
    case kDownload:
      return "DownloadAdapter stream";
    case kUpload:
      return "UploadUpdate stream";
    case kAdminStatus:
      return "Admin GetStatus";
    case kProbeHeartbeat:
      return "Heartbeat, prober";
    default:
      return "Heartbeat, baseline server";
  }
}

bool LoadReport::heartbeat_goal_met() const {
  for (int p = 0; p < kNumPhases; ++p) {
    const LatencyStats& s = latency[goal_heartbeat()][p];
    if (s.errors > 0 || (s.count > 0 && s.p99_ms >= 100.0)) return false;
  }
  return latency_all[goal_heartbeat()].count > 0;
}

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options) {
  if (options.clients < 1 || options.rounds < 1 || options.heartbeat_interval_s < 1) {
    return absl::InvalidArgumentError("clients, rounds and heartbeat_interval_s must be >= 1");
  }
  TempDir dir;
  if (dir.path().empty()) return absl::InternalError("cannot create a temp dir");
  const std::string log_path = options.server_log.empty() ? dir.path() + "/server.log" : options.server_log;
  // Every child before any thread exists in this process. The prober first: it is told the ports
  // once they are known.
  ProbeTable* probes = nullptr;
  pid_t prober = -1;
  int probefd[2] = {-1, -1};
  const std::string probe_results = dir.path() + "/probe.bin";
  if (options.probe_process) {
    probes = ProbeTable::Create(options.clients);
    if (probes == nullptr || pipe(probefd) != 0) return absl::InternalError("cannot set up the prober (mmap, pipe)");
    prober = fork();
    if (prober < 0) return absl::InternalError("fork() failed");
    if (prober == 0) {
      ::close(probefd[1]);
      RunProber(options, probes, probefd[0], probe_results);
    }
    ::close(probefd[0]);
  }
  auto stop_prober = [&] {
    if (prober <= 0) return;
    kill(prober, SIGKILL);
    waitpid(prober, nullptr, 0);
    prober = -1;
  };
  int sinkfd[2], pipefd[2];
  if (pipe(sinkfd) != 0 || pipe(pipefd) != 0) {
    stop_prober();
    return absl::InternalError("pipe() failed");
  }
  const pid_t sink = fork();
  if (sink < 0) {
    stop_prober();
    return absl::InternalError("fork() failed");
  }
  if (sink == 0) {
    ::close(sinkfd[0]);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    ServeSink(sinkfd[1]);
  }
  ::close(sinkfd[1]);
  const pid_t child = fork();
  if (child < 0) {
    stop_prober();
    kill(sink, SIGKILL);
    waitpid(sink, nullptr, 0);
    return absl::InternalError("fork() failed");
  }
  if (child == 0) {
    ::close(sinkfd[0]);
    ::close(pipefd[0]);
    ServeChild(options, dir.path(), log_path, pipefd[1]);
  }
  ::close(pipefd[1]);
  auto kill_child = [&] {
    stop_prober();
    kill(sink, SIGKILL);
    waitpid(sink, nullptr, 0);
    kill(child, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(child, nullptr, WNOHANG) == child) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  };
  const int sink_port = ReadPort(sinkfd[0]);
  const int port = ReadPort(pipefd[0]);
  if (port <= 0 || sink_port <= 0) {
    kill_child();
    std::ifstream log(log_path);
    std::stringstream text;
    text << log.rdbuf();
    return absl::UnavailableError(absl::StrCat("the load server did not start: ", text.str().substr(0, 2000)));
  }

  if (options.clients_nice > 0) {  // no thread exists yet: every thread started from here inherits it
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, 0);
    if (errno == 0) (void)setpriority(PRIO_PROCESS, 0, std::min(now + options.clients_nice, 19));
  }
  LoadReport report;
  report.options = options;
  report.server_pid = child;
  Shared shared;
  shared.options = options;
  shared.address = absl::StrCat("127.0.0.1:", port);
  shared.sink_address = absl::StrCat("127.0.0.1:", sink_port);
  shared.t0 = Steady::now();
  shared.deadline = shared.t0 + std::chrono::milliseconds(options.run_timeout_ms);
  const int64_t sys0_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  shared.initial = LoadAdapter(options.adapter_kib, false);
  shared.probes = probes;
  if (prober > 0 && !SendProberSetup(probefd[1], {port, sink_port, shared.t0, shared.deadline})) {
    kill_child();
    return absl::InternalError("cannot send the prober its setup");
  }
  {
    const v1::RunConfig config = LoadRunConfig(options);
    absl::StatusOr<CodecOptions> codec = CodecOptionsFromSpec(config.codec());
    absl::StatusOr<std::string> encoded =
        codec.ok() ? EncodeUpdate(LoadAdapter(options.adapter_kib, true), *codec) : absl::StatusOr<std::string>(codec.status());
    if (!encoded.ok() || codec->codec != CodecId::kRawF32 || codec->zstd) {
      kill_child();
      return absl::FailedPreconditionError(
          absl::StrCat("the load run needs the raw fp32 codec without zstd: ", encoded.status().ToString()));
    }
    shared.encoded = *std::move(encoded);
  }

  // Server samplers: /proc, and the Admin service's view (phase, live clients).
  std::atomic<bool> sampling{true};
  std::vector<ResourceSample> resources;
  auto sample_server = [&] {
    const auto st = ProcStatus(child);
    ResourceSample s;
    s.t_ms = shared.NowMs();
    s.rss_kb = st.count("VmRSS:") ? st.at("VmRSS:") : -1;
    s.hwm_kb = st.count("VmHWM:") ? st.at("VmHWM:") : -1;
    s.threads = st.count("Threads:") ? st.at("Threads:") : -1;
    s.fds = CountFds(child);
    if (s.rss_kb >= 0) resources.push_back(s);
  };
  std::thread proc_sampler([&] {
    while (sampling.load()) {
      sample_server();
      std::this_thread::sleep_for(std::chrono::milliseconds(options.sample_ms));
    }
  });
  auto admin_channel = MakeChannel(shared.address, -1);
  auto admin = v1::Admin::NewStub(admin_channel);
  std::vector<AdminPoint> admin_points;
  std::vector<Sample> admin_samples;
  std::thread admin_sampler([&] {
    while (sampling.load()) {
      v1::GetStatusRequest request;
      request.set_max_history(1);
      v1::GetStatusResponse response;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      const auto t0 = Steady::now();
      const grpc::Status s = admin->GetStatus(&ctx, request, &response);
      const double start = std::chrono::duration<double, std::milli>(t0 - shared.t0).count();
      admin_samples.push_back({kAdminStatus, start, shared.NowMs() - start, s.ok(), static_cast<int>(s.error_code())});
      if (s.ok()) admin_points.push_back({start, response.phase(), static_cast<int>(response.connected_clients())});
      std::this_thread::sleep_for(std::chrono::milliseconds(options.sample_ms));
    }
  });

  std::vector<std::unique_ptr<LoadClient>> clients;
  for (int c = 0; c < options.clients; ++c) clients.push_back(std::make_unique<LoadClient>(c, &shared));
  std::vector<std::thread> threads;
  threads.reserve(2 * clients.size());
  for (auto& c : clients) {
    threads.emplace_back([&c] { c->RunMain(); });
    threads.emplace_back([&c] { c->RunHeartbeats(); });
  }
  for (auto& t : threads) t.join();
  // The prober stops once every client is done; its calls have 10 s deadlines.
  if (prober > 0) {
    probes->Stop();
    int status = -1;
    for (int i = 0; i < 300 && waitpid(prober, &status, WNOHANG) != prober; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      report.problems.push_back(absl::StrCat("the prober did not finish cleanly (wait status ", status, ")"));
      stop_prober();
    }
    prober = -1;
    absl::StatusOr<std::vector<ProbeResult>> got = ReadProbeResults(probe_results, probes->slots());
    if (!got.ok()) {
      report.problems.push_back(got.status().ToString());
    } else {
      for (size_t slot = 0; slot < got->size(); ++slot) {
        LoadClient& c = *clients[slot];
        ProbeResult& pr = (*got)[slot];
        c.hb_samples.insert(c.hb_samples.end(), pr.samples.begin(), pr.samples.end());
        c.cancels.insert(c.cancels.end(), pr.cancels.begin(), pr.cancels.end());
        c.hb_unauthenticated += pr.unauthenticated;
      }
    }
  }

  // The round history, as the server recorded it.
  v1::GetStatusResponse final_status;
  {
    v1::GetStatusRequest request;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = admin->GetStatus(&ctx, request, &final_status);
    if (!s.ok()) report.problems.push_back(absl::StrCat("final Admin GetStatus: ", s.error_message()));
  }
  sampling.store(false);
  proc_sampler.join();
  admin_sampler.join();
  sample_server();  // the server as the run left it
  kill_child();
  report.wall_s = shared.NowMs() / 1000.0;

  // --- Validation and figures ---------------------------------------------------------------------
  int finished = 0;
  std::set<int> unauthenticated, cancelled;
  std::map<uint64_t, std::vector<const RoundEvents*>> by_round;
  for (size_t c = 0; c < clients.size(); ++c) {
    const LoadClient& lc = *clients[c];
    finished += lc.finished ? 1 : 0;
    if (!lc.problem.empty() && report.problems.size() < 20) report.problems.push_back(lc.problem);
    if (lc.unauthenticated + lc.hb_unauthenticated > 0) unauthenticated.insert(static_cast<int>(c));
    for (const auto& [round, task] : lc.cancels) {
      auto it = lc.rounds.find(round);
      if (it == lc.rounds.end() || it->second.accepted + it->second.duplicates == 0) cancelled.insert(static_cast<int>(c));
    }
    for (const auto& [round, ev] : lc.rounds) by_round[round].push_back(&ev);
  }
  report.finished = finished == options.clients;
  if (!report.finished) {
    report.problems.push_back(absl::StrCat(finished, " of ", options.clients, " clients were told the run finished"));
  }
  report.clients_unauthenticated = static_cast<int>(unauthenticated.size());
  report.clients_cancelled = static_cast<int>(cancelled.size());
  std::set<int> dead = unauthenticated;
  dead.insert(cancelled.begin(), cancelled.end());
  report.declared_dead = static_cast<int>(dead.size());
  {
    absl::MutexLock lock(&shared.mu);
    report.adapter_exact = shared.adapter_exact;
    report.adapter_bytes = shared.adapter_bytes;
    report.upload_bytes = shared.upload_bytes;
    if (!shared.adapter_exact) report.problems.push_back(shared.adapter_problem);
  }

  // Rounds and phase intervals.
  const double all_joined_ms = static_cast<double>(shared.all_joined_us.load()) / 1000.0;
  std::vector<std::pair<double, double>> burst, aggregation;
  struct RoundTimes {
    uint64_t round;
    double first_task, last_download, last_accept, commit;
  };
  std::vector<RoundTimes> times;
  double previous_commit_ms = all_joined_ms;
  std::vector<double> round_times;
  for (const v1::RoundSummary& h : final_status.history()) {
    RoundFigures f;
    f.round = h.round();
    f.updates_in_history = static_cast<int>(h.updates_accepted());
    auto em = h.eval_metrics().find("eval_ms");
    if (em != h.eval_metrics().end()) f.eval_ms_reported = em->second;
    const double commit_ms = static_cast<double>(h.committed_unix_ms() - sys0_ms);
    double first_task = 1e300, last_task = -1, last_download = -1, last_accept = -1;
    for (const RoundEvents* ev : by_round[h.round()]) {
      if (ev->task_ms >= 0) {
        ++f.tasks;
        first_task = std::min(first_task, ev->task_ms);
        last_task = std::max(last_task, ev->task_ms);
      }
      last_download = std::max(last_download, ev->downloaded_ms);
      last_accept = std::max(last_accept, ev->accepted_ms);
      f.accepted += ev->accepted;
      f.duplicates += ev->duplicates;
    }
    if (f.tasks > 0) {
      f.selection_s = (first_task - previous_commit_ms) / 1000.0;
      f.task_spread_s = (last_task - first_task) / 1000.0;
      f.burst_s = (last_download - first_task) / 1000.0;
      f.uploads_s = (last_accept - last_download) / 1000.0;
      f.aggregation_s = (commit_ms - last_accept) / 1000.0;
      f.round_s = (commit_ms - first_task) / 1000.0;
      times.push_back({f.round, first_task, last_download, last_accept, commit_ms});
      burst.push_back({first_task, last_download});
      aggregation.push_back({last_accept, commit_ms});
      round_times.push_back(f.round_s);
      report.max_task_spread_s = std::max(report.max_task_spread_s, f.task_spread_s);
    }
    for (const ResourceSample& s : resources) {
      if (s.t_ms >= commit_ms) {
        f.rss_kb_after = s.rss_kb;
        f.fds_after = s.fds;
        break;
      }
    }
    previous_commit_ms = commit_ms;
    if (f.updates_in_history != options.clients) {
      report.problems.push_back(absl::StrCat("round ", f.round, " committed ", f.updates_in_history, " updates, not ",
                                             options.clients));
    }
    if (f.accepted != options.clients) {
      report.problems.push_back(
          absl::StrCat("round ", f.round, ": ", f.accepted, " clients had their update accepted, not ", options.clients));
    }
    report.rounds.push_back(f);
  }
  report.rounds_committed = static_cast<int>(final_status.history_size());
  if (report.rounds_committed != options.rounds) {
    report.problems.push_back(absl::StrCat(report.rounds_committed, " rounds committed, not ", options.rounds));
  }

  auto phase_of = [&](const Sample& s) {
    for (const auto& [x, y] : aggregation) {
      if (s.start_ms >= x && s.start_ms <= y) return kAggregation;
    }
    for (const auto& [x, y] : burst) {
      if (s.start_ms >= x && s.start_ms <= y) return kBurst;
    }
    return kOther;
  };
  std::array<std::array<std::vector<double>, kNumPhases>, kNumRpcs> values;
  std::array<std::array<int64_t, kNumPhases>, kNumRpcs> errors{};
  auto add = [&](const std::vector<Sample>& v) {
    for (const Sample& s : v) {
      const Phase p = phase_of(s);
      values[s.rpc][p].push_back(s.dur_ms);
      if (!s.ok) {
        ++errors[s.rpc][p];
        ++report.errors_by_code[absl::StrCat(RpcName(s.rpc), " ", CodeName(s.code))];
      }
    }
  };
  for (const auto& c : clients) {
    add(c->main_samples);
    add(c->hb_samples);
  }
  add(admin_samples);
  if (!options.samples_csv.empty()) {
    std::ofstream csv(options.samples_csv);
    csv << "call,client,phase,start_ms,dur_ms,code\n";
    auto put = [&](const std::vector<Sample>& v, int client) {
      for (const Sample& s : v) {
        // Call names hold commas ("Heartbeat, prober"): quoted.
        csv << '"' << RpcName(s.rpc) << "\"," << client << ',' << PhaseName(phase_of(s)) << ',' << s.start_ms << ','
            << s.dur_ms << ',' << CodeName(s.code) << '\n';
      }
    };
    for (size_t c = 0; c < clients.size(); ++c) {
      put(clients[c]->main_samples, static_cast<int>(c));
      put(clients[c]->hb_samples, static_cast<int>(c));
    }
    put(admin_samples, -1);
    if (!csv) report.problems.push_back(absl::StrCat("cannot write ", options.samples_csv));
  }
  for (int r = 0; r < kNumRpcs; ++r) {
    std::vector<double> all;
    int64_t all_errors = 0;
    for (int p = 0; p < kNumPhases; ++p) {
      report.latency[r][p] = StatsOf(values[r][p], errors[r][p]);
      all.insert(all.end(), values[r][p].begin(), values[r][p].end());
      all_errors += errors[r][p];
    }
    report.latency_all[r] = StatsOf(all, all_errors);
  }

  // Where the slowest Heartbeats of each phase fell.
  {
    std::array<std::vector<Sample>, kNumPhases> hb;
    for (const auto& c : clients) {
      for (const Sample& s : c->hb_samples) {
        if (s.rpc == report.goal_heartbeat()) hb[phase_of(s)].push_back(s);
      }
    }
    for (int p = 0; p < kNumPhases; ++p) {
      std::sort(hb[p].begin(), hb[p].end(), [](const Sample& a, const Sample& b) { return a.dur_ms > b.dur_ms; });
      for (size_t i = 0; i < hb[p].size() && i < 3; ++i) {
        const Sample& s = hb[p][i];
        const RoundTimes* rt = nullptr;
        for (const RoundTimes& t : times) {
          if (t.first_task <= s.start_ms + s.dur_ms) rt = &t;  // the latest round begun by the call's end
        }
        char b[256];
        if (rt == nullptr) {
          std::snprintf(b, sizeof(b), "%.0f ms, at %.2f s of the run, before round 1's first task", s.dur_ms,
                        s.start_ms / 1000.0);
        } else {
          std::snprintf(b, sizeof(b),
                        "%.0f ms, sent %+.2f s from round %llu's first task (last download %+.2f, last ack %+.2f, "
                        "commit %+.2f)%s",
                        s.dur_ms, (s.start_ms - rt->first_task) / 1000.0, static_cast<unsigned long long>(rt->round),
                        (rt->last_download - rt->first_task) / 1000.0, (rt->last_accept - rt->first_task) / 1000.0,
                        (rt->commit - rt->first_task) / 1000.0, s.ok ? "" : absl::StrCat(", ", CodeName(s.code)).c_str());
        }
        report.slowest_heartbeats[p].push_back(b);
      }
    }
  }

  // Liveness as the server counted it, from all joined until the run finished.
  for (const AdminPoint& a : admin_points) {
    if (all_joined_ms < 0 || a.t_ms < all_joined_ms || a.phase == v1::ROUND_PHASE_FINISHED) continue;
    ++report.admin_samples;
    report.min_connected = report.min_connected < 0 ? a.connected : std::min(report.min_connected, a.connected);
    int& m = report.min_connected_by_phase[phase_of(Sample{kAdminStatus, a.t_ms, 0, true, 0})];
    m = m < 0 ? a.connected : std::min(m, a.connected);
  }
  if (report.declared_dead > 0) {
    report.problems.push_back(absl::StrCat(report.declared_dead, " live clients declared dead (",
                                           report.clients_unauthenticated, " sessions expired, ",
                                           report.clients_cancelled, " tasks cancelled)"));
  }
  if (report.min_connected >= 0 && report.min_connected < options.clients) {
    report.problems.push_back(absl::StrCat("the server counted as few as ", report.min_connected, " of ",
                                           options.clients, " live clients as connected"));
  }

  // Server process.
  report.resources = resources;
  for (const ResourceSample& s : resources) {
    if (report.fds_start == 0 && s.t_ms >= all_joined_ms) {
      report.rss_start_kb = s.rss_kb;
      report.fds_start = s.fds;
    }
    report.rss_peak_kb = std::max(report.rss_peak_kb, s.rss_kb);
    report.fds_max = std::max(report.fds_max, s.fds);
    report.threads_max = std::max(report.threads_max, s.threads);
    report.rss_end_kb = s.rss_kb;
    report.hwm_end_kb = s.hwm_kb;
    report.fds_end = s.fds;
  }
  for (const ResourceSample& s : resources) {
    if (s.rss_kb != report.rss_peak_kb) continue;
    const RoundTimes* rt = nullptr;
    for (const RoundTimes& t : times) {
      if (t.first_task <= s.t_ms) rt = &t;
    }
    char b[256];
    if (rt == nullptr) {
      std::snprintf(b, sizeof(b), "at %.2f s of the run, before round 1's first task", s.t_ms / 1000.0);
    } else {
      std::snprintf(b, sizeof(b), "%+.2f s from round %llu's first task (last download %+.2f, last ack %+.2f, commit %+.2f)",
                    (s.t_ms - rt->first_task) / 1000.0, static_cast<unsigned long long>(rt->round),
                    (rt->last_download - rt->first_task) / 1000.0, (rt->last_accept - rt->first_task) / 1000.0,
                    (rt->commit - rt->first_task) / 1000.0);
    }
    report.rss_peak_at = b;
    break;
  }
  const std::map<std::string, int64_t> m = ParseMetrics(dir.path() + "/metrics.txt");
  auto metric = [&](const char* name) { return m.count(name) ? m.at(name) : int64_t{-1}; };
  report.updates_accepted_total = metric("fedlora_updates_accepted_total");
  report.updates_duplicate_total = metric("fedlora_updates_duplicate_total");
  report.updates_rejected_total = metric("fedlora_updates_rejected_total");
  report.rounds_abandoned_total = metric("fedlora_rounds_abandoned_total");
  report.quota_refusals_total = metric("fedlora_quota_refusals_total");
  if (report.updates_accepted_total != int64_t{options.clients} * options.rounds) {
    report.problems.push_back(absl::StrCat("the server counted ", report.updates_accepted_total,
                                           " accepted updates, not ", int64_t{options.clients} * options.rounds));
  }
  if (report.rounds_abandoned_total != 0) {
    report.problems.push_back(absl::StrCat(report.rounds_abandoned_total, " rounds abandoned"));
  }
  {
    std::ifstream log(log_path);
    std::string line;
    while (std::getline(log, line)) {
      const bool w = line.rfind("W ", 0) == 0, e = line.rfind("E ", 0) == 0;
      report.log_warnings += w ? 1 : 0;
      report.log_errors += e ? 1 : 0;
      if ((w || e) && report.log_excerpt.size() < 8) report.log_excerpt.push_back(line.substr(0, 300));
    }
  }
  return report;
}

std::string FormatReport(const LoadReport& r) {
  const LoadOptions& o = r.options;
  std::string out;
  auto line = [&](const std::string& s) { absl::StrAppend(&out, s, "\n"); };
  char b[512];
  std::snprintf(b, sizeof(b),
                "load: %d clients (each selected every round), %d rounds, adapter %.2f MiB (safetensors), update %.2f "
                "MiB sealed fp32 per client; per round %.0f MiB down + %.0f MiB up",
                o.clients, o.rounds, r.adapter_bytes / 1048576.0, r.upload_bytes / 1048576.0,
                o.clients * r.adapter_bytes / 1048576.0, o.clients * r.upload_bytes / 1048576.0);
  line(b);
  std::snprintf(b, sizeof(b),
                "      evaluation %lld ms (%s) per round; Heartbeat every %d s%s, dead after %lld ms of silence; "
                "WaitForTask long poll %d s; %s",
                static_cast<long long>(o.eval_ms), o.eval_burn ? "CPU burn" : "sleep", o.heartbeat_interval_s,
                o.idle_heartbeats ? " (also while idle)" : " (only while holding a task)",
                static_cast<long long>(o.heartbeat_timeout_ms), o.wait_for_task_s,
                o.probe_every > 0 ? absl::StrCat("every ", o.probe_every, "th client probes WaitForTask(max_wait 0) at each heartbeat").c_str()
                                  : "no WaitForTask probes");
  line(b);
  line(absl::StrCat("      server bulk work (uploads, download indexing, aggregation, evaluation) at nice +",
                    o.server_bulk_work_nice, "; clients at nice +", o.clients_nice, "; probing clients' heartbeats from ",
                    o.probe_process ? "the prober process" : "the clients' process"));
  if (r.valid()) {
    line(absl::StrCat("validated: ", r.rounds_committed, " rounds committed with ", o.clients,
                      " updates each, every update accepted once; final adapter = initial + rounds x delta, bit for bit"));
  } else {
    line(absl::StrCat("VALIDATION PROBLEMS (", r.problems.size(), "):"));
    for (const std::string& p : r.problems) line(absl::StrCat("  - ", p));
  }
  line("rounds (seconds): selection = previous commit (round 1: all joined) .. first task; spread = first .. last task "
       "received;");
  line("  burst = first task .. last download; uploads = .. last ack; aggregation = .. commit; round = first task .. commit");
  line("  round  selection  spread   burst  uploads  aggregation  round   eval(ms)  updates  RSS after(MiB)  fds after");
  std::vector<double> rt, bt, at;
  for (const RoundFigures& f : r.rounds) {
    std::snprintf(b, sizeof(b), "  %5llu  %9.2f  %6.2f  %6.2f  %7.2f  %11.2f  %6.2f  %8.0f  %7d  %14.1f  %9lld",
                  static_cast<unsigned long long>(f.round), f.selection_s, f.task_spread_s, f.burst_s, f.uploads_s,
                  f.aggregation_s, f.round_s, f.eval_ms_reported, f.updates_in_history, f.rss_kb_after / 1024.0,
                  static_cast<long long>(f.fds_after));
    line(b);
    rt.push_back(f.round_s);
    bt.push_back(f.burst_s);
    at.push_back(f.aggregation_s);
  }
  std::snprintf(b, sizeof(b), "  median round %.2f s, burst %.2f s, aggregation/evaluation %.2f s", Median(rt), Median(bt),
                Median(at));
  line(b);
  line("latency, ms (count, p50, p99, max, errors), by the phase in which each call was sent:");
  std::snprintf(b, sizeof(b), "  %-26s %-24s %7s %9s %9s %9s %6s", "call", "phase", "count", "p50", "p99", "max", "err");
  line(b);
  for (int rpc = 0; rpc < kNumRpcs; ++rpc) {
    for (int p = 0; p < kNumPhases; ++p) {
      const LatencyStats& s = r.latency[rpc][p];
      if (s.count == 0) continue;
      std::snprintf(b, sizeof(b), "  %-26s %-24s %7lld %9.2f %9.2f %9.2f %6lld", RpcName(static_cast<Rpc>(rpc)),
                    PhaseName(static_cast<Phase>(p)), static_cast<long long>(s.count), s.p50_ms, s.p99_ms, s.max_ms,
                    static_cast<long long>(s.errors));
      line(b);
    }
  }
  if (!r.errors_by_code.empty()) {
    std::string e;
    for (const auto& [k, n] : r.errors_by_code) absl::StrAppend(&e, e.empty() ? "" : ", ", k, " x", n);
    line(absl::StrCat("  failed calls: ", e));
  }
  for (int p = 0; p < kNumPhases; ++p) {
    for (const std::string& w : r.slowest_heartbeats[p]) {
      line(absl::StrCat("  slowest ", RpcName(r.goal_heartbeat()), ", ", PhaseName(static_cast<Phase>(p)), ": ", w));
    }
  }
  std::snprintf(b, sizeof(b), "  task delivery: the last client got its task up to %.2f s after the first (max over rounds)",
                r.max_task_spread_s);
  line(b);
  std::snprintf(b, sizeof(b),
                "server process (pid %d, sampled every %lld ms): VmRSS %.1f MiB when all joined, peak %.1f, end %.1f; "
                "VmHWM %.1f MiB; open fds %lld when all joined, max %lld, end %lld; threads max %lld",
                static_cast<int>(r.server_pid), static_cast<long long>(o.sample_ms), r.rss_start_kb / 1024.0,
                r.rss_peak_kb / 1024.0, r.rss_end_kb / 1024.0, r.hwm_end_kb / 1024.0,
                static_cast<long long>(r.fds_start), static_cast<long long>(r.fds_max), static_cast<long long>(r.fds_end),
                static_cast<long long>(r.threads_max));
  line(b);
  line(absl::StrCat("  peak VmRSS sampled ", r.rss_peak_at));
  std::snprintf(b, sizeof(b),
                "server counters: updates accepted %lld, duplicate %lld, rejected %lld, rounds abandoned %lld, quota "
                "refusals %lld; log: %lld warnings, %lld errors",
                static_cast<long long>(r.updates_accepted_total), static_cast<long long>(r.updates_duplicate_total),
                static_cast<long long>(r.updates_rejected_total), static_cast<long long>(r.rounds_abandoned_total),
                static_cast<long long>(r.quota_refusals_total), static_cast<long long>(r.log_warnings),
                static_cast<long long>(r.log_errors));
  line(b);
  for (const std::string& l : r.log_excerpt) line(absl::StrCat("  log: ", l));
  std::snprintf(b, sizeof(b),
                "liveness: %d live clients declared dead (%d told their session expired, %d had a task cancelled that "
                "was never accepted); server's live count min %d of %d over %lld Admin samples (by phase: %d, %d, %d)",
                r.declared_dead, r.clients_unauthenticated, r.clients_cancelled, r.min_connected, o.clients,
                static_cast<long long>(r.admin_samples), r.min_connected_by_phase[kBurst],
                r.min_connected_by_phase[kAggregation], r.min_connected_by_phase[kOther]);
  line(b);
  std::string hb;
  for (int p = 0; p < kNumPhases; ++p) {
    const LatencyStats& s = r.latency[r.goal_heartbeat()][p];
    if (s.count > 0) {
      std::snprintf(b, sizeof(b), "%s p99 %.1f ms", PhaseName(static_cast<Phase>(p)), s.p99_ms);
    } else {
      std::snprintf(b, sizeof(b), "%s: no heartbeats", PhaseName(static_cast<Phase>(p)));
    }
    absl::StrAppend(&hb, hb.empty() ? "" : ", ", b);
  }
  line(absl::StrCat("goal: ", RpcName(r.goal_heartbeat()), " p99 < 100 ms in every phase: ",
                    r.heartbeat_goal_met() ? "MET" : "MISSED", " (", hb, ")"));
  line(absl::StrCat("goal: no live client declared dead: ", r.liveness_goal_met() ? "MET" : "MISSED"));
  std::snprintf(b, sizeof(b), "wall time %.1f s", r.wall_s);
  line(b);
  return out;
}

std::string FormatFigures(const LoadReport& r) {
  std::string out;
  auto fig = [&](const std::string& key, double v) {
    char b[128];
    std::snprintf(b, sizeof(b), "figure %s %.3f\n", key.c_str(), v);
    out += b;
  };
  static const char* kPhaseKey[] = {"burst", "agg", "other"};
  static const char* kRpcKey[] = {"heartbeat", "wait_probe", "wait_long", "download", "upload", "admin", "baseline", "probe_heartbeat"};
  for (int rpc = 0; rpc < kNumRpcs; ++rpc) {
    for (int p = 0; p < kNumPhases; ++p) {
      const LatencyStats& s = r.latency[rpc][p];
      if (s.count == 0) continue;
      const std::string k = absl::StrCat(kRpcKey[rpc], ".", kPhaseKey[p], ".");
      fig(k + "p50_ms", s.p50_ms);
      fig(k + "p99_ms", s.p99_ms);
      fig(k + "max_ms", s.max_ms);
      fig(k + "errors", static_cast<double>(s.errors));
    }
  }
  std::vector<double> rt, bt, at;
  for (const RoundFigures& f : r.rounds) {
    fig(absl::StrCat("round", f.round, ".round_s"), f.round_s);
    rt.push_back(f.round_s);
    bt.push_back(f.burst_s);
    at.push_back(f.aggregation_s);
  }
  fig("round_s.median", Median(rt));
  fig("burst_s.median", Median(bt));
  fig("aggregation_s.median", Median(at));
  fig("task_spread_s.max", r.max_task_spread_s);
  fig("server.rss_start_mib", r.rss_start_kb / 1024.0);
  fig("server.rss_peak_mib", r.rss_peak_kb / 1024.0);
  fig("server.rss_end_mib", r.rss_end_kb / 1024.0);
  fig("server.vmhwm_mib", r.hwm_end_kb / 1024.0);
  fig("server.fds_start", static_cast<double>(r.fds_start));
  fig("server.fds_max", static_cast<double>(r.fds_max));
  fig("server.fds_end", static_cast<double>(r.fds_end));
  fig("server.threads_max", static_cast<double>(r.threads_max));
  fig("liveness.declared_dead", r.declared_dead);
  fig("liveness.min_connected", r.min_connected);
  for (int p = 0; p < kNumPhases; ++p) {
    fig(absl::StrCat("liveness.min_connected.", kPhaseKey[p]), r.min_connected_by_phase[p]);
  }
  fig("valid", r.valid() ? 1 : 0);
  fig("wall_s", r.wall_s);
  return out;
}

}  // namespace fedlora::load
