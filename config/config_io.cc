// The run config's parsing, defaults and validation. Over 600 lines, not split yet: issue 37 moves
// each domain's defaults and validation to its own module (the resolved run config), which is the
// split; a split by section here first would be undone by it.
#include "config/config_io.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/config_json.h"
#include "config/config_paths.h"
#include "core/status.h"
#include "google/protobuf/util/json_util.h"
#include "proto/address.h"
#include "proto/wire.h"

namespace fedlora {
namespace {

using v1::AdaptiveClipping;
using v1::AggregationConfig;
using v1::CodecStage;
using v1::DifferentialPrivacyConfig;
using v1::RunConfig;
using v1::SimulationConfig;
using v1::TaskConfig;
using v1::TrainingConfig;

// ------------------------------------------------------------------------------------------------
// Defaults

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
        if (!p->has_level()) p->set_level(3);
      }
      break;
    }
    case CodecStage::TOPK: {
      if (stage->has_top_k() || stage->params_case() == CodecStage::PARAMS_NOT_SET) {
        auto* p = stage->mutable_top_k();
        if (!p->has_fraction()) p->set_fraction(0.01);
        if (uplink && !p->has_error_feedback()) p->set_error_feedback(true);
        if (!p->has_global()) p->set_global(false);
      }
      break;
    }
    case CodecStage::RANDOMK: {
      if (stage->has_random_k() || stage->params_case() == CodecStage::PARAMS_NOT_SET) {
        auto* p = stage->mutable_random_k();
        if (!p->has_fraction()) p->set_fraction(0.01);
        if (uplink && !p->has_error_feedback()) p->set_error_feedback(true);
      }
      break;
    }
    case CodecStage::QUANT: {
      if (stage->has_quant() || stage->params_case() == CodecStage::PARAMS_NOT_SET) {
        auto* p = stage->mutable_quant();
        if (!p->has_bits()) p->set_bits(8);
        if (!p->has_block_size() && !shared_scale) p->set_block_size(256);
        if (!p->has_stochastic()) p->set_stochastic(true);
        if (uplink && !p->has_error_feedback()) p->set_error_feedback(!p->stochastic());
      }
      break;
    }
    case CodecStage::LOWRANK: {
      if (stage->has_low_rank() || stage->params_case() == CodecStage::PARAMS_NOT_SET) {
        auto* p = stage->mutable_low_rank();
        if (!p->has_rank()) p->set_rank(4);
      }
      break;
    }
    default:
      break;
  }
}

// The last path component of a model directory, ignoring trailing slashes ("models/x/" -> "x").
std::string LastPathComponent(const std::string& path) {
  size_t end = path.find_last_not_of('/');
  if (end == std::string::npos) return "";
  size_t start = path.find_last_of('/', end);
  start = start == std::string::npos ? 0 : start + 1;
  return path.substr(start, end - start + 1);
}

// ------------------------------------------------------------------------------------------------
// Validation

// Collects every problem of a config, each naming its field path.
class Problems {
 public:
  void Add(std::string message) { messages_.push_back(std::move(message)); }

  // "<path> (<value>) <what>"
  template <typename T>
  void Bad(const std::string& path, const T& value, const std::string& what) {
    Add(absl::StrCat(path, " (", value, ") ", what));
  }

  template <typename T>
  void Range(const std::string& path, T value, T lo, T hi) {
    if (value < lo || value > hi) Bad(path, value, absl::StrCat("must be in [", lo, ", ", hi, "]"));
  }

  // Finite and within [lo, hi], with either end optionally open.
  void RealRange(const std::string& path, double value, double lo, bool lo_open, double hi,
                 bool hi_open) {
    bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) &&
              (hi_open ? value < hi : value <= hi);
    if (!ok) {
      Bad(path, value,
          absl::StrCat("must be finite and in ", lo_open ? "(" : "[", lo, ", ", hi,
                       hi_open ? ")" : "]"));
    }
  }
  void Positive(const std::string& path, double value) {
    if (!(std::isfinite(value) && value > 0)) Bad(path, value, "must be finite and > 0");
  }
  void NonNegative(const std::string& path, double value) {
    if (!(std::isfinite(value) && value >= 0)) Bad(path, value, "must be finite and >= 0");
  }
  void NonEmpty(const std::string& path, const std::string& value) {
    if (value.empty()) Add(absl::StrCat(path, " must not be empty"));
  }

  absl::Status ToStatus() const {
    if (messages_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(messages_, "; "));
  }

 private:
  std::vector<std::string> messages_;
};

// Quotes a string for an error message.
std::string Quoted(const std::string& s) { return absl::StrCat("\"", absl::CEscape(s), "\""); }

bool IsLowerHex(const std::string& s, size_t length) {
  if (s.size() != length) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A non-empty list of non-empty, distinct strings.
void CheckNameList(Problems& p, const std::string& path,
                   const google::protobuf::RepeatedPtrField<std::string>& names, size_t min_count) {
  if (static_cast<size_t>(names.size()) < min_count) {
    p.Add(absl::StrCat(path, " has ", names.size(), " entries, needs at least ", min_count));
  }
  std::set<std::string> seen;
  for (int i = 0; i < names.size(); ++i) {
    std::string item = absl::StrCat(path, "[", i, "]");
    if (names[i].empty()) p.Add(absl::StrCat(item, " must not be empty"));
    if (!seen.insert(names[i]).second) p.Bad(item, Quoted(names[i]), "is a duplicate");
  }
}

void ValidateModel(Problems& p, const v1::ModelConfig& m) {
  p.NonEmpty("model.path", m.path());
  if (m.id().empty() && !m.path().empty()) {
    p.Bad("model.path", Quoted(m.path()), "gives no model.id; set model.id");
  }
  if (!m.sha256().empty() && !IsLowerHex(m.sha256(), 64)) {
    p.Bad("model.sha256", Quoted(m.sha256()), "must be 64 lowercase hex characters");
  }
  p.Range<uint32_t>("model.max_seq_len", m.max_seq_len(), 1, 1u << 20);
  if (!v1::ModelConfig::Precision_IsValid(m.precision())) {
    p.Bad("model.precision", m.precision(), "is not a known precision (FP32, BF16, INT8)");
  }
}

void ValidateLora(Problems& p, const v1::LoraConfig& l) {
  p.Range<uint32_t>("lora.rank", l.rank(), 1, 4096);
  p.Positive("lora.alpha", l.alpha());
  p.RealRange("lora.dropout", l.dropout(), 0, false, 1, true);
  CheckNameList(p, "lora.target_modules", l.target_modules(), 1);
}

void ValidateTask(Problems& p, const TaskConfig& t) {
  if (!TaskConfig::Kind_IsValid(t.kind()) || t.kind() == TaskConfig::KIND_UNSPECIFIED) {
    p.Bad("task.kind", t.kind(), "is not a known task kind");
  } else if (t.kind() == TaskConfig::SEQUENCE_CLASSIFICATION) {
    CheckNameList(p, "task.labels", t.labels(), 2);
    p.NonEmpty("task.label_field", t.label_field());
    p.NonEmpty("task.text_field", t.text_field());
    if (!t.pair_field().empty() && t.pair_field() == t.text_field()) {
      p.Bad("task.pair_field", Quoted(t.pair_field()), "must differ from task.text_field");
    }
    for (const auto& [name, set] : {std::pair{"prompt_field", !t.prompt_field().empty()},
                                    {"response_field", !t.response_field().empty()},
                                    {"system_prompt", !t.system_prompt().empty()},
                                    {"chat_template", !t.chat_template().empty()},
                                    {"exact_match", t.exact_match()}}) {
      if (set)
        p.Add(absl::StrCat("task.", name, " belongs to CAUSAL_LM, not SEQUENCE_CLASSIFICATION"));
    }
  } else if (t.kind() == TaskConfig::CAUSAL_LM) {
    if (t.labels_size() > 0) {
      p.Add(absl::StrCat("task.labels has ", t.labels_size(), " entries; CAUSAL_LM takes none"));
    }
    for (const auto& [name, value] : {std::pair{"text_field", &t.text_field()},
                                      {"pair_field", &t.pair_field()},
                                      {"label_field", &t.label_field()}}) {
      if (!value->empty()) {
        p.Add(absl::StrCat("task.", name,
                           " belongs to SEQUENCE_CLASSIFICATION; CAUSAL_LM reads "
                           "task.prompt_field and task.response_field"));
      }
    }
    p.NonEmpty("task.prompt_field", t.prompt_field());
    p.NonEmpty("task.response_field", t.response_field());
    if (!t.prompt_field().empty() && t.prompt_field() == t.response_field()) {
      p.Bad("task.response_field", Quoted(t.response_field()),
            "must differ from task.prompt_field");
    }
  }
}

void ValidateTraining(Problems& p, const TrainingConfig& t) {
  switch (t.local_work_case()) {
    case TrainingConfig::kLocalEpochs:
      p.Range<uint32_t>("training.local_epochs", t.local_epochs(), 1, 1000);
      break;
    case TrainingConfig::kLocalSteps:
      p.Range<uint32_t>("training.local_steps", t.local_steps(), 1, 10'000'000);
      if (t.warmup_steps() > t.local_steps()) {
        p.Bad("training.warmup_steps", t.warmup_steps(),
              absl::StrCat("exceeds training.local_steps (", t.local_steps(), ")"));
      }
      break;
    case TrainingConfig::LOCAL_WORK_NOT_SET:
      p.Add("training: one of training.local_epochs or training.local_steps must be set");
      break;
  }
  p.Range<uint32_t>("training.batch_size", t.batch_size(), 1, 65536);
  p.Positive("training.learning_rate", t.learning_rate());
  if (!TrainingConfig::Optimizer_IsValid(t.optimizer()) ||
      t.optimizer() == TrainingConfig::OPTIMIZER_UNSPECIFIED) {
    p.Bad("training.optimizer", t.optimizer(), "is not a known optimizer");
  }
  if (!TrainingConfig::Schedule_IsValid(t.schedule()) ||
      t.schedule() == TrainingConfig::SCHEDULE_UNSPECIFIED) {
    p.Bad("training.schedule", t.schedule(), "is not a known schedule");
  }
  p.NonNegative("training.weight_decay", t.weight_decay());
  p.NonNegative("training.grad_clip_norm", t.grad_clip_norm());
  p.Range<uint32_t>("training.grad_accumulation", t.grad_accumulation(), 1, 1024);
  if (!TrainingConfig::Schedule_IsValid(t.round_schedule())) {
    p.Bad("training.round_schedule", t.round_schedule(), "is not a known schedule");
  }
  p.RealRange("training.adam_beta1", t.adam_beta1(), 0, false, 1, true);
  p.RealRange("training.adam_beta2", t.adam_beta2(), 0, false, 1, true);
  p.Positive("training.adam_epsilon", t.adam_epsilon());
  p.RealRange("training.momentum", t.momentum(), 0, false, 1, true);
  p.RealRange("training.logit_adjustment", t.logit_adjustment(), 0, false, 10, false);
}

void ValidateSelection(Problems& p, const v1::SelectionConfig& s) {
  p.Range<uint32_t>("selection.clients_per_round", s.clients_per_round(), 1, 100'000);
  p.RealRange("selection.over_selection", s.over_selection(), 1, false, 10, false);
  if (s.min_clients() < 1) {
    p.Bad("selection.min_clients", s.min_clients(), "must be >= 1");
  } else if (s.min_clients() > s.clients_per_round()) {
    p.Bad("selection.min_clients", s.min_clients(),
          absl::StrCat("exceeds selection.clients_per_round (", s.clients_per_round(), ")"));
  }
  p.Range<uint32_t>("selection.round_deadline_seconds", s.round_deadline_seconds(), 1, 604'800);
  p.Range<uint32_t>("selection.heartbeat_interval_seconds", s.heartbeat_interval_seconds(), 1,
                    3600);
  if (s.heartbeat_timeout_seconds() <= s.heartbeat_interval_seconds()) {
    p.Bad("selection.heartbeat_timeout_seconds", s.heartbeat_timeout_seconds(),
          absl::StrCat("must exceed selection.heartbeat_interval_seconds (",
                       s.heartbeat_interval_seconds(), ")"));
  } else {
    p.Range<uint32_t>("selection.heartbeat_timeout_seconds", s.heartbeat_timeout_seconds(), 1,
                      86'400);
  }
  p.Range<uint32_t>("selection.retry_after_seconds", s.retry_after_seconds(), 1, 3600);
}

bool IsAdaptiveServerStrategy(AggregationConfig::Strategy s) {
  return s == AggregationConfig::FEDADAM || s == AggregationConfig::FEDYOGI ||
         s == AggregationConfig::FEDADAGRAD;
}

bool NeedsIndividualUpdates(AggregationConfig::Strategy s) {
  return s == AggregationConfig::MEDIAN || s == AggregationConfig::TRIMMED_MEAN ||
         s == AggregationConfig::KRUM;
}

void ValidateAggregation(Problems& p, const RunConfig& c) {
  const AggregationConfig& a = c.aggregation();
  if (!AggregationConfig::Strategy_IsValid(a.strategy()) ||
      a.strategy() == AggregationConfig::STRATEGY_UNSPECIFIED) {
    p.Bad("aggregation.strategy", a.strategy(), "is not a known strategy");
  }
  p.NonNegative("aggregation.proximal_mu", a.proximal_mu());
  if (a.strategy() == AggregationConfig::FEDPROX && a.proximal_mu() == 0) {
    p.Bad("aggregation.proximal_mu", a.proximal_mu(), "must be > 0 with strategy FEDPROX");
  }
  p.Positive("aggregation.server_learning_rate", a.server_learning_rate());
  p.RealRange("aggregation.server_momentum", a.server_momentum(), 0, false, 1, true);
  if (a.server_momentum() > 0 && a.strategy() != AggregationConfig::FEDAVG &&
      a.strategy() != AggregationConfig::FEDPROX) {
    p.Bad("aggregation.server_momentum", a.server_momentum(),
          absl::StrCat("applies to FEDAVG and FEDPROX only, not ",
                       AggregationConfig::Strategy_Name(a.strategy())));
  }
  p.RealRange("aggregation.server_beta1", a.server_beta1(), 0, false, 1, true);
  p.RealRange("aggregation.server_beta2", a.server_beta2(), 0, false, 1, true);
  p.Positive("aggregation.server_tau", a.server_tau());
  p.NonNegative("aggregation.max_update_norm", a.max_update_norm());
  if (a.max_examples_per_client() > (uint64_t{1} << 32)) {
    p.Bad("aggregation.max_examples_per_client", a.max_examples_per_client(),
          "must be at most 2^32");
  }
  if (a.weight_by_examples() && a.max_examples_per_client() == 0) {
    p.Add(
        "aggregation.weight_by_examples needs aggregation.max_examples_per_client: a client's "
        "example count is "
        "its own claim and its weight in the mean, so without a bound one site could set the mean "
        "alone");
  }
  const uint32_t rounds = ConfiguredRounds(c);
  if (a.average_last_rounds() > rounds) {
    p.Bad("aggregation.average_last_rounds", a.average_last_rounds(),
          absl::StrCat("exceeds the run's rounds (", rounds,
                       "): there are not that many adapters to average"));
  }
}

void ValidateSecureAggregation(Problems& p, const RunConfig& c) {
  if (!c.privacy().secure_aggregation()) return;
  if (!c.server().audit_public_key_file().empty()) {
    p.Add(
        "server.audit_public_key_file cannot be used with privacy.secure_aggregation: the server "
        "never sees an "
        "individual update there, so it has none to keep");
  }
  // The masked fixed-point vector is the update's wire format: sparse or per-client-scaled codecs
  // cannot be summed under masks. A QUANT stage sets the fixed point's precision instead, with one
  // power-of-two scale for every client.
  const bool quant_only =
      c.codec().stages_size() == 1 && c.codec().stages(0).id() == CodecStage::QUANT;
  if (c.codec().stages_size() > 0 && !quant_only) {
    p.Add(
        "codec with privacy.secure_aggregation takes no stage but QUANT: the masked fixed-point "
        "vector is the "
        "update's wire format, and sparse, half-precision or compressed updates cannot be summed "
        "under masks");
  }
  if (quant_only) {
    const v1::QuantParams& q = c.codec().stages(0).quant();
    if (q.bits() < 2) {
      p.Bad("codec.stages[0].quant.bits", q.bits(),
            "must be 2, 4 or 8 with privacy.secure_aggregation");
    }
    if (!q.stochastic()) {
      p.Add(
          "codec.stages[0].quant.stochastic must be true with privacy.secure_aggregation (unbiased "
          "rounding)");
    }
    if (q.error_feedback()) {
      p.Add("codec.stages[0].quant.error_feedback does not apply with privacy.secure_aggregation");
    }
    if (q.has_block_size()) {
      p.Add(
          "codec.stages[0].quant.block_size does not apply with privacy.secure_aggregation: every "
          "client "
          "quantizes with one scale for the whole update, so that the levels add up");
    }
  }
  if (c.aggregation().weight_by_examples()) {
    p.Add(
        "aggregation.weight_by_examples must be false with privacy.secure_aggregation: the server "
        "only learns "
        "the plain sum of the updates");
  }
  if (!c.privacy().dp().enabled() && c.aggregation().max_update_norm() <= 0) {
    p.Add(
        "privacy.secure_aggregation needs a bound on every update for its fixed-point encoding: "
        "set "
        "aggregation.max_update_norm (clients clip to it) or privacy.dp.clip_norm");
  }
  if (c.selection().min_clients() < 3) {
    p.Bad("selection.min_clients", c.selection().min_clients(),
          "must be >= 3 with privacy.secure_aggregation: with two clients each would learn the "
          "other's update");
  }
}

void ValidatePrivacy(Problems& p, const RunConfig& c) {
  ValidateSecureAggregation(p, c);
  const DifferentialPrivacyConfig& dp = c.privacy().dp();
  const AdaptiveClipping& ac = dp.adaptive_clipping();
  if (!dp.enabled()) {
    // Settings of a switched-off feature would be silently ignored: refuse them.
    const bool any = dp.mode() != DifferentialPrivacyConfig::MODE_UNSPECIFIED ||
                     dp.has_clip_norm() || dp.has_noise_multiplier() || dp.has_target_delta() ||
                     dp.has_max_epsilon() || dp.has_population_size() || dp.has_adaptive_clipping();
    if (any)
      p.Add(
          "privacy.dp settings are given but privacy.dp.enabled is false: enable it or remove "
          "them");
    return;
  }
  if (!DifferentialPrivacyConfig::Mode_IsValid(dp.mode()))
    p.Bad("privacy.dp.mode", dp.mode(), "is not a known mode");
  if (!dp.has_clip_norm()) {
    p.Add("privacy.dp.clip_norm is required with differential privacy");
  } else {
    p.Positive("privacy.dp.clip_norm", dp.clip_norm());
  }
  if (!dp.has_noise_multiplier()) {
    p.Add("privacy.dp.noise_multiplier is required with differential privacy");
  } else {
    p.RealRange("privacy.dp.noise_multiplier", dp.noise_multiplier(), 0, true, 1e6, false);
  }
  p.RealRange("privacy.dp.target_delta", dp.target_delta(), 0, true, 0.1, false);
  if (dp.has_max_epsilon()) p.Positive("privacy.dp.max_epsilon", dp.max_epsilon());
  if (dp.has_population_size()) {
    // Amplification by subsampling needs each round's cohort to be a uniformly random sample of a
    // population the server knows; the server selects the first clients that ask, so the only
    // sampling rate it can honour is 1.
    p.Add(
        "privacy.dp.population_size is refused: the server selects the first clients that ask for "
        "a task, not a "
        "uniformly random sample of a population, so the accountant takes the sampling rate 1; "
        "remove it");
  }
  const AggregationConfig& a = c.aggregation();
  if (dp.mode() == DifferentialPrivacyConfig::DISTRIBUTED && !c.privacy().secure_aggregation()) {
    p.Add(
        "privacy.dp.mode DISTRIBUTED needs privacy.secure_aggregation: without it the server sees "
        "each update "
        "with only its client's share of the noise (use CENTRAL)");
  }
  if (a.weight_by_examples()) {
    p.Add(
        "aggregation.weight_by_examples must be false with differential privacy: each client's "
        "weight must be "
        "bounded, so every update weighs the same");
  }
  if (a.max_update_norm() != 0) {
    p.Add(
        "aggregation.max_update_norm is replaced by privacy.dp.clip_norm with differential "
        "privacy: remove it");
  }
  if (ac.enabled()) {
    p.RealRange("privacy.dp.adaptive_clipping.target_quantile", ac.target_quantile(), 0, true, 1,
                true);
    p.Positive("privacy.dp.adaptive_clipping.learning_rate", ac.learning_rate());
    if (!std::isfinite(ac.count_noise_stddev()) ||
        (dp.has_noise_multiplier() && !(ac.count_noise_stddev() > dp.noise_multiplier() / 2))) {
      p.Bad("privacy.dp.adaptive_clipping.count_noise_stddev", ac.count_noise_stddev(),
            absl::StrCat("must be finite and > noise_multiplier / 2 (", dp.noise_multiplier() / 2,
                         "), or the count's noise would leave none for the update"));
    }
  } else if (ac.has_target_quantile() || ac.has_learning_rate() || ac.has_count_noise_stddev()) {
    p.Add("privacy.dp.adaptive_clipping settings are given but adaptive_clipping.enabled is false");
  }
}

const char* StageName(CodecStage::Id id) {
  return CodecStage::Id_IsValid(id) ? CodecStage::Id_Name(id).c_str() : "?";
}

// `field` names the spec ("codec" or "downlink_codec") in messages.
void ValidateCodec(Problems& p, const v1::CodecSpec& codec, const std::string& field,
                   bool shared_scale = false) {
  const bool downlink = field != "codec";
  std::set<int> seen;
  int value_encoders = 0;  // FP16, BF16, QUANT: alternative encodings of each value
  int sparsifiers = 0;     // TOPK, RANDOMK, LOWRANK: alternative reductions of each tensor
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
    CodecStage::ParamsCase expected = CodecStage::PARAMS_NOT_SET;
    switch (s.id()) {
      case CodecStage::NONE:
        if (codec.stages_size() != 1) p.Bad(path + ".id", "NONE", "must be the only stage");
        break;
      case CodecStage::ZSTD:
        expected = CodecStage::kZstd;
        if (i != codec.stages_size() - 1) p.Bad(path + ".id", "ZSTD", "must be the last stage");
        if (s.has_zstd()) p.Range<int32_t>(path + ".zstd.level", s.zstd().level(), -7, 22);
        break;
      case CodecStage::FP16:
      case CodecStage::BF16:
        ++value_encoders;
        break;
      case CodecStage::TOPK:
        expected = CodecStage::kTopK;
        ++sparsifiers;
        if (s.has_top_k()) {
          p.RealRange(path + ".top_k.fraction", s.top_k().fraction(), 0, true, 1, false);
        }
        break;
      case CodecStage::RANDOMK:
        expected = CodecStage::kRandomK;
        ++sparsifiers;
        if (s.has_random_k()) {
          p.RealRange(path + ".random_k.fraction", s.random_k().fraction(), 0, true, 1, false);
        }
        break;
      case CodecStage::QUANT:
        expected = CodecStage::kQuant;
        ++value_encoders;
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
        ++sparsifiers;
        if (s.has_low_rank()) {
          p.Range<uint32_t>(path + ".low_rank.rank", s.low_rank().rank(), 1, 4096);
        }
        break;
      default:
        break;
    }
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
  if (value_encoders > 1)
    p.Add(absl::StrCat(field, ".stages combine more than one of FP16, BF16 and QUANT"));
  bool encoded = false;  // a sparsifier chooses among the raw values, so it comes first
  for (int i = 0; i < codec.stages_size(); ++i) {
    const CodecStage::Id id = codec.stages(i).id();
    if (id == CodecStage::FP16 || id == CodecStage::BF16 || id == CodecStage::QUANT) encoded = true;
    if ((id == CodecStage::TOPK || id == CodecStage::RANDOMK || id == CodecStage::LOWRANK) &&
        encoded) {
      p.Bad(absl::StrCat(field, ".stages[", i, "].id"), StageName(id),
            "must come before FP16, BF16 or QUANT");
    }
  }
  if (sparsifiers > 1)
    p.Add(absl::StrCat(field, ".stages combine more than one of TOPK, RANDOMK and LOWRANK"));
}

void ValidateData(Problems& p, const v1::DataConfig& d) {
  p.Range<uint32_t>("data.eval_every_rounds", d.eval_every_rounds(), 1, 1'000'000);
  p.Range<uint32_t>("data.eval_batch_size", d.eval_batch_size(), 1, 65536);
}

void ValidateServer(Problems& p, const v1::ServerConfig& s) {
  const v1::TlsConfig& tls = s.tls();
  const bool has_tls =
      !tls.cert_file().empty() || !tls.key_file().empty() || !tls.client_ca_file().empty();
  if (has_tls &&
      (tls.cert_file().empty() || tls.key_file().empty() || tls.client_ca_file().empty())) {
    p.Add(
        "server.tls needs cert_file, key_file and client_ca_file together: every client presents a "
        "certificate, "
        "and its CN is the client's identity (server-only TLS, with self-named clients, is not "
        "supported)");
  }
  if (!has_tls && (!tls.crl_file().empty() || tls.allowed_client_ids_size() > 0 ||
                   tls.operator_ids_size() > 0)) {
    p.Add(
        "server.tls.crl_file, allowed_client_ids and operator_ids need server.tls (cert_file, "
        "key_file, "
        "client_ca_file): without TLS no caller has a certificate");
  }
  auto check_ids = [&](const google::protobuf::RepeatedPtrField<std::string>& ids,
                       const char* field) {
    for (int i = 0; i < ids.size(); ++i) {
      const std::string& id = ids.Get(i);
      const bool ok =
          !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char ch) {
            return absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' ||
                   ch == '-' || ch == '@';
          });
      if (!ok)
        p.Bad(absl::StrCat("server.tls.", field, "[", i, "]"), Quoted(id),
              "must be 1-128 characters of [A-Za-z0-9._@-]");
    }
  };
  check_ids(tls.allowed_client_ids(), "allowed_client_ids");
  check_ids(tls.operator_ids(), "operator_ids");
  if (s.insecure() && has_tls) p.Add("server.insecure and server.tls exclude each other");
  // The plaintext rule is the server's (Server::Create, whatever sets the address): a loopback
  // address without TLS still needs server.insecure there; `fedlora simulate` sets it itself.
  std::string host;
  uint32_t port = 0;
  if (!SplitHostPort(s.listen_address(), &host, &port)) {
    p.Bad("server.listen_address", Quoted(s.listen_address()),
          "must be host:port with an explicit host (IPv6 in brackets) and a port 0-65535");
  } else if (!has_tls && !IsLoopbackHost(host)) {
    p.Bad("server.listen_address", Quoted(s.listen_address()),
          "is not a loopback address and needs server.tls.cert_file, key_file and client_ca_file "
          "(plaintext, "
          "with server.insecure, is for 127.0.0.1, [::1] and localhost only)");
  }
  if (!s.metrics_address().empty() && !SplitHostPort(s.metrics_address(), &host, &port)) {
    p.Bad("server.metrics_address", Quoted(s.metrics_address()),
          "must be host:port with an explicit host (IPv6 in brackets) and a port 0-65535");
  }
  if (!s.health_address().empty()) {
    if (!SplitHostPort(s.health_address(), &host, &port)) {
      p.Bad("server.health_address", Quoted(s.health_address()),
            "must be host:port with an explicit host (IPv6 in brackets) and a port 0-65535");
    } else if (port != 0 && (s.health_address() == s.listen_address() ||
                             s.health_address() == s.metrics_address())) {
      p.Bad("server.health_address", Quoted(s.health_address()),
            "must differ from server.listen_address and server.metrics_address");
    }
  }
  if (s.max_client_bytes_per_round() < s.max_update_bytes()) {
    p.Bad("server.max_client_bytes_per_round", s.max_client_bytes_per_round(),
          absl::StrCat("is less than server.max_update_bytes (", s.max_update_bytes(),
                       "): no update could arrive"));
  }
  p.Range<uint32_t>("server.max_client_uploads_in_flight", s.max_client_uploads_in_flight(), 1, 64);
  p.Range<uint32_t>("server.max_client_uploads_per_round", s.max_client_uploads_per_round(), 1,
                    1000);
  p.Range<uint32_t>("server.max_client_reports_per_round", s.max_client_reports_per_round(), 1,
                    1000);
  p.Range<uint32_t>("server.max_metrics_per_report", s.max_metrics_per_report(), 0, 10'000);
  p.Range<uint32_t>("server.max_aggregation_attempts", s.max_aggregation_attempts(), 1, 100);
  p.Range<uint64_t>("server.grpc_memory_bytes", s.grpc_memory_bytes(), uint64_t{16} << 20,
                    uint64_t{64} << 30);
  p.Range<uint32_t>("server.grpc_max_threads", s.grpc_max_threads(), 4, 4096);
  p.Range<uint32_t>("server.max_concurrent_streams", s.max_concurrent_streams(), 4, 10'000);
  p.Range<uint32_t>("server.max_client_downloads_in_flight", s.max_client_downloads_in_flight(), 1,
                    64);
  p.Range<uint32_t>("server.retain_rounds", s.retain_rounds(), 0, 1'000'000);
  p.NonEmpty("server.store_dir", s.store_dir());
  p.Range<uint32_t>("server.chunk_size_bytes", s.chunk_size_bytes(), kMinChunkSizeBytes,
                    kMaxChunkSizeBytes);
  if (s.max_update_bytes() < s.chunk_size_bytes()) {
    p.Bad("server.max_update_bytes", s.max_update_bytes(),
          absl::StrCat("is less than server.chunk_size_bytes (", s.chunk_size_bytes(), ")"));
  }
  // gRPC takes its message limit as an int.
  constexpr uint64_t kMaxGrpcMessageBytes = (1ull << 31) - 1;
  uint64_t min_message = uint64_t{s.chunk_size_bytes()} + kChunkMessageOverheadBytes;
  if (s.max_message_bytes() < min_message || s.max_message_bytes() > kMaxGrpcMessageBytes) {
    p.Bad("server.max_message_bytes", s.max_message_bytes(),
          absl::StrCat("must be in [server.chunk_size_bytes + ", kChunkMessageOverheadBytes, " = ",
                       min_message, ", ", kMaxGrpcMessageBytes, "]"));
  }
}

void ValidateSimulation(Problems& p, const SimulationConfig& s) {
  p.Range<uint32_t>("simulation.num_clients", s.num_clients(), 1, 100'000);
  if (!SimulationConfig::Partition_IsValid(s.partition()) ||
      s.partition() == SimulationConfig::PARTITION_UNSPECIFIED) {
    p.Bad("simulation.partition", s.partition(), "is not a known partition");
  }
  p.Positive("simulation.dirichlet_alpha", s.dirichlet_alpha());
  if (s.partition() == SimulationConfig::BY_KEY && s.partition_key_field().empty()) {
    p.Add("simulation.partition_key_field must be set with partition BY_KEY");
  }
  p.RealRange("simulation.dropout_probability", s.dropout_probability(), 0, false, 1, false);
  p.RealRange("simulation.straggler_probability", s.straggler_probability(), 0, false, 1, false);
  p.NonNegative("simulation.straggler_delay_seconds", s.straggler_delay_seconds());
  p.RealRange("simulation.crash_probability", s.crash_probability(), 0, false, 1, false);
  p.Range<uint32_t>("simulation.parallelism", s.parallelism(), 0, 4096);
  if (s.has_shards_per_client())
    p.Range<uint32_t>("simulation.shards_per_client", s.shards_per_client(), 1, 100'000);
}

bool IsValidRunId(const std::string& id) {
  if (id.empty() || id.size() > 64 || id == "." || id == "..") return false;
  for (char c : id) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

}  // namespace

void ApplyRunConfigDefaults(RunConfig* c) {
  if (c->run_id().empty()) c->set_run_id("default");
  if (!c->has_rounds()) c->set_rounds(kDefaultRounds);

  auto* task = c->mutable_task();
  if (task->kind() == TaskConfig::KIND_UNSPECIFIED)
    task->set_kind(TaskConfig::SEQUENCE_CLASSIFICATION);
  const bool causal_lm = task->kind() == TaskConfig::CAUSAL_LM;
  if (causal_lm) {
    if (task->prompt_field().empty()) task->set_prompt_field("prompt");
    if (task->response_field().empty()) task->set_response_field("response");
  } else {
    if (task->text_field().empty()) task->set_text_field("text");
    if (task->label_field().empty()) task->set_label_field("label");
  }

  auto* model = c->mutable_model();
  if (model->id().empty()) model->set_id(LastPathComponent(model->path()));
  if (!model->has_max_seq_len()) model->set_max_seq_len(causal_lm ? 256 : 128);

  auto* lora = c->mutable_lora();
  if (!lora->has_rank()) lora->set_rank(8);
  if (!lora->has_alpha()) lora->set_alpha(16.0);
  if (lora->target_modules().empty()) {
    if (causal_lm) {
      for (const char* m :
           {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
        lora->add_target_modules(m);
    } else {
      lora->add_target_modules("query");
      lora->add_target_modules("value");
    }
  }

  auto* t = c->mutable_training();
  if (t->local_work_case() == TrainingConfig::LOCAL_WORK_NOT_SET) t->set_local_epochs(1);
  if (!t->has_batch_size()) t->set_batch_size(16);
  if (!t->has_learning_rate())
    t->set_learning_rate(causal_lm ? kDecoderDefaultLearningRate : kDefaultLearningRate);
  if (t->optimizer() == TrainingConfig::OPTIMIZER_UNSPECIFIED)
    t->set_optimizer(TrainingConfig::ADAMW);
  if (t->schedule() == TrainingConfig::SCHEDULE_UNSPECIFIED)
    t->set_schedule(TrainingConfig::CONSTANT);
  if (!t->has_grad_clip_norm()) t->set_grad_clip_norm(1.0);
  if (!t->has_grad_accumulation()) t->set_grad_accumulation(1);
  if (!t->has_adam_beta1()) t->set_adam_beta1(0.9);
  if (!t->has_adam_beta2()) t->set_adam_beta2(0.999);
  if (!t->has_adam_epsilon()) t->set_adam_epsilon(1e-8);

  auto* s = c->mutable_selection();
  if (!s->has_clients_per_round()) s->set_clients_per_round(10);
  if (!s->has_over_selection()) s->set_over_selection(1.3);
  if (!s->has_min_clients()) s->set_min_clients((s->clients_per_round() + 1) / 2);
  if (!s->has_round_deadline_seconds()) s->set_round_deadline_seconds(600);
  if (!s->has_heartbeat_interval_seconds()) s->set_heartbeat_interval_seconds(10);
  if (!s->has_heartbeat_timeout_seconds()) s->set_heartbeat_timeout_seconds(30);
  if (!s->has_retry_after_seconds()) s->set_retry_after_seconds(5);

  auto* a = c->mutable_aggregation();
  if (a->strategy() == AggregationConfig::STRATEGY_UNSPECIFIED)
    a->set_strategy(AggregationConfig::FEDAVG);
  if (!a->has_proximal_mu())
    a->set_proximal_mu(a->strategy() == AggregationConfig::FEDPROX ? 0.01 : 0.0);
  if (!a->has_server_learning_rate())
    a->set_server_learning_rate(IsAdaptiveServerStrategy(a->strategy()) ? 0.01 : 1.0);
  if (!a->has_server_momentum()) a->set_server_momentum(0.0);
  if (!a->has_server_beta1()) a->set_server_beta1(0.9);
  if (!a->has_server_beta2()) a->set_server_beta2(0.99);
  if (!a->has_server_tau()) a->set_server_tau(1e-3);
  // Differential privacy bounds each client's influence, and secure aggregation sums without
  // weights: with either, every update weighs the same; so does every update without a bound on
  // the count a client may claim.
  if (!a->has_weight_by_examples()) {
    a->set_weight_by_examples(!c->privacy().dp().enabled() && !c->privacy().secure_aggregation() &&
                              a->max_examples_per_client() > 0);
  }

  if (c->privacy().dp().enabled()) {
    auto* dp = c->mutable_privacy()->mutable_dp();
    if (dp->mode() == DifferentialPrivacyConfig::MODE_UNSPECIFIED)
      dp->set_mode(DifferentialPrivacyConfig::CENTRAL);
    if (!dp->has_target_delta()) dp->set_target_delta(1e-5);
    if (dp->adaptive_clipping().enabled()) {
      auto* ac = dp->mutable_adaptive_clipping();
      if (!ac->has_target_quantile()) ac->set_target_quantile(0.5);
      if (!ac->has_learning_rate()) ac->set_learning_rate(0.2);
      if (!ac->has_count_noise_stddev() && dp->has_noise_multiplier()) {
        const double per_round = static_cast<double>(c->selection().clients_per_round()) / 20.0;
        ac->set_count_noise_stddev(per_round > dp->noise_multiplier() / 2 ? per_round
                                                                          : dp->noise_multiplier());
      }
    }
  }

  for (CodecStage& stage : *c->mutable_codec()->mutable_stages()) {
    ApplyCodecStageDefaults(&stage, /*uplink=*/true, c->privacy().secure_aggregation());
  }
  for (CodecStage& stage : *c->mutable_downlink_codec()->mutable_stages()) {
    ApplyCodecStageDefaults(&stage, /*uplink=*/false);
  }

  auto* d = c->mutable_data();
  if (!d->has_eval_every_rounds()) d->set_eval_every_rounds(1);
  if (!d->has_eval_batch_size()) d->set_eval_batch_size(64);

  auto* srv = c->mutable_server();
  if (srv->listen_address().empty()) srv->set_listen_address(kDefaultListenAddress);
  if (srv->store_dir().empty()) srv->set_store_dir("fedlora_store");
  if (!srv->has_chunk_size_bytes()) srv->set_chunk_size_bytes(kDefaultChunkSizeBytes);
  if (!srv->has_max_update_bytes()) srv->set_max_update_bytes(kDefaultMaxUpdateBytes);
  if (!srv->has_max_message_bytes()) srv->set_max_message_bytes(kDefaultMaxMessageBytes);
  if (!srv->has_max_client_bytes_per_round())
    srv->set_max_client_bytes_per_round(4 * srv->max_update_bytes());
  if (!srv->has_max_client_uploads_in_flight()) srv->set_max_client_uploads_in_flight(2);
  if (!srv->has_max_client_uploads_per_round()) srv->set_max_client_uploads_per_round(4);
  if (!srv->has_max_client_reports_per_round()) srv->set_max_client_reports_per_round(4);
  if (!srv->has_max_metrics_per_report()) srv->set_max_metrics_per_report(64);
  if (!srv->has_min_free_disk_bytes()) srv->set_min_free_disk_bytes(uint64_t{1} << 30);
  if (!srv->has_max_aggregation_attempts()) srv->set_max_aggregation_attempts(3);
  if (!srv->has_grpc_memory_bytes()) srv->set_grpc_memory_bytes(uint64_t{1} << 30);
  if (!srv->has_grpc_max_threads()) srv->set_grpc_max_threads(256);
  if (!srv->has_max_concurrent_streams()) srv->set_max_concurrent_streams(1000);
  if (!srv->has_max_client_downloads_in_flight()) srv->set_max_client_downloads_in_flight(2);
  if (!srv->has_retain_rounds()) srv->set_retain_rounds(10);

  auto* sim = c->mutable_simulation();
  if (!sim->has_num_clients()) sim->set_num_clients(10);
  if (sim->partition() == SimulationConfig::PARTITION_UNSPECIFIED)
    sim->set_partition(SimulationConfig::IID);
  if (!sim->has_dirichlet_alpha()) sim->set_dirichlet_alpha(0.5);
  if (!sim->has_shards_per_client()) sim->set_shards_per_client(2);
}

absl::Status ValidatePrivacySettings(const RunConfig& c) {
  Problems p;
  ValidatePrivacy(p, c);
  return p.ToStatus();
}

absl::Status ValidateRunConfig(const RunConfig& c) {
  Problems p;
  if (!IsValidRunId(c.run_id())) {
    p.Bad("run_id", Quoted(c.run_id()), "must be 1-64 characters from [A-Za-z0-9._-]");
  }
  p.Range<uint32_t>("rounds", c.rounds(), 1, 1'000'000);
  ValidateModel(p, c.model());
  ValidateLora(p, c.lora());
  ValidateTask(p, c.task());
  if (c.model().precision() == v1::ModelConfig::INT8 &&
      c.task().kind() != v1::TaskConfig::CAUSAL_LM) {
    p.Add(
        "model.precision INT8 applies to decoder models (task.kind CAUSAL_LM): encoders have no "
        "Q8_0 base");
  }
  ValidateTraining(p, c.training());
  ValidateSelection(p, c.selection());
  ValidateAggregation(p, c);
  ValidateCodec(p, c.codec(), "codec", c.privacy().secure_aggregation());
  ValidateCodec(p, c.downlink_codec(), "downlink_codec");
  ValidateData(p, c.data());
  ValidatePrivacy(p, c);
  ValidateServer(p, c.server());
  ValidateSimulation(p, c.simulation());
  const SimulationConfig::Partition partition = c.simulation().partition();
  if (c.task().kind() == TaskConfig::CAUSAL_LM &&
      (partition == SimulationConfig::DIRICHLET || partition == SimulationConfig::LABEL_SHARDS)) {
    p.Add(absl::StrCat("simulation.partition ", SimulationConfig::Partition_Name(partition),
                       " splits by label and CAUSAL_LM has none: use IID or BY_KEY"));
  }
  for (std::string& refused : UnimplementedSettings(c)) p.Add(std::move(refused));
  return p.ToStatus();
}

std::vector<std::string> UnimplementedSettings(const RunConfig& c) {
  std::vector<std::string> out;
  auto refuse = [&out](const std::string& what, const std::string& why) {
    out.push_back(absl::StrCat(what, " is not implemented yet",
                               why.empty() ? "" : absl::StrCat(" (", why, ")")));
  };
  const std::string& arch = c.model().architecture();
  if (c.task().kind() == TaskConfig::CAUSAL_LM) {
    if (!arch.empty() && arch != "llama" && arch != "qwen2") {
      refuse(absl::StrCat("model.architecture \"", absl::CEscape(arch), "\" for CAUSAL_LM"),
             "supported: \"llama\", \"qwen2\"");
    }
    if (c.training().logit_adjustment() != 0) {
      refuse("training.logit_adjustment for CAUSAL_LM", "it adjusts a classifier's label logits");
    }
  } else if (!arch.empty() && arch != "bert" && arch != "roberta" && arch != "xlm-roberta") {
    refuse(absl::StrCat("model.architecture \"", absl::CEscape(arch), "\""),
           "supported: \"bert\", \"roberta\", \"xlm-roberta\"");
  }
  const AggregationConfig& a = c.aggregation();
  if (NeedsIndividualUpdates(a.strategy())) {
    refuse(absl::StrCat("aggregation.strategy ", AggregationConfig::Strategy_Name(a.strategy())),
           "available: FEDAVG, FEDPROX, FEDADAM, FEDYOGI, FEDADAGRAD");
  }
  if (a.has_trim_fraction()) refuse("aggregation.trim_fraction", "it belongs to TRIMMED_MEAN");
  if (a.has_krum_byzantine_clients())
    refuse("aggregation.krum_byzantine_clients", "it belongs to KRUM");
  const v1::DifferentialPrivacyConfig& dp = c.privacy().dp();
  if (dp.mode() == DifferentialPrivacyConfig::LOCAL)
    refuse("privacy.dp.mode LOCAL", "CENTRAL and DISTRIBUTED are");
  if (c.privacy().secure_aggregation() && dp.enabled() && dp.adaptive_clipping().enabled()) {
    refuse("privacy.dp.adaptive_clipping with privacy.secure_aggregation",
           "the server would need each update's norm; fixed clipping is");
  }
  return out;
}

namespace {

// Parses, resolves relative paths against `base_dir` (when set), overrides, defaults and validates.
// Errors of the text are located ("<source>:<line>:<column>: "); the others start with "<source>:
// ".
absl::StatusOr<RunConfig> ParseRunConfigText(std::string_view json, const std::string& source,
                                             const std::filesystem::path* base_dir,
                                             const ConfigOverrides& overrides) {
  const std::string prefix = source.empty() ? "" : absl::StrCat(source, ": ");
  FEDLORA_ASSIGN_OR_RETURN(const std::string checked, CheckRunConfigJson(json, source));
  RunConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // a misspelt field must not silently take its default
  auto parsed = google::protobuf::util::JsonStringToMessage(checked, &config, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "run config: ", std::string(parsed.message().data(), parsed.message().size())));
  }
  if (base_dir != nullptr) ResolveRunConfigPaths(&config, *base_dir);
  if (overrides) overrides(&config);
  ApplyRunConfigDefaults(&config);
  absl::Status valid = ValidateRunConfig(config);
  if (!valid.ok())
    return absl::Status(valid.code(), absl::StrCat(prefix, std::string(valid.message())));
  return config;
}

}  // namespace

absl::StatusOr<RunConfig> ParseRunConfigJson(std::string_view json,
                                             const ConfigOverrides& overrides) {
  return ParseRunConfigText(json, "", nullptr, overrides);
}

absl::StatusOr<RunConfig> LoadRunConfigFile(const std::string& path,
                                            const ConfigOverrides& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    return absl::NotFoundError(absl::StrCat(path, ": run config not found",
                                            ec ? absl::StrCat(" (", ec.message(), ")") : ""));
  }
  if (!fs::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": run config is not a regular file"));
  }
  uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    return absl::Status(absl::ErrnoToStatusCode(ec.value()),
                        absl::StrCat(path, ": cannot stat run config: ", ec.message()));
  }
  if (size > kMaxRunConfigFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": run config is ", size, " bytes, more than the limit of ", kMaxRunConfigFileBytes));
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    return absl::Status(err != 0 ? absl::ErrnoToStatusCode(err) : absl::StatusCode::kUnknown,
                        absl::StrCat(path, ": cannot open run config: ",
                                     err != 0 ? std::strerror(err) : "unknown error"));
  }
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size))) {
    return absl::DataLossError(absl::StrCat(path, ": short read of run config"));
  }
  const fs::path dir = fs::path(path).parent_path();
  return ParseRunConfigText(text, path, &dir, overrides);
}

std::string RunConfigToJson(const RunConfig& config) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto printed = google::protobuf::util::MessageToJsonString(config, &out, options);
  // Printing fails only for google.protobuf.Any fields whose type cannot be resolved; RunConfig has
  // none, so a failure is a bug in this file.
  if (!printed.ok()) {
    std::fprintf(stderr, "RunConfigToJson: %s\n", printed.ToString().c_str());
    std::abort();
  }
  return out;
}

RunConfig RedactRunConfigForClients(const RunConfig& config) {
  RunConfig redacted = config;
  redacted.mutable_model()->clear_path();
  redacted.clear_data();
  redacted.clear_server();
  redacted.clear_simulation();
  return redacted;
}

}  // namespace fedlora
