#include "aggregation/server_optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/tensor.h"

namespace fedlora {
namespace {

constexpr char kKindKey[] = "fedlora.server_optimizer";
constexpr char kStepsKey[] = "fedlora.server_steps";

bool InUnitInterval(double x) { return std::isfinite(x) && x >= 0.0 && x < 1.0; }

// Index of each tensor of `tensors` in `spec` (by name), or InvalidArgument naming the mismatch.
template <typename T>
absl::StatusOr<std::vector<size_t>> MatchToSpec(const std::vector<TensorSpec>& spec,
                                                const std::vector<T>& tensors,
                                                std::string_view what) {
  if (tensors.size() != spec.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ServerOptimizer: ", ToAbsl(what), " has ",
                                                   tensors.size(), " tensors, the spec ",
                                                   spec.size()));
  }
  absl::flat_hash_map<std::string_view, size_t> by_name;
  for (size_t i = 0; i < spec.size(); ++i) by_name.emplace(spec[i].name, i);
  std::vector<size_t> slot(tensors.size());
  std::vector<bool> seen(spec.size(), false);
  for (size_t t = 0; t < tensors.size(); ++t) {
    auto it = by_name.find(tensors[t].name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("ServerOptimizer: ", ToAbsl(what), " tensor '",
                                                     tensors[t].name, "' is not in the adapter"));
    }
    if (seen[it->second]) {
      return absl::InvalidArgumentError(absl::StrCat("ServerOptimizer: ", ToAbsl(what),
                                                     " repeats tensor '", tensors[t].name, "'"));
    }
    seen[it->second] = true;
    const TensorSpec& s = spec[it->second];
    auto numel = CheckedNumel(s.shape);
    if (tensors[t].shape != s.shape || !numel.ok() ||
        static_cast<int64_t>(tensors[t].values.size()) != *numel) {
      return absl::InvalidArgumentError(absl::StrCat("ServerOptimizer: ", ToAbsl(what), " tensor '",
                                                     tensors[t].name,
                                                     "' does not have the adapter's shape"));
    }
    slot[t] = it->second;
  }
  return slot;
}

}  // namespace

std::string_view ServerOptimizerName(ServerOptimizerKind kind) {
  switch (kind) {
    case ServerOptimizerKind::kSgd:
      return "sgd";
    case ServerOptimizerKind::kAdam:
      return "adam";
    case ServerOptimizerKind::kYogi:
      return "yogi";
    case ServerOptimizerKind::kAdagrad:
      return "adagrad";
  }
  return "unknown";
}

absl::StatusOr<ServerOptimizer> ServerOptimizer::Create(const ServerOptimizerOptions& options,
                                                        std::vector<TensorSpec> spec) {
  const auto bad = [](std::string_view field, double value, std::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat("ServerOptimizer: ", ToAbsl(field), " ", value, " ", ToAbsl(want)));
  };
  if (!std::isfinite(options.learning_rate) || options.learning_rate <= 0) {
    return bad("learning_rate", options.learning_rate, "must be finite and > 0");
  }
  if (!InUnitInterval(options.momentum))
    return bad("momentum", options.momentum, "is not in [0, 1)");
  if (!InUnitInterval(options.beta1)) return bad("beta1", options.beta1, "is not in [0, 1)");
  if (!InUnitInterval(options.beta2)) return bad("beta2", options.beta2, "is not in [0, 1)");
  if (!std::isfinite(options.tau) || options.tau <= 0)
    return bad("tau", options.tau, "must be finite and > 0");
  if (spec.empty())
    return absl::InvalidArgumentError("ServerOptimizer: the adapter spec has no tensors");

  ServerOptimizer opt;
  opt.options_ = options;
  absl::flat_hash_map<std::string_view, size_t> names;
  int64_t total = 0;
  for (const TensorSpec& t : spec) {
    if (t.name.empty() || !names.emplace(t.name, 0).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("ServerOptimizer: empty or duplicate spec tensor '", t.name, "'"));
    }
    auto numel = CheckedNumel(t.shape);
    if (!numel.ok())
      return Annotate(numel.status(), absl::StrCat("ServerOptimizer: spec tensor '", t.name, "'"));
    opt.offsets_.push_back(total);
    total += *numel;
  }
  opt.offsets_.push_back(total);
  opt.spec_ = std::move(spec);
  const bool adaptive = options.kind != ServerOptimizerKind::kSgd;
  opt.stateful_ = adaptive || options.momentum > 0;
  if (opt.stateful_) opt.m_.assign(static_cast<size_t>(total), 0.0);
  if (adaptive) {
    // Yogi and Adagrad start v at tau^2 (Reddi et al.); Adam starts at 0 and corrects the bias.
    const double v0 = options.kind == ServerOptimizerKind::kAdam ? 0.0 : options.tau * options.tau;
    opt.v_.assign(static_cast<size_t>(total), v0);
  }
  return opt;
}

absl::Status ServerOptimizer::Step(const std::vector<UpdateTensor>& mean_delta,
                                   std::vector<UpdateTensor>& global) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<size_t> delta_slot, MatchToSpec(spec_, mean_delta, "delta"));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<size_t> global_slot,
                           MatchToSpec(spec_, global, "global adapter"));
  std::vector<const UpdateTensor*> delta_of(spec_.size());
  for (size_t t = 0; t < mean_delta.size(); ++t) delta_of[delta_slot[t]] = &mean_delta[t];

  const ServerOptimizerOptions& o = options_;
  const int64_t t_next = steps_ + 1;
  // Adam's bias correction folded into the step size.
  double lr = o.learning_rate;
  if (o.kind == ServerOptimizerKind::kAdam) {
    lr *= std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(t_next))) /
          (1.0 - std::pow(o.beta1, static_cast<double>(t_next)));
  }
  // Compute into fresh buffers; commit only when every element is finite.
  std::vector<double> m_next = m_;
  std::vector<double> v_next = v_;
  std::vector<std::vector<float>> x_next(global.size());
  for (size_t g = 0; g < global.size(); ++g) {
    const size_t s = global_slot[g];
    const UpdateTensor& d = *delta_of[s];
    const std::vector<float>& x = global[g].values;
    std::vector<float>& out = x_next[g];
    out.resize(x.size());
    const size_t base = static_cast<size_t>(offsets_[s]);
    for (size_t i = 0; i < x.size(); ++i) {
      const double delta = d.values[i];
      if (!std::isfinite(delta)) {
        return absl::InvalidArgumentError(absl::StrCat("ServerOptimizer: delta tensor '", d.name,
                                                       "' value ", i, " is not finite"));
      }
      double step;
      if (o.kind == ServerOptimizerKind::kSgd) {
        if (stateful_) {
          double& m = m_next[base + i];
          m = o.momentum * m + delta;
          step = m;
        } else {
          step = delta;
        }
      } else {
        double& m = m_next[base + i];
        double& v = v_next[base + i];
        m = o.beta1 * m + (1.0 - o.beta1) * delta;
        const double d2 = delta * delta;
        switch (o.kind) {
          case ServerOptimizerKind::kAdam:
            v = o.beta2 * v + (1.0 - o.beta2) * d2;
            break;
          case ServerOptimizerKind::kYogi:
            v = v - (1.0 - o.beta2) * d2 * (v > d2 ? 1.0 : (v < d2 ? -1.0 : 0.0));
            break;
          default:  // kAdagrad
            v = v + d2;
            break;
        }
        step = m / (std::sqrt(v) + o.tau);
      }
      const float next = static_cast<float>(static_cast<double>(x[i]) + lr * step);
      if (!std::isfinite(next)) {
        return absl::InvalidArgumentError(absl::StrCat("ServerOptimizer: global tensor '",
                                                       global[g].name, "' value ", i,
                                                       " would not be finite after the step"));
      }
      out[i] = next;
    }
  }
  for (size_t g = 0; g < global.size(); ++g) global[g].values.swap(x_next[g]);
  m_.swap(m_next);
  v_.swap(v_next);
  steps_ = t_next;
  return absl::OkStatus();
}

absl::StatusOr<std::string> ServerOptimizer::SaveState() const {
  std::vector<SafetensorsTensorToWrite> tensors;
  for (size_t s = 0; s < spec_.size(); ++s) {
    const size_t begin = static_cast<size_t>(offsets_[s]);
    const size_t n = static_cast<size_t>(offsets_[s + 1] - offsets_[s]);
    if (!m_.empty())
      tensors.push_back(
          {"m/" + spec_[s].name, DType::kF64, spec_[s].shape, m_.data() + begin, n * 8});
    if (!v_.empty())
      tensors.push_back(
          {"v/" + spec_[s].name, DType::kF64, spec_[s].shape, v_.data() + begin, n * 8});
  }
  return SerializeSafetensors(tensors, {{kKindKey, std::string(ServerOptimizerName(options_.kind))},
                                        {kStepsKey, absl::StrCat(steps_)}});
}

absl::Status ServerOptimizer::LoadState(std::string_view bytes) {
  const auto loss = [](std::string_view why) {
    return absl::DataLossError(absl::StrCat("server optimizer state: ", ToAbsl(why)));
  };
  auto file = SafetensorsFile::FromBytes(std::string(bytes), "server optimizer state");
  if (!file.ok()) return loss(ToStd(file.status().message()));
  const auto& meta = (*file)->metadata();
  auto kind = meta.find(kKindKey);
  auto steps = meta.find(kStepsKey);
  int64_t saved_steps = 0;
  if (kind == meta.end() || steps == meta.end() || !absl::SimpleAtoi(steps->second, &saved_steps) ||
      saved_steps < 0) {
    return loss("no optimizer kind or step count in the metadata");
  }
  // The next Step counts one more: a saved count at the top of int64 would overflow there.
  if (saved_steps == std::numeric_limits<int64_t>::max()) {
    return loss(absl::StrCat("step count ", saved_steps, " leaves no next step"));
  }
  if (kind->second != ServerOptimizerName(options_.kind)) {
    return loss(absl::StrCat("saved by optimizer '", kind->second, "', this run uses '",
                             ToAbsl(ServerOptimizerName(options_.kind)), "'"));
  }
  const size_t expected = spec_.size() * ((m_.empty() ? 0 : 1) + (v_.empty() ? 0 : 1));
  if ((*file)->names().size() != expected) {
    return loss(absl::StrCat("holds ", (*file)->names().size(), " tensors, expected ", expected));
  }
  std::vector<double> m(m_.size()), v(v_.size());
  for (size_t s = 0; s < spec_.size(); ++s) {
    const size_t begin = static_cast<size_t>(offsets_[s]);
    const size_t n = static_cast<size_t>(offsets_[s + 1] - offsets_[s]);
    for (auto [prefix, dst] :
         {std::pair<const char*, std::vector<double>*>{"m/", &m}, {"v/", &v}}) {
      if (dst->empty()) continue;
      auto t = (*file)->Get(prefix + spec_[s].name);
      if (!t.ok()) return loss(ToStd(t.status().message()));
      if (t->dtype != DType::kF64 || t->shape != spec_[s].shape || t->size != n * 8) {
        return loss(
            absl::StrCat("tensor '", prefix, spec_[s].name, "' does not match the adapter"));
      }
      std::memcpy(dst->data() + begin, t->data, t->size);
    }
  }
  for (double x : m) {
    if (!std::isfinite(x)) return loss("a first-moment value is not finite");
  }
  for (double x : v) {
    if (!std::isfinite(x) || x < 0) return loss("a second-moment value is not finite and >= 0");
  }
  m_ = std::move(m);
  v_ = std::move(v);
  steps_ = saved_steps;
  return absl::OkStatus();
}

}  // namespace fedlora
