#include "compression/update_io.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "compression/quantize.h"
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
      case v1::CodecStage::TOPK:
        options.sparsifier = Sparsifier::kTopK;
        options.fraction =
            stage.top_k().has_fraction() ? stage.top_k().fraction() : kDefaultSparsifyFraction;
        options.global_top_k = stage.top_k().global();
        options.error_feedback |=
            !stage.top_k().has_error_feedback() || stage.top_k().error_feedback();
        break;
      case v1::CodecStage::RANDOMK:
        options.sparsifier = Sparsifier::kRandomK;
        options.fraction = stage.random_k().has_fraction() ? stage.random_k().fraction()
                                                           : kDefaultSparsifyFraction;
        options.error_feedback |=
            !stage.random_k().has_error_feedback() || stage.random_k().error_feedback();
        break;
      case v1::CodecStage::LOWRANK: {
        // PowerSGD is biased: its error feedback is always on.
        options.sparsifier = Sparsifier::kLowRank;
        options.low_rank = stage.low_rank().has_rank() ? stage.low_rank().rank() : kDefaultLowRank;
        options.error_feedback = true;
        if (options.low_rank < 1 || options.low_rank > kMaxLowRank) {
          return absl::InvalidArgumentError(absl::StrCat("codec stage ", i, ": low_rank.rank ",
                                                         options.low_rank, " is not in [1, ",
                                                         kMaxLowRank, "]"));
        }
        break;
      }
      case v1::CodecStage::QUANT: {
        const v1::QuantParams& q = stage.quant();
        options.codec = CodecId::kQuant;
        options.quant_bits = q.has_bits() ? static_cast<int>(q.bits()) : kDefaultQuantBits;
        options.quant_block_size = q.has_block_size() ? q.block_size() : kDefaultQuantBlockSize;
        options.quant_stochastic = q.has_stochastic() ? q.stochastic() : kDefaultQuantStochastic;
        options.error_feedback |=
            q.has_error_feedback() ? q.error_feedback() : !options.quant_stochastic;
        FEDLORA_RETURN_IF_ERROR(
            Annotate(CheckQuantSpec(options.quant_bits, options.quant_block_size),
                     absl::StrCat("codec stage ", i)));
        break;
      }
      case v1::CodecStage::ZSTD:
        if (i != n - 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("codec stage ", i, ": ZSTD must be the last stage"));
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
  return AdapterFromSafetensors(*file, "global adapter");
}

absl::StatusOr<std::vector<UpdateTensor>> AdapterFromSafetensors(const SafetensorsFile& file,
                                                                 std::string_view what) {
  std::vector<UpdateTensor> out;
  for (const std::string& name : file.names()) {
    FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, file.Get(name));
    if (t.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), " tensor '", name, "' is ",
                                                     ToAbsl(DTypeName(t.dtype)), ", expected F32"));
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

absl::StatusOr<std::string> AdapterToSafetensors(const std::vector<UpdateTensor>& adapter) {
  std::vector<SafetensorsTensorToWrite> tensors;
  tensors.reserve(adapter.size());
  for (const UpdateTensor& t : adapter) {
    tensors.push_back(
        {t.name, DType::kF32, t.shape, t.values.data(), t.values.size() * sizeof(float)});
  }
  return SerializeSafetensors(tensors, {{"format", "pt"}});
}

}  // namespace fedlora
