// fedlora embed: the frozen model's pooled sentence embeddings of a dataset, as .npy files.
//
//   fedlora embed --model models/all-MiniLM-L6-v2 --data data/fortunes/train.jsonl
//       --out train_emb.npy --labels-out train_labels.npy
//
// --out gets float32 [examples, hidden]; --labels-out (optional) int32 [examples], the label
// indices in the order of --label-names (RUN/labels.json from `fedlora train`, or a labels.txt
// with one name a line) or else the data's own sorted label order. The model, its tokenizer and
// the data come from workload/factory.h LoadWorkload (the flags as a run config, tools/common.h
// CommandRunConfig; the request's frozen_base), as every command's do.
// Used by scripts/baseline_frozen_embeddings.py.
#include <algorithm>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/status.h"
#include "kernels/base/context.h"
#include "kernels/threads.h"
#include "model/bert.h"
#include "tools/common.h"
#include "train/dataset.h"
#include "train/trainer.h"
#include "train/training_defaults.h"
#include "workload/factory.h"
#include "workload/lora_model.h"

namespace fedlora::tools {
namespace {

struct EmbedFlags {
  std::string model_dir, data_path, out_path, labels_out, label_names_path;
  std::string pooling = "mean";
  EncoderDataFlags fields;
  int batch_size = 32;
  int max_seq_len = kDefaultMaxSeqLen;
  int threads = 0;
};

// The label order --label-names gives ("": none, the data's own).
absl::StatusOr<std::vector<std::string>> ReadLabelOrder(const std::string& path) {
  if (path.ends_with(".json")) {
    FEDLORA_ASSIGN_OR_RETURN(nlohmann::json labels, ReadJsonFile(path));
    return GetStringArray(labels, "label_names", path);
  }
  if (path.empty()) return std::vector<std::string>{};
  return LoadLabelNames(path);
}

absl::Status Embed(EmbedFlags f, Pooling pooling) {
  if (!IsDirectory(f.model_dir))
    return absl::NotFoundError(absl::StrCat("model directory ", f.model_dir, " not found"));
  if (!IsRegularFile(f.data_path))
    return absl::NotFoundError(absl::StrCat("data file ", f.data_path, " not found"));
  kernels::SetNumThreads(f.threads);
  // The encoder's config.json before the labels: a decoder or a broken checkpoint fails on it.
  FEDLORA_RETURN_IF_ERROR(EncoderMaxSeqLen(f.model_dir, f.max_seq_len).status());
  FEDLORA_ASSIGN_OR_RETURN(const std::vector<std::string> label_names,
                           ReadLabelOrder(f.label_names_path));
  // The data as a classifier's training data, planned for --batch-size examples per pass, on the
  // frozen base: the fresh adapter's B is zero, so the model computes exactly the frozen one.
  v1::RunConfig config =
      CommandRunConfig(f.model_dir, /*decoder=*/false, f.max_seq_len, {}, {}, f.fields);
  for (const std::string& label : label_names) config.mutable_task()->add_labels(label);
  config.mutable_data()->set_eval_batch_size(static_cast<uint32_t>(f.batch_size));
  FEDLORA_ASSIGN_OR_RETURN(Workload w, LoadWorkload(config, {.model_path = f.model_dir,
                                                             .train_path = f.data_path,
                                                             .role = ModelRole::kEvaluate,
                                                             .frozen_base = true}));
  const TokenizedDataset& data = *w.train.examples;
  if (data.size() == 0)
    return absl::InvalidArgumentError(absl::StrCat(f.data_path, " has no examples"));
  BertClassifier& model = static_cast<ClassifierModel&>(*w.models[0]).model();
  const int64_t hidden = model.config().hidden_size;
  std::vector<float> embeddings;
  embeddings.reserve(static_cast<size_t>(data.size() * hidden));
  std::vector<int32_t> labels;
  std::vector<int64_t> idx;
  // The checkpoint's pad id, as train/ and the evaluator pad (padded positions are masked).
  const int32_t pad_id = static_cast<int32_t>(model.config().pad_token_id);
  for (int64_t pos = 0; pos < data.size(); pos += f.batch_size) {
    const int64_t end = std::min<int64_t>(pos + f.batch_size, data.size());
    idx.resize(end - pos);
    std::iota(idx.begin(), idx.end(), pos);
    const BertClassifier::Batch batch = MakeBatch(data, idx, pad_id);
    FEDLORA_ASSIGN_OR_RETURN(std::vector<float> pooled, model.PooledEmbeddings(batch, pooling));
    embeddings.insert(embeddings.end(), pooled.begin(), pooled.end());
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  }
  FEDLORA_RETURN_IF_ERROR(WriteNpyFloat(f.out_path, embeddings, {data.size(), hidden}));
  if (!f.labels_out.empty())
    FEDLORA_RETURN_IF_ERROR(WriteNpyInt32(f.labels_out, labels, {data.size()}));
  std::cerr << "fedlora embed: " << data.size() << " x " << hidden << " embeddings written to "
            << f.out_path << "\n";
  return absl::OkStatus();
}

}  // namespace

int RunEmbed(int argc, char** argv) {
  const std::string command = argv[0];
  EmbedFlags f;
  FlagSet flags(
      command, "Writes the frozen model's pooled embeddings of a dataset as a float32 .npy array.");
  flags.AddString("model", &f.model_dir, "model directory", true);
  flags.AddString("data", &f.data_path, "data file (JSONL, CSV or TSV)", true);
  flags.AddString("out", &f.out_path, "output .npy for the embeddings [examples, hidden]", true);
  flags.AddString("labels-out", &f.labels_out, "output .npy for the label indices [examples]");
  AddEncoderDataFlags(flags, &f.fields);
  flags.AddString(
      "label-names", &f.label_names_path,
      "label order: a labels.json from `fedlora train`, or a text file with one label a line");
  flags.AddChoice("pooling", &f.pooling, {"mean", "cls"}, "mean (over real tokens) or cls");
  flags.AddInt("batch-size", &f.batch_size, "examples per forward pass");
  flags.AddInt("max-seq-len", &f.max_seq_len, "tokens per example; longer texts are cut");
  flags.AddInt("threads", &f.threads, "CPU threads (0: all cores)");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (!flags.positional().empty())
    return UsageError(command, "unexpected argument '" + flags.positional()[0] + "'");
  if (const std::string p = EncoderDataFlagsProblem(f.fields, flags, /*decoder=*/false);
      !p.empty()) {
    return UsageError(command, p);
  }
  Pooling pooling;
  if (f.pooling == "mean") {
    pooling = Pooling::kMean;
  } else if (f.pooling == "cls") {
    pooling = Pooling::kCls;
  } else {
    return UsageError(command, "--pooling must be mean or cls, got '" + f.pooling + "'");
  }
  if (f.batch_size < 1) return UsageError(command, "--batch-size must be >= 1");
  if (f.max_seq_len < 2) return UsageError(command, "--max-seq-len must be >= 2");
  if (f.threads < 0) return UsageError(command, "--threads must be >= 0");
  if (absl::Status s = Embed(f, pooling); !s.ok()) return Fail(command, s);
  return kExitOk;
}

}  // namespace fedlora::tools
