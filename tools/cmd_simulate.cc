// fedlora simulate: a whole federation on one machine, over the real protocol (see sim/simulator.h).
//
//   fedlora simulate --config configs/default.json --out runs/default
//   fedlora simulate --config configs/iid.json --rounds 3 --num-clients 4 --seed 7
//
// Writes into --out: rounds.jsonl / rounds.csv / rounds.svg (rewritten after every round),
// summary.json, final_adapter.safetensors, adapter/ (PEFT's files with the labels, max_seq_len and
// prompt settings: model/adapter_dir.h) and store/ (the server's store).
// Prints the per-round summary table on stdout and the progress line on stderr. The log of the
// server and the virtual clients is appended to --out/server.log (or --log-file); its WARNING and
// ERROR lines are copied to stderr. --verbose sends the whole log (DEBUG up) to stderr instead.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "config/config_io.h"
#include "config/resolved.h"
#include "core/logging.h"
#include "core/status.h"
#include "sim/simulator.h"
#include "tools/common.h"

namespace fedlora::tools {
namespace {

struct SimulateFlags {
  std::string config_path;
  std::string out_dir = "runs/simulate";
  int64_t rounds = -1;   // -1: keep the config's
  int64_t clients = -1;  // -1: keep the config's simulation.num_clients
  uint64_t seed = 0;
  bool seed_given = false;
  int parallelism = -1;          // -1: keep the config's simulation.parallelism
  float crash_probability = -1;  // -1: keep the config's simulation.crash_probability
  int shards_per_client = 0;     // > 0: LABEL_SHARDS with this many labels per client
  float max_seconds = 0.0f;
  bool progress = true;
  bool mtls = false;
  std::string device = "cpu";
  std::string references;  // LABEL=VALUE,... for rounds.svg
  LogFlags log;
};

// --reference "centralized=0.7725,other=0.7": each a label and a finite number.
absl::StatusOr<std::vector<sim::ReferenceLine>> ParseReferences(const std::string& text) {
  std::vector<sim::ReferenceLine> out;
  if (text.empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const size_t eq = item.rfind('=');
    sim::ReferenceLine r;
    if (eq != absl::string_view::npos)
      r.label = std::string(absl::StripAsciiWhitespace(item.substr(0, eq)));
    if (eq == absl::string_view::npos || r.label.empty() ||
        !absl::SimpleAtod(item.substr(eq + 1), &r.value) || !std::isfinite(r.value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--reference: '", item, "' is not LABEL=NUMBER (e.g. centralized=0.7725)"));
    }
    out.push_back(std::move(r));
  }
  return out;
}

// Where the log goes: --log-file when given ("-": stderr), else stderr with --verbose, else
// out_dir/server.log. Empty: stderr.
std::string LogPath(const SimulateFlags& f) {
  if (!f.log.file.empty()) return LogFilePath(f.log);
  return f.log.verbose ? std::string() : f.out_dir + "/server.log";
}

// The flags' overrides of the config (rounds, seed, clients, and the simulation section).
void ApplyOverrides(const SimulateFlags& f, v1::RunConfig& config) {
  if (f.rounds >= 0) config.set_rounds(static_cast<uint32_t>(f.rounds));
  if (f.seed_given) config.set_seed(f.seed);
  if (f.clients >= 0) {
    const uint32_t n = static_cast<uint32_t>(f.clients);
    config.mutable_simulation()->set_num_clients(n);
    v1::SelectionConfig* sel = config.mutable_selection();
    // Fewer clients than a round needs could never fill one: shrink the round to fit.
    if (sel->clients_per_round() > n) {
      FEDLORA_SAY("fedlora simulate: clients_per_round %u -> %u to fit --num-clients\n",
                  sel->clients_per_round(), n);
      sel->set_clients_per_round(n);
    }
    if (sel->min_clients() > sel->clients_per_round())
      sel->set_min_clients(sel->clients_per_round());
  }
  v1::SimulationConfig* sim = config.mutable_simulation();
  if (f.parallelism >= 0) sim->set_parallelism(static_cast<uint32_t>(f.parallelism));
  if (f.crash_probability >= 0) sim->set_crash_probability(f.crash_probability);
  if (f.shards_per_client > 0) {
    sim->set_partition(v1::SimulationConfig::LABEL_SHARDS);
    sim->set_shards_per_client(static_cast<uint32_t>(f.shards_per_client));
  }
}

// The summary table on stdout, and on stderr the final figure and where the reports are.
void PrintOutcome(const SimulateFlags& f, const v1::RunConfig& config, const std::string& log_path,
                  const sim::SimResult& result) {
  std::cout << sim::SummaryTable(result.rounds) << std::flush;
  if (!result.rounds.empty()) {
    const sim::RoundRecord &first = result.rounds.front(), &last = result.rounds.back();
    // A decoder run without exact match has perplexity only.
    const bool perplexity =
        !std::isfinite(last.eval_accuracy) && std::isfinite(last.eval_perplexity);
    FEDLORA_SAY(
        "fedlora simulate: %s %.4f after %d rounds (untuned %.4f), %.1f s; reports in %s "
        "(rounds.jsonl, rounds.csv, rounds.svg, summary.json), adapter in %s/adapter%s%s\n",
        perplexity ? "perplexity" : "accuracy",
        perplexity ? last.eval_perplexity : last.eval_accuracy, last.round,
        perplexity ? first.eval_perplexity : first.eval_accuracy, result.seconds, f.out_dir.c_str(),
        f.out_dir.c_str(), log_path.empty() ? "" : ", log in ", log_path.c_str());
    if (std::isfinite(last.dp_epsilon)) {
      FEDLORA_SAY(
          "fedlora simulate: differential privacy: epsilon %.4f at delta %g after %d rounds\n",
          last.dp_epsilon, config.privacy().dp().target_delta(), last.round);
    }
  }
}

absl::Status Simulate(const SimulateFlags& f) {
  // The simulated federation runs on loopback in plaintext (its server picks a free port), whatever
  // the config's server section says; a config that asks for TLS is refused rather than ignored.
  bool asks_for_tls = false;
  FEDLORA_ASSIGN_OR_RETURN(v1::RunConfig config,
                           LoadRunConfigFile(f.config_path, [&](v1::RunConfig* c) {
                             asks_for_tls = c->server().has_tls();
                             c->mutable_server()->clear_tls();
                             c->mutable_server()->set_listen_address("127.0.0.1:0");
                             c->mutable_server()->set_insecure(true);
                           }));
  if (asks_for_tls) {
    return absl::InvalidArgumentError(
        "server.tls: `fedlora simulate` runs its virtual clients over loopback without TLS; remove "
        "server.tls "
        "(updates are still sealed end to end)");
  }
  ApplyOverrides(f, config);
  ApplyRunConfigDefaults(&config);
  FEDLORA_RETURN_IF_ERROR(ValidateRunConfig(config));
  FEDLORA_RETURN_IF_ERROR(CheckRunConfigInputsExist(config, /*reads_train_data=*/true));

  const std::string log_path = LogPath(f);
  FEDLORA_RETURN_IF_ERROR(OpenLogFile(log_path));
  // The file is appended to: this line marks where a run starts.
  FEDLORA_LOG(INFO) << "fedlora simulate: run " << config.run_id() << ", config " << f.config_path
                    << ", out " << f.out_dir;

  sim::SimOptions options;
  options.out_dir = f.out_dir;
  options.max_seconds = f.max_seconds;
  options.progress = f.progress;
  options.mtls = f.mtls;
  FEDLORA_ASSIGN_OR_RETURN(options.references, ParseReferences(f.references));
  FEDLORA_ASSIGN_OR_RETURN(const DevicePlan devices,
                           PlanDevices(f.device, RunRole::kSimulator, config));
  options.device = devices.models;  // and its updates' (devices.updates is the same)
  FEDLORA_ASSIGN_OR_RETURN(ResolvedRunConfig resolved, ResolveRunConfig(config));
  absl::StatusOr<sim::SimResult> run = sim::RunSimulation(std::move(resolved), options);
  if (!run.ok()) {
    if (!log_path.empty()) FEDLORA_SAY("fedlora simulate: the log is in %s\n", log_path.c_str());
    return run.status();
  }
  PrintOutcome(f, config, log_path, *run);
  return absl::OkStatus();
}

}  // namespace

int RunSimulate(int argc, char** argv) {
  const std::string command = argv[0];
  SimulateFlags f;
  FlagSet flags(
      command,
      "Runs a federation on this machine: one aggregation server and N virtual clients speaking "
      "the\n"
      "real protocol over loopback, with the partitioning and faults of the config's simulation\n"
      "section. Writes per-round reports (JSONL, CSV, SVG) and the final adapter into --out.\n"
      "The console shows the progress line and the summary table; the log of the server and the\n"
      "clients is appended to <out>/server.log (or --log-file), and its WARNING and ERROR lines\n"
      "are copied to stderr. --verbose (or --log-file -) sends the log to stderr instead.");
  flags.AddString("config", &f.config_path, "run config (JSON, see proto/fedlora/v1/config.proto)",
                  true);
  flags.AddString("out", &f.out_dir, "output directory (its store/ subdirectory is recreated)");
  flags.AddInt("rounds", &f.rounds, "override the config's rounds");
  flags.AddInt("num-clients", &f.clients,
               "override simulation.num_clients (clients_per_round shrinks to fit)");
  flags.AddRenamed("clients", "num-clients", "the number of virtual clients");
  flags.AddUint("seed", &f.seed, "override the config's seed");
  flags.AddInt(
      "parallelism", &f.parallelism,
      "override simulation.parallelism: virtual clients training at once (0: the number of cores)");
  flags.AddFloat("crash-probability", &f.crash_probability,
                 "override simulation.crash_probability: a selected client's upload is cut off "
                 "midway (it resumes)");
  flags.AddInt("shards-per-client", &f.shards_per_client,
               "partition by label shards (LABEL_SHARDS), this many labels per client");
  flags.AddFloat("max-seconds", &f.max_seconds, "give up when the run takes longer (0: no limit)");
  flags.AddBool("progress", &f.progress, "show a progress line on stderr");
  for (const char* name : {"rounds", "num-clients", "seed", "parallelism", "crash-probability"}) {
    flags.SetDefaultText(name, "the config's");
  }
  flags.SetDefaultText("shards-per-client", "the config's partition");
  flags.AddString("device", &f.device,
                  "cpu, cuda or auto (the GPU when one is usable): where the virtual clients and "
                  "the evaluation "
                  "compute and the server sums; a run that needs the CPU (INT8 precision) "
                  "runs there with auto and is refused with cuda");
  flags.AddBool(
      "mtls", &f.mtls,
      "serve the federation over mutual TLS with a development PKI made for the run in <out>/pki");
  flags.AddString(
      "reference", &f.references,
      "LABEL=VALUE[,LABEL=VALUE...]: figures drawn across rounds.svg's accuracy (or perplexity) "
      "panel for comparison, e.g. centralized=0.7725");
  if (auto code = ParseFlagsOrExit(flags, argc, argv, &f.log)) return *code;
  if (!flags.positional().empty())
    return UsageError(command, "unexpected argument '" + flags.positional()[0] + "'");
  if (absl::StatusOr<std::vector<sim::ReferenceLine>> r = ParseReferences(f.references); !r.ok()) {
    return UsageError(command, std::string(r.status().message()));
  }
  // A json log holds json only: the redrawn progress line is off unless asked for.
  if (GetLogFormat() == LogFormat::kJson && !flags.WasSet("progress")) f.progress = false;
  // An override given is checked whole: -1 typed is refused, not taken as "the config's".
  f.seed_given = flags.WasSet("seed");
  if (flags.WasSet("rounds") && (f.rounds < 1 || f.rounds > 1'000'000)) {
    return UsageError(command, "--rounds must be 1-1000000");
  }
  if (flags.WasSet("num-clients") && f.clients < 1)
    return UsageError(command, "--num-clients must be >= 1");
  if (flags.WasSet("parallelism") && f.parallelism < 0)
    return UsageError(command, "--parallelism must be >= 0");
  if (flags.WasSet("crash-probability") &&
      !(f.crash_probability >= 0 && f.crash_probability <= 1)) {
    return UsageError(command, "--crash-probability must be in [0, 1]");
  }
  if (f.shards_per_client < 0) return UsageError(command, "--shards-per-client must be >= 0");
  if (absl::Status s = Simulate(f); !s.ok()) return Fail(command, s);
  return kExitOk;
}

}  // namespace fedlora::tools
