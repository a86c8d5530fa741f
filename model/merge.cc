#include "model/merge.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/adapter_dir.h"
#include "model/decoder.h"
#include "model/gguf_lora.h"
#include "model/peft.h"

namespace fedlora {
namespace {

namespace fs = std::filesystem;

constexpr char kPeftPrefix[] = "base_model.model.";
constexpr char kMergeMarker[] = "fedlora_merge.json";
// Files copied from the base beside the weights: tokenizers and generation settings.
constexpr const char* kCopied[] = {"tokenizer.json",
                                   "tokenizer_config.json",
                                   "special_tokens_map.json",
                                   "vocab.txt",
                                   "vocab.json",
                                   "merges.txt",
                                   "added_tokens.json",
                                   "tokenizer.model",
                                   "sentencepiece.bpe.model",
                                   "generation_config.json",
                                   "chat_template.json",
                                   "chat_template.jinja"};

// The base's safetensors files (one, or the shards of model.safetensors.index.json), by tensor.
struct BaseWeights {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> where;  // name -> file, sorted
};

absl::StatusOr<BaseWeights> OpenBase(const std::string& dir) {
  BaseWeights b;
  const std::string single = dir + "/model.safetensors",
                    index = dir + "/model.safetensors.index.json";
  std::error_code ec;
  std::set<std::string> shards;
  if (fs::exists(single, ec)) {
    shards.insert("model.safetensors");
  } else if (fs::exists(index, ec)) {
    FEDLORA_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(index));
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index, ": no weight_map object"));
    }
    for (const auto& [name, shard] : j["weight_map"].items()) {
      const std::string file = shard.is_string() ? shard.get<std::string>() : "";
      if (file.empty() || file.find('/') != std::string::npos || file == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(index, ": weight_map[\"", name, "\"] is not a file in ", dir));
      }
      shards.insert(file);
    }
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir,
                     ": neither model.safetensors nor model.safetensors.index.json (merge reads "
                     "safetensors checkpoints)"));
  }
  for (const std::string& shard : shards) {
    FEDLORA_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(dir + "/" + shard));
    for (const std::string& n : f->names()) {
      if (!b.where.emplace(n, f.get()).second) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", n, "' is in two shards"));
      }
    }
    b.files.push_back(std::move(f));
  }
  return b;
}

// One output tensor: a base tensor as it is (data points into its file) or values owned here.
struct OutTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t size = 0;
  std::shared_ptr<std::vector<uint8_t>> owned;
};

// `values` stored as `dtype` (F32, F16 or BF16).
OutTensor Owned(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
  auto bytes =
      std::make_shared<std::vector<uint8_t>>(values.size() * (dtype == DType::kF32 ? 4 : 2));
  if (dtype == DType::kF32) {
    std::memcpy(bytes->data(), values.data(), bytes->size());
  } else if (dtype == DType::kBF16) {
    ConvertF32ToBF16(values.data(), reinterpret_cast<uint16_t*>(bytes->data()), values.size());
  } else {
    ConvertF32ToF16(values.data(), reinterpret_cast<uint16_t*>(bytes->data()), values.size());
  }
  return {dtype, std::move(shape), bytes->data(), bytes->size(), bytes};
}

struct LoraPair {
  const AdapterTensor* a = nullptr;
  const AdapterTensor* b = nullptr;
};

// W += scale * B @ A for the base tensor `name` of `out`.
absl::Status FoldPair(const std::string& name, const LoraPair& pair, float scale, int rank,
                      std::map<std::string, OutTensor>& out) {
  if (pair.a == nullptr || pair.b == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("adapter tensor '",
                                                   (pair.a ? pair.a : pair.b)->name, "' has no ",
                                                   pair.a ? "lora_B" : "lora_A", " beside it"));
  }
  auto it = out.find(name);
  if (it == out.end()) {
    return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", pair.a->name,
                                                   "': the base model has no '", name,
                                                   "' (an adapter for another base model?)"));
  }
  OutTensor& w = it->second;
  const int64_t rows = pair.b->shape.size() == 2 ? pair.b->shape[0] : -1;
  const int64_t cols = pair.a->shape.size() == 2 ? pair.a->shape[1] : -1;
  if (w.shape != std::vector<int64_t>{rows, cols} || pair.a->shape[0] != rank ||
      pair.b->shape[1] != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adapter tensors '", pair.a->name, "' [", absl::StrJoin(pair.a->shape, ", "),
        "] and lora_B [", absl::StrJoin(pair.b->shape, ", "), "] do not fit '", name, "' [",
        absl::StrJoin(w.shape, ", "), "] at rank ", rank, " (an adapter for another base model?)"));
  }
  if (w.dtype != DType::kF32 && w.dtype != DType::kF16 && w.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("base tensor '", name, "' has dtype ",
                                                   std::string(DTypeName(w.dtype)),
                                                   ": merge folds into F32, F16 or BF16 weights"));
  }
  SafetensorsTensor t;
  t.dtype = w.dtype;
  t.shape = w.shape;
  t.data = static_cast<const uint8_t*>(w.data);
  FEDLORA_ASSIGN_OR_RETURN(std::vector<float> v, t.ToF32());
  const float* a = pair.a->values.data();
  const float* b = pair.b->values.data();
  for (int64_t i = 0; i < rows; ++i) {
    float* row = v.data() + i * cols;
    for (int k = 0; k < rank; ++k) {
      const float f = scale * b[i * rank + k];
      const float* ak = a + static_cast<int64_t>(k) * cols;
      for (int64_t j = 0; j < cols; ++j) row[j] += f * ak[j];
    }
  }
  w = Owned(w.dtype, w.shape, v);
  return absl::OkStatus();
}

// A classifier's config.json: its ForSequenceClassification architecture and labels.
nlohmann::json ClassifierConfig(nlohmann::json config, const std::string& model_type,
                                const std::vector<std::string>& labels) {
  static const std::map<std::string, std::string> kArch = {
      {"bert", "BertForSequenceClassification"},
      {"roberta", "RobertaForSequenceClassification"},
      {"xlm-roberta", "XLMRobertaForSequenceClassification"}};
  config["architectures"] = nlohmann::json::array({kArch.at(model_type)});
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (size_t i = 0; i < labels.size(); ++i) {
    id2label[std::to_string(i)] = labels[i];
    label2id[labels[i]] = i;
  }
  config["id2label"] = id2label;
  config["label2id"] = label2id;
  return config;
}

// What a merge works from, once checked.
struct MergePlan {
  LoraOptions lora;
  std::string base_path;
  nlohmann::json config;  // the base's config.json
  AdapterDirInfo info;
  bool classifier = false;
  std::string model_type;
};

absl::StatusOr<MergePlan> PlanMerge(const std::string& adapter_dir, const std::string& model_path,
                                    const std::string& out_dir) {
  MergePlan p;
  FEDLORA_ASSIGN_OR_RETURN(p.lora,
                           ReadPeftLoraOptions(adapter_dir));  // refuses what is not implemented
  FEDLORA_ASSIGN_OR_RETURN(p.base_path, AdapterBaseModel(adapter_dir, model_path));
  if (IsGgufPath(p.base_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the base model ", p.base_path,
                     " is a GGUF file: merge writes a Hugging Face (safetensors) model and a GGUF "
                     "has no Hugging Face config "
                     "or tokenizer files (and its weights are quantized). For llama.cpp, write the "
                     "adapter as a GGUF LoRA "
                     "(fedlora export --adapter ",
                     adapter_dir,
                     " --gguf OUT.gguf) and load it with --lora; or merge onto "
                     "the safetensors checkpoint the GGUF was converted from (--model DIR)"));
  }
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_empty(out_dir, ec) &&
      !fs::exists(fs::path(out_dir) / kMergeMarker, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(out_dir,
                     " is a directory of other files: name a new (or empty) directory; merge "
                     "replaces only a model "
                     "it wrote (",
                     kMergeMarker, ")"));
  }
  FEDLORA_ASSIGN_OR_RETURN(p.config, ReadJsonFile(p.base_path + "/config.json"));
  if (!p.config.is_object())
    return absl::InvalidArgumentError(absl::StrCat(p.base_path, "/config.json: not an object"));
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json peft, ReadJsonFile(adapter_dir + "/" + kPeftConfigFile));
  FEDLORA_ASSIGN_OR_RETURN(p.info, ReadAdapterMetadata(adapter_dir));
  p.classifier = (p.info.task && *p.info.task == "sequence_classification") ||
                 (peft.is_object() && peft.value("task_type", "") == "SEQ_CLS");
  p.model_type = p.config.value("model_type", "");
  if (p.classifier && p.model_type != "bert" && p.model_type != "roberta" &&
      p.model_type != "xlm-roberta") {
    return absl::InvalidArgumentError(
        absl::StrCat("a classifier's adapter on a base of model_type \"", p.model_type,
                     "\": merge writes BERT and RoBERTa classifiers"));
  }
  if (!p.classifier && !IsDecoderCheckpoint(p.base_path)) {
    return absl::InvalidArgumentError(absl::StrCat(adapter_dir, " is a causal-LM adapter but ",
                                                   p.base_path,
                                                   " is not a decoder checkpoint (LLaMA, Qwen2)"));
  }
  if (p.classifier && !p.info.label_names) {
    return absl::InvalidArgumentError(
        absl::StrCat(adapter_dir,
                     " has no labels.json: the merged classifier's id2label would be LABEL_0, "
                     "LABEL_1, ...; write "
                     "{\"label_names\": [...]} there, in the classifier's row order"));
  }
  return p;
}

// Folds every LoRA pair of `adapter` into `out` and puts its other tensors (modules_to_save) there.
absl::Status ApplyAdapter(const std::vector<AdapterTensor>& adapter, const LoraOptions& lora,
                          std::map<std::string, OutTensor>& out) {
  std::map<std::string, LoraPair> pairs;  // base weight name -> its LoRA pair
  for (const AdapterTensor& t : adapter) {
    if (t.name.rfind(kPeftPrefix, 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter tensor '", t.name, "' is not a PEFT name (", kPeftPrefix, "...)"));
    }
    for (float v : t.values) {
      if (!std::isfinite(v))
        return absl::InvalidArgumentError(
            absl::StrCat("adapter tensor '", t.name, "' has a non-finite value"));
    }
    const std::string name = t.name.substr(sizeof(kPeftPrefix) - 1);
    bool lora_tensor = false;
    for (const bool is_a : {true, false}) {
      const std::string suffix = is_a ? ".lora_A.weight" : ".lora_B.weight";
      const size_t n = suffix.size();
      if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0) {
        LoraPair& p = pairs[name.substr(0, name.size() - n) + ".weight"];
        (is_a ? p.a : p.b) = &t;
        lora_tensor = true;
      }
    }
    if (lora_tensor) continue;
    // modules_to_save (the classifier head): the adapter's tensor is the module's.
    auto it = out.find(name);
    if (it != out.end() && it->second.shape != t.shape) {
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", t.name, "' [",
                                                     absl::StrJoin(t.shape, ", "),
                                                     "] does not fit the base's '", name, "'"));
    }
    out[name] = Owned(DType::kF32, t.shape, t.values);
  }
  const float scale = lora.alpha / static_cast<float>(lora.rank);
  for (const auto& [name, pair] : pairs)
    FEDLORA_RETURN_IF_ERROR(FoldPair(name, pair, scale, lora.rank, out));
  return absl::OkStatus();
}

}  // namespace

absl::Status MergeAdapter(const std::string& adapter_dir, const std::string& model_path,
                          const std::string& out_dir) {
  FEDLORA_ASSIGN_OR_RETURN(MergePlan plan, PlanMerge(adapter_dir, model_path, out_dir));
  FEDLORA_ASSIGN_OR_RETURN(BaseWeights base, OpenBase(plan.base_path));
  // Output names: a BertModel checkpoint lacks the "bert." ("roberta.") its classifier's names have.
  std::string add_prefix;
  if (plan.classifier) {
    const std::string prefix = plan.model_type == "bert" ? "bert." : "roberta.";
    if (!base.where.count(prefix + "embeddings.word_embeddings.weight")) add_prefix = prefix;
  }
  std::map<std::string, OutTensor> out;
  for (const auto& [name, file] : base.where) {
    FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, file->Get(name));
    out[add_prefix + name] = {t.dtype, t.shape, t.data, t.size, nullptr};
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<AdapterTensor> adapter, ReadAdapterTensors(adapter_dir));
  FEDLORA_RETURN_IF_ERROR(ApplyAdapter(adapter, plan.lora, out));
  if (plan.classifier) {
    const std::vector<std::string>& labels = *plan.info.label_names;
    const std::string head = out.count("classifier.out_proj.weight") ? "classifier.out_proj.weight"
                                                                     : "classifier.weight";
    const int64_t rows = out.count(head) ? out[head].shape[0] : -1;
    if (rows != static_cast<int64_t>(labels.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          adapter_dir, ": ", labels.size(), " label names in labels.json for a classifier head of ",
          rows < 0 ? std::string("no") : std::to_string(rows), " rows"));
    }
    plan.config = ClassifierConfig(std::move(plan.config), plan.model_type, labels);
  }
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const auto& [name, t] : out) tensors.push_back({name, t.dtype, t.shape, t.data, t.size});
  std::error_code ec;
  const nlohmann::json marker = {
      {"adapter", fs::absolute(adapter_dir, ec).lexically_normal().string()},
      {"base_model", fs::absolute(plan.base_path, ec).lexically_normal().string()},
      {"lora_scale", plan.lora.alpha / static_cast<float>(plan.lora.rank)}};
  return WriteDirectoryWhole(out_dir, [&](const std::string& tmp) {
    FEDLORA_RETURN_IF_ERROR(
        WriteSafetensors(tmp + "/model.safetensors", tensors, {{"format", "pt"}}));
    FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(tmp + "/config.json", plan.config.dump(2) + "\n"));
    for (const char* file : kCopied) {
      const fs::path from = fs::path(plan.base_path) / file;
      if (!fs::is_regular_file(from, ec)) continue;
      FEDLORA_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(from.string()));
      FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(tmp + "/" + file, bytes));
    }
    return WriteFileAtomically(tmp + "/" + kMergeMarker, marker.dump(2) + "\n");
  });
}

}  // namespace fedlora
