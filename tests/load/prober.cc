#include "tests/load/prober.h"

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "proto/wire.h"

namespace fedlora::load {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int index) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(16 << 20);
  args.SetMaxReceiveMessageSize(16 << 20);
  // Its own TCP connection per client, as separate machines would have.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("fedlora.load.client", index);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// ---- the table -----------------------------------------------------------------------------------

ProbeTable* ProbeTable::Create(int slots) {
  const size_t bytes = sizeof(ProbeTable) + sizeof(Slot) * static_cast<size_t>(std::max(slots, 0));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, 0, bytes);
  auto* t = new (p) ProbeTable();
  t->slots_ = slots;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  const int rc = pthread_mutex_init(&t->mu_, &attr);
  pthread_mutexattr_destroy(&attr);
  return rc == 0 ? t : nullptr;
}

bool ProbeTable::Publish(int i, const std::string& session, const std::string& task_id,
                         uint64_t task_round) {
  if (i < 0 || i >= slots_ || session.size() > kMaxField || task_id.size() > kMaxField)
    return false;
  pthread_mutex_lock(&mu_);
  Slot* s = slot(i);
  std::memcpy(s->session, session.data(), session.size());
  s->session_len = static_cast<uint32_t>(session.size());
  std::memcpy(s->task_id, task_id.data(), task_id.size());
  s->task_len = static_cast<uint32_t>(task_id.size());
  s->task_round = task_round;
  pthread_mutex_unlock(&mu_);
  return true;
}

void ProbeTable::MarkDone(int i) {
  if (i < 0 || i >= slots_) return;
  pthread_mutex_lock(&mu_);
  slot(i)->done = true;
  pthread_mutex_unlock(&mu_);
}

ProbeTable::View ProbeTable::Read(int i) {
  View v;
  if (i < 0 || i >= slots_) return v;
  pthread_mutex_lock(&mu_);
  const Slot* s = slot(i);
  v.session.assign(s->session, s->session_len);
  v.task_id.assign(s->task_id, s->task_len);
  v.task_round = s->task_round;
  v.done = s->done;
  pthread_mutex_unlock(&mu_);
  return v;
}

// ---- setup and results ---------------------------------------------------------------------------

namespace {

int64_t Nanos(Steady::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

bool ReadSetup(int fd, ProberSetup* setup) {
  std::string text;
  char buf[256];
  pollfd pfd{fd, POLLIN, 0};
  while (text.find('\n') == std::string::npos && poll(&pfd, 1, 120'000) == 1) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  long long t0 = 0, deadline = 0;
  if (std::sscanf(text.c_str(), "%d %d %lld %lld", &setup->port, &setup->sink_port, &t0,
                  &deadline) != 4)
    return false;
  setup->t0 = Steady::time_point(std::chrono::nanoseconds(t0));
  setup->deadline = Steady::time_point(std::chrono::nanoseconds(deadline));
  return setup->port > 0 && setup->sink_port > 0;
}

// The results file: per slot, unauthenticated, the samples, then the cancels.
template <typename T>
void Put(std::ofstream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(v));
}
template <typename T>
bool Get(std::ifstream& in, T* v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(v), sizeof(*v)));
}

// One client's heartbeats (and a probing client's probes), as LoadClient::RunHeartbeats sends
// them from the load process without a prober.
void ProbeLoop(const LoadOptions& o, const ProberSetup& setup, ProbeTable* table, int slot,
               ProbeResult* out) {
  const int index = slot;
  const bool probe = o.probe_every > 0 && index % o.probe_every == 0;
  const std::string id = absl::StrCat("load-", index);
  auto stub = v1::Federation::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", setup.port), index));
  std::unique_ptr<v1::Federation::Stub> sink;
  if (probe)
    sink = v1::Federation::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", setup.sink_port), index));
  auto record = [&](Rpc rpc, Steady::time_point start, const grpc::Status& status) {
    out->samples.push_back(
        {rpc, std::chrono::duration<double, std::milli>(start - setup.t0).count(),
         std::chrono::duration<double, std::milli>(Steady::now() - start).count(), status.ok(),
         static_cast<int>(status.error_code())});
  };
  auto context = [&](const std::string& session) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx->AddMetadata(kClientIdMetadataKey, id);
    if (!session.empty()) ctx->AddMetadata(kSessionMetadataKey, session);
    return ctx;
  };
  const auto interval = std::chrono::milliseconds(int64_t{1000} * o.heartbeat_interval_s);
  auto next = Steady::now() + interval * index / std::max(1, o.clients);
  while (true) {
    // Sleeps in steps of 50 ms so that a finished client stops promptly.
    while (Steady::now() < next) {
      if (table->stopped() || Steady::now() > setup.deadline || table->Read(slot).done) return;
      std::this_thread::sleep_for(
          std::min<Steady::duration>(next - Steady::now(), std::chrono::milliseconds(50)));
    }
    const ProbeTable::View v = table->Read(slot);
    if (v.done || table->stopped() || Steady::now() > setup.deadline) return;
    next += interval;
    if (next < Steady::now()) next = Steady::now() + interval;  // a slow call: skip, do not burst
    if (v.session.empty()) continue;
    if (!o.idle_heartbeats && v.task_id.empty()) continue;
    v1::HeartbeatRequest request;
    request.set_task_id(v.task_id);
    request.set_state(v.task_id.empty() ? v1::CLIENT_STATE_IDLE : v1::CLIENT_STATE_TRAINING);
    v1::HeartbeatResponse response;
    auto ctx = context(v.session);
    const auto t0 = Steady::now();
    const grpc::Status s = stub->Heartbeat(ctx.get(), request, &response);
    record(kProbeHeartbeat, t0, s);
    if (s.ok() && response.action() == v1::HeartbeatResponse::CANCEL_TASK && !v.task_id.empty()) {
      out->cancels.push_back({v.task_round, v.task_id});
    }
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) ++out->unauthenticated;
    if (!probe) continue;
    v1::WaitForTaskRequest wait;
    wait.set_max_wait_seconds(0);
    v1::WaitForTaskResponse answer;
    auto wctx = context(v.session);
    const auto w0 = Steady::now();
    const grpc::Status ws = stub->WaitForTask(wctx.get(), wait, &answer);
    record(kWaitProbe, w0, ws);
    if (ws.error_code() == grpc::StatusCode::UNAUTHENTICATED) ++out->unauthenticated;
    v1::HeartbeatResponse sink_response;
    grpc::ClientContext sctx;
    sctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const auto b0 = Steady::now();
    record(kBaseline, b0, sink->Heartbeat(&sctx, request, &sink_response));
  }
}

}  // namespace

bool SendProberSetup(int fd, const ProberSetup& setup) {
  const std::string text = absl::StrCat(setup.port, " ", setup.sink_port, " ", Nanos(setup.t0), " ",
                                        Nanos(setup.deadline), "\n");
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

[[noreturn]] void RunProber(const LoadOptions& options, ProbeTable* table, int setup_fd,
                            const std::string& result_path) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the load run
  ProberSetup setup;
  if (!ReadSetup(setup_fd, &setup)) _exit(1);
  std::vector<ProbeResult> results(static_cast<size_t>(table->slots()));
  std::vector<std::thread> threads;
  for (int s = 0; s < table->slots(); ++s) {
    threads.emplace_back(
        [&, s] { ProbeLoop(options, setup, table, s, &results[static_cast<size_t>(s)]); });
  }
  for (auto& t : threads) t.join();
  _exit(WriteProbeResults(result_path, results) ? 0 : 1);
}

bool WriteProbeResults(const std::string& path, const std::vector<ProbeResult>& results) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const ProbeResult& r : results) {
    Put(out, r.unauthenticated);
    Put(out, r.samples.size());
    for (const Sample& s : r.samples) Put(out, s);
    Put(out, r.cancels.size());
    for (const auto& [round, task] : r.cancels) {
      Put(out, round);
      Put(out, task.size());
      out.write(task.data(), static_cast<std::streamsize>(task.size()));
    }
  }
  out.close();
  return static_cast<bool>(out);
}

absl::StatusOr<std::vector<ProbeResult>> ReadProbeResults(const std::string& path, int slots) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("the prober wrote no results to ", path));
  const absl::Status cut =
      absl::DataLossError(absl::StrCat("the prober's results in ", path, " are cut short"));
  std::vector<ProbeResult> results(static_cast<size_t>(slots));
  for (ProbeResult& r : results) {
    size_t n = 0;
    if (!Get(in, &r.unauthenticated) || !Get(in, &n) || n > (size_t{1} << 24)) return cut;
    r.samples.resize(n);
    for (Sample& s : r.samples) {
      if (!Get(in, &s)) return cut;
    }
    if (!Get(in, &n) || n > (size_t{1} << 20)) return cut;
    for (size_t i = 0; i < n; ++i) {
      uint64_t round = 0;
      size_t len = 0;
      if (!Get(in, &round) || !Get(in, &len) || len > ProbeTable::kMaxField) return cut;
      std::string task(len, '\0');
      if (!in.read(task.data(), static_cast<std::streamsize>(len))) return cut;
      r.cancels.push_back({round, std::move(task)});
    }
  }
  return results;
}

}  // namespace fedlora::load
