// The aggregation server under load (see tests/load/load_harness.h for what runs and how phases
// and "declared dead" are defined).
//
//   load_server_bench [key=value ...]
//     clients=200 rounds=4 adapter_kib=4096 eval_ms=3000 eval=burn|sleep bulk_nice=10 clients_nice=19
//     hb_interval_s=1
//     hb_timeout_ms=3000 idle_heartbeats=1 probe_every=4 probe_process=1 wait_s=20 timeout_s=600 server_log=PATH
//     samples_csv=PATH (every timed call, for plotting)
//
// Prints the figures, then "figure <key> <value>" lines (scripts/load_test.sh takes their medians
// over repetitions). Exit status: 0 valid run, 2 the run completed with validation problems (a
// client declared dead, a round short of updates; the figures are still printed), 1 setup failed.
//
// Napkin math for the defaults: 200 clients x 4 MiB = 800 MiB sent by the server at the start of
// each round (from the download cache: the blob verified and its chunks hashed once), and as much
// received (hashed, written, fsynced, unsealed, validated) before aggregation decodes 800 MiB again
// and evaluation burns 3 s of one core. On 2 cores that is several seconds of server CPU per
// round beside the clients' own (sealing and hashing 800 MiB): Heartbeat latency shows whether
// the server keeps answering small calls through it.
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "tests/load/load_harness.h"

int main(int argc, char** argv) {
  fedlora::load::LoadOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq),
                      value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    int64_t n = 0;
    const bool num = absl::SimpleAtoi(value, &n);
    if (key == "clients" && num)
      o.clients = static_cast<int>(n);
    else if (key == "rounds" && num)
      o.rounds = static_cast<int>(n);
    else if (key == "adapter_kib" && num)
      o.adapter_kib = n;
    else if (key == "eval_ms" && num)
      o.eval_ms = n;
    else if (key == "bulk_nice" && num)
      o.server_bulk_work_nice = static_cast<int>(n);
    else if (key == "clients_nice" && num)
      o.clients_nice = static_cast<int>(n);
    else if (key == "eval" && (value == "burn" || value == "sleep"))
      o.eval_burn = value == "burn";
    else if (key == "hb_interval_s" && num)
      o.heartbeat_interval_s = static_cast<int>(n);
    else if (key == "hb_timeout_ms" && num)
      o.heartbeat_timeout_ms = n;
    else if (key == "idle_heartbeats" && num)
      o.idle_heartbeats = n != 0;
    else if (key == "probe_every" && num)
      o.probe_every = static_cast<int>(n);
    else if (key == "probe_process" && num)
      o.probe_process = n != 0;
    else if (key == "wait_s" && num)
      o.wait_for_task_s = static_cast<int>(n);
    else if (key == "timeout_s" && num)
      o.run_timeout_ms = n * 1000;
    else if (key == "server_log")
      o.server_log = value;
    else if (key == "samples_csv")
      o.samples_csv = value;
    else {
      std::fprintf(stderr,
                   "unknown or malformed argument '%s' (see the top of bench/load/load_bench.cc)\n",
                   argv[i]);
      return 1;
    }
  }
  absl::StatusOr<fedlora::load::LoadReport> r =
      fedlora::load::RunLoad(o);  // forks: before any thread
  if (!r.ok()) {
    std::fprintf(stderr, "load run failed: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("%s%s", fedlora::load::FormatReport(*r).c_str(),
              fedlora::load::FormatFigures(*r).c_str());
  return r->valid() ? 0 : 2;
}
