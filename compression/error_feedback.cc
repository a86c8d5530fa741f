#include "compression/error_feedback.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "compression/update_io.h"
#include "core/safetensors.h"
#include "core/status.h"

namespace fedlora {
namespace {

constexpr char kRunIdKey[] = "fedlora_run_id";

}  // namespace

absl::StatusOr<ErrorFeedback> ErrorFeedback::Load(const std::string& path, const std::string& run_id) {
  ErrorFeedback ef;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (absl::IsNotFound(file.status())) return ef;
  if (!file.ok()) return Annotate(file.status(), "error-feedback residual");
  auto it = (*file)->metadata().find(kRunIdKey);
  if (it == (*file)->metadata().end() || it->second != run_id) return ef;
  FEDLORA_ASSIGN_OR_RETURN(ef.residual_, AdapterFromSafetensors(**file, "error-feedback residual " + path));
  return ef;
}

absl::Status ErrorFeedback::Save(const std::string& path, const std::string& run_id) const {
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const UpdateTensor& t : residual_) {
    tensors.push_back({t.name, DType::kF32, t.shape, t.values.data(), t.values.size() * sizeof(float)});
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
                                                  const CodecOptions& options) {
  std::vector<UpdateTensor> corrected = Corrected(update);
  FEDLORA_ASSIGN_OR_RETURN(std::string wire, EncodeUpdate(corrected, options));
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
  has_pending_ = false;
}

}  // namespace fedlora
