// The aggregation server under load: one Server in a child process (so that its RSS and file
// descriptors are its own) and N raw-protocol clients in this process, over 127.0.0.1 plaintext,
// every client selected every round. Shared by the CI test (tests/load/load_test.cc) and the
// benchmark (bench/load/load_bench.cc).
//
//   fedlora::load::LoadOptions o;          // 200 clients, 4 rounds, 4 MiB adapter, 3 s CPU-burn eval
//   FEDLORA_ASSIGN_OR_RETURN(LoadReport r, RunLoad(o));   // fork()s: call before any thread exists
//   std::printf("%s", FormatReport(r).c_str());
//
// Each client: Join, then WaitForTask long polls; on a task it downloads the global adapter (chunk
// count and byte count checked, chunk hashes not: that is client CPU the server does not spend),
// "trains" at once (a fixed delta, encoded once for everyone; only its last value differs per
// client, +e or -e, so that the mean is the common delta exactly when every update is counted
// once), seals it to the run's aggregation key, uploads it (resuming through GetUploadStatus after
// a broken stream) and reports metrics. A second thread per client sends Heartbeat every
// heartbeat interval, with the task id while it holds one and (idle_heartbeats) without one
// otherwise; every probe_every-th client also sends WaitForTask with max_wait_seconds 0 at each
// heartbeat, which the server answers at once, then the same Heartbeat to the baseline server
// (kBaseline). With probe_process (the default) every client's heartbeats and probes go out from
// the prober process instead (prober.h; kProbeHeartbeat), which moves no bulk data, as from
// machines of their own; and this process runs at clients_nice, so that the clients' bulk work
// takes only the CPU the server leaves. Every call is timed with steady_clock.
//
// Phases, from the clients' events and the server's round history (its commit times):
//   download burst           round r's first task received .. the last client has downloaded it
//   aggregation/evaluation   round r's last upload ack received .. round r committed (server time)
//   other                    the rest (selection, uploads, between rounds)
// A call counts in the phase in which it was sent. (A stall that a call sent earlier runs into
// shows in that call's phase; FormatReport places the slowest Heartbeats in their round.)
//
// "Declared dead": a client answered UNAUTHENTICATED (its session expired for silence), or
// CANCEL_TASK for a task whose update never got accepted, or missing from the server's live count
// (Admin GetStatus.connected_clients) while the run was on. All clients stay alive throughout, so
// every such declaration is wrong. LoadReport::declared_dead counts clients of the first two kinds;
// min_connected shows the third.
//
// Processes: the fedlora server, a trivial baseline server (see kBaseline), the prober (see
// probe_process) and this one, which runs the clients and samples the server's
// /proc/<pid>/status (VmRSS, VmHWM, Threads) and /proc/<pid>/fd every sample_ms.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fedlora::load {

struct LoadOptions {
  int clients = 200;
  int rounds = 4;
  // Size of the adapter's fp32 values, KiB: 16 layers x (lora_A [r, 1024] + lora_B [1024, r]),
  // r = adapter_kib / 128 (at least 1), so 4096 KiB is rank 32. Each upload is the same size.
  int64_t adapter_kib = 4096;
  // Server-side evaluation per round, milliseconds, on the round driver thread: a CPU burn (true),
  // which competes for the cores as a real forward pass would, or a sleep (false).
  int64_t eval_ms = 3000;
  bool eval_burn = true;
  // ServerOptions::bulk_work_nice of the server (0: its bulk work at its own priority).
  int server_bulk_work_nice = 10;
  // Niceness added to this process (the clients) once the servers and the prober are forked: the
  // clients stand for machines of their own, whose CPUs the server would not share. 0: the
  // clients compete with the server for the cores on equal terms.
  int clients_nice = 19;
  // Run config heartbeat interval (seconds) and the server's dead-client timeout (milliseconds).
  int heartbeat_interval_s = 1;
  int64_t heartbeat_timeout_ms = 3000;
  // Heartbeat while idle too (waiting for a task). False: only while holding a task, as the SDK does.
  bool idle_heartbeats = true;
  // Every n-th client probes WaitForTask(max_wait 0) at each heartbeat; 0: no probes.
  int probe_every = 4;
  // Every client's heartbeats (and the probes) go out from a process of their own (prober.h), as
  // from machines of their own; false: from this process, queued behind every client's bulk data.
  bool probe_process = true;
  // WaitForTask long poll, seconds (the SDK's default 20).
  int wait_for_task_s = 20;
  // The whole run is abandoned after this long, milliseconds.
  int64_t run_timeout_ms = 600'000;
  // Server RSS/fd and Admin status sampling period, milliseconds.
  int64_t sample_ms = 100;
  // Where the server child's stderr goes; empty: a file in the run's temp dir, scanned, then removed.
  std::string server_log;
  // When set, every timed call is written there as CSV (call, client, phase, start_ms, dur_ms, code;
  // start_ms from the run's start), for plotting.
  std::string samples_csv;
};

enum Phase { kBurst = 0, kAggregation = 1, kOther = 2, kNumPhases = 3 };
const char* PhaseName(Phase p);

// The timed calls.
// kBaseline: the probing clients' Heartbeat to a trivial Federation server in a third process
// (answers at once, no state): what the machine and the client process alone cost a call, at the
// same moments, so that the server's share of the latency can be told apart on a busy machine.
// kProbeHeartbeat: the clients' Heartbeat sent from the prober process (prober.h), which moves no
// bulk data: the server's latency without the load process's own queue in it.
enum Rpc {
  kHeartbeat = 0,
  kWaitProbe,
  kWaitLong,
  kDownload,
  kUpload,
  kAdminStatus,
  kBaseline,
  kProbeHeartbeat,
  kNumRpcs
};
const char* RpcName(Rpc r);

struct LatencyStats {
  int64_t count = 0;
  int64_t errors = 0;  // calls that ended with a non-OK status
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
};

struct RoundFigures {
  uint64_t round = 0;
  int updates_in_history = -1;  // the server's count for the committed round (-1: not committed)
  int tasks = 0;                // clients that received a task of this round
  int accepted = 0;             // ACCEPTED acks, not duplicates
  int duplicates = 0;           // acks marked duplicate
  // Seconds: previous commit (or all clients joined) .. first task; first .. last task received;
  // first task .. last download; last download .. last ack; last ack .. commit; first task .. commit.
  double selection_s = 0, task_spread_s = 0, burst_s = 0, uploads_s = 0, aggregation_s = 0,
         round_s = 0;
  double eval_ms_reported = -1;  // the evaluator's own timing, from the round's eval metrics
  // Server RSS (KiB) and open fds at the first sample after the commit.
  int64_t rss_kb_after = -1, fds_after = -1;
};

struct ResourceSample {
  double t_ms = 0;  // since the run's start
  int64_t rss_kb = 0, hwm_kb = 0, fds = 0, threads = 0;
};

struct LoadReport {
  LoadOptions options;
  pid_t server_pid = 0;
  double wall_s = 0;
  int64_t adapter_bytes = 0;  // safetensors blob clients download
  int64_t upload_bytes = 0;   // one sealed update
  // Validation: every problem found (empty: the run is valid).
  std::vector<std::string> problems;
  bool finished = false;       // every client was told RunFinished
  bool adapter_exact = false;  // final adapter == initial + rounds x delta, bit for bit
  int rounds_committed = 0;
  std::vector<RoundFigures> rounds;
  std::array<std::array<LatencyStats, kNumPhases>, kNumRpcs> latency{};
  std::array<LatencyStats, kNumRpcs> latency_all{};
  // Failed calls by RPC and gRPC status code name ("Heartbeat UNAUTHENTICATED" -> count).
  std::map<std::string, int64_t> errors_by_code;
  // Long-poll wake-up: for each task answer, seconds from the round's first task answer.
  double max_task_spread_s = 0;
  // Liveness as the clients saw it, and as the server counted it.
  int clients_unauthenticated = 0;  // clients told their session expired (distinct)
  int clients_cancelled = 0;  // clients whose task was cancelled and never accepted (distinct)
  int declared_dead = 0;      // union of the two
  int min_connected = -1;     // lowest Admin connected_clients while the run was on
  std::array<int, kNumPhases> min_connected_by_phase{-1, -1, -1};  // the same, by phase
  int64_t admin_samples = 0;
  // The slowest Heartbeats of each phase, placed in their round: "round 2, 1.23 s after its first
  // task (last download +4.00, last ack +9.10, commit +15.20): 812 ms".
  std::array<std::vector<std::string>, kNumPhases> slowest_heartbeats;
  // Server process.
  std::vector<ResourceSample> resources;
  int64_t rss_start_kb = 0, rss_peak_kb = 0, rss_end_kb = 0, hwm_end_kb = 0;
  int64_t fds_start = 0, fds_max = 0, fds_end = 0, threads_max = 0;
  std::string rss_peak_at;  // where in its round the peak VmRSS sample fell
  // Server counters at the end (Prometheus text), -1 when missing.
  int64_t updates_accepted_total = -1, updates_duplicate_total = -1, updates_rejected_total = -1,
          rounds_abandoned_total = -1, quota_refusals_total = -1;
  // Server log: warning and error lines, and a few of them.
  int64_t log_warnings = 0, log_errors = 0;
  std::vector<std::string> log_excerpt;

  bool valid() const { return problems.empty(); }
  // The goal: Heartbeat p99 under 100 ms in every phase, and no client declared dead. The
  // heartbeats it is measured on: the prober's when there is one, else every client's.
  Rpc goal_heartbeat() const {
    return latency_all[kProbeHeartbeat].count > 0 ? kProbeHeartbeat : kHeartbeat;
  }
  bool heartbeat_goal_met() const;
  bool liveness_goal_met() const { return declared_dead == 0 && min_connected >= options.clients; }
};

// Runs the load. fork()s the server first: call it before this process has started any thread
// (gRPC, a thread pool). Errors: setting up (temp dir, fork, the server not starting); problems of
// the run itself (a round not committing, a client declared dead, a wrong adapter) are in
// LoadReport::problems.
absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options);

// Human-readable figures, and "figure <key> <value>" lines for scripts/load_test.sh.
std::string FormatReport(const LoadReport& report);
std::string FormatFigures(const LoadReport& report);

}  // namespace fedlora::load
