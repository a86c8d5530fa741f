#include "tests/load/load_harness.h"

#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/update_io.h"
#include "fedlora/v1/admin.grpc.pb.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "tests/load/load_internal.h"
#include "tests/load/prober.h"

namespace fedlora::load {
namespace {

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
  auto rank = [&](double q) {
    return v[static_cast<size_t>(std::max<double>(0, std::ceil(q * v.size()) - 1))];
  };
  s.p50_ms = rank(0.50);
  s.p99_ms = rank(0.99);
  s.max_ms = v.back();
  return s;
}

const char* CodeName(int code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "?";
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

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options) {
  if (options.clients < 1 || options.rounds < 1 || options.heartbeat_interval_s < 1) {
    return absl::InvalidArgumentError("clients, rounds and heartbeat_interval_s must be >= 1");
  }
  TempDir dir;
  if (dir.path().empty()) return absl::InternalError("cannot create a temp dir");
  const std::string log_path =
      options.server_log.empty() ? dir.path() + "/server.log" : options.server_log;
  // Every child before any thread exists in this process. The prober first: it is told the ports
  // once they are known.
  ProbeTable* probes = nullptr;
  pid_t prober = -1;
  int probefd[2] = {-1, -1};
  const std::string probe_results = dir.path() + "/probe.bin";
  if (options.probe_process) {
    probes = ProbeTable::Create(options.clients);
    if (probes == nullptr || pipe(probefd) != 0)
      return absl::InternalError("cannot set up the prober (mmap, pipe)");
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
    return absl::UnavailableError(
        absl::StrCat("the load server did not start: ", text.str().substr(0, 2000)));
  }

  if (options.clients_nice >
      0) {  // no thread exists yet: every thread started from here inherits it
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
  const int64_t sys0_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
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
        codec.ok() ? EncodeUpdate(LoadAdapter(options.adapter_kib, true), *codec)
                   : absl::StatusOr<std::string>(codec.status());
    if (!encoded.ok() || codec->codec != CodecId::kRawF32 || codec->zstd) {
      kill_child();
      return absl::FailedPreconditionError(absl::StrCat(
          "the load run needs the raw fp32 codec without zstd: ", encoded.status().ToString()));
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
      admin_samples.push_back(
          {kAdminStatus, start, shared.NowMs() - start, s.ok(), static_cast<int>(s.error_code())});
      if (s.ok())
        admin_points.push_back(
            {start, response.phase(), static_cast<int>(response.connected_clients())});
      std::this_thread::sleep_for(std::chrono::milliseconds(options.sample_ms));
    }
  });

  std::vector<std::unique_ptr<LoadClient>> clients;
  for (int c = 0; c < options.clients; ++c)
    clients.push_back(std::make_unique<LoadClient>(c, &shared));
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
      report.problems.push_back(
          absl::StrCat("the prober did not finish cleanly (wait status ", status, ")"));
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
    if (!s.ok())
      report.problems.push_back(absl::StrCat("final Admin GetStatus: ", s.error_message()));
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
      if (it == lc.rounds.end() || it->second.accepted + it->second.duplicates == 0)
        cancelled.insert(static_cast<int>(c));
    }
    for (const auto& [round, ev] : lc.rounds) by_round[round].push_back(&ev);
  }
  report.finished = finished == options.clients;
  if (!report.finished) {
    report.problems.push_back(
        absl::StrCat(finished, " of ", options.clients, " clients were told the run finished"));
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
      report.problems.push_back(absl::StrCat("round ", f.round, " committed ", f.updates_in_history,
                                             " updates, not ", options.clients));
    }
    if (f.accepted != options.clients) {
      report.problems.push_back(absl::StrCat("round ", f.round, ": ", f.accepted,
                                             " clients had their update accepted, not ",
                                             options.clients));
    }
    report.rounds.push_back(f);
  }
  report.rounds_committed = static_cast<int>(final_status.history_size());
  if (report.rounds_committed != options.rounds) {
    report.problems.push_back(
        absl::StrCat(report.rounds_committed, " rounds committed, not ", options.rounds));
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
        csv << '"' << RpcName(s.rpc) << "\"," << client << ',' << PhaseName(phase_of(s)) << ','
            << s.start_ms << ',' << s.dur_ms << ',' << CodeName(s.code) << '\n';
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
      std::sort(hb[p].begin(), hb[p].end(),
                [](const Sample& a, const Sample& b) { return a.dur_ms > b.dur_ms; });
      for (size_t i = 0; i < hb[p].size() && i < 3; ++i) {
        const Sample& s = hb[p][i];
        const RoundTimes* rt = nullptr;
        for (const RoundTimes& t : times) {
          if (t.first_task <= s.start_ms + s.dur_ms)
            rt = &t;  // the latest round begun by the call's end
        }
        char b[256];
        if (rt == nullptr) {
          std::snprintf(b, sizeof(b), "%.0f ms, at %.2f s of the run, before round 1's first task",
                        s.dur_ms, s.start_ms / 1000.0);
        } else {
          std::snprintf(b, sizeof(b),
                        "%.0f ms, sent %+.2f s from round %llu's first task (last download %+.2f, "
                        "last ack %+.2f, "
                        "commit %+.2f)%s",
                        s.dur_ms, (s.start_ms - rt->first_task) / 1000.0,
                        static_cast<unsigned long long>(rt->round),
                        (rt->last_download - rt->first_task) / 1000.0,
                        (rt->last_accept - rt->first_task) / 1000.0,
                        (rt->commit - rt->first_task) / 1000.0,
                        s.ok ? "" : absl::StrCat(", ", CodeName(s.code)).c_str());
        }
        report.slowest_heartbeats[p].push_back(b);
      }
    }
  }

  // Liveness as the server counted it, from all joined until the run finished.
  for (const AdminPoint& a : admin_points) {
    if (all_joined_ms < 0 || a.t_ms < all_joined_ms || a.phase == v1::ROUND_PHASE_FINISHED)
      continue;
    ++report.admin_samples;
    report.min_connected =
        report.min_connected < 0 ? a.connected : std::min(report.min_connected, a.connected);
    int& m = report.min_connected_by_phase[phase_of(Sample{kAdminStatus, a.t_ms, 0, true, 0})];
    m = m < 0 ? a.connected : std::min(m, a.connected);
  }
  if (report.declared_dead > 0) {
    report.problems.push_back(absl::StrCat(report.declared_dead, " live clients declared dead (",
                                           report.clients_unauthenticated, " sessions expired, ",
                                           report.clients_cancelled, " tasks cancelled)"));
  }
  if (report.min_connected >= 0 && report.min_connected < options.clients) {
    report.problems.push_back(absl::StrCat("the server counted as few as ", report.min_connected,
                                           " of ", options.clients, " live clients as connected"));
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
      std::snprintf(b, sizeof(b), "at %.2f s of the run, before round 1's first task",
                    s.t_ms / 1000.0);
    } else {
      std::snprintf(b, sizeof(b),
                    "%+.2f s from round %llu's first task (last download %+.2f, last ack %+.2f, "
                    "commit %+.2f)",
                    (s.t_ms - rt->first_task) / 1000.0, static_cast<unsigned long long>(rt->round),
                    (rt->last_download - rt->first_task) / 1000.0,
                    (rt->last_accept - rt->first_task) / 1000.0,
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
                                           " accepted updates, not ",
                                           int64_t{options.clients} * options.rounds));
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
      if ((w || e) && report.log_excerpt.size() < 8)
        report.log_excerpt.push_back(line.substr(0, 300));
    }
  }
  return report;
}

}  // namespace fedlora::load
