// `fedlora simulate`: a whole federation on one machine. One aggregation server (server/, on
// 127.0.0.1 with a kernel-chosen port) and N virtual clients (the client SDK, fedlora::Client)
// speak the real gRPC protocol over loopback, so a simulation runs the same selection, upload,
// validation, aggregation and checkpoint code as a deployment.
//
//   FEDLORA_ASSIGN_OR_RETURN(v1::RunConfig config, LoadRunConfigFile("configs/default.json"));
//   FEDLORA_ASSIGN_OR_RETURN(ResolvedRunConfig run, ResolveRunConfig(std::move(config)));
//   sim::SimOptions options;
//   options.out_dir = "runs/default";
//   FEDLORA_ASSIGN_OR_RETURN(sim::SimResult result, sim::RunSimulation(std::move(run), options));
//   std::cout << sim::SummaryTable(result.rounds);
//
// How it runs:
//   - data.train_path is partitioned across simulation.num_clients clients (train/partition.h:
//     IID, Dirichlet label skew, label shards, or by key); data.eval_path is the held-out split the
//     server's evaluator scores every new global adapter on.
//   - Virtual clients are cheap records (an id, their example indices, fault state). Each runs the
//     SDK's RunUntilDone loop on its own thread, mostly blocked in long polls; only `parallelism`
//     of them train at once, each borrowing one of `parallelism` model instances from a pool and
//     holding nothing but its adapter delta in between (the local optimizer starts afresh every
//     task, as in FedAvg). Memory is O(parallelism x model + clients x indices).
//   - Every core stays busy: each pooled model computes on a thread pool of its own, and the
//     cores are shared among the models lent at the moment (core/thread_budget.h): a client that
//     trains alone gets all of them, k clients training at once get cores / k each. The shares
//     change as clients start and finish, between kernels. OpenBLAS runs single-threaded; a GEMM
//     is split over the model's pool instead (kernels/gemm.h).
//   - The base model's frozen weights are loaded once (model/bert.h BertBase, or for a CAUSAL_LM
//     run model/decoder.h DecoderBase) and shared by every pool slot; a slot adds its adapter,
//     head and activation buffers. The evaluator borrows the slots.
//   - Faults, all seeded from (config.seed, server round, client): a dropout client vanishes after
//     selection (stops sending anything; it rejoins after the round is committed), a straggler
//     sleeps simulation.straggler_delay_seconds after training (past the deadline when the delay is
//     longer than what is left of it), and a crash cuts the client's connection midway through its
//     upload (the SDK reconnects and resumes from the server's durable chunks).
//   - Reports: out_dir/rounds.jsonl, rounds.csv and rounds.svg are rewritten after every round;
//     summary.json, final_adapter.safetensors (the global adapter's tensors) and adapter/ (an
//     adapter directory, model/adapter_dir.h: PEFT's files, the labels, max_seq_len and prompt
//     settings) are written at the end; out_dir/store holds the server's store (recreated per run).
//
// Determinism: with the same config and seed, and when every selected client is needed (no
// over-selection, so no race decides whose upload lands first), the final adapter is bit-identical
// across runs: partitions, task seeds, dropout masks and faults are seeded, the server samples each
// round's clients from all live ones (not the first to poll), aggregation is exact, and a client's
// training does not depend on how many threads it got: the CPU kernels give the same bits at every
// pool width (kernels/base/context.h), and the split GEMM the bits of the single-threaded one. With
// model.precision BF16 the bf16 GEMMs (oneDNN) are not promised the same bits at every width, so
// two such runs may differ in the last bits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "config/resolved.h"
#include "core/tensor.h"
#include "fedlora/v1/config.pb.h"
#include "sim/report.h"

namespace fedlora::sim {

enum class FaultKind { kDropout, kStraggler, kCrash };

// A fault forced on one client in one server round, in addition to the seeded random ones (tests).
struct InjectedFault {
  uint64_t server_round = 1;
  int client = 0;  // index in [0, num_clients)
  FaultKind kind = FaultKind::kDropout;
};

// Settings the run config has no field for (see the simulation section of config.proto).
struct SimOptions {
  // Directory for the reports, the final adapter and the server's store. Created if missing.
  std::string out_dir;
  std::vector<InjectedFault> faults;
  // Show a progress line on stderr (core/progress.h). It is written to stderr directly, also away
  // from a terminal, so that it stays on the console when the log goes to a file.
  bool progress = true;
  // Give up (DeadlineExceeded) when the run has not finished after this many seconds; 0: never.
  double max_seconds = 0.0;
  // Server timings in milliseconds that the run config does not set: how long the server collects
  // candidates before sampling (it samples as soon as every live client waits, which takes well
  // under a second here; the window only bounds a round that waits for a vanished client) and its
  // driver tick.
  int64_t selection_window_ms = 5000;
  int64_t tick_ms = 50;
  // Serve the federation over mutual TLS, as a deployment does, with a development PKI made for the
  // run in <out_dir>/pki (crypto/certs.h): a CA, the server's certificate for 127.0.0.1 and one
  // client certificate per virtual client (CN = its id, the identity the server sees). False:
  // plaintext on loopback, identities from metadata.
  bool mtls = false;
  // Where the virtual clients' models compute (ModelOptions::device, DecoderOptions::device) and
  // the server sums the updates (ServerOptions::aggregation_device): with kCuda every pooled model
  // has its own stream and all share one device copy of the base. The models refuse kCuda with
  // int8 math: config/device_plan.h DeviceForRun picks the CPU for it. bf16 math and exact-match
  // evaluation run on CUDA.
  Device device = Device::kCpu;
  // Figures drawn across rounds.svg's quality panel (e.g. the centralized baseline's accuracy).
  std::vector<ReferenceLine> references;
};

struct SimResult {
  // rounds[0]: the initial adapter (untuned: zero LoRA B, and a random classifier head) before
  // training.
  std::vector<RoundRecord> rounds;
  std::vector<UpdateTensor> final_adapter;  // sorted by name
  std::string final_adapter_sha256;         // of the server's blob (safetensors bytes)
  std::vector<int64_t> client_sizes;        // examples per virtual client
  std::vector<std::vector<int64_t>> client_label_histograms;
  double seconds = 0.0;         // wall time of the whole run
  int64_t connection_cuts = 0;  // connections the crash proxies cut (injected crashes)
};

// Runs the federation described by `run.config` (defaults applied and validated by the caller, e.g.
// through LoadRunConfigFile, then resolved); the server takes `run` as it is. InvalidArgument for a
// config the simulation cannot run (no data paths, clients_per_round above num_clients, bad
// options); the model, data and server errors keep their codes; DeadlineExceeded when max_seconds
// passes.
absl::StatusOr<SimResult> RunSimulation(ResolvedRunConfig run, const SimOptions& options);
// The same for a config not resolved yet (validated first, then ResolveRunConfig).
absl::StatusOr<SimResult> RunSimulation(const v1::RunConfig& config, const SimOptions& options);

}  // namespace fedlora::sim
