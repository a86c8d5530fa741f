#include "model/adapter_dir.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <stdlib.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <set>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/gguf.h"
#include "core/json.h"
#include "core/status.h"
#include "model/peft.h"

namespace fedlora {
namespace {

namespace fs = std::filesystem;

bool IsFile(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

const char* TaskName(AdapterTask task) {
  return task == AdapterTask::kCausalLm ? "causal_lm" : "sequence_classification";
}

// Rows of the classifier among `tensors` (BERT's classifier.weight, RoBERTa's
// classifier.out_proj.weight); -1 when there is none.
int64_t ClassifierRows(const std::vector<SafetensorsTensorToWrite>& tensors) {
  for (const auto& t : tensors) {
    if ((t.name == "base_model.model.classifier.weight" ||
         t.name == "base_model.model.classifier.out_proj.weight") &&
        !t.shape.empty()) {
      return t.shape[0];
    }
  }
  return -1;
}

absl::Status CheckMetadata(const std::vector<SafetensorsTensorToWrite>& tensors,
                           const AdapterMetadata& meta, const std::string& dir) {
  const std::string what = absl::StrCat("adapter ", dir, ": ");
  if (meta.base_model.empty()) return absl::InvalidArgumentError(what + "no base model recorded");
  if (meta.max_seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "max_seq_len ", meta.max_seq_len, " (must be >= 1)"));
  }
  if (meta.task == AdapterTask::kCausalLm) {
    if (meta.chat_template.empty())
      return absl::InvalidArgumentError(what + "a decoder adapter needs its chat template");
    if (!meta.label_names.empty())
      return absl::InvalidArgumentError(what + "a decoder adapter has no label names");
    return absl::OkStatus();
  }
  const std::set<std::string> distinct(meta.label_names.begin(), meta.label_names.end());
  if (meta.label_names.size() < 2 || distinct.size() != meta.label_names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "a classifier needs >= 2 distinct label names, got ", meta.label_names.size()));
  }
  const int64_t rows = ClassifierRows(tensors);
  if (rows != static_cast<int64_t>(meta.label_names.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, meta.label_names.size(), " label names for a classifier of ",
                     rows < 0 ? std::string("no") : std::to_string(rows), " rows"));
  }
  return absl::OkStatus();
}

nlohmann::json LabelsJson(const std::vector<std::string>& names) {
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (size_t i = 0; i < names.size(); ++i) {
    id2label[std::to_string(i)] = names[i];
    label2id[names[i]] = i;
  }
  return {{"label_names", names}, {"id2label", id2label}, {"label2id", label2id}};
}

nlohmann::json MetadataJson(const AdapterMetadata& meta, const std::string& base) {
  nlohmann::json j = {{"format", 1},
                      {"task", TaskName(meta.task)},
                      {"base_model", base},
                      {"max_seq_len", meta.max_seq_len}};
  if (meta.task == AdapterTask::kCausalLm) {
    j["system_prompt"] = meta.system_prompt;
    j["chat_template"] = meta.chat_template;
  }
  if (!meta.run_id.empty()) j["run_id"] = meta.run_id;
  if (meta.round >= 0) j["round"] = meta.round;
  return j;
}

// "ORG/NAME" from a Hugging Face model URL (https://huggingface.co/ORG/NAME), else "".
std::string HuggingFaceRepoId(std::string_view url) {
  for (std::string_view prefix :
       {"https://huggingface.co/", "http://huggingface.co/", "https://hf.co/"}) {
    if (url.substr(0, prefix.size()) != prefix) continue;
    std::string_view rest = url.substr(prefix.size());
    if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos || slash == 0 || slash + 1 == rest.size()) return "";
    for (char c : rest) {
      const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                      c == '.' || c == '/';
      if (!ok) return "";
    }
    if (rest.find('/', slash + 1) != std::string_view::npos) return "";
    return std::string(rest);
  }
  return "";
}

// What adapter_config.json names as the base (`base` is absolute): something PEFT's
// from_pretrained can use. A directory as it is; a .gguf file (which PEFT cannot load) by the
// Hugging Face repo the GGUF says it was converted from (general.source.repo_url or
// general.source.url), else the directory holding it. Not general.base_model.*: those name the
// model this one was fine-tuned from, another model.
absl::StatusOr<std::string> PeftBaseModelName(const std::string& base) {
  if (!IsGgufPath(base)) return base;
  FEDLORA_ASSIGN_OR_RETURN(auto file, GgufFile::Open(base));
  for (const char* key : {"general.source.repo_url", "general.source.url"}) {
    if (!file->Has(key)) continue;
    absl::StatusOr<std::string_view> url = file->GetString(key);
    if (!url.ok()) continue;
    if (std::string id = HuggingFaceRepoId(*url); !id.empty()) return id;
  }
  return fs::path(base).parent_path().string();
}

// Puts the complete directory `tmp` at `dir`: a rename when `dir` is missing or empty, else an
// atomic exchange with the old one, which is then removed.
absl::Status MoveIntoPlace(const std::string& tmp, const std::string& dir) {
  if (rename(tmp.c_str(), dir.c_str()) == 0) return absl::OkStatus();
  if (errno != ENOTEMPTY && errno != EEXIST) return ErrnoToStatus(errno, "rename", dir);
  std::error_code ec;
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
      return ErrnoToStatus(errno, "rename (exchange)", dir);
    // A file system without the exchange: the old directory steps aside first (a crash between the
    // two renames leaves both complete, beside each other, and none at `dir`).
    std::string old = dir + ".old-XXXXXX";
    if (mkdtemp(old.data()) == nullptr) return ErrnoToStatus(errno, "mkdtemp", old);
    if (rename(dir.c_str(), old.c_str()) != 0) return ErrnoToStatus(errno, "rename", dir);
    if (rename(tmp.c_str(), dir.c_str()) != 0) return ErrnoToStatus(errno, "rename", dir);
    fs::remove_all(old, ec);
    return absl::OkStatus();
  }
  fs::remove_all(tmp, ec);  // now the old adapter; a leftover is harmless
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckAdapterDirectoryTarget(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return absl::OkStatus();
  if (!fs::is_directory(st)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " exists and is not a directory: name a new directory"));
  }
  if (fs::is_empty(dir, ec) || fs::exists(fs::path(dir) / kPeftConfigFile, ec))
    return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(dir,
                   " is a directory of other files, not an adapter directory: name a new (or "
                   "empty) directory; an "
                   "adapter is written whole and replaces only an earlier adapter"));
}

absl::Status WriteDirectoryWhole(const std::string& dir,
                                 const std::function<absl::Status(const std::string&)>& fill) {
  std::error_code ec;
  const fs::path target = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (ec) return ErrnoToStatus(ec.value(), "absolute", dir);
  // A directory path ends in a name ("runs/x/" is "runs/x").
  const fs::path clean = target.filename().empty() ? target.parent_path() : target;
  const std::string parent = clean.parent_path().string();
  fs::create_directories(parent, ec);
  if (ec) return ErrnoToStatus(ec.value(), "mkdir", parent);
  std::string tmp = clean.string() + ".tmp-XXXXXX";
  if (mkdtemp(tmp.data()) == nullptr) return ErrnoToStatus(errno, "mkdtemp", tmp);
  chmod(tmp.c_str(), 0755);  // mkdtemp's 0700 would hide the files from their other users
  absl::Status s = fill(tmp);
  if (s.ok()) s = MoveIntoPlace(tmp, clean.string());
  if (!s.ok()) {
    fs::remove_all(tmp, ec);
    return s;
  }
  return FsyncDirectory(parent);
}

absl::Status WriteAdapterDirectory(const std::string& dir,
                                   const std::vector<SafetensorsTensorToWrite>& tensors,
                                   nlohmann::json peft_config, const AdapterMetadata& meta) {
  FEDLORA_RETURN_IF_ERROR(CheckMetadata(tensors, meta, dir));
  FEDLORA_RETURN_IF_ERROR(CheckAdapterDirectoryTarget(dir));
  std::error_code ec;
  if (!fs::exists(meta.base_model, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter ", dir, ": base model ", meta.base_model,
                     " does not exist (an adapter records its absolute path)"));
  }
  const std::string base = fs::absolute(fs::path(meta.base_model), ec).lexically_normal().string();
  FEDLORA_ASSIGN_OR_RETURN(peft_config["base_model_name_or_path"], PeftBaseModelName(base));
  return WriteDirectoryWhole(dir, [&](const std::string& tmp) {
    FEDLORA_RETURN_IF_ERROR(
        WriteSafetensors(tmp + "/" + kPeftWeightsFile, tensors, {{"format", "pt"}}));
    FEDLORA_RETURN_IF_ERROR(
        WriteFileAtomically(tmp + "/" + kPeftConfigFile, peft_config.dump(2) + "\n"));
    if (meta.task == AdapterTask::kSequenceClassification) {
      FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(tmp + "/" + kLabelsFile,
                                                  LabelsJson(meta.label_names).dump(2) + "\n"));
    }
    return WriteFileAtomically(tmp + "/" + kAdapterMetadataFile,
                               MetadataJson(meta, base).dump(2) + "\n");
  });
}

absl::StatusOr<std::string> AdapterBaseModel(const std::string& dir,
                                             const std::string& model_path) {
  const std::string config_path = dir + "/" + kPeftConfigFile;
  std::string base = model_path, from = "--model";
  if (base.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(AdapterDirInfo info, ReadAdapterMetadata(dir));
    if (info.base_model) {
      base = *info.base_model;
      from = dir + "/" + kAdapterMetadataFile;
    }
  }
  if (base.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJsonFile(config_path));
    FEDLORA_ASSIGN_OR_RETURN(base, GetStringOr(cfg, "base_model_name_or_path", "", config_path));
    from = config_path;
  }
  if (base.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(dir, " records no base model: name it with --model"));
  std::error_code ec;
  if (!fs::exists(base, ec)) {
    return absl::NotFoundError(absl::StrCat("base model ", base, " (from ", from,
                                            ") not found here: name its location with --model"));
  }
  return base;
}

namespace {

std::vector<SafetensorsTensorToWrite> TensorsOf(const std::vector<Param>& params) {
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const Param& p : params) {
    tensors.push_back(
        {p.name, DType::kF32, p.shape, p.value.data(), p.value.size() * sizeof(float)});
  }
  return tensors;
}

}  // namespace

absl::Status SaveAdapterDirectory(const BertClassifier& model, const AdapterMetadata& meta,
                                  const std::string& dir) {
  if (meta.task != AdapterTask::kSequenceClassification) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter ", dir, ": an encoder's adapter is a classifier's"));
  }
  return WriteAdapterDirectory(dir, TensorsOf(model.trainable_params()), PeftAdapterConfig(model),
                               meta);
}

absl::Status SaveAdapterDirectory(const CausalLm& model, const AdapterMetadata& meta,
                                  const std::string& dir) {
  if (meta.task != AdapterTask::kCausalLm) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter ", dir, ": a decoder's adapter is a causal LM's"));
  }
  return WriteAdapterDirectory(dir, TensorsOf(model.trainable_params()), PeftAdapterConfig(model),
                               meta);
}

absl::StatusOr<AdapterDirInfo> ReadAdapterMetadata(const std::string& dir) {
  AdapterDirInfo info;
  const std::string labels_path = dir + "/" + kLabelsFile;
  if (IsFile(labels_path)) {
    FEDLORA_ASSIGN_OR_RETURN(nlohmann::json labels, ReadJsonFile(labels_path));
    FEDLORA_ASSIGN_OR_RETURN(info.label_names, GetStringArray(labels, "label_names", labels_path));
  }
  const std::string meta_path = dir + "/" + kAdapterMetadataFile;
  if (IsFile(meta_path)) {
    FEDLORA_ASSIGN_OR_RETURN(nlohmann::json meta, ReadJsonFile(meta_path));
    if (!meta.is_object())
      return absl::InvalidArgumentError(absl::StrCat(meta_path, ": expected a JSON object"));
    if (meta.contains("max_seq_len")) {
      FEDLORA_ASSIGN_OR_RETURN(int64_t n, GetInt(meta, "max_seq_len", meta_path));
      if (n < 1 || n > (1 << 20))
        return absl::InvalidArgumentError(absl::StrCat(meta_path, ": max_seq_len ", n));
      info.max_seq_len = static_cast<int>(n);
    }
    if (meta.contains("system_prompt")) {
      FEDLORA_ASSIGN_OR_RETURN(info.system_prompt, GetString(meta, "system_prompt", meta_path));
    }
    if (meta.contains("chat_template")) {
      FEDLORA_ASSIGN_OR_RETURN(info.chat_template, GetString(meta, "chat_template", meta_path));
    }
    if (meta.contains("task")) {
      FEDLORA_ASSIGN_OR_RETURN(info.task, GetString(meta, "task", meta_path));
    }
    if (meta.contains("base_model")) {
      FEDLORA_ASSIGN_OR_RETURN(info.base_model, GetString(meta, "base_model", meta_path));
    }
  }
  return info;
}

}  // namespace fedlora
