// The load report's text: FormatReport for people, FormatFigures for scripts/load_test.sh.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/load/load_harness.h"

namespace fedlora::load {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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

std::string FormatReport(const LoadReport& r) {
  const LoadOptions& o = r.options;
  std::string out;
  auto line = [&](const std::string& s) { absl::StrAppend(&out, s, "\n"); };
  char b[512];
  std::snprintf(b, sizeof(b),
                "load: %d clients (each selected every round), %d rounds, adapter %.2f MiB "
                "(safetensors), update %.2f "
                "MiB sealed fp32 per client; per round %.0f MiB down + %.0f MiB up",
                o.clients, o.rounds, r.adapter_bytes / 1048576.0, r.upload_bytes / 1048576.0,
                o.clients * r.adapter_bytes / 1048576.0, o.clients * r.upload_bytes / 1048576.0);
  line(b);
  std::snprintf(
      b, sizeof(b),
      "      evaluation %lld ms (%s) per round; Heartbeat every %d s%s, dead after %lld ms of "
      "silence; "
      "WaitForTask long poll %d s; %s",
      static_cast<long long>(o.eval_ms), o.eval_burn ? "CPU burn" : "sleep", o.heartbeat_interval_s,
      o.idle_heartbeats ? " (also while idle)" : " (only while holding a task)",
      static_cast<long long>(o.heartbeat_timeout_ms), o.wait_for_task_s,
      o.probe_every > 0 ? absl::StrCat("every ", o.probe_every,
                                       "th client probes WaitForTask(max_wait 0) at each heartbeat")
                              .c_str()
                        : "no WaitForTask probes");
  line(b);
  line(absl::StrCat(
      "      server bulk work (uploads, download indexing, aggregation, evaluation) at nice +",
      o.server_bulk_work_nice, "; clients at nice +", o.clients_nice,
      "; probing clients' heartbeats from ",
      o.probe_process ? "the prober process" : "the clients' process"));
  if (r.valid()) {
    line(absl::StrCat("validated: ", r.rounds_committed, " rounds committed with ", o.clients,
                      " updates each, every update accepted once; final adapter = initial + rounds "
                      "x delta, bit for bit"));
  } else {
    line(absl::StrCat("VALIDATION PROBLEMS (", r.problems.size(), "):"));
    for (const std::string& p : r.problems) line(absl::StrCat("  - ", p));
  }
  line(
      "rounds (seconds): selection = previous commit (round 1: all joined) .. first task; spread = "
      "first .. last task "
      "received;");
  line(
      "  burst = first task .. last download; uploads = .. last ack; aggregation = .. commit; "
      "round = first task .. commit");
  line(
      "  round  selection  spread   burst  uploads  aggregation  round   eval(ms)  updates  RSS "
      "after(MiB)  fds after");
  std::vector<double> rt, bt, at;
  for (const RoundFigures& f : r.rounds) {
    std::snprintf(b, sizeof(b),
                  "  %5llu  %9.2f  %6.2f  %6.2f  %7.2f  %11.2f  %6.2f  %8.0f  %7d  %14.1f  %9lld",
                  static_cast<unsigned long long>(f.round), f.selection_s, f.task_spread_s,
                  f.burst_s, f.uploads_s, f.aggregation_s, f.round_s, f.eval_ms_reported,
                  f.updates_in_history, f.rss_kb_after / 1024.0,
                  static_cast<long long>(f.fds_after));
    line(b);
    rt.push_back(f.round_s);
    bt.push_back(f.burst_s);
    at.push_back(f.aggregation_s);
  }
  std::snprintf(b, sizeof(b), "  median round %.2f s, burst %.2f s, aggregation/evaluation %.2f s",
                Median(rt), Median(bt), Median(at));
  line(b);
  line("latency, ms (count, p50, p99, max, errors), by the phase in which each call was sent:");
  std::snprintf(b, sizeof(b), "  %-26s %-24s %7s %9s %9s %9s %6s", "call", "phase", "count", "p50",
                "p99", "max", "err");
  line(b);
  for (int rpc = 0; rpc < kNumRpcs; ++rpc) {
    for (int p = 0; p < kNumPhases; ++p) {
      const LatencyStats& s = r.latency[rpc][p];
      if (s.count == 0) continue;
      std::snprintf(b, sizeof(b), "  %-26s %-24s %7lld %9.2f %9.2f %9.2f %6lld",
                    RpcName(static_cast<Rpc>(rpc)), PhaseName(static_cast<Phase>(p)),
                    static_cast<long long>(s.count), s.p50_ms, s.p99_ms, s.max_ms,
                    static_cast<long long>(s.errors));
      line(b);
    }
  }
  if (!r.errors_by_code.empty()) {
    std::string e;
    for (const auto& [k, n] : r.errors_by_code)
      absl::StrAppend(&e, e.empty() ? "" : ", ", k, " x", n);
    line(absl::StrCat("  failed calls: ", e));
  }
  for (int p = 0; p < kNumPhases; ++p) {
    for (const std::string& w : r.slowest_heartbeats[p]) {
      line(absl::StrCat("  slowest ", RpcName(r.goal_heartbeat()), ", ",
                        PhaseName(static_cast<Phase>(p)), ": ", w));
    }
  }
  std::snprintf(b, sizeof(b),
                "  task delivery: the last client got its task up to %.2f s after the first (max "
                "over rounds)",
                r.max_task_spread_s);
  line(b);
  std::snprintf(
      b, sizeof(b),
      "server process (pid %d, sampled every %lld ms): VmRSS %.1f MiB when all joined, peak %.1f, "
      "end %.1f; "
      "VmHWM %.1f MiB; open fds %lld when all joined, max %lld, end %lld; threads max %lld",
      static_cast<int>(r.server_pid), static_cast<long long>(o.sample_ms), r.rss_start_kb / 1024.0,
      r.rss_peak_kb / 1024.0, r.rss_end_kb / 1024.0, r.hwm_end_kb / 1024.0,
      static_cast<long long>(r.fds_start), static_cast<long long>(r.fds_max),
      static_cast<long long>(r.fds_end), static_cast<long long>(r.threads_max));
  line(b);
  line(absl::StrCat("  peak VmRSS sampled ", r.rss_peak_at));
  std::snprintf(b, sizeof(b),
                "server counters: updates accepted %lld, duplicate %lld, rejected %lld, rounds "
                "abandoned %lld, quota "
                "refusals %lld; log: %lld warnings, %lld errors",
                static_cast<long long>(r.updates_accepted_total),
                static_cast<long long>(r.updates_duplicate_total),
                static_cast<long long>(r.updates_rejected_total),
                static_cast<long long>(r.rounds_abandoned_total),
                static_cast<long long>(r.quota_refusals_total),
                static_cast<long long>(r.log_warnings), static_cast<long long>(r.log_errors));
  line(b);
  for (const std::string& l : r.log_excerpt) line(absl::StrCat("  log: ", l));
  std::snprintf(b, sizeof(b),
                "liveness: %d live clients declared dead (%d told their session expired, %d had a "
                "task cancelled that "
                "was never accepted); server's live count min %d of %d over %lld Admin samples (by "
                "phase: %d, %d, %d)",
                r.declared_dead, r.clients_unauthenticated, r.clients_cancelled, r.min_connected,
                o.clients, static_cast<long long>(r.admin_samples),
                r.min_connected_by_phase[kBurst], r.min_connected_by_phase[kAggregation],
                r.min_connected_by_phase[kOther]);
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
  line(absl::StrCat("goal: no live client declared dead: ",
                    r.liveness_goal_met() ? "MET" : "MISSED"));
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
  static const char* kRpcKey[] = {"heartbeat", "wait_probe", "wait_long", "download",
                                  "upload",    "admin",      "baseline",  "probe_heartbeat"};
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
