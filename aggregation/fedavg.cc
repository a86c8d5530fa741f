#include "aggregation/fedavg.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

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

// The fixed-point term (kernels/base/fixed_point.h), or nullopt when x is NaN/Inf or out of range.
std::optional<u128> FixedPointTerm(float x, uint64_t w) {
  u128 q;
  if (!kernels::FixedPointTerm(std::bit_cast<uint32_t>(x), w, &q)) return std::nullopt;
  return q;
}

}  // namespace

std::vector<TensorSpec> SpecFromUpdate(const std::vector<UpdateTensor>& tensors) {
  std::vector<TensorSpec> spec;
  spec.reserve(tensors.size());
  for (const UpdateTensor& t : tensors) spec.push_back({t.name, t.shape});
  return spec;
}

absl::StatusOr<StreamingFedAvg> StreamingFedAvg::Create(std::vector<TensorSpec> spec,
                                                        Device device) {
  if (spec.empty())
    return absl::InvalidArgumentError("StreamingFedAvg: the adapter spec has no tensors");
  StreamingFedAvg avg;
  int64_t total = 0;
  for (size_t i = 0; i < spec.size(); ++i) {
    const TensorSpec& t = spec[i];
    if (t.name.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("StreamingFedAvg: spec tensor ", i, " has no name"));
    if (!avg.index_.emplace(t.name, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("StreamingFedAvg: duplicate spec tensor '", t.name, "'"));
    }
    auto numel = CheckedNumel(t.shape);
    if (!numel.ok())
      return Annotate(numel.status(), absl::StrCat("StreamingFedAvg: spec tensor '", t.name, "'"));
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
  FEDLORA_ASSIGN_OR_RETURN(avg.dev_values_,
                           kernels::DeviceArray<float>::Zeros(*avg.backend_, total));
  avg.staging_.resize(static_cast<size_t>(total));
  return avg;
}

// One tensor of an update: `count` values, at positions index[0, count) of the tensor when
// `index` is set, else at 0, 1, ...
struct StreamingFedAvg::TensorView {
  const std::string& name;
  const std::vector<int64_t>& shape;
  const float* values;
  const int64_t* index;
  int64_t count;
  int64_t Position(int64_t i) const { return index != nullptr ? index[i] : i; }
};

absl::Status StreamingFedAvg::Add(const std::vector<UpdateTensor>& update, int64_t num_examples) {
  std::vector<TensorView> views;
  views.reserve(update.size());
  for (const UpdateTensor& u : update) {
    views.push_back(
        {u.name, u.shape, u.values.data(), nullptr, static_cast<int64_t>(u.values.size())});
  }
  return AddViews(views, num_examples);
}

absl::Status StreamingFedAvg::Add(const std::vector<KeptTensor>& update, int64_t num_examples) {
  std::vector<TensorView> views;
  views.reserve(update.size());
  for (const KeptTensor& u : update) {
    if (!u.dense && u.indices.size() != u.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: tensor '", u.name, "' has ",
                                                     u.indices.size(), " indices for ",
                                                     u.values.size(), " kept values"));
    }
    views.push_back({u.name, u.shape, u.values.data(), u.dense ? nullptr : u.indices.data(),
                     static_cast<int64_t>(u.values.size())});
  }
  return AddViews(views, num_examples);
}

absl::Status StreamingFedAvg::AddViews(const std::vector<TensorView>& update,
                                       int64_t num_examples) {
  if (num_examples < 1 || num_examples > kMaxWeight) {
    return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: num_examples ", num_examples,
                                                   " is not in [1, ", kMaxWeight, "]"));
  }
  if (num_updates_ >= kMaxUpdates) {
    return absl::ResourceExhaustedError(
        absl::StrCat("StreamingFedAvg: already holds the maximum of ", kMaxUpdates, " updates"));
  }
  if (update.size() != spec_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: update has ", update.size(),
                                                   " tensors, the global adapter has ",
                                                   spec_.size()));
  }
  // Structure first (names, sizes and positions only), so that a mismatched update touches no sums.
  std::vector<size_t> slot(update.size());
  std::vector<bool> seen(spec_.size(), false);
  for (size_t t = 0; t < update.size(); ++t) {
    const TensorView& u = update[t];
    auto it = index_.find(u.name);
    if (it == index_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: update tensor '", u.name,
                                                     "' is not in the global adapter"));
    }
    if (seen[it->second]) {
      return absl::InvalidArgumentError(
          absl::StrCat("StreamingFedAvg: update repeats tensor '", u.name, "'"));
    }
    seen[it->second] = true;
    slot[t] = it->second;
    const TensorSpec& s = spec_[it->second];
    if (u.shape != s.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("StreamingFedAvg: tensor '", u.name, "' has shape ", ShapeString(u.shape),
                       ", the global adapter has ", ShapeString(s.shape)));
    }
    const int64_t n = offsets_[it->second + 1] - offsets_[it->second];
    if (u.index == nullptr && u.count != n) {
      return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: tensor '", u.name, "' has ",
                                                     u.count, " values for shape ",
                                                     ShapeString(s.shape), " (", n, ")"));
    }
    for (int64_t i = 0; u.index != nullptr && i < u.count; ++i) {
      const int64_t floor = i == 0 ? 0 : u.index[i - 1] + 1;
      if (u.index[i] < floor || u.index[i] >= n) {
        return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: tensor '", u.name,
                                                       "' kept index ", i, " (", u.index[i],
                                                       ") is not in [", floor, ", ", n, ")"));
      }
    }
  }
  const uint64_t w = static_cast<uint64_t>(num_examples);
  FEDLORA_RETURN_IF_ERROR(backend_ != nullptr ? AddOnDevice(update, slot, w)
                                              : AddOnHost(update, slot, w));
  ++num_updates_;
  total_weight_ += w;
  return absl::OkStatus();
}

namespace {

// Refusing value i of tensor `name` (at position `pos`): not finite, or out of the accumulator's range.
absl::Status BadValue(const std::string& name, int64_t pos, float x, uint64_t w) {
  if (!std::isfinite(x)) {
    return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg: tensor '", name, "' value ",
                                                   pos, " is not finite (", x, ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("StreamingFedAvg: tensor '", name, "' value ", pos, " (", x,
                   ") times num_examples ", w, " exceeds the accumulator range 2^",
                   StreamingFedAvg::kMaxTermLog2 - StreamingFedAvg::kFracBits));
}

}  // namespace

absl::Status StreamingFedAvg::AddOnHost(const std::vector<TensorView>& update,
                                        const std::vector<size_t>& slot, uint64_t w) {
  // One pass over the values, checking and accumulating each (wrapping u128 adds; exact, see the
  // header): the values are read once, not once to check and again to add. A bad value ends the
  // pass, and the terms this call added so far are subtracted again. The sums are modulo 2^128, so
  // subtracting the same terms restores every bit: a refused update leaves no trace.
  for (size_t t = 0; t < update.size(); ++t) {
    const TensorView& u = update[t];
    u128* sums = sums_.data() + offsets_[slot[t]];
    for (int64_t i = 0; i < u.count; ++i) {
      const std::optional<u128> term = FixedPointTerm(u.values[i], w);  // nullopt for NaN/Inf too
      if (term.has_value()) {
        sums[u.Position(i)] += *term;
        continue;
      }
      // Roll back: every earlier tensor in full, this one up to (not including) value i.
      for (size_t r = 0; r <= t; ++r) {
        const TensorView& v = update[r];
        u128* back = sums_.data() + offsets_[slot[r]];
        const int64_t end = r == t ? i : v.count;
        for (int64_t j = 0; j < end; ++j) back[v.Position(j)] -= *FixedPointTerm(v.values[j], w);
      }
      return BadValue(u.name, u.Position(i), u.values[i], w);
    }
  }
  return absl::OkStatus();
}

absl::Status StreamingFedAvg::AddOnDevice(const std::vector<TensorView>& update,
                                          const std::vector<size_t>& slot, uint64_t w) {
  // A dense update is staged in spec order and added element by element; a sparse one as its kept
  // values, each with its position in the sums.
  bool dense = true;
  for (const TensorView& u : update) dense = dense && u.index == nullptr;
  std::vector<int64_t> begin(update.size());  // where each tensor's values start in staging_
  int64_t staged = 0;
  for (size_t t = 0; t < update.size(); ++t) {
    const TensorView& u = update[t];
    begin[t] = dense ? offsets_[slot[t]] : staged;
    std::copy(u.values, u.values + u.count, staging_.begin() + begin[t]);
    if (!dense) {
      index_staging_.resize(static_cast<size_t>(staged + u.count));
      for (int64_t i = 0; i < u.count; ++i)
        index_staging_[staged + i] = offsets_[slot[t]] + u.Position(i);
    }
    staged += u.count;
  }
  kernels::FixedPointAccumulateArgs args{
      .n = staged, .x = dev_values_.data(), .weight = w, .sums = dev_sums_.data()};
  FEDLORA_RETURN_IF_ERROR(
      backend_->Upload(dev_values_.data(), staging_.data(), staged * sizeof(float)));
  if (!dense) {
    if (dev_index_.size() < static_cast<size_t>(staged)) {
      dev_index_ = {};  // freed before the larger one is asked for
      FEDLORA_ASSIGN_OR_RETURN(dev_index_, kernels::DeviceArray<int64_t>::Zeros(*backend_, staged));
    }
    FEDLORA_RETURN_IF_ERROR(
        backend_->Upload(dev_index_.data(), index_staging_.data(), staged * sizeof(int64_t)));
    args.index = dev_index_.data();
  }
  int64_t bad = -1;
  args.first_bad = &bad;
  FEDLORA_RETURN_IF_ERROR(kernels::FixedPointAccumulate(backend_->ctx(), args));
  if (bad < 0) return absl::OkStatus();
  // Every in-range term was added: subtract the same terms, which restores every bit.
  args.sign = -1;
  int64_t again = -1;
  args.first_bad = &again;
  FEDLORA_RETURN_IF_ERROR(kernels::FixedPointAccumulate(backend_->ctx(), args));
  // The kernel names the smallest staged position: in spec order when dense, else in update order.
  size_t t = 0;
  while (t + 1 < update.size() && !(begin[t] <= bad && bad < begin[t] + update[t].count)) ++t;
  return BadValue(update[t].name, update[t].Position(bad - begin[t]),
                  staging_[static_cast<size_t>(bad)], w);
}

absl::StatusOr<std::vector<u128>> StreamingFedAvg::HostSums() const {
  if (backend_ == nullptr) return sums_;
  std::vector<u128> host(dev_sums_.size());
  FEDLORA_RETURN_IF_ERROR(backend_->Download(host.data(), dev_sums_.data(), dev_sums_.bytes()));
  return host;
}

absl::Status StreamingFedAvg::Merge(const StreamingFedAvg& other) {
  if (other.spec_.size() != spec_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("StreamingFedAvg::Merge: other has ",
                                                   other.spec_.size(), " tensors, this has ",
                                                   spec_.size()));
  }
  for (size_t t = 0; t < spec_.size(); ++t) {
    if (other.spec_[t].name != spec_[t].name || other.spec_[t].shape != spec_[t].shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("StreamingFedAvg::Merge: tensor ", t, " is '", other.spec_[t].name, "' ",
                       ShapeString(other.spec_[t].shape), " in other but '", spec_[t].name, "' ",
                       ShapeString(spec_[t].shape), " here"));
    }
  }
  if (num_updates_ + other.num_updates_ > kMaxUpdates) {
    return absl::ResourceExhaustedError(absl::StrCat("StreamingFedAvg::Merge: ", num_updates_,
                                                     " + ", other.num_updates_, " updates exceed ",
                                                     kMaxUpdates));
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
  if (num_updates_ == 0)
    return absl::FailedPreconditionError("StreamingFedAvg: no updates to average");
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

namespace {

template <class Tensor>
double NormOf(const std::vector<Tensor>& update) {
  double sq = 0.0;
  for (const Tensor& t : update) {
    for (float x : t.values) sq += static_cast<double>(x) * static_cast<double>(x);
  }
  return std::sqrt(sq);
}

template <class Tensor>
double ClipNorm(std::vector<Tensor>& update, double max_norm) {
  const double norm = NormOf(update);
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  double scale = max_norm / norm;
  for (int attempt = 0; attempt < 8; ++attempt) {
    for (Tensor& t : update) {
      for (float& x : t.values) x = static_cast<float>(static_cast<double>(x) * scale);
    }
    const double now = NormOf(update);
    if (now <= max_norm) return norm;
    // Rounding each value to fp32 left the norm a hair above the bound: shrink by a little more.
    scale = max_norm / now * (1.0 - 0x1p-20);
  }
  for (Tensor& t : update)
    std::fill(t.values.begin(), t.values.end(), 0.0f);  // unreachable in practice
  return norm;
}

}  // namespace

double UpdateNorm(const std::vector<UpdateTensor>& update) { return NormOf(update); }
double UpdateNorm(const std::vector<KeptTensor>& update) { return NormOf(update); }
double ClipUpdateNorm(std::vector<UpdateTensor>& update, double max_norm) {
  return ClipNorm(update, max_norm);
}
double ClipUpdateNorm(std::vector<KeptTensor>& update, double max_norm) {
  return ClipNorm(update, max_norm);
}

}  // namespace fedlora
