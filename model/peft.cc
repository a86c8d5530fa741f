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

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "mkdir", dir);
  return absl::OkStatus();
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

nlohmann::json PeftAdapterConfig(const BertClassifier& model) {
  const ModelOptions& o = model.options();
  nlohmann::json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "SEQ_CLS";
  j["r"] = o.lora.rank;
  j["lora_alpha"] = o.lora.alpha;
  j["lora_dropout"] = o.lora.dropout;
  j["target_modules"] = TargetModulesJson(model.lora_targets());
  j["modules_to_save"] = nlohmann::json::array({"classifier"});
  j["base_model_name_or_path"] = o.base_model_name;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["revision"] = nullptr;
  return j;
}

absl::Status SavePeftAdapter(const BertClassifier& model, const std::string& dir) {
  FEDLORA_RETURN_IF_ERROR(MakeDirs(dir));
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const Param& p : model.trainable_params()) {
    tensors.push_back(
        {p.name, DType::kF32, p.shape, p.value.data(), p.value.size() * sizeof(float)});
  }
  FEDLORA_RETURN_IF_ERROR(
      WriteSafetensors(dir + "/" + kPeftWeightsFile, tensors, {{"format", "pt"}}));
  return WriteFileAtomically(dir + "/" + kPeftConfigFile, PeftAdapterConfig(model).dump(2) + "\n");
}

absl::Status LoadPeftAdapter(const std::string& dir, BertClassifier* model) {
  const std::string config_path = dir + "/" + kPeftConfigFile;
  const std::string weights_path = dir + "/" + kPeftWeightsFile;
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJsonFile(config_path));
  if (!cfg.is_object())
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": expected a JSON object"));
  const nlohmann::json expected = PeftAdapterConfig(*model);
  FEDLORA_ASSIGN_OR_RETURN(std::string peft_type, GetString(cfg, "peft_type", config_path));
  if (peft_type != "LORA") {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": peft_type \"", peft_type, "\", expected \"LORA\""));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string task_type,
                           GetStringOr(cfg, "task_type", "SEQ_CLS", config_path));
  if (task_type != "SEQ_CLS") {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": task_type \"", task_type, "\", expected \"SEQ_CLS\""));
  }
  FEDLORA_ASSIGN_OR_RETURN(int64_t r, GetInt(cfg, "r", config_path));
  if (r != model->options().lora.rank) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": adapter rank r = ", r,
                                                   ", the model has rank ",
                                                   model->options().lora.rank));
  }
  FEDLORA_ASSIGN_OR_RETURN(double alpha, GetDouble(cfg, "lora_alpha", config_path));
  if (std::fabs(alpha - model->options().lora.alpha) > 1e-6 * std::fabs(alpha)) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path, ": lora_alpha = ", alpha, ", the model has ", model->options().lora.alpha));
  }
  const auto targets = cfg.find("target_modules");
  if (targets == cfg.end() || !SameTargets(*targets, expected["target_modules"])) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": target_modules ",
                     targets == cfg.end() ? std::string("missing") : targets->dump(),
                     ", the model has ", expected["target_modules"].dump()));
  }

  FEDLORA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(weights_path));
  std::vector<Param>& params = model->trainable_params();
  std::set<std::string> wanted;
  for (const Param& p : params) wanted.insert(p.name);
  std::vector<std::string> missing, extra, wrong;
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
      wrong.push_back(absl::StrCat("'", p.name, "' has shape [", absl::StrJoin(t.shape, ", "),
                                   "], expected [", absl::StrJoin(p.shape, ", "), "]"));
      continue;
    }
    const size_t n = static_cast<size_t>(t.numel());
    values[i].resize(n);
    if (t.dtype == DType::kF32) {
      std::memcpy(values[i].data(), t.data, n * sizeof(float));
    } else if (t.dtype == DType::kBF16 || t.dtype == DType::kF16) {
      std::vector<uint16_t> bits(n);
      std::memcpy(bits.data(), t.data, n * sizeof(uint16_t));
      if (t.dtype == DType::kBF16) {
        ConvertBF16ToF32(bits.data(), values[i].data(), n);
      } else {
        ConvertF16ToF32(bits.data(), values[i].data(), n);
      }
    } else {
      wrong.push_back(absl::StrCat("'", p.name, "' has dtype ", std::string(DTypeName(t.dtype)),
                                   ", expected F32, F16 or BF16"));
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
    return absl::InvalidArgumentError(
        absl::StrCat(weights_path, " does not match the model: ", absl::StrJoin(problems, "; ")));
  }
  for (size_t i = 0; i < params.size(); ++i) params[i].value = std::move(values[i]);
  return absl::OkStatus();
}

}  // namespace fedlora
