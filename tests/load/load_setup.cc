// The load run itself (its adapter, config and delta) and the two server processes it forks: the
// fedlora server (ServeChild) and the trivial baseline server (ServeSink). See load_internal.h.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "config/config_io.h"
#include "server/evaluator.h"
#include "server/server.h"
#include "tests/load/load_internal.h"

namespace fedlora::load {
namespace {

float InitialValue(int64_t i) { return static_cast<float>((i * 5) % 16 - 8) / 64.0f; }

ServerOptions LoadServerOptions(const LoadOptions& o, const v1::RunConfig& config,
                                const std::string& data_dir) {
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
  absl::StatusOr<std::map<std::string, double>> Evaluate(
      uint64_t round, const std::vector<UpdateTensor>&) override {
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
    return std::map<std::string, double>{{"eval_loss", 1.0 / static_cast<double>(round + 1)},
                                         {"eval_ms", took}};
  }

 private:
  int64_t ms_;
  bool burn_;
};

// The baseline server's one method (ServeSink).
class SinkService final : public v1::Federation::CallbackService {
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest*,
                                      v1::HeartbeatResponse* response) override {
    response->set_action(v1::HeartbeatResponse::CONTINUE);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

}  // namespace

float PatchOf(int c, int clients) {
  if (c >= clients - clients % 2) return 0.0f;
  return c % 2 == 0 ? kPatch : -kPatch;
}

std::vector<UpdateTensor> LoadAdapter(int64_t kib, bool delta) {
  const int64_t rank = std::max<int64_t>(1, kib / 128);
  std::vector<UpdateTensor> a;
  for (int l = 0; l < kLayers; ++l) {
    const std::string base =
        absl::StrCat("base_model.model.layers.", l < 10 ? "0" : "", l, ".self_attn.q_proj");
    a.push_back({base + ".lora_A.weight", {rank, kHidden}, {}});
    a.push_back({base + ".lora_B.weight", {kHidden, rank}, {}});
  }
  for (UpdateTensor& t : a) {
    t.values.resize(static_cast<size_t>(rank * kHidden));
    for (size_t i = 0; i < t.values.size(); ++i)
      t.values[i] = delta ? kDelta : InitialValue(static_cast<int64_t>(i));
  }
  std::sort(a.begin(), a.end(),
            [](const UpdateTensor& x, const UpdateTensor& y) { return x.name < y.name; });
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

[[noreturn]] void ServeChild(const LoadOptions& o, const std::string& dir,
                             const std::string& log_path, int fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the load run
  const int log =
      ::open(log_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (log >= 0) dup2(log, STDERR_FILENO);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  LoadEvaluator evaluator(o.eval_ms, o.eval_burn);
  const v1::RunConfig config = LoadRunConfig(o);
  auto server = Server::Create(LoadServerOptions(o, config, dir + "/store"), config,
                               LoadAdapter(o.adapter_kib, false), &evaluator);
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

int ReadPort(int fd) {
  char buf[32] = {};
  pollfd pfd{fd, POLLIN, 0};
  const bool readable = poll(&pfd, 1, 60'000) == 1 && read(fd, buf, sizeof(buf) - 1) > 0;
  ::close(fd);
  return readable ? std::atoi(buf) : 0;
}

}  // namespace fedlora::load
