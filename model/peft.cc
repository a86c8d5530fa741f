#include "model/peft.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"

namespace fedlora {
namespace {

// PEFT's suffix for each target: it matches a module when its name equals the suffix or ends with
// "." + suffix.
const char* PeftSuffix(LoraTarget t) {
  switch (t) {
    case LoraTarget::kQuery:
      return "query";
    case LoraTarget::kKey:
      return "key";
    case LoraTarget::kValue:
      return "value";
    case LoraTarget::kAttnOut:
      return "attention.output.dense";
    case LoraTarget::kIntermediate:
      return "intermediate.dense";
    case LoraTarget::kOutput:
      return "output.dense";
  }
  return "?";
}

std::string RegexEscapeDots(const char* path) {
  std::string out;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '.') out += '\\';
    out += *p;
  }
  return out;
}

nlohmann::json TargetModulesJson(const std::vector<LoraTarget>& targets) {
  bool ffn_output = false, attn_output = false;
  for (LoraTarget t : targets) {
    ffn_output |= t == LoraTarget::kOutput;
    attn_output |= t == LoraTarget::kAttnOut;
  }
  if (ffn_output && !attn_output) {
    std::vector<std::string> alternatives;
    for (LoraTarget t : targets) alternatives.push_back(RegexEscapeDots(LoraTargetPath(t)));
    return absl::StrCat(".*encoder\\.layer\\.\\d+\\.(", absl::StrJoin(alternatives, "|"), ")");
  }
  nlohmann::json list = nlohmann::json::array();
  for (LoraTarget t : targets) list.push_back(PeftSuffix(t));
  return list;
}

// True when two target_modules values select the same modules: equal regular expressions, or
// lists naming the same set in any order (PEFT writes them as a set, so the order varies).
bool SameTargets(const nlohmann::json& a, const nlohmann::json& b) {
  if (!a.is_array() || !b.is_array()) return a == b;
  auto to_set = [](const nlohmann::json& list) {
    std::set<std::string> out;
    for (const auto& item : list)
      out.insert(item.is_string() ? item.get<std::string>() : item.dump());
    return out;
  };
  return to_set(a) == to_set(b);
}

}  // namespace

namespace {

nlohmann::json EncoderPeftConfig(const LoraOptions& lora, const std::vector<LoraTarget>& targets,
                                 const std::string& base_model) {
  nlohmann::json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "SEQ_CLS";
  j["r"] = lora.rank;
  j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  j["target_modules"] = TargetModulesJson(targets);
  j["modules_to_save"] = nlohmann::json::array({"classifier"});
  j["base_model_name_or_path"] = base_model;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["revision"] = nullptr;
  return j;
}

nlohmann::json DecoderPeftConfig(const LoraOptions& lora, const std::vector<DecoderTarget>& targets,
                                 const std::string& base_model) {
  nlohmann::json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["r"] = lora.rank;
  j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  nlohmann::json names = nlohmann::json::array();
  for (DecoderTarget t : targets) names.push_back(DecoderTargetName(t));
  j["target_modules"] = names;
  j["modules_to_save"] = nullptr;
  j["base_model_name_or_path"] = base_model;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["use_rslora"] = false;
  j["use_dora"] = false;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["revision"] = nullptr;
  return j;
}

}  // namespace

nlohmann::json PeftAdapterConfig(const BertClassifier& model) {
  const ModelOptions& o = model.options();
  return EncoderPeftConfig(o.lora, model.lora_targets(), o.base_model_name);
}

// The models order their targets as the enums do, each once (BertClassifier, CausalLm).
absl::StatusOr<nlohmann::json> PeftEncoderAdapterConfig(const LoraOptions& lora,
                                                        const std::string& base_model) {
  bool use[kNumLoraTargets] = {};
  for (const std::string& name : lora.target_modules) {
    FEDLORA_ASSIGN_OR_RETURN(LoraTarget t, ParseLoraTarget(name));
    use[static_cast<int>(t)] = true;
  }
  std::vector<LoraTarget> targets;
  for (int i = 0; i < kNumLoraTargets; ++i) {
    if (use[i]) targets.push_back(static_cast<LoraTarget>(i));
  }
  return EncoderPeftConfig(lora, targets, base_model);
}

absl::StatusOr<nlohmann::json> PeftDecoderAdapterConfig(const LoraOptions& lora,
                                                        const std::string& base_model) {
  bool use[kNumDecoderTargets] = {};
  for (const std::string& name : lora.target_modules) {
    FEDLORA_ASSIGN_OR_RETURN(DecoderTarget t, ParseDecoderTarget(name));
    use[static_cast<int>(t)] = true;
  }
  std::vector<DecoderTarget> targets;
  for (int i = 0; i < kNumDecoderTargets; ++i) {
    if (use[i]) targets.push_back(static_cast<DecoderTarget>(i));
  }
  return DecoderPeftConfig(lora, targets, base_model);
}

namespace {

// PEFT LoraConfig settings fedlora does not implement: an adapter that sets any of them would load
// with the wrong scale or shape, so it is refused. Absent, null, false, "none" and empty are fine.
absl::Status RefuseUnimplemented(const nlohmann::json& cfg, const std::string& config_path) {
  auto set = [&](const char* key) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return false;
    if (it->is_boolean()) return it->get<bool>();
    if (it->is_object() || it->is_array()) return !it->empty();
    return true;
  };
  for (const char* key : {"use_rslora", "use_dora", "alpha_pattern", "rank_pattern",
                          "layers_to_transform", "layers_pattern", "layer_replication",
                          "megatron_config", "loftq_config", "fan_in_fan_out"}) {
    if (set(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": ", key, " = ", cfg.at(key).dump(),
                       " is a PEFT setting fedlora does not implement"));
    }
  }
  auto bias = cfg.find("bias");
  if (bias != cfg.end() && !(bias->is_string() && bias->get<std::string>() == "none")) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": bias = ", bias->dump(),
                     ": only \"none\" (no trained biases) is implemented"));
  }
  return absl::OkStatus();
}

// Checks adapter_config.json against `expected` (the model's own) and loads every param's values
// from the weights file. On error the params are unchanged.
absl::Status LoadAdapter(const std::string& dir, const nlohmann::json& expected, int rank,
                         float lora_alpha, std::vector<Param>& params) {
  const std::string config_path = dir + "/" + kPeftConfigFile;
  const std::string weights_path = dir + "/" + kPeftWeightsFile;
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJsonFile(config_path));
  if (!cfg.is_object())
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": expected a JSON object"));
  FEDLORA_ASSIGN_OR_RETURN(std::string peft_type, GetString(cfg, "peft_type", config_path));
  if (peft_type != "LORA") {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": peft_type \"", peft_type, "\", expected \"LORA\""));
  }
  const std::string want_task = expected["task_type"].get<std::string>();
  FEDLORA_ASSIGN_OR_RETURN(std::string task_type,
                           GetStringOr(cfg, "task_type", want_task, config_path));
  if (task_type != want_task) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": task_type \"", task_type, "\", expected \"", want_task, "\""));
  }
  FEDLORA_RETURN_IF_ERROR(RefuseUnimplemented(cfg, config_path));
  FEDLORA_ASSIGN_OR_RETURN(int64_t r, GetInt(cfg, "r", config_path));
  if (r != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": adapter rank r = ", r, ", the model has rank ", rank));
  }
  FEDLORA_ASSIGN_OR_RETURN(double alpha, GetDouble(cfg, "lora_alpha", config_path));
  if (std::fabs(alpha - lora_alpha) > 1e-6 * std::fabs(alpha)) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": lora_alpha = ", alpha, ", the model has ", lora_alpha));
  }
  const auto targets = cfg.find("target_modules");
  if (targets == cfg.end() || !SameTargets(*targets, expected["target_modules"])) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": target_modules ",
                     targets == cfg.end() ? std::string("missing") : targets->dump(),
                     ", the model has ", expected["target_modules"].dump()));
  }

  FEDLORA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(weights_path));
  std::set<std::string> wanted;
  for (const Param& p : params) wanted.insert(p.name);
  std::vector<std::string> missing, extra, wrong;
  bool shape_mismatch = false;
  for (const std::string& name : file->names()) {
    if (wanted.count(name) == 0) extra.push_back(name);
  }
  std::vector<std::vector<float>> values(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (!file->Contains(p.name)) {
      missing.push_back(p.name);
      continue;
    }
    FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, file->Get(p.name));
    if (t.shape != p.shape) {
      shape_mismatch = true;
      wrong.push_back(absl::StrCat("'", p.name, "' has shape [", absl::StrJoin(t.shape, ", "),
                                   "], expected [", absl::StrJoin(p.shape, ", "), "]"));
      continue;
    }
    values[i].resize(static_cast<size_t>(t.numel()));
    if (absl::Status copied = t.CopyToF32(values[i].data()); !copied.ok()) {
      wrong.push_back(std::string(copied.message()));
      continue;
    }
    for (float v : values[i]) {
      if (!std::isfinite(v)) {
        wrong.push_back(absl::StrCat("'", p.name, "' contains a non-finite value"));
        break;
      }
    }
  }
  if (!missing.empty() || !extra.empty() || !wrong.empty()) {
    std::vector<std::string> problems;
    if (!missing.empty())
      problems.push_back(absl::StrCat("missing tensors: ", absl::StrJoin(missing, ", ")));
    if (!extra.empty())
      problems.push_back(absl::StrCat("unexpected tensors: ", absl::StrJoin(extra, ", ")));
    if (!wrong.empty()) problems.push_back(absl::StrJoin(wrong, "; "));
    if (missing.empty() && extra.empty() && !shape_mismatch) {  // bad values, not another model
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": ", absl::StrJoin(problems, "; ")));
    }
    // The rank and targets agreed: names or shapes that do not fit mean another base model.
    std::string base = "another base model";
    if (auto b = cfg.find("base_model_name_or_path");
        b != cfg.end() && b->is_string() && !b->get<std::string>().empty()) {
      base = absl::StrCat("another base model (its adapter_config.json names ",
                          b->get<std::string>(), ")");
    }
    return absl::InvalidArgumentError(absl::StrCat(dir, " is an adapter for ", base,
                                                   ": its tensors do not fit this model's (",
                                                   absl::StrJoin(problems, "; "), ")"));
  }
  for (size_t i = 0; i < params.size(); ++i) params[i].value = std::move(values[i]);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoraOptions> ReadPeftLoraOptions(const std::string& dir) {
  const std::string config_path = dir + "/" + kPeftConfigFile;
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJsonFile(config_path));
  if (!cfg.is_object())
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": expected a JSON object"));
  FEDLORA_RETURN_IF_ERROR(RefuseUnimplemented(cfg, config_path));
  LoraOptions o;
  FEDLORA_ASSIGN_OR_RETURN(int64_t r, GetInt(cfg, "r", config_path));
  if (r < 1 || r > (1 << 16))
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": r = ", r));
  o.rank = static_cast<int>(r);
  FEDLORA_ASSIGN_OR_RETURN(double alpha, GetDouble(cfg, "lora_alpha", config_path));
  o.alpha = static_cast<float>(alpha);
  FEDLORA_ASSIGN_OR_RETURN(double dropout, GetDoubleOr(cfg, "lora_dropout", 0.0, config_path));
  o.dropout = static_cast<float>(dropout);
  auto targets = cfg.find("target_modules");
  if (targets == cfg.end() || !targets->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path,
                     ": target_modules must be a list of module names (a regular expression is not "
                     "supported here)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(o.target_modules, GetStringArray(cfg, "target_modules", config_path));
  return o;
}

absl::Status LoadPeftAdapter(const std::string& dir, BertClassifier* model) {
  return LoadAdapter(dir, PeftAdapterConfig(*model), model->options().lora.rank,
                     model->options().lora.alpha, model->trainable_params());
}

nlohmann::json PeftAdapterConfig(const CausalLm& model) {
  const DecoderOptions& o = model.options();
  return DecoderPeftConfig(o.lora, model.lora_targets(), o.base_model_name);
}

absl::Status LoadPeftAdapter(const std::string& dir, CausalLm* model) {
  return LoadAdapter(dir, PeftAdapterConfig(*model), model->options().lora.rank,
                     model->options().lora.alpha, model->trainable_params());
}

}  // namespace fedlora
