#include "server/adapter_io.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {

absl::Status CanonicalizeAdapter(std::vector<UpdateTensor>& adapter) {
  std::sort(adapter.begin(), adapter.end(),
            [](const UpdateTensor& a, const UpdateTensor& b) { return a.name < b.name; });
  for (size_t i = 0; i < adapter.size(); ++i) {
    const UpdateTensor& t = adapter[i];
    if (t.name.empty()) return absl::InvalidArgumentError("adapter tensor with an empty name");
    if (i > 0 && adapter[i - 1].name == t.name) {
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", t.name, "' appears twice"));
    }
    FEDLORA_ASSIGN_OR_RETURN(int64_t numel, CheckedNumel(t.shape));
    if (numel != static_cast<int64_t>(t.values.size())) {
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", t.name, "' has ", t.values.size(),
                                                     " values for ", numel, " elements"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> AdapterToSafetensors(const std::vector<UpdateTensor>& adapter) {
  std::vector<SafetensorsTensorToWrite> tensors;
  tensors.reserve(adapter.size());
  for (const UpdateTensor& t : adapter) {
    tensors.push_back({t.name, DType::kF32, t.shape, t.values.data(), t.values.size() * sizeof(float)});
  }
  return SerializeSafetensors(tensors, {{"format", "pt"}});
}

absl::StatusOr<std::vector<UpdateTensor>> AdapterFromSafetensors(const std::string& bytes) {
  FEDLORA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::FromBytes(bytes, "global adapter"));
  std::vector<UpdateTensor> out;
  for (const std::string& name : file->names()) {
    FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, file->Get(name));
    if (t.dtype != DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("global adapter tensor '", name, "' is ", ToAbsl(DTypeName(t.dtype)), ", expected F32"));
    }
    UpdateTensor u;
    u.name = name;
    u.shape = t.shape;
    u.values.resize(t.size / sizeof(float));
    if (t.size > 0) std::memcpy(u.values.data(), t.data, t.size);
    out.push_back(std::move(u));
  }
  return out;
}

absl::StatusOr<CodecOptions> CodecOptionsFromSpec(const v1::CodecSpec& spec) {
  CodecOptions options;
  const int n = spec.stages_size();
  for (int i = 0; i < n; ++i) {
    const v1::CodecStage& stage = spec.stages(i);
    switch (stage.id()) {
      case v1::CodecStage::NONE:
        break;
      case v1::CodecStage::FP16:
        options.codec = CodecId::kF16;
        break;
      case v1::CodecStage::BF16:
        options.codec = CodecId::kBF16;
        break;
      case v1::CodecStage::ZSTD:
        if (i != n - 1) {
          return absl::InvalidArgumentError(absl::StrCat("codec stage ", i, ": ZSTD must be the last stage"));
        }
        options.zstd = true;
        if (stage.has_zstd() && stage.zstd().has_level()) options.zstd_level = stage.zstd().level();
        break;
      default:
        return absl::UnimplementedError(absl::StrCat("codec stage ", i, ": ",
                                                     v1::CodecStage::Id_Name(stage.id()),
                                                     " is not implemented by this build"));
    }
  }
  return options;
}

void FillTensorSpecs(const std::vector<UpdateTensor>& adapter, v1::AdapterManifest* manifest) {
  manifest->clear_tensors();
  for (const UpdateTensor& t : adapter) {
    v1::TensorSpec* spec = manifest->add_tensors();
    spec->set_name(t.name);
    spec->set_dtype("F32");
    for (int64_t d : t.shape) spec->add_shape(d);
  }
}

}  // namespace fedlora
