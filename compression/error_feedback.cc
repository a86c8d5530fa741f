#include "compression/error_feedback.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "compression/update_io.h"
#include "core/safetensors.h"
#include "core/status.h"

namespace fedlora {
namespace {

constexpr char kRunIdKey[] = "fedlora_run_id";
constexpr char kWarmStartPrefix[] = "low_rank_q/";
constexpr size_t kWarmStartPrefixSize = sizeof(kWarmStartPrefix) - 1;

}  // namespace

absl::StatusOr<ErrorFeedback> ErrorFeedback::Load(const std::string& path,
                                                  const std::string& run_id) {
  ErrorFeedback ef;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (absl::IsNotFound(file.status())) return ef;
  if (!file.ok()) return Annotate(file.status(), "error-feedback residual");
  auto it = (*file)->metadata().find(kRunIdKey);
  if (it == (*file)->metadata().end() || it->second != run_id) return ef;
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> tensors,
                           AdapterFromSafetensors(**file, "error-feedback residual " + path));
  for (UpdateTensor& t : tensors) {
    if (t.name.starts_with(kWarmStartPrefix)) {
      ef.warm_[t.name.substr(kWarmStartPrefixSize)] = std::move(t.values);
    } else {
      ef.residual_.push_back(std::move(t));
    }
  }
  return ef;
}

absl::Status ErrorFeedback::Save(const std::string& path, const std::string& run_id) const {
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const UpdateTensor& t : residual_) {
    tensors.push_back(
        {t.name, DType::kF32, t.shape, t.values.data(), t.values.size() * sizeof(float)});
  }
  for (const auto& [name, q] : warm_) {
    tensors.push_back({absl::StrCat(kWarmStartPrefix, name),
                       DType::kF32,
                       {static_cast<int64_t>(q.size())},
                       q.data(),
                       q.size() * sizeof(float)});
  }
  return WriteSafetensors(path, tensors, {{kRunIdKey, run_id}});
}

std::vector<UpdateTensor> ErrorFeedback::Corrected(const std::vector<UpdateTensor>& update) const {
  absl::flat_hash_map<std::string_view, const UpdateTensor*> by_name;
  for (const UpdateTensor& r : residual_) by_name[r.name] = &r;
  std::vector<UpdateTensor> out = update;
  for (UpdateTensor& t : out) {
    auto it = by_name.find(t.name);
    if (it == by_name.end() || it->second->shape != t.shape) continue;
    const std::vector<float>& r = it->second->values;
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] += r[i];
  }
  return out;
}

absl::StatusOr<std::string> ErrorFeedback::Encode(const std::vector<UpdateTensor>& update,
                                                  const CodecOptions& options,
                                                  kernels::Backend* backend) {
  std::vector<UpdateTensor> corrected = Corrected(update);
  CodecOptions o = options;
  pending_warm_ = warm_;
  o.warm_start = options.sparsifier == Sparsifier::kLowRank ? &pending_warm_ : nullptr;
  FEDLORA_ASSIGN_OR_RETURN(std::string wire, EncodeUpdate(corrected, o, backend));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> sent, DecodeUpdate(wire, DecodeLimits{}));
  for (size_t t = 0; t < corrected.size(); ++t) {
    std::vector<float>& c = corrected[t].values;
    const std::vector<float>& s = sent[t].values;
    for (size_t i = 0; i < c.size(); ++i) c[i] -= s[i];
  }
  pending_ = std::move(corrected);
  has_pending_ = true;
  return wire;
}

void ErrorFeedback::Commit() {
  if (!has_pending_) return;
  residual_ = std::move(pending_);
  pending_.clear();
  warm_ = std::move(pending_warm_);
  pending_warm_.clear();
  has_pending_ = false;
}

}  // namespace fedlora
