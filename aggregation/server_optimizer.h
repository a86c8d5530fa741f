// Server-side optimizers: how the round's mean client delta moves the global adapter.
//
//   FEDLORA_ASSIGN_OR_RETURN(ServerOptimizer opt, ServerOptimizer::Create(options, SpecFromUpdate(global)));
//   FEDLORA_RETURN_IF_ERROR(opt.LoadState(saved));              // after a restart, if a state was saved
//   FEDLORA_RETURN_IF_ERROR(opt.Step(mean_delta, global));      // once per committed round
//   FEDLORA_ASSIGN_OR_RETURN(std::string state, opt.SaveState());  // durable with the new adapter
//
// The mean delta Δ (client adapter minus the global adapter it trained from, averaged by
// StreamingFedAvg) is a pseudo-gradient pointing downhill (Reddi et al., "Adaptive Federated
// Optimization", ICLR 2021). With x the global adapter, η the server learning rate:
//
//   kSgd      m = μ m + Δ;  x += η m          (μ = 0: FedAvg, η = 1: x becomes the client mean;
//                                              μ > 0: FedAvgM, Hsu et al. 2019)
//   kAdam     m = β1 m + (1-β1) Δ;  v = β2 v + (1-β2) Δ²;
//             x += η √(1-β2^t) / (1-β1^t) · m / (√v + τ)      (bias-corrected, as Kingma & Ba)
//   kYogi     m as Adam;  v = v - (1-β2) Δ² sign(v - Δ²);  x += η m / (√v + τ),  v starts at τ²
//   kAdagrad  m as Adam;  v = v + Δ²;                     x += η m / (√v + τ),  v starts at τ²
//
// Determinism: every element is computed in double from fp32 inputs and rounded to fp32 once, and
// the state (m, v in fp64, the step count t) is saved exactly, so a server that restarts and loads
// the saved state continues bit-identically. Step refuses a delta that does not match the spec or
// holds NaN/Inf, or a result that would not be finite; on any error neither the adapter nor the
// state changes.
//
// Memory: kSgd without momentum keeps nothing; with momentum 8 bytes per element; the adaptive
// kinds 16 bytes per element. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregation/fedavg.h"
#include "compression/codec.h"

namespace fedlora {

enum class ServerOptimizerKind { kSgd, kAdam, kYogi, kAdagrad };

// "sgd", "adam", "yogi", "adagrad".
std::string_view ServerOptimizerName(ServerOptimizerKind kind);

struct ServerOptimizerOptions {
  ServerOptimizerKind kind = ServerOptimizerKind::kSgd;
  double learning_rate = 1.0;  // η, finite and > 0
  double momentum = 0.0;       // μ of kSgd, in [0, 1)
  double beta1 = 0.9;          // adaptive kinds, in [0, 1)
  double beta2 = 0.99;         // adaptive kinds, in [0, 1)
  double tau = 1e-3;           // adaptive kinds, finite and > 0
};

class ServerOptimizer {
 public:
  // InvalidArgument naming the option when one is out of range, or when the spec is empty or has
  // duplicate names.
  static absl::StatusOr<ServerOptimizer> Create(const ServerOptimizerOptions& options,
                                                std::vector<TensorSpec> spec);

  // Copyable (the coordinator steps a copy and keeps it only once the round is durable).
  ServerOptimizer(const ServerOptimizer&) = default;
  ServerOptimizer& operator=(const ServerOptimizer&) = default;
  ServerOptimizer(ServerOptimizer&&) = default;
  ServerOptimizer& operator=(ServerOptimizer&&) = default;

  // global += the step computed from `mean_delta` (both matched to the spec by name). On error
  // neither `global` nor the optimizer state changes.
  absl::Status Step(const std::vector<UpdateTensor>& mean_delta, std::vector<UpdateTensor>& global);

  // True when the optimizer carries state from one round to the next (momentum or an adaptive
  // kind): the server must then save it with every committed adapter.
  bool stateful() const { return stateful_; }
  int64_t steps() const { return steps_; }

  // The state as a safetensors file: "m/<name>" and "v/<name>" (F64, the spec's shapes) and the
  // metadata fedlora.server_optimizer (kind name) and fedlora.server_steps. An empty-tensor file
  // for a stateless optimizer.
  absl::StatusOr<std::string> SaveState() const;
  // Replaces the state with a SaveState() output. DataLoss when the bytes are not such a file or
  // were saved by another optimizer kind or for another spec; the state is unchanged then.
  absl::Status LoadState(std::string_view bytes);

 private:
  ServerOptimizer() = default;

  ServerOptimizerOptions options_;
  std::vector<TensorSpec> spec_;
  std::vector<int64_t> offsets_;  // start of each spec tensor in m_ / v_
  bool stateful_ = false;
  std::vector<double> m_;  // first moment (kSgd: the momentum buffer); empty when stateless
  std::vector<double> v_;  // second moment; adaptive kinds only
  int64_t steps_ = 0;
};

}  // namespace fedlora
