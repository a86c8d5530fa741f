// Every client's heartbeats, sent from a process of their own (LoadOptions::probe_process).
//
// 200 clients moving 1.6 GB a round in one process queue their own calls behind each other: the
// trivial baseline server, answered from that process, shows seconds of p99 in the download burst,
// and heartbeats that wait that long make the server declare their clients dead. A client on a
// machine of its own has no such queue. The prober stands in for the clients' heartbeat threads:
// the clients still download, train and upload from the load process, but their Heartbeat (and,
// for every probe_every-th, the WaitForTask(max_wait 0) probe and the baseline Heartbeat) go out
// from this second process, which moves no bulk data. The load process publishes each client's
// session and held task into a table in shared memory (ProbeTable); the prober reads it before
// every heartbeat.
//
//   ProbeTable* table = ProbeTable::Create(clients);    // before fork()
//   if (fork() == 0) RunProber(options, table, setup_pipe[0], dir + "/probe.bin");
//   ...SendProberSetup(setup_pipe[1], {port, sink_port, t0, deadline});
//   table->Publish(client, session, task_id, round);     // whenever they change
//   table->MarkDone(client);                             // the client's run is over
//   ...waitpid, then ReadProbeResults(dir + "/probe.bin", clients)
#pragma once

#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/load/load_harness.h"

namespace fedlora::load {

using Steady = std::chrono::steady_clock;

// One timed call; start_ms from the run's t0 (steady_clock is one clock for every process).
struct Sample {
  Rpc rpc;
  double start_ms;
  double dur_ms;
  bool ok;
  int code;  // grpc::StatusCode
};

// A channel with its own TCP connection, as a separate machine would have; index tells them apart.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int index);

// Slot i is client i. Lives in MAP_SHARED memory, guarded by a process-shared mutex; never
// unmapped (a load run makes one).
class ProbeTable {
 public:
  static constexpr size_t kMaxField = 128;  // session tokens and task ids are far shorter
  // nullptr when the shared mapping cannot be made.
  static ProbeTable* Create(int slots);

  int slots() const { return slots_; }
  // False when a field is longer than kMaxField.
  bool Publish(int slot, const std::string& session, const std::string& task_id,
               uint64_t task_round);
  void MarkDone(int slot);
  struct View {
    std::string session, task_id;
    uint64_t task_round = 0;
    bool done = false;
  };
  View Read(int slot);
  // Every prober thread stops at its next heartbeat.
  void Stop() { stop_.store(true); }
  bool stopped() const { return stop_.load(); }

 private:
  struct Slot {
    char session[kMaxField];
    char task_id[kMaxField];
    uint32_t session_len, task_len;
    uint64_t task_round;
    bool done;
  };
  ProbeTable() = default;
  Slot* slot(int i) { return reinterpret_cast<Slot*>(this + 1) + i; }

  pthread_mutex_t mu_;
  std::atomic<bool> stop_{false};
  int slots_ = 0;
};

struct ProberSetup {
  int port = 0, sink_port = 0;
  Steady::time_point t0, deadline;
};
// Writes the setup the prober waits for (it has to be forked before the servers' ports are known).
bool SendProberSetup(int fd, const ProberSetup& setup);

// The prober process: reads its setup from `setup_fd`, runs one heartbeat thread per slot until
// every slot is done (or the table is stopped, or the deadline passes), writes what it measured
// to `result_path` and exits.
[[noreturn]] void RunProber(const LoadOptions& options, ProbeTable* table, int setup_fd,
                            const std::string& result_path);

// What the prober measured for one client.
struct ProbeResult {
  std::vector<Sample> samples;
  std::vector<std::pair<uint64_t, std::string>> cancels;  // (round, task id) answered CANCEL_TASK
  int unauthenticated = 0;
};
// The results file RunProber leaves: per slot, in slot order. Read errors: NotFound, DataLoss.
bool WriteProbeResults(const std::string& path, const std::vector<ProbeResult>& results);
absl::StatusOr<std::vector<ProbeResult>> ReadProbeResults(const std::string& path, int slots);

}  // namespace fedlora::load
