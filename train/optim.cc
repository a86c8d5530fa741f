#include "train/optim.h"

#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/adamw.h"

namespace fedlora {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t NumelOf(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Resolves a negative eps to the optimizer's own default.
OptimizerOptions WithEps(OptimizerOptions options, float default_eps) {
  if (options.eps < 0.0f) options.eps = default_eps;
  return options;
}

// Multiplies p by (1 - lr * wd): decoupled weight decay as PyTorch applies it, before the update.
void DecayInPlace(Param& param, float lr, float weight_decay) {
  const float keep = 1.0f - lr * weight_decay;
  for (float& p : param.value) p *= keep;
}

}  // namespace

Optimizer::~Optimizer() = default;

bool Optimizer::DecaysParam(const Param& param, const OptimizerOptions& options) {
  if (options.weight_decay == 0.0f) return false;
  if (param.shape.size() <= 1 && !options.decay_one_dim_params) return false;
  return true;
}

absl::Status Optimizer::Step(std::vector<Param>& params, float lr) {
  if (!std::isfinite(lr) || lr < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(name()), ": learning rate must be finite and >= 0, got ", lr));
  }
  // Validate everything before touching anything, so a failed Step leaves params and state as
  // they were.
  std::set<std::string> seen;
  for (const Param& p : params) {
    if (p.grad.size() != p.value.size()) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(name()), ": param ", p.name,
                                                     " has ", p.value.size(), " values but ",
                                                     p.grad.size(), " grads"));
    }
    if (NumelOf(p.shape) != p.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(name()), ": param ", p.name,
                                                     " has shape ", ShapeString(p.shape), " but ",
                                                     p.numel(), " values"));
    }
    if (!seen.insert(p.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(name()), ": param name ", p.name, " appears twice"));
    }
    auto it = state_.find(p.name);
    if (it != state_.end() && it->second.shape != p.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(name()), ": param ", p.name, " changed shape from ",
                       ShapeString(it->second.shape), " to ", ShapeString(p.shape)));
    }
  }
  const size_t num_slots = SlotNames().size();
  ++step_;
  for (Param& p : params) {
    if (p.frozen) continue;  // no state, no decay: its value stays as it is
    Entry& entry = state_[p.name];
    if (entry.slots.empty()) {
      entry.shape = p.shape;
      entry.slots.assign(num_slots, std::vector<float>(p.value.size(), 0.0f));
    }
    FEDLORA_RETURN_IF_ERROR(Update(p, entry.slots, step_, lr));
  }
  return absl::OkStatus();
}

OptimizerState Optimizer::ExportState() const {
  OptimizerState out;
  out.optimizer = std::string(name());
  out.step = step_;
  const std::vector<std::string> slot_names = SlotNames();
  for (const auto& [param_name, entry] : state_) {
    for (size_t s = 0; s < slot_names.size(); ++s) {
      out.tensors.push_back(
          {absl::StrCat(param_name, ".", slot_names[s]), entry.shape, entry.slots[s]});
    }
  }
  return out;
}

absl::Status Optimizer::ImportState(const OptimizerState& state) {
  if (state.optimizer != name()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer state is for '", state.optimizer,
                                                   "', not '", std::string(name()), "'"));
  }
  if (state.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state has negative step ", state.step));
  }
  const std::vector<std::string> slot_names = SlotNames();
  std::map<std::string, Entry> restored;
  for (const OptimizerStateTensor& t : state.tensors) {
    size_t slot = slot_names.size();
    std::string param_name;
    for (size_t s = 0; s < slot_names.size(); ++s) {
      const std::string suffix = "." + slot_names[s];
      if (t.name.size() > suffix.size() &&
          t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        slot = s;
        param_name = t.name.substr(0, t.name.size() - suffix.size());
        break;
      }
    }
    if (slot == slot_names.size()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state tensor '", t.name,
                                                     "' is not a ", std::string(name()), " slot"));
    }
    if (NumelOf(t.shape) != static_cast<int64_t>(t.value.size())) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state tensor '", t.name,
                                                     "' has shape ", ShapeString(t.shape), " but ",
                                                     t.value.size(), " values"));
    }
    Entry& entry = restored[param_name];
    if (entry.slots.empty()) {
      entry.shape = t.shape;
      entry.slots.assign(slot_names.size(), std::vector<float>());
    } else if (entry.shape != t.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state for ", param_name, " has mismatched shapes ",
                       ShapeString(entry.shape), " and ", ShapeString(t.shape)));
    }
    entry.slots[slot] = t.value;
  }
  for (auto& [param_name, entry] : restored) {
    for (size_t s = 0; s < slot_names.size(); ++s) {
      if (entry.slots[s].size() != static_cast<size_t>(NumelOf(entry.shape))) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state for ", param_name, " lacks slot ", slot_names[s]));
      }
    }
  }
  state_ = std::move(restored);
  step_ = state.step;
  return absl::OkStatus();
}

AdamW::AdamW(const OptimizerOptions& options) : Optimizer(WithEps(options, 1e-8f)) {}

absl::Status AdamW::Update(Param& param, std::vector<std::vector<float>>& slots, int64_t step,
                           float lr) {
  kernels::AdamWArgs args;
  args.n = param.numel();
  args.param = param.value.data();
  args.grad = param.grad.data();
  args.m = slots[0].data();
  args.v = slots[1].data();
  args.lr = lr;
  args.beta1 = options_.beta1;
  args.beta2 = options_.beta2;
  args.eps = options_.eps;
  args.weight_decay = DecaysParam(param, options_) ? options_.weight_decay : 0.0f;
  args.step = step;
  return kernels::AdamWStep(kernels::ExecContext{}, args);
}

Lamb::Lamb(const OptimizerOptions& options) : Optimizer(WithEps(options, 1e-6f)) {}

float Lamb::last_trust_ratio(const std::string& param_name) const {
  auto it = last_trust_.find(param_name);
  return it == last_trust_.end() ? 1.0f : it->second;
}

absl::Status Lamb::Update(Param& param, std::vector<std::vector<float>>& slots, int64_t step,
                          float lr) {
  const float b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
  const float wd = DecaysParam(param, options_) ? options_.weight_decay : 0.0f;
  const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(step));
  float* m = slots[0].data();
  float* v = slots[1].data();
  const float* g = param.grad.data();
  float* p = param.value.data();
  const int64_t n = param.numel();
  // Pass 1: moments, the update direction u (kept in a scratch buffer), and both norms.
  std::vector<float> u(n);
  double p_sq = 0.0, u_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    const float m_hat = static_cast<float>(m[i] / bc1);
    const float v_hat = static_cast<float>(v[i] / bc2);
    u[i] = m_hat / (std::sqrt(v_hat) + eps) + wd * p[i];
    p_sq += static_cast<double>(p[i]) * p[i];
    u_sq += static_cast<double>(u[i]) * u[i];
  }
  // phi is the identity (the paper's choice in its experiments). A zero-norm weight (e.g. a
  // freshly zeroed LoRA B) or a zero update gets ratio 1, as in the reference implementations,
  // otherwise it would never move.
  const double p_norm = std::sqrt(p_sq), u_norm = std::sqrt(u_sq);
  const float trust = (p_norm > 0.0 && u_norm > 0.0) ? static_cast<float>(p_norm / u_norm) : 1.0f;
  last_trust_[param.name] = trust;
  const float scale = lr * trust;
  for (int64_t i = 0; i < n; ++i) p[i] -= scale * u[i];
  return absl::OkStatus();
}

Sgd::Sgd(const OptimizerOptions& options) : Optimizer(WithEps(options, 0.0f)) {}

absl::Status Sgd::Update(Param& param, std::vector<std::vector<float>>& slots, int64_t step,
                         float lr) {
  if (DecaysParam(param, options_)) DecayInPlace(param, lr, options_.weight_decay);
  float* buf = slots[0].data();
  const float* g = param.grad.data();
  float* p = param.value.data();
  const float mu = options_.momentum;
  for (int64_t i = 0; i < param.numel(); ++i) {
    buf[i] = mu * buf[i] + g[i];
    p[i] -= lr * buf[i];
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(std::string_view name,
                                                         const OptimizerOptions& options) {
  const std::string lower = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  auto in_unit = [](float b) { return std::isfinite(b) && b >= 0.0f && b < 1.0f; };
  if (!in_unit(options.beta1) || !in_unit(options.beta2)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer betas must be in [0, 1), got (",
                                                   options.beta1, ", ", options.beta2, ")"));
  }
  if (!in_unit(options.momentum)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer momentum must be in [0, 1), got ", options.momentum));
  }
  if (!std::isfinite(options.weight_decay) || options.weight_decay < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight decay must be >= 0, got ", options.weight_decay));
  }
  const bool eps_given = options.eps >= 0.0f;
  if (eps_given && !(options.eps > 0.0f && std::isfinite(options.eps)) && lower != "sgd") {
    return absl::InvalidArgumentError(absl::StrCat("optimizer eps must be > 0, got ", options.eps));
  }
  if (lower == "adamw") return std::make_unique<AdamW>(options);
  if (lower == "lamb") return std::make_unique<Lamb>(options);
  if (lower == "sgd") return std::make_unique<Sgd>(options);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", std::string(name), "' (expected adamw, lamb or sgd)"));
}

float GlobalGradNorm(const std::vector<Param>& params) {
  double sum = 0.0;
  for (const Param& p : params) {
    if (p.frozen) continue;
    for (float g : p.grad) sum += static_cast<double>(g) * g;
  }
  return static_cast<float>(std::sqrt(sum));
}

float ClipGradNorm(std::vector<Param>& params, float max_norm) {
  const float norm = GlobalGradNorm(params);
  if (!(max_norm > 0.0f) || !std::isfinite(norm) || norm <= max_norm) return norm;
  const float scale = static_cast<float>(static_cast<double>(max_norm) / norm);
  for (Param& p : params) {
    if (p.frozen) continue;
    for (float& g : p.grad) g *= scale;
  }
  return norm;
}

}  // namespace fedlora
