// fedlora server: runs the aggregation server for the run described by a config file.
//
//   fedlora server --config run.json --cert server.pem --key server.key --client-ca ca.pem [--crl crl.pem]
//   fedlora server --config run.json --insecure          # plaintext, loopback addresses only
//   fedlora server ... --health-listen 0.0.0.0:8081      # a plaintext port for health probes only
//
// The initial global adapter is the model's freshly initialised LoRA matrices and classifier (PEFT's
// initialisation, seeded by the run's seed), so every restart of a new run starts from the same
// bits. When data.eval_path is set, every new global adapter is evaluated on it (loss, accuracy,
// macro-F1 recorded with the round). Runs until SIGINT/SIGTERM, or until --linger-seconds after
// the run finished (clients then still fetch the final adapter); SIGHUP re-reads the TLS CRL.
// Prints the bound address on stdout, and at the end either "run finished: ..." or, for a run
// stopped before its last round, "stopped at round N: ..." (a restart on the same store resumes it).
//
// --out DIR: when the run finishes, its final adapter is written to DIR/adapter as an adapter
// directory (model/adapter_dir.h: PEFT's files, the labels, max_seq_len and prompt settings), and
// with --out-every-round each committed round's to DIR/round-N as it commits; each atomically
// (tools/adapter_export.h, as `fedlora export` writes them).
//
// Stopping: SIGINT or SIGTERM turns health NOT_SERVING, stops the round driver, refuses new
// calls, gives calls in flight up to 2 s (uploads cut off then resume from their checkpoints), and
// exits 0. A second SIGINT/SIGTERM during that shutdown exits at once with 128 + the signal
// number, leaving the store as a crash would (the restart recovers from it).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/config_io.h"
#include "config/resolved.h"
#include "core/logging.h"
#include "core/status.h"
#include "proto/address.h"
#include "server/server.h"
#include "server/store.h"
#include "tools/adapter_export.h"
#include "tools/common.h"
#include "train/train_config.h"
#include "workload/factory.h"

namespace fedlora::tools {
namespace {

// --- Signals ---------------------------------------------------------------------------------------
// Threads created before main (OpenBLAS's pool) do not block the stop signals, so the kernel may
// deliver SIGINT/SIGTERM/SIGHUP to any of them: a handler, not a blocked mask alone, keeps the
// default action (death) away. The handler only writes the signal number to a self-pipe, which the
// serve loop reads; main's thread blocks the signals so that the threads it starts (gRPC's, the
// driver, the metrics pool) inherit the mask and never run the handler. It unblocks them while it
// waits in ppoll (where a signal that no other thread can take is delivered) and once the shutdown
// has begun.

int g_signal_pipe[2] = {-1, -1};
// Set when the shutdown begins: a stop signal then ends the process at once.
std::atomic<bool> g_shutting_down{false};

sigset_t ServerSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

void OnServerSignal(int sig) {
  if (sig != SIGHUP && g_shutting_down.load()) {
    static const char kMessage[] =
        "fedlora server: stop signal during the shutdown: exiting without finishing it\n";
    (void)!write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    _exit(128 + sig);
  }
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!write(g_signal_pipe[1], &byte, 1);  // non-blocking: a full pipe already holds a stop
  errno = saved_errno;
}

// The signals that arrived since the last call, oldest first; waits up to `timeout_ms` for one.
std::vector<int> WaitForSignals(int timeout_ms) {
  sigset_t unblocked;
  pthread_sigmask(SIG_SETMASK, nullptr, &unblocked);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigdelset(&unblocked, sig);
  pollfd pfd{g_signal_pipe[0], POLLIN, 0};
  const timespec wait{timeout_ms / 1000, (timeout_ms % 1000) * 1'000'000L};
  ppoll(&pfd, 1, &wait, &unblocked);  // EINTR when the handler ran in here: the byte is in the pipe
  std::vector<int> got;
  unsigned char buf[64];
  ssize_t n;
  while ((n = read(g_signal_pipe[0], buf, sizeof(buf))) > 0) got.insert(got.end(), buf, buf + n);
  return got;
}

// From here on a stop signal exits at once (OnServerSignal), on whichever thread takes it.
void ForceExitOnNextStopSignal() {
  g_shutting_down.store(true);
  const sigset_t set = ServerSignals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

bool IsStop(int sig) { return sig == SIGINT || sig == SIGTERM; }

// Server-side evaluation of each new global adapter (workload/evaluator.h) with the run's model.
class RoundEvaluator : public Evaluator {
 public:
  RoundEvaluator(std::unique_ptr<LoraModel> model, std::unique_ptr<HeldOutEvaluator> evaluator)
      : model_(std::move(model)), evaluator_(std::move(evaluator)) {}

  absl::StatusOr<std::map<std::string, double>> Evaluate(
      uint64_t round, const std::vector<UpdateTensor>& adapter) override {
    FEDLORA_RETURN_IF_ERROR(LoadAdapter(adapter, *model_));
    LoraModel* models[] = {model_.get()};
    FEDLORA_ASSIGN_OR_RETURN(EvalFigures r, evaluator_->Evaluate(models));
    FEDLORA_LOG(INFO) << "round " << round << " eval: " << r.json;
    return evaluator_->Metrics(r);
  }

 private:
  std::unique_ptr<LoraModel> model_;
  std::unique_ptr<HeldOutEvaluator> evaluator_;
};

// The initial adapter (the model's freshly initialised trainable params, PEFT's initialisation
// seeded by the run's seed) and the held-out evaluator (none without data.eval_path).
absl::Status LoadRun(const v1::RunConfig& config, Device device, std::vector<UpdateTensor>* initial,
                     std::unique_ptr<Evaluator>* evaluator) {
  // The stored round metrics name the macro-F1 "macro_f1" (the simulator's "eval_macro_f1").
  FEDLORA_ASSIGN_OR_RETURN(Workload w, LoadWorkload(config, {.model_path = config.model().path(),
                                                             .train_path = "",
                                                             .eval_path = config.data().eval_path(),
                                                             .device = device,
                                                             .role = ModelRole::kEvaluate,
                                                             .macro_f1_key = "macro_f1"}));
  std::unique_ptr<LoraModel> model = std::move(w.models.front());
  *initial = AdapterOf(*model);
  if (w.evaluator == nullptr) return absl::OkStatus();
  *evaluator = std::make_unique<RoundEvaluator>(std::move(model), std::move(w.evaluator));
  return absl::OkStatus();
}

// --out: writes the run's committed adapters from the store as the serve loop polls it.
class OutWriter {
 public:
  OutWriter(std::string dir, bool every_round, RunAdapterFormat format, std::string run_id)
      : dir_(std::move(dir)),
        every_round_(every_round),
        format_(std::move(format)),
        run_id_(std::move(run_id)) {}

  void Poll(Server& server) {
    Coordinator& run = server.coordinator();
    const int64_t committed = run.rounds_committed();
    if (every_round_ && committed != seen_committed_) {
      absl::StatusOr<std::vector<RoundRecord>> rounds = server.store().ListRounds(run_id_);
      if (!rounds.ok()) {
        FEDLORA_LOG(ERROR) << "--out: " << rounds.status();
      }
      int64_t listed = 0;
      for (const RoundRecord& r : rounds.value_or(std::vector<RoundRecord>{})) {
        if (r.state != RoundState::kCommitted) continue;
        ++listed;
        if (r.round <= last_round_) continue;
        last_round_ = r.round;
        const std::string dir = absl::StrCat(dir_, "/round-", r.round);
        if (IsDirectory(dir)) continue;  // written before a restart (whole: the writes are atomic)
        absl::StatusOr<int64_t> done =
            ExportRound(server.store(), server.blobs(), run_id_, r.round, format_, dir);
        if (done.ok()) {
          FEDLORA_LOG(INFO) << "round " << r.round << "'s adapter written to " << dir;
        } else {
          FEDLORA_LOG(ERROR) << "--out-every-round: round " << r.round << ": " << done.status();
        }
      }
      if (listed >= committed) seen_committed_ = committed;  // else look again at the next poll
    }
    if (final_written_ || !run.finished()) return;
    final_written_ = true;
    const std::string dir = dir_ + "/adapter";
    absl::StatusOr<int64_t> round =
        ExportRound(server.store(), server.blobs(), run_id_, 0, format_, dir);
    if (round.ok()) {
      std::cout << "final adapter (round " << *round << ") written to " << dir << std::endl;
    } else {
      final_status_ = round.status();
      FEDLORA_LOG(ERROR) << "--out: the final adapter was not written: " << round.status();
    }
  }
  // The final adapter's write, once tried.
  const absl::Status& status() const { return final_status_; }

 private:
  const std::string dir_;
  const bool every_round_;
  const RunAdapterFormat format_;
  const std::string run_id_;
  int64_t seen_committed_ = -1, last_round_ = 0;
  bool final_written_ = false;
  absl::Status final_status_;
};

struct ServeFlags {
  std::string config_path, listen, health_listen, metrics_listen, store, cert, key, client_ca, crl,
      operators;
  std::string out;
  bool out_every_round = false;
  bool insecure = false;
  int64_t linger_seconds = 30;
  int64_t rounds = -1;         // -1: the config's
  std::string device = "cpu";  // the held-out evaluator's and the aggregation's
};

// The run config with the flags' overrides, applied before it is validated so that the plaintext
// rule and the TLS checks apply to them as to the config's own values.
absl::StatusOr<v1::RunConfig> LoadServeConfig(const ServeFlags& f) {
  return LoadRunConfigFile(f.config_path, [&f](v1::RunConfig* c) {
    if (f.rounds >= 0) c->set_rounds(static_cast<uint32_t>(f.rounds));
    v1::ServerConfig* s = c->mutable_server();
    if (!f.listen.empty()) s->set_listen_address(f.listen);
    if (!f.health_listen.empty()) s->set_health_address(f.health_listen);
    if (!f.metrics_listen.empty()) s->set_metrics_address(f.metrics_listen);
    if (!f.store.empty()) s->set_store_dir(f.store);
    if (f.insecure) s->set_insecure(true);
    if (!f.cert.empty()) s->mutable_tls()->set_cert_file(f.cert);
    if (!f.key.empty()) s->mutable_tls()->set_key_file(f.key);
    if (!f.client_ca.empty()) s->mutable_tls()->set_client_ca_file(f.client_ca);
    if (!f.crl.empty()) s->mutable_tls()->set_crl_file(f.crl);
    if (!f.operators.empty()) {
      s->mutable_tls()->clear_operator_ids();
      for (const std::string& id : SplitList(f.operators)) s->mutable_tls()->add_operator_ids(id);
    }
  });
}

// Where the server listens, on stdout: the address, the health and metrics ports, and the live view.
void PrintListening(Server& server, const ServerOptions& options) {
  std::cout << "listening on " << server.address();
  if (server.health_port() != 0) std::cout << " (health on port " << server.health_port() << ")";
  if (server.metrics_port() != 0) std::cout << " (metrics on port " << server.metrics_port() << ")";
  std::cout << std::endl;
  if (server.metrics_port() != 0) {
    // The live view (server/live_view.h) on the metrics listener; a wildcard address as loopback.
    std::string host = options.metrics_address.substr(0, options.metrics_address.rfind(':'));
    if (host == "0.0.0.0" || host == "localhost") host = "127.0.0.1";
    if (host == "[::]") host = "[::1]";
    std::cout << "live view: " << (options.tls.enabled() ? "https://" : "http://") << host << ":"
              << server.metrics_port() << "/ ("
              << (options.tls.enabled() ? "operator certificates only" : "loopback only") << ")"
              << std::endl;
  }
}

// The serve loop: reloads the CRL on SIGHUP and polls --out, until a stop signal (returned) or
// `linger_seconds` after the run finished (0 returned).
int ServeUntilDone(Server& server, int64_t linger_seconds, std::optional<OutWriter>& out) {
  int stop = 0;
  std::optional<std::chrono::steady_clock::time_point> finished_at;
  while (stop == 0) {
    for (int sig : WaitForSignals(/*timeout_ms=*/200)) {
      if (IsStop(sig)) {
        stop = sig;
      } else if (sig == SIGHUP) {
        const absl::Status reloaded = server.ReloadCrl();
        FEDLORA_LOG(INFO) << "SIGHUP: "
                          << (reloaded.ok() ? "CRL reloaded" : std::string(reloaded.message()));
      }
    }
    if (out) out->Poll(server);
    if (stop != 0 || !server.coordinator().finished()) continue;
    const auto now = std::chrono::steady_clock::now();
    if (!finished_at) finished_at = now;
    if (now - *finished_at >= std::chrono::seconds(linger_seconds)) break;
  }
  return stop;
}

// How the run ended, on stdout: finished, or stopped and resumable.
void PrintOutcome(Server& server, const ServerOptions& options) {
  Coordinator& run = server.coordinator();
  if (run.finished()) {
    std::cout << "run finished: " << run.rounds_committed() << " rounds committed, adapter "
              << run.global_adapter_sha256() << std::endl;
  } else {
    std::cout << "stopped at round " << server.metrics().current_round.load() << ": "
              << run.rounds_committed()
              << " rounds committed; the run resumes when the server restarts on "
              << options.data_dir << std::endl;
  }
}

absl::Status Serve(const ServeFlags& f) {
  if (g_signal_pipe[0] < 0)
    return absl::InternalError("the stop signals could not be set up (no pipe)");
  FEDLORA_ASSIGN_OR_RETURN(v1::RunConfig loaded, LoadServeConfig(f));
  // Resolved once: the server's options and the server take this value (config/resolved.h).
  FEDLORA_ASSIGN_OR_RETURN(const ResolvedRunConfig run, ResolveRunConfig(std::move(loaded)));
  const v1::RunConfig& config = run.config;
  ServerOptions options = ServerOptionsFromRunConfig(run);
  // The plaintext rule before anything is loaded: a server that may not start says so at once.
  if (!options.tls.enabled()) {
    FEDLORA_RETURN_IF_ERROR(
        CheckPlaintextAllowed(options.listen_address, options.insecure, "server listen address"));
  }

  FEDLORA_RETURN_IF_ERROR(CheckRunConfigInputsExist(config, /*reads_train_data=*/false));
  std::vector<UpdateTensor> initial;
  std::unique_ptr<Evaluator> evaluator;
  FEDLORA_ASSIGN_OR_RETURN(const DevicePlan devices,
                           PlanDevices(f.device, RunRole::kServer, config));
  const Device device = devices.models;
  FEDLORA_RETURN_IF_ERROR(LoadRun(config, device, &initial, &evaluator));
  options.aggregation_device = devices.updates;  // exact sums: the same bits on either device
  std::optional<OutWriter> out;
  if (!f.out.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(RunAdapterFormat format, AdapterFormatForRun(config, ""));
    FEDLORA_RETURN_IF_ERROR(CheckAdapterDirectoryTarget(f.out + "/adapter"));
    out.emplace(f.out, f.out_every_round, std::move(format), config.run_id());
  }

  // A stop asked for while the model loaded: the store has not been opened yet.
  for (int sig : WaitForSignals(0)) {
    if (IsStop(sig)) {
      FEDLORA_LOG(INFO) << strsignal(sig) << " before the server started";
      std::cout << "stopped before serving; the store " << options.data_dir << " was not opened"
                << std::endl;
      return absl::OkStatus();
    }
  }
  FEDLORA_ASSIGN_OR_RETURN(auto server,
                           Server::Create(options, run, std::move(initial), evaluator.get()));
  PrintListening(*server, options);
  const int stop = ServeUntilDone(*server, f.linger_seconds, out);
  if (stop != 0) {
    FEDLORA_LOG(INFO) << strsignal(stop)
                      << ": shutting down (a second SIGINT or SIGTERM exits at once)";
  }
  if (out) out->Poll(*server);  // a run that finished since the last poll
  ForceExitOnNextStopSignal();
  server->Shutdown();
  PrintOutcome(*server, options);
  return out ? out->status() : absl::OkStatus();
}

}  // namespace

void PrepareServerSignals() {
  if (g_signal_pipe[0] >= 0) return;
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
    return;  // Serve refuses to start
  }
  struct sigaction action {};
  action.sa_handler = OnServerSignal;
  action.sa_mask = ServerSignals();  // one handler at a time
  action.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &action, nullptr);
  const sigset_t set = ServerSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int RunServer(int argc, char** argv) {
  PrepareServerSignals();  // a no-op when main called it first
  FlagSet flags(argv[0], "Runs the aggregation server for a run config.");
  ServeFlags f;
  flags.AddString("config", &f.config_path, "run config (JSON, see proto/fedlora/v1/config.proto)",
                  /*required=*/true);
  flags.AddString("listen", &f.listen, "host:port to listen on (overrides server.listen_address)");
  flags.AddString(
      "health-listen", &f.health_listen,
      "host:port of a plaintext port serving only gRPC health (overrides server.health_address)");
  flags.AddString("metrics-listen", &f.metrics_listen,
                  "host:port of the Prometheus endpoint (overrides server.metrics_address)");
  flags.AddString("store", &f.store, "store directory (overrides server.store_dir)");
  flags.AddString("cert", &f.cert, "PEM server certificate chain (overrides server.tls.cert_file)");
  flags.AddString("key", &f.key, "PEM key of --cert (overrides server.tls.key_file)");
  flags.AddString("client-ca", &f.client_ca,
                  "PEM CA that signs client certificates (server.tls.client_ca_file)");
  flags.AddString("crl", &f.crl,
                  "PEM CRL of revoked client certificates, re-read on change and SIGHUP");
  flags.AddString(
      "operators", &f.operators,
      "certificate CNs that may call the Admin service, comma-separated (server.tls.operator_ids)");
  flags.AddString(
      "device", &f.device,
      "cpu, cuda or auto (the GPU when one is usable): where the round's updates are summed "
      "(the same bits on both) and the held-out evaluation computes; an evaluation that needs the "
      "CPU (INT8 precision) runs there with auto and is refused with cuda");
  flags.AddBool("insecure", &f.insecure,
                "serve plaintext without TLS: loopback addresses only (server.insecure)");
  flags.AddInt("linger-seconds", &f.linger_seconds,
               "keep serving this long after the run finished");
  flags.AddInt("rounds", &f.rounds, "rounds to run (overrides the config's rounds)");
  flags.SetDefaultText("rounds", "the config's");
  flags.AddString("out", &f.out,
                  "when the run finishes, write its final adapter to OUT/adapter (PEFT's files "
                  "with the labels, "
                  "max_seq_len and prompt settings)");
  flags.AddBool("out-every-round", &f.out_every_round,
                "with --out: also each committed round's adapter to OUT/round-N");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (f.out_every_round && f.out.empty())
    return UsageError(argv[0], "--out-every-round needs --out DIR");
  if (f.rounds != -1 && (f.rounds < 1 || f.rounds > 1'000'000)) {
    return UsageError(argv[0], "--rounds must be 1-1000000");
  }
  absl::Status s = Serve(f);
  return s.ok() ? kExitOk : Fail(argv[0], s);
}

}  // namespace fedlora::tools
