// The adapter directory every fedlora command writes (`train`, `simulate`, `server --out`,
// `export`), through one function, so that each one carries what is needed to use it:
//
//   adapter_config.json, adapter_model.safetensors   PEFT's two files (model/peft.h);
//       base_model_name_or_path is what PEFT's from_pretrained can use: the base model's absolute
//       directory; for a GGUF decoder (a file PEFT cannot load) the Hugging Face repo id the GGUF
//       records as its source (general.source.repo_url or .url, "ORG/NAME"), else the absolute
//       directory holding it (transformers loads the file with from_pretrained(dir,
//       gguf_file=name)). fedlora_adapter.json keeps the exact path.
//   labels.json          classifiers only: {"label_names": [...], "id2label": {"0": ...},
//       "label2id": {...: 0}}, the classifier's rows in order. PEFT's adapter_config.json has no
//       place for them (PEFT's LoraConfig refuses unknown keys), so they sit beside it, ready for
//       AutoModelForSequenceClassification.from_pretrained(base, id2label=..., label2id=...).
//   fedlora_adapter.json {"format": 1, "task": "sequence_classification" | "causal_lm",
//       "base_model", "max_seq_len" (tokens per example the run used), for decoders
//       "system_prompt" and "chat_template" (its name), and for a federation's adapter "run_id"
//       and "round"}. `fedlora eval` and `generate` take their defaults from it.
//
//   AdapterMetadata meta{.task = AdapterTask::kSequenceClassification, .base_model = "models/m",
//                        .label_names = {"neg", "pos"}, .max_seq_len = 128};
//   FEDLORA_RETURN_IF_ERROR(SaveAdapterDirectory(*model, meta, "runs/x/adapter"));
//   FEDLORA_ASSIGN_OR_RETURN(AdapterDirInfo info, ReadAdapterMetadata("runs/x/adapter"));
//
// Writing is atomic: the files are written and synced into a fresh sibling directory
// (<dir>.tmp-XXXXXX), which is then renamed to <dir>; an existing adapter directory is swapped
// out whole (renameat2 RENAME_EXCHANGE) and removed. A crash leaves either the old directory or
// the new one, never a mix (at worst a stray <dir>.tmp-XXXXXX beside it).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/safetensors.h"
#include "model/bert.h"
#include "model/decoder.h"

namespace fedlora {

inline constexpr char kLabelsFile[] = "labels.json";
inline constexpr char kAdapterMetadataFile[] = "fedlora_adapter.json";

enum class AdapterTask { kSequenceClassification, kCausalLm };

struct AdapterMetadata {
  AdapterTask task = AdapterTask::kSequenceClassification;
  std::string base_model{};  // must exist; made absolute (against the working directory)
  std::vector<std::string> label_names{};  // classifiers: one per classifier row, in order (>= 2)
  int max_seq_len = 0;                     // >= 1
  std::string system_prompt{};             // decoders ("": none)
  std::string chat_template{};             // decoders: chatml, smollm2, qwen2 or llama3 (required)
  std::string run_id{};                    // a federation's adapter: its run ("" otherwise)
  int64_t round = -1;                      // and the committed round it is (-1: not recorded)
};

// The one writer: `tensors` as adapter_model.safetensors (format "pt"), `peft_config` as
// adapter_config.json with base_model_name_or_path set for the base model (above), and the two
// metadata files, atomically (above). InvalidArgument for metadata that does not fit: a
// classifier without >= 2 distinct label names or with a count other than its classifier's
// rows, a max_seq_len < 1, a decoder without its chat template, a base model that does not
// exist; and
// CheckAdapterDirectoryTarget's errors.
absl::Status WriteAdapterDirectory(const std::string& dir,
                                   const std::vector<SafetensorsTensorToWrite>& tensors,
                                   nlohmann::json peft_config, const AdapterMetadata& meta);

// Writes directory `dir` whole, as WriteAdapterDirectory does: `fill(tmp)` writes the files into a
// fresh sibling directory, which then takes `dir`'s place (an existing `dir` is swapped out and
// removed); on an error the sibling is removed. The caller checks first that `dir` may go.
absl::Status WriteDirectoryWhole(const std::string& dir,
                                 const std::function<absl::Status(const std::string&)>& fill);

// The base model an adapter directory is for: `model_path` when given, else fedlora_adapter.json's
// base_model, else adapter_config.json's base_model_name_or_path. NotFound, naming where the path
// came from and --model, when it does not exist here; InvalidArgument when nothing names one.
absl::StatusOr<std::string> AdapterBaseModel(const std::string& dir, const std::string& model_path);

// The model's trainable params and PEFT config through WriteAdapterDirectory.
absl::Status SaveAdapterDirectory(const BertClassifier& model, const AdapterMetadata& meta,
                                  const std::string& dir);
absl::Status SaveAdapterDirectory(const CausalLm& model, const AdapterMetadata& meta,
                                  const std::string& dir);

// OK when `dir` may receive an adapter directory: it does not exist, is empty, or already holds
// one (adapter_config.json), which is then replaced whole. FailedPrecondition otherwise (a
// directory of other files is never deleted), naming it. For commands that check before they
// spend time training.
absl::Status CheckAdapterDirectoryTarget(const std::string& dir);

// What an adapter directory records beside its weights; each field is empty when its file does
// not say it (an adapter written by PEFT, or by fedlora before these files existed).
struct AdapterDirInfo {
  std::optional<std::vector<std::string>> label_names;  // labels.json
  std::optional<int> max_seq_len;                       // fedlora_adapter.json from here on
  std::optional<std::string> system_prompt;
  std::optional<std::string> chat_template;
  std::optional<std::string> task;        // "sequence_classification" | "causal_lm"
  std::optional<std::string> base_model;  // the exact path the adapter was trained on
};

// Reads labels.json and fedlora_adapter.json where present. InvalidArgument naming the file for
// one that is present but malformed.
absl::StatusOr<AdapterDirInfo> ReadAdapterMetadata(const std::string& dir);

}  // namespace fedlora
