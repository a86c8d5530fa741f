#include "compression/update_io.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {

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

}  // namespace fedlora
