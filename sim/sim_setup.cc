#include "sim/sim_setup.h"

#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "config/config_io.h"
#include "config/defaults.h"
#include "core/file.h"
#include "core/rng.h"
#include "core/status.h"
#include "crypto/certs.h"

namespace fedlora::sim {
namespace {

// Salt of the fault stream: faults never share random bits with training or selection.
constexpr uint64_t kFaultSalt = 0x6661'756c'7473'0001ull;  // "faults"

}  // namespace

absl::Status CheckSimulation(const v1::RunConfig& config, const SimOptions& options,
                             int num_clients) {
  const v1::SimulationConfig& sc = config.simulation();
  const int64_t per_round = config.selection().has_clients_per_round()
                                ? config.selection().clients_per_round()
                                : kDefaultClientsPerRound;
  if (options.out_dir.empty()) return absl::InvalidArgumentError("simulate: no output directory");
  if (per_round > num_clients) {
    return absl::InvalidArgumentError(absl::StrCat("selection.clients_per_round (", per_round,
                                                   ") exceeds simulation.num_clients (",
                                                   num_clients, "): no round could ever fill"));
  }
  if (!(sc.crash_probability() >= 0 && sc.crash_probability() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulation.crash_probability ", sc.crash_probability(), " is not in [0, 1]"));
  }
  // Refuse what fedlora does not do yet, before anything is written (configs built in code skip
  // ValidateRunConfig).
  if (std::vector<std::string> refused = UnimplementedSettings(config); !refused.empty()) {
    return absl::UnimplementedError(absl::StrCat("simulate: ", absl::StrJoin(refused, "; ")));
  }
  for (const InjectedFault& f : options.faults) {
    if (f.client < 0 || f.client >= num_clients) {
      return absl::InvalidArgumentError(
          absl::StrCat("injected fault names client ", f.client, " of ", num_clients));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", options.out_dir, ": ", ec.message()));
  // The store is the simulation's own: a leftover one would make the server resume an old run.
  std::filesystem::remove_all(options.out_dir + "/store", ec);
  std::filesystem::remove_all(options.out_dir + "/clients", ec);
  return absl::OkStatus();
}

absl::StatusOr<Partition> PartitionClients(const v1::RunConfig& config, const SimData& data,
                                           int num_clients) {
  const v1::SimulationConfig& sc = config.simulation();
  if (sc.partition() == v1::SimulationConfig::BY_KEY) {
    return PartitionByKey(data.train_keys, num_clients, config.seed());
  }
  PartitionOptions po;
  po.num_clients = num_clients;
  po.seed = config.seed();
  po.dirichlet_alpha = sc.has_dirichlet_alpha() ? sc.dirichlet_alpha() : kDefaultDirichletAlpha;
  po.scheme = sc.partition() == v1::SimulationConfig::DIRICHLET ? PartitionScheme::kDirichlet
                                                                : PartitionScheme::kIid;
  if (sc.partition() == v1::SimulationConfig::LABEL_SHARDS) {
    po.scheme = PartitionScheme::kLabelShards;
    po.shards_per_client = static_cast<int>(sc.has_shards_per_client() ? sc.shards_per_client()
                                                                       : kDefaultShardsPerClient);
  }
  return PartitionByLabel(data.workload.train_labels, data.num_partition_labels(), po);
}

absl::StatusOr<ServerTlsOptions> MakeSimulationPki(const std::string& out_dir, int num_clients) {
  const std::string dir = out_dir + "/pki/";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("creating ", dir, ": ", ec.message()));
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  crypto::CertificateRequest r;
  r.common_name = "fedlora simulation CA";
  r.not_after_unix_s = now + 7 * 86400;
  FEDLORA_ASSIGN_OR_RETURN(crypto::PemPair ca, crypto::CreateCertificateAuthority(r));
  auto write = [&dir](const std::string& name, const crypto::PemPair& pair) -> absl::Status {
    FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(dir + name + ".pem", pair.cert_pem));
    return WriteFileAtomically(dir + name + ".key", pair.key_pem);
  };
  FEDLORA_RETURN_IF_ERROR(write("ca", ca));
  r.common_name = "localhost";
  r.ip_addresses = {"127.0.0.1"};
  r.dns_names = {"localhost"};
  FEDLORA_ASSIGN_OR_RETURN(crypto::PemPair server, crypto::IssueServerCertificate(ca, r));
  FEDLORA_RETURN_IF_ERROR(write("server", server));
  r.ip_addresses.clear();
  r.dns_names.clear();
  for (int i = 0; i < num_clients; ++i) {
    r.common_name = absl::StrFormat("sim-client-%05d", i);
    FEDLORA_ASSIGN_OR_RETURN(crypto::PemPair client, crypto::IssueClientCertificate(ca, r));
    FEDLORA_RETURN_IF_ERROR(write(r.common_name, client));
  }
  ServerTlsOptions tls;
  tls.cert_file = dir + "server.pem";
  tls.key_file = dir + "server.key";
  tls.client_ca_file = dir + "ca.pem";
  return tls;
}

ClientOptions VirtualClientOptions(const SimOptions& options, const std::string& server_address,
                                   const std::string& id) {
  ClientOptions o;
  o.server_address = server_address;
  o.client_id = id;
  if (options.mtls) {
    const std::string pki = options.out_dir + "/pki/";
    o.tls.root_ca_file = pki + "ca.pem";
    o.tls.cert_file = pki + id + ".pem";
    o.tls.key_file = pki + id + ".key";
  } else {
    o.insecure = true;  // the simulation's own server, on loopback
  }
  o.has_cuda = options.device == Device::kCuda;
  o.device_name = std::string(DeviceName(options.device));
  o.encode_on_cuda = o.has_cuda;  // the update encodes where the client trains
  o.wait_for_task_seconds = 5;    // short long polls: the run's end is noticed within seconds
  o.retry.initial_backoff_ms = 100;
  o.retry.max_backoff_ms = 2000;  // loopback: a failed call is a crash test, retry soon
  o.retry.max_attempts = 30;
  o.download_final_adapter = false;
  o.client_version = "fedlora-sim";
  o.state_dir = options.out_dir + "/clients/" + id;  // survives the client's simulated crashes
  return o;
}

FaultDecision DecideFaults(const v1::RunConfig& config, const std::vector<InjectedFault>& faults,
                           uint64_t round, int client) {
  const v1::SimulationConfig& s = config.simulation();
  const uint64_t seed = config.seed() ^ kFaultSalt;
  const uint64_t stream = MakeStream(static_cast<uint32_t>(round), static_cast<uint32_t>(client));
  FaultDecision d;
  // UniformAt is in [0, 1): probability 0 never fires, probability 1 always does.
  d.dropout = UniformAt(seed, stream, 0) < s.dropout_probability();
  d.straggler = !d.dropout && UniformAt(seed, stream, 1) < s.straggler_probability();
  d.crash = !d.dropout && UniformAt(seed, stream, 2) < s.crash_probability();
  for (const InjectedFault& f : faults) {
    if (f.server_round != round || f.client != client) continue;
    if (f.kind == FaultKind::kDropout) d.dropout = true;
    if (f.kind == FaultKind::kStraggler) d.straggler = true;
    if (f.kind == FaultKind::kCrash) d.crash = true;
  }
  if (d.dropout) d.straggler = d.crash = false;
  return d;
}

absl::Status WriteSummary(const v1::RunConfig& config, const SimResult& result, int parallelism,
                          const std::vector<std::string>& label_names, const std::string& out_dir) {
  nlohmann::json j;
  j["run_id"] = config.run_id();
  j["seed"] = config.seed();
  j["config"] = nlohmann::json::parse(RunConfigToJson(config), nullptr, /*allow_exceptions=*/false);
  j["parallelism"] = parallelism;
  j["client_sizes"] = result.client_sizes;
  j["client_label_histograms"] = result.client_label_histograms;
  j["label_names"] = label_names;
  j["final_adapter_sha256"] = result.final_adapter_sha256;
  j["seconds"] = result.seconds;
  j["connection_cuts"] = result.connection_cuts;
  nlohmann::json rounds = nlohmann::json::array();
  for (const RoundRecord& r : result.rounds)
    rounds.push_back(nlohmann::json::parse(RoundRecordToJson(r)));
  j["rounds"] = rounds;
  if (!result.rounds.empty()) {
    const RoundRecord &first = result.rounds.front(), &last = result.rounds.back();
    if (config.task().kind() != v1::TaskConfig::CAUSAL_LM || config.task().exact_match()) {
      j["initial_accuracy"] = first.eval_accuracy;
      j["final_accuracy"] = last.eval_accuracy;
    }
    if (config.task().kind() == v1::TaskConfig::CAUSAL_LM) {
      j["initial_perplexity"] = first.eval_perplexity;
      j["final_perplexity"] = last.eval_perplexity;
    }
    if (config.privacy().dp().enabled()) {
      j["dp_epsilon"] = last.dp_epsilon;
      j["dp_delta"] = config.privacy().dp().target_delta();
    }
  }
  return WriteFileAtomically(out_dir + "/summary.json", j.dump(2) + "\n");
}

}  // namespace fedlora::sim
