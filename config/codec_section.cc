// The codec and downlink_codec sections: each stage's parameter defaults (compression/codec.h owns
// their values) and the checks of a stage list.
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "config/sections.h"
#include "proto/wire.h"

namespace fedlora::config_internal {
namespace {

using v1::CodecStage;

// For the downlink (`uplink` false) error_feedback stays unset: it does not apply there.
// `shared_scale`: the run has secure aggregation, whose QUANT stage has one scale for the whole
// update (no blocks).
void ApplyCodecStageDefaults(CodecStage* stage, bool uplink, bool shared_scale = false) {
  if (stage->version() == 0) stage->set_version(kCodecStageVersion);
  // Parameters are filled only for a stage whose params case is unset or already matches its id; a
  // mismatch is left for validation to report.
  switch (stage->id()) {
    case CodecStage::ZSTD: {
      if (stage->has_zstd() || stage->params_case() == CodecStage::PARAMS_NOT_SET) {
        auto* p = stage->mutable_zstd();
        if (!p->has_level()) p->set_level(kDefaultZstdLevel);
      }
      break;
    }
    case CodecStage::TOPK: {
      if (stage->has_top_k() || stage->params_case() == CodecStage::PARAMS_NOT_SET) {
        auto* p = stage->mutable_top_k();
        if (!p->has_fraction()) p->set_fraction(kDefaultSparsifyFraction);
        if (uplink && !p->has_error_feedback()) p->set_error_feedback(true);
        if (!p->has_global()) p->set_global(false);
      }
      break;
    }
    case CodecStage::RANDOMK: {
      if (stage->has_random_k() || stage->params_case() == CodecStage::PARAMS_NOT_SET) {
        auto* p = stage->mutable_random_k();
        if (!p->has_fraction()) p->set_fraction(kDefaultSparsifyFraction);
        if (uplink && !p->has_error_feedback()) p->set_error_feedback(true);
      }
      break;
    }
    case CodecStage::QUANT: {
      if (stage->has_quant() || stage->params_case() == CodecStage::PARAMS_NOT_SET) {
        auto* p = stage->mutable_quant();
        if (!p->has_bits()) p->set_bits(kDefaultQuantBits);
        if (!p->has_block_size() && !shared_scale) p->set_block_size(kDefaultQuantBlockSize);
        if (!p->has_stochastic()) p->set_stochastic(kDefaultQuantStochastic);
        if (uplink && !p->has_error_feedback()) p->set_error_feedback(!p->stochastic());
      }
      break;
    }
    case CodecStage::LOWRANK: {
      if (stage->has_low_rank() || stage->params_case() == CodecStage::PARAMS_NOT_SET) {
        auto* p = stage->mutable_low_rank();
        if (!p->has_rank()) p->set_rank(kDefaultLowRank);
      }
      break;
    }
    default:
      break;
  }
}

const char* StageName(CodecStage::Id id) {
  return CodecStage::Id_IsValid(id) ? CodecStage::Id_Name(id).c_str() : "?";
}

// How many stages of each exclusive kind a codec has.
struct StageKinds {
  int value_encoders = 0;  // FP16, BF16, QUANT: alternative encodings of each value
  int sparsifiers = 0;     // TOPK, RANDOMK, LOWRANK: alternative reductions of each tensor
};

// Stage `i` of `n`'s place and parameters; returns the parameters case its id expects.
CodecStage::ParamsCase ValidateStage(Problems& p, const CodecStage& s, int i, int n,
                                     const std::string& path, bool shared_scale,
                                     StageKinds* kinds) {
  CodecStage::ParamsCase expected = CodecStage::PARAMS_NOT_SET;
  switch (s.id()) {
    case CodecStage::NONE:
      if (n != 1) p.Bad(path + ".id", "NONE", "must be the only stage");
      break;
    case CodecStage::ZSTD:
      expected = CodecStage::kZstd;
      if (i != n - 1) p.Bad(path + ".id", "ZSTD", "must be the last stage");
      if (s.has_zstd()) p.Range<int32_t>(path + ".zstd.level", s.zstd().level(), -7, 22);
      break;
    case CodecStage::FP16:
    case CodecStage::BF16:
      ++kinds->value_encoders;
      break;
    case CodecStage::TOPK:
      expected = CodecStage::kTopK;
      ++kinds->sparsifiers;
      if (s.has_top_k()) {
        p.RealRange(path + ".top_k.fraction", s.top_k().fraction(), 0, true, 1, false);
      }
      break;
    case CodecStage::RANDOMK:
      expected = CodecStage::kRandomK;
      ++kinds->sparsifiers;
      if (s.has_random_k()) {
        p.RealRange(path + ".random_k.fraction", s.random_k().fraction(), 0, true, 1, false);
      }
      break;
    case CodecStage::QUANT:
      expected = CodecStage::kQuant;
      ++kinds->value_encoders;
      if (s.has_quant()) {
        uint32_t bits = s.quant().bits();
        if (bits != 1 && bits != 2 && bits != 4 && bits != 8) {
          p.Bad(path + ".quant.bits", bits, "must be 1, 2, 4 or 8");
        }
        if (s.quant().has_block_size() || !shared_scale) {
          p.Range<uint32_t>(path + ".quant.block_size", s.quant().block_size(), 8, 65536);
          if (s.quant().block_size() % 8 != 0) {
            p.Bad(path + ".quant.block_size", s.quant().block_size(), "must be a multiple of 8");
          }
        }
      }
      break;
    case CodecStage::LOWRANK:
      expected = CodecStage::kLowRank;
      ++kinds->sparsifiers;
      if (s.has_low_rank()) {
        p.Range<uint32_t>(path + ".low_rank.rank", s.low_rank().rank(), 1, 4096);
      }
      break;
    default:
      break;
  }
  return expected;
}

// A sparsifier chooses among the raw values, so it comes before any value encoder.
void ValidateStageOrder(Problems& p, const v1::CodecSpec& codec, const std::string& field) {
  bool encoded = false;
  for (int i = 0; i < codec.stages_size(); ++i) {
    const CodecStage::Id id = codec.stages(i).id();
    if (id == CodecStage::FP16 || id == CodecStage::BF16 || id == CodecStage::QUANT) encoded = true;
    if ((id == CodecStage::TOPK || id == CodecStage::RANDOMK || id == CodecStage::LOWRANK) &&
        encoded) {
      p.Bad(absl::StrCat(field, ".stages[", i, "].id"), StageName(id),
            "must come before FP16, BF16 or QUANT");
    }
  }
}

}  // namespace

void ValidateCodec(Problems& p, const v1::CodecSpec& codec, const std::string& field,
                   bool shared_scale) {
  const bool downlink = field != "codec";
  std::set<int> seen;
  StageKinds kinds;
  for (int i = 0; i < codec.stages_size(); ++i) {
    const CodecStage& s = codec.stages(i);
    const std::string path = absl::StrCat(field, ".stages[", i, "]");
    if (!CodecStage::Id_IsValid(s.id()) || s.id() == CodecStage::ID_UNSPECIFIED) {
      p.Bad(path + ".id", s.id(), "is not a known codec stage");
      continue;
    }
    if (s.version() < 1 || s.version() > kCodecStageVersion) {
      p.Bad(path + ".version", s.version(),
            absl::StrCat("is not a known version (1 to ", kCodecStageVersion, ")"));
    }
    if (!seen.insert(s.id()).second) p.Bad(path + ".id", StageName(s.id()), "appears twice");
    const CodecStage::ParamsCase expected =
        ValidateStage(p, s, i, codec.stages_size(), path, shared_scale, &kinds);
    const bool error_feedback_set = (s.has_top_k() && s.top_k().has_error_feedback()) ||
                                    (s.has_random_k() && s.random_k().has_error_feedback()) ||
                                    (s.has_quant() && s.quant().has_error_feedback());
    if (downlink && error_feedback_set) {
      p.Add(absl::StrCat(
          path, " sets error_feedback, which does not apply to the downlink: the server always ",
          "carries what the codec drops into the next round's delta"));
    }
    if (s.params_case() != expected) {
      p.Add(absl::StrCat(path, " has parameters that do not belong to stage ", StageName(s.id())));
    }
  }
  if (kinds.value_encoders > 1)
    p.Add(absl::StrCat(field, ".stages combine more than one of FP16, BF16 and QUANT"));
  ValidateStageOrder(p, codec, field);
  if (kinds.sparsifiers > 1)
    p.Add(absl::StrCat(field, ".stages combine more than one of TOPK, RANDOMK and LOWRANK"));
}

void ApplyCodecDefaults(v1::RunConfig* c) {
  for (CodecStage& stage : *c->mutable_codec()->mutable_stages()) {
    ApplyCodecStageDefaults(&stage, /*uplink=*/true, c->privacy().secure_aggregation());
  }
  for (CodecStage& stage : *c->mutable_downlink_codec()->mutable_stages()) {
    ApplyCodecStageDefaults(&stage, /*uplink=*/false);
  }
}

}  // namespace fedlora::config_internal
