// Optimizers for the trainable parameters (LoRA matrices and the task head), and global-norm
// gradient clipping.
//
//   OptimizerOptions opt;                      // AdamW defaults: betas (0.9, 0.999), eps 1e-8
//   opt.weight_decay = 0.01f;
//   FEDLORA_ASSIGN_OR_RETURN(auto optimizer, MakeOptimizer("adamw", opt));
//   model.ZeroGrad();
//   FEDLORA_ASSIGN_OR_RETURN(float loss, model.ForwardBackward(batch, seed));
//   float norm = ClipGradNorm(model.trainable_params(), /*max_norm=*/1.0f);
//   FEDLORA_RETURN_IF_ERROR(optimizer->Step(model.trainable_params(), schedule.LearningRateAt(t)));
//
// Optimizer state (moments, step count) is keyed by parameter name, created lazily on the first
// Step, and can be exported/imported for checkpoints. Math is fp32 per element with the
// per-tensor reductions (LAMB norms) accumulated in double, so results do not depend on threads.
// Not thread-safe: one optimizer belongs to one training loop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/param.h"
#include "train/training_defaults.h"

namespace fedlora {

struct OptimizerOptions {
  float beta1 = static_cast<float>(kDefaultAdamBeta1);  // first-moment decay (AdamW, LAMB)
  float beta2 = static_cast<float>(kDefaultAdamBeta2);  // second-moment decay (AdamW, LAMB)
  float momentum = 0.0f;  // SGD's heavy-ball momentum, in [0, 1); 0 is plain SGD
  // Added to sqrt(v_hat). 1e-8 is PyTorch's AdamW default; LAMB implementations use 1e-6.
  // A negative value means "the optimizer's own default".
  float eps = -1.0f;
  // Decoupled weight decay coefficient (per unit learning rate): p -= lr * weight_decay * p.
  float weight_decay = 0.0f;
  // Biases and LayerNorm-like parameters (1-D tensors) are usually exempt from weight decay
  // (BERT's original recipe). Set to true to decay every tensor.
  bool decay_one_dim_params = false;
};

// One tensor of optimizer state, e.g. name "<param name>.exp_avg". Laid out like a Param so a
// checkpoint writer can store it as a safetensors entry.
struct OptimizerStateTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> value;
};

struct OptimizerState {
  std::string optimizer;  // "adamw", "lamb", "sgd": Import refuses a different kind
  int64_t step = 0;       // number of Step calls taken (drives bias correction)
  std::vector<OptimizerStateTensor> tensors;
};

class Optimizer {
 public:
  virtual ~Optimizer();

  // Applies one update with learning rate `lr` to every param from its `grad`, skipping frozen
  // ones (Param::frozen: no state, no weight decay). Fails with
  // InvalidArgument (changing nothing) when a grad's size differs from its value's, when lr is
  // negative or not finite, or when a param's shape changed since the state was created.
  absl::Status Step(std::vector<Param>& params, float lr);

  // The optimizer's name as accepted by MakeOptimizer.
  virtual std::string_view name() const = 0;

  int64_t step_count() const { return step_; }
  // The options with eps resolved to this optimizer's default when it was given as negative.
  const OptimizerOptions& options() const { return options_; }

  // Snapshot of the state for a checkpoint; Import restores it (InvalidArgument when the
  // optimizer kind differs or a tensor name is not one this optimizer keeps).
  OptimizerState ExportState() const;
  absl::Status ImportState(const OptimizerState& state);

  // Whether `param` gets weight decay under `options` (exposed for tests and logging).
  static bool DecaysParam(const Param& param, const OptimizerOptions& options);

 protected:
  explicit Optimizer(const OptimizerOptions& options) : options_(options) {}

  // Names of the per-param state slots, e.g. {"exp_avg", "exp_avg_sq"}.
  virtual std::vector<std::string> SlotNames() const = 0;
  // Updates one param; `slots` holds SlotNames().size() buffers of param.numel() floats.
  // `step` is the 1-based index of this update. Step has validated sizes and shapes already.
  virtual absl::Status Update(Param& param, std::vector<std::vector<float>>& slots, int64_t step,
                              float lr) = 0;

  OptimizerOptions options_;

 private:
  struct Entry {
    std::vector<int64_t> shape;
    std::vector<std::vector<float>> slots;
  };
  int64_t step_ = 0;
  std::map<std::string, Entry> state_;  // ordered: export is deterministic
};

// AdamW (Loshchilov & Hutter 2019), PyTorch's formulation (computed by kernels::AdamWStep, which
// follows torch.optim.AdamW's order of operations):
//   p <- p * (1 - lr * wd);  m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2
//   p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
class AdamW : public Optimizer {
 public:
  explicit AdamW(const OptimizerOptions& options);
  std::string_view name() const override { return "adamw"; }

 protected:
  std::vector<std::string> SlotNames() const override { return {"exp_avg", "exp_avg_sq"}; }
  absl::Status Update(Param& param, std::vector<std::vector<float>>& slots, int64_t step,
                      float lr) override;
};

// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2) with bias
// correction. Per tensor:
//   r = m_hat / (sqrt(v_hat) + eps);  u = r + wd * p
//   trust = ||p|| / ||u||  (1 when either norm is 0);  p <- p - lr * trust * u
class Lamb : public Optimizer {
 public:
  explicit Lamb(const OptimizerOptions& options);
  std::string_view name() const override { return "lamb"; }

  // The trust ratio used by the most recent Step for `param_name` (1 when unknown). For tests
  // and diagnostics.
  float last_trust_ratio(const std::string& param_name) const;

 protected:
  std::vector<std::string> SlotNames() const override { return {"exp_avg", "exp_avg_sq"}; }
  absl::Status Update(Param& param, std::vector<std::vector<float>>& slots, int64_t step,
                      float lr) override;

 private:
  std::map<std::string, float> last_trust_;
};

// SGD with optional heavy-ball momentum (OptimizerOptions::momentum; 0 disables it) and decoupled
// weight decay:
//   p <- p * (1 - lr * wd);  buf <- momentum * buf + g;  p <- p - lr * buf
class Sgd : public Optimizer {
 public:
  explicit Sgd(const OptimizerOptions& options);
  std::string_view name() const override { return "sgd"; }

 protected:
  std::vector<std::string> SlotNames() const override { return {"momentum"}; }
  absl::Status Update(Param& param, std::vector<std::vector<float>>& slots, int64_t step,
                      float lr) override;
};

// "adamw", "lamb" or "sgd" (case-insensitive). InvalidArgument for any other name or for
// options out of range (betas outside [0, 1), eps <= 0 when given, weight_decay < 0).
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(std::string_view name,
                                                         const OptimizerOptions& options);

// Global L2 norm of all grads, sqrt(sum over params of sum g^2), accumulated in double. Frozen
// params are left out here and in ClipGradNorm.
float GlobalGradNorm(const std::vector<Param>& params);

// Scales every grad by max_norm / norm when the global norm exceeds max_norm, so that the new
// global norm equals max_norm (exactly, up to fp32 rounding; unlike PyTorch there is no +1e-6 in
// the denominator). max_norm <= 0 disables clipping. A non-finite norm leaves the grads alone:
// the caller sees it in the return value and decides (the trainer fails the step).
// Returns the norm before clipping.
float ClipGradNorm(std::vector<Param>& params, float max_norm);

}  // namespace fedlora
