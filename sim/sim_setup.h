// The simulation's setup and end, outside its run loop (sim/simulator.cc): the checks of its
// options, the clients' partition of the training data, their SDK options and seeded faults, the
// development PKI of an mTLS run, and summary.json.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fedlora/client.h"
#include "fedlora/v1/config.pb.h"
#include "server/options.h"
#include "sim/sim_data.h"
#include "sim/simulator.h"
#include "train/partition.h"

namespace fedlora::sim {

// InvalidArgument for options the run cannot honour (no out_dir, clients_per_round above
// num_clients, crash_probability outside [0, 1], an injected fault naming no client),
// Unimplemented for settings fedlora does not carry out; then creates out_dir and removes a
// leftover store and client state (the server would resume an old run).
absl::Status CheckSimulation(const v1::RunConfig& config, const SimOptions& options,
                             int num_clients);

// The training examples' split across `num_clients` clients (simulation.partition).
absl::StatusOr<Partition> PartitionClients(const v1::RunConfig& config, const SimData& data,
                                           int num_clients);

// SimOptions::mtls: the run's PKI in <out_dir>/pki (a CA, the server's certificate for 127.0.0.1,
// one client certificate per virtual client), and the server's TLS options for it.
absl::StatusOr<ServerTlsOptions> MakeSimulationPki(const std::string& out_dir, int num_clients);

// The faults of `client` in server round `round`: the seeded random ones
// (simulation.dropout_probability, straggler_probability, crash_probability) and the injected ones.
// A dropout excludes the others.
struct FaultDecision {
  bool dropout = false;
  bool straggler = false;
  bool crash = false;
};
FaultDecision DecideFaults(const v1::RunConfig& config, const std::vector<InjectedFault>& faults,
                           uint64_t round, int client);

// The SDK options of virtual client `id` talking to `server_address`: mTLS with the run's PKI or
// plaintext, short long polls, quick retries, its state under out_dir/clients/<id>.
ClientOptions VirtualClientOptions(const SimOptions& options, const std::string& server_address,
                                   const std::string& id);

// Writes out_dir/summary.json: the run, its config, the clients, every round and the final figures.
absl::Status WriteSummary(const v1::RunConfig& config, const SimResult& result, int parallelism,
                          const std::vector<std::string>& label_names, const std::string& out_dir);

}  // namespace fedlora::sim
