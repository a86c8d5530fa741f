#include "aggregation/fedavg.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/tensor.h"

namespace fedlora {
namespace {

using u128 = unsigned __int128;
using i128 = __int128;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The fixed-point term (kernels/fixed_point.h), or nullopt when x is NaN/Inf or out of range.
std::optional<u128> FixedPointTerm(float x, uint64_t w) {
  u128 q;
  if (!kernels::FixedPointTerm(std::bit_cast<uint32_t>(x), w, &q)) return std::nullopt;
  return q;
}

}  // namespace

std::string_view AggregationStrategyName(AggregationStrategy strategy) {
  switch (strategy) {
    case AggregationStrategy::kFedAvg:
      return "fedavg";
    case AggregationStrategy::kFedProx:
      return "fedprox";
  }
  return "unknown";
}

absl::StatusOr<AggregationStrategy> ParseAggregationStrategy(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(ToAbsl(name));
  if (lower == "fedavg") return AggregationStrategy::kFedAvg;
  if (lower == "fedprox") return AggregationStrategy::kFedProx;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown aggregation strategy '", ToAbsl(name), "' (expected fedavg or fedprox)"));
}

std::vector<TensorSpec> SpecFromParams(const std::vector<Param>& params) {
  std::vector<TensorSpec> spec;
  spec.reserve(params.size());
  for (const Param& p : params) spec.push_back({p.name, p.shape});
  return spec;
}

std::vector<TensorSpec> SpecFromUpdate(const std::vector<UpdateTensor>& tensors) {
  std::vector<TensorSpec> spec;
  spec.reserve(tensors.size());
  for (const UpdateTensor& t : tensors) spec.push_back({t.name, t.shape});
  return spec;
}

absl::StatusOr<StreamingFedAvg> StreamingFedAvg::Create(std::vector<TensorSpec> spec, Device device) {
  if (spec.empty()) return absl::InvalidArgumentError("StreamingFedAvg: the adapter spec has no tensors");
  StreamingFedAvg avg;
  int64_t total = 0;
  for (size_t i = 0; i < spec.size(); ++i) {
    const TensorSpec& t = spec[i];
    if (t.name.empty())
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: spec tensor ", i, " has no name"));
    if (!avg.index_.emplace(t.name, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: duplicate spec tensor '", t.name, "'"));
    }
    auto numel = CheckedNumel(t.shape);
    if (!numel.ok()) return Annotate(numel.status(), absl::StrCat("StreamingFedAvg: spec tensor '", t.name, "'"));
    avg.offsets_.push_back(total);
    if (*numel > std::numeric_limits<int64_t>::max() / 16 - total) {
      return absl::InvalidArgumentError("StreamingFedAvg: the adapter spec has too many elements");
    }
    total += *numel;
  }
  avg.offsets_.push_back(total);
  avg.spec_ = std::move(spec);
  if (device == Device::kCpu) {
    avg.sums_.assign(static_cast<size_t>(total), u128{0});
    return avg;
  }
  FEDLORA_ASSIGN_OR_RETURN(avg.backend_, kernels::Backend::Create(device));
  FEDLORA_ASSIGN_OR_RETURN(avg.dev_sums_, kernels::DeviceArray<u128>::Zeros(*avg.backend_, total));
  FEDLORA_ASSIGN_OR_RETURN(avg.dev_values_, kernels::DeviceArray<float>::Zeros(*avg.backend_, total));
  avg.staging_.resize(static_cast<size_t>(total));
  return avg;
}

absl::Status StreamingFedAvg::Add(const std::vector<UpdateTensor>& update, int64_t num_examples) {
  if (num_examples < 1 || num_examples > kMaxWeight) {
    return absl::InvalidArgumentError(
        absl::StrCat("StreamingFedAvg: num_examples ", num_examples, " is not in [1, ", kMaxWeight, "]"));
  }
  if (num_updates_ >= kMaxUpdates) {
    return absl::ResourceExhaustedError(
        absl::StrCat("StreamingFedAvg: already holds the maximum of ", kMaxUpdates, " updates"));
  }
  if (update.size() != spec_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StreamingFedAvg: update has ", update.size(), " tensors, the global adapter has ", spec_.size()));
  }
  // Structure first (cheap: names and sizes only), so that a mismatched update touches no sums.
  std::vector<size_t> slot(update.size());
  std::vector<bool> seen(spec_.size(), false);
  for (size_t t = 0; t < update.size(); ++t) {
    const UpdateTensor& u = update[t];
    auto it = index_.find(u.name);
    if (it == index_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("StreamingFedAvg: update tensor '", u.name, "' is not in the global adapter"));
    }
    if (seen[it->second]) {
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: update repeats tensor '", u.name, "'"));
    }
    seen[it->second] = true;
    slot[t] = it->second;
    const TensorSpec& s = spec_[it->second];
    if (u.shape != s.shape) {
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: tensor '", u.name, "' has shape ",
                                                     ShapeString(u.shape), ", the global adapter has ",
                                                     ShapeString(s.shape)));
    }
    const int64_t n = offsets_[it->second + 1] - offsets_[it->second];
    if (static_cast<int64_t>(u.values.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: tensor '", u.name, "' has ", u.values.size(),
                                                     " values for shape ", ShapeString(s.shape), " (", n, ")"));
    }
  }
  // Then one pass over the values, checking and accumulating each (wrapping u128 adds; exact, see
  // the header): the values are read once, not once to check and again to add. A bad value ends the
  // pass, and the terms this call added so far are subtracted again. The sums are modulo 2^128, so
  // subtracting the same terms restores every bit: a refused update leaves no trace.
  const uint64_t w = static_cast<uint64_t>(num_examples);
  if (backend_ != nullptr) return AddOnDevice(update, slot, w);
  for (size_t t = 0; t < update.size(); ++t) {
    const UpdateTensor& u = update[t];
    u128* sums = sums_.data() + offsets_[slot[t]];
    for (size_t i = 0; i < u.values.size(); ++i) {
      const std::optional<u128> term = FixedPointTerm(u.values[i], w);  // nullopt for NaN/Inf too
      if (term.has_value()) {
        sums[i] += *term;
        continue;
      }
      // Roll back: every earlier tensor in full, this one up to (not including) value i.
      for (size_t r = 0; r <= t; ++r) {
        const std::vector<float>& values = update[r].values;
        u128* back = sums_.data() + offsets_[slot[r]];
        const size_t end = r == t ? i : values.size();
        for (size_t j = 0; j < end; ++j) back[j] -= *FixedPointTerm(values[j], w);
      }
      const float x = u.values[i];
      if (!std::isfinite(x)) {
        return absl::InvalidArgumentError(
            absl::StrCat("StreamingFedAvg: tensor '", u.name, "' value ", i, " is not finite (", x, ")"));
      }
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: tensor '", u.name, "' value ", i, " (", x,
                                                     ") times num_examples ", num_examples,
                                                     " exceeds the accumulator range 2^", kMaxTermLog2 - kFracBits));
    }
  }
  ++num_updates_;
  total_weight_ += w;
  return absl::OkStatus();
}

absl::Status StreamingFedAvg::AddOnDevice(const std::vector<UpdateTensor>& update, const std::vector<size_t>& slot,
                                          uint64_t w) {
  for (size_t t = 0; t < update.size(); ++t) {
    std::copy(update[t].values.begin(), update[t].values.end(), staging_.begin() + offsets_[slot[t]]);
  }
  const int64_t n = offsets_.back();
  FEDLORA_RETURN_IF_ERROR(backend_->Upload(dev_values_.data(), staging_.data(), staging_.size() * sizeof(float)));
  kernels::FixedPointAccumulateArgs args{.n = n, .x = dev_values_.data(), .weight = w, .sums = dev_sums_.data()};
  int64_t bad = -1;
  args.first_bad = &bad;
  FEDLORA_RETURN_IF_ERROR(kernels::FixedPointAccumulate(backend_->ctx(), args));
  if (bad >= 0) {
    // Every in-range term was added: subtract the same terms, which restores every bit.
    args.sign = -1;
    int64_t again = -1;
    args.first_bad = &again;
    FEDLORA_RETURN_IF_ERROR(kernels::FixedPointAccumulate(backend_->ctx(), args));
    const size_t t = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), bad) - offsets_.begin() - 1);
    const size_t i = static_cast<size_t>(bad - offsets_[t]);
    const float x = staging_[static_cast<size_t>(bad)];
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("StreamingFedAvg: tensor '", spec_[t].name, "' value ", i, " is not finite (", x, ")"));
    }
    return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: tensor '", spec_[t].name, "' value ", i, " (", x,
                                                   ") times num_examples ", w, " exceeds the accumulator range 2^",
                                                   kMaxTermLog2 - kFracBits));
  }
  ++num_updates_;
  total_weight_ += w;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<u128>> StreamingFedAvg::HostSums() const {
  if (backend_ == nullptr) return sums_;
  std::vector<u128> host(dev_sums_.size());
  FEDLORA_RETURN_IF_ERROR(backend_->Download(host.data(), dev_sums_.data(), dev_sums_.bytes()));
  return host;
}

absl::Status StreamingFedAvg::Merge(const StreamingFedAvg& other) {
  if (other.spec_.size() != spec_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StreamingFedAvg::Merge: other has ", other.spec_.size(), " tensors, this has ", spec_.size()));
  }
  for (size_t t = 0; t < spec_.size(); ++t) {
    if (other.spec_[t].name != spec_[t].name || other.spec_[t].shape != spec_[t].shape) {
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg::Merge: tensor ", t, " is '", other.spec_[t].name,
                                                     "' ", ShapeString(other.spec_[t].shape), " in other but '",
                                                     spec_[t].name, "' ", ShapeString(spec_[t].shape), " here"));
    }
  }
  if (num_updates_ + other.num_updates_ > kMaxUpdates) {
    return absl::ResourceExhaustedError(absl::StrCat("StreamingFedAvg::Merge: ", num_updates_, " + ",
                                                     other.num_updates_, " updates exceed ", kMaxUpdates));
  }
  if (backend_ == nullptr && other.backend_ == nullptr) {
    for (size_t i = 0; i < sums_.size(); ++i) sums_[i] += other.sums_[i];
  } else {  // through the host: O(model) once per merge
    FEDLORA_ASSIGN_OR_RETURN(std::vector<u128> mine, HostSums());
    FEDLORA_ASSIGN_OR_RETURN(const std::vector<u128> theirs, other.HostSums());
    for (size_t i = 0; i < mine.size(); ++i) mine[i] += theirs[i];
    if (backend_ == nullptr) {
      sums_ = std::move(mine);
    } else {
      FEDLORA_RETURN_IF_ERROR(backend_->Upload(dev_sums_.data(), mine.data(), dev_sums_.bytes()));
    }
  }
  num_updates_ += other.num_updates_;
  total_weight_ += other.total_weight_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UpdateTensor>> StreamingFedAvg::Finish() const {
  if (num_updates_ == 0) return absl::FailedPreconditionError("StreamingFedAvg: no updates to average");
  std::vector<u128> downloaded;
  if (backend_ != nullptr) {
    FEDLORA_ASSIGN_OR_RETURN(downloaded, HostSums());
  }
  const std::vector<u128>& sums = backend_ == nullptr ? sums_ : downloaded;
  // mean = S * 2^-kFracBits / W. |S| < 2^127 converts to long double (64-bit mantissa on x86-64,
  // 113-bit on aarch64) with relative error <= 2^-64, the division adds as much, and the final
  // cast rounds to fp32: a deterministic function of (S, W) alone.
  const long double inv_scale = std::ldexp(1.0L, -kFracBits);
  const long double weight = static_cast<long double>(total_weight_);
  std::vector<UpdateTensor> out(spec_.size());
  for (size_t t = 0; t < spec_.size(); ++t) {
    out[t].name = spec_[t].name;
    out[t].shape = spec_[t].shape;
    const int64_t begin = offsets_[t], end = offsets_[t + 1];
    out[t].values.resize(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) {
      const i128 s = static_cast<i128>(sums[static_cast<size_t>(i)]);
      out[t].values[static_cast<size_t>(i - begin)] =
          static_cast<float>(static_cast<long double>(s) * inv_scale / weight);
    }
  }
  return out;
}

double UpdateNorm(const std::vector<UpdateTensor>& update) {
  double sq = 0.0;
  for (const UpdateTensor& t : update) {
    for (float x : t.values) sq += static_cast<double>(x) * static_cast<double>(x);
  }
  return std::sqrt(sq);
}

double ClipUpdateNorm(std::vector<UpdateTensor>& update, double max_norm) {
  const double norm = UpdateNorm(update);
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  double scale = max_norm / norm;
  for (int attempt = 0; attempt < 8; ++attempt) {
    for (UpdateTensor& t : update) {
      for (float& x : t.values) x = static_cast<float>(static_cast<double>(x) * scale);
    }
    const double now = UpdateNorm(update);
    if (now <= max_norm) return norm;
    // Rounding each value to fp32 left the norm a hair above the bound: shrink by a little more.
    scale = max_norm / now * (1.0 - 0x1p-20);
  }
  for (UpdateTensor& t : update) std::fill(t.values.begin(), t.values.end(), 0.0f);  // unreachable in practice
  return norm;
}

}  // namespace fedlora
