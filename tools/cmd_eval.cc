// fedlora eval: scores a model with a LoRA adapter on a labelled dataset.
//
//   fedlora eval --model models/all-MiniLM-L6-v2 --adapter runs/central --data
//   data/fortunes/test.jsonl
//
// The adapter directory is what fedlora (train, simulate, server --out, export) or PEFT wrote:
// adapter_config.json gives the LoRA shape (r, lora_alpha, target_modules), the classifier's rows
// in adapter_model.safetensors the number of labels, and labels.json the label order: a
// classifier adapter without it is refused (the order is never guessed from the data).
// fedlora_adapter.json gives the defaults of --max-seq-len (and for decoders --system and
// --chat-template): the run's values; a flag that differs wins and is said on stderr. Prints one
// JSON line on stdout: {"count":..,"loss":..,"accuracy":..,"macro_f1":..}.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "kernels/context.h"
#include "model/adapter_dir.h"
#include "model/bert.h"
#include "model/decoder.h"
#include "model/peft.h"
#include "tools/common.h"
#include "tools/decoder_commands.h"
#include "train/trainer.h"
#include "workload/evaluator.h"
#include "workload/factory.h"

namespace fedlora::tools {
namespace {

struct EvalFlags {
  std::string model_dir, adapter_dir, data_path;
  DecoderDataFlags data;
  EncoderDataFlags fields;
  int batch_size = 32;
  int max_seq_len = 128;
  int threads = 0;
  bool bf16 = false;
  bool bf16_math = false;      // implies bf16
  bool int8_math = false;      // decoders
  std::string device = "cpu";  // --device: cpu, cuda, auto
  // Which of the settings an adapter records were given on the command line.
  bool max_seq_len_given = false, system_given = false, chat_template_given = false;
};

// The model options an adapter directory implies.
absl::StatusOr<ModelOptions> OptionsFromAdapter(const std::string& dir,
                                                std::vector<std::string>& label_names) {
  const std::string config_path = dir + "/" + kPeftConfigFile;
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json config, ReadJsonFile(config_path));
  ModelOptions options;
  FEDLORA_ASSIGN_OR_RETURN(int64_t rank, GetInt(config, "r", config_path));
  FEDLORA_ASSIGN_OR_RETURN(double alpha, GetDouble(config, "lora_alpha", config_path));
  options.lora.rank = static_cast<int>(rank);
  options.lora.alpha = static_cast<float>(alpha);
  if (!config.contains("target_modules") || !config["target_modules"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path,
                     ": target_modules must be a list of module names (a regular expression is not "
                     "supported by fedlora eval)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(options.lora.target_modules,
                           GetStringArray(config, "target_modules", config_path));

  const std::string weights_path = dir + "/" + kPeftWeightsFile;
  FEDLORA_ASSIGN_OR_RETURN(auto weights, SafetensorsFile::Open(weights_path));
  FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor classifier,
                           weights->Get("base_model.model.classifier.weight"));
  if (classifier.shape.size() != 2 || classifier.shape[0] < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(weights_path, ": classifier.weight must be [labels >= 2, hidden]"));
  }
  options.num_labels = static_cast<int>(classifier.shape[0]);

  const std::string labels_path = dir + "/" + kLabelsFile;
  FEDLORA_ASSIGN_OR_RETURN(AdapterDirInfo info, ReadAdapterMetadata(dir));
  if (!info.label_names) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " has no ", kLabelsFile, ": the order of its classifier's ", options.num_labels,
        " rows is not recorded, and fedlora eval does not guess it from the data (a file holding "
        "some of the "
        "labels would be scored against the wrong rows). fedlora train, simulate, server --out and "
        "export "
        "write it; for another adapter write ",
        labels_path,
        " as {\"label_names\": [row 0's label, row 1's, ...]}, in the order of the run's labels"));
  }
  label_names = *info.label_names;
  if (static_cast<int>(label_names.size()) != options.num_labels) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, " names ", label_names.size(),
                                                   " labels but the classifier has ",
                                                   options.num_labels));
  }
  return options;
}

absl::Status Eval(EvalFlags f) {
  FEDLORA_ASSIGN_OR_RETURN(const Device resolved, ResolveDevice(f.device));
  // An encoder refuses --int8-math and --exact-match below, with its own message.
  const bool decoder = IsDecoderCheckpoint(f.model_dir);
  FEDLORA_ASSIGN_OR_RETURN(const Device device,
                           DeviceForRun(f.device, resolved, CpuOnlyWork(decoder && f.int8_math)));
  if (IsDirectory(f.adapter_dir)) {
    FEDLORA_RETURN_IF_ERROR(
        ApplyAdapterSettings("fedlora eval", f.adapter_dir,
                             {.max_seq_len = &f.max_seq_len,
                              .max_seq_len_given = f.max_seq_len_given,
                              .system = decoder ? &f.data.system : nullptr,
                              .system_given = f.system_given,
                              .chat_template = decoder ? &f.data.chat_template : nullptr,
                              .chat_template_given = f.chat_template_given}));
  }
  if (decoder) {
    return EvalDecoder({.model = f.model_dir,
                        .adapter = f.adapter_dir,
                        .data_path = f.data_path,
                        .data = f.data,
                        .batch_size = f.batch_size,
                        .max_seq_len = f.max_seq_len,
                        .threads = f.threads,
                        .bf16 = f.bf16,
                        .bf16_math = f.bf16_math,
                        .int8_math = f.int8_math,
                        .device = device});
  }
  if (f.adapter_dir.empty()) {
    return absl::InvalidArgumentError("--adapter is required for an encoder (its classifier)");
  }
  if (f.data.exact_match || !f.data.chat_template.empty() || !f.data.system.empty() ||
      f.data.prompt_field != "prompt" || f.data.response_field != "response" || f.int8_math) {
    return absl::InvalidArgumentError(
        "--exact-match, --chat-template, --system, --prompt-field, --response-field and "
        "--int8-math apply to "
        "decoder models only");
  }
  if (!IsDirectory(f.model_dir))
    return absl::NotFoundError(absl::StrCat("model directory ", f.model_dir, " not found"));
  if (!IsDirectory(f.adapter_dir)) {
    return absl::NotFoundError(absl::StrCat("adapter directory ", f.adapter_dir, " not found"));
  }
  if (!IsRegularFile(f.data_path))
    return absl::NotFoundError(absl::StrCat("data file ", f.data_path, " not found"));
  kernels::SetNumThreads(f.threads);
  FEDLORA_ASSIGN_OR_RETURN(f.max_seq_len, EncoderMaxSeqLen(f.model_dir, f.max_seq_len));
  std::vector<std::string> label_names;
  FEDLORA_ASSIGN_OR_RETURN(ModelOptions options, OptionsFromAdapter(f.adapter_dir, label_names));
  FEDLORA_ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizer(f.model_dir));
  FEDLORA_ASSIGN_OR_RETURN(
      TokenizedDataset data,
      LoadTokenizedDataset(f.data_path, *tokenizer, f.max_seq_len, label_names, f.fields));
  if (static_cast<int>(label_names.size()) > options.num_labels) {
    return absl::InvalidArgumentError(absl::StrCat(f.data_path, " has ", label_names.size(),
                                                   " labels but the adapter's classifier has ",
                                                   options.num_labels));
  }
  options.bf16_weights = f.bf16 || f.bf16_math;
  options.bf16_math = f.bf16_math;
  options.max_batch = f.batch_size;
  options.max_seq = f.max_seq_len;
  options.base_model_name = f.model_dir;
  options.device = device;
  FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<BertClassifier> classifier,
                           BertClassifier::Load(f.model_dir, options));
  FEDLORA_RETURN_IF_ERROR(LoadPeftAdapter(f.adapter_dir, classifier.get()));
  // The held-out evaluator of the server and the simulator (workload/evaluator.h), on one model.
  FEDLORA_ASSIGN_OR_RETURN(
      auto evaluator,
      MakeHeldOutEvaluator(
          std::make_shared<const TokenizedDataset>(std::move(data)),
          HeldOutOptions{.batch_size = f.batch_size, .exact_match = false, .tokenizer = nullptr}));
  ClassifierModel model(std::move(classifier));
  LoraModel* models[] = {&model};
  FEDLORA_ASSIGN_OR_RETURN(EvalFigures result, evaluator->Evaluate(models));
  std::cout << result.json << std::endl;
  return absl::OkStatus();
}

}  // namespace

int RunEval(int argc, char** argv) {
  const std::string command = argv[0];
  EvalFlags f;
  FlagSet flags(
      command,
      "Evaluates a model with a LoRA adapter; prints one JSON line. An encoder is scored on a\n"
      "labelled dataset (loss, accuracy, macro-F1); a decoder on JSONL conversations (response\n"
      "loss and perplexity, and with --exact-match the fraction of exact greedy completions).");
  flags.AddString("model", &f.model_dir, "base model: an encoder directory, or a decoder", true);
  flags.AddString("adapter", &f.adapter_dir,
                  "adapter directory (adapter_config.json, adapter_model.safetensors); decoders "
                  "without one are scored untuned");
  flags.AddString("data", &f.data_path, "data file (encoders: JSONL, CSV or TSV; decoders: JSONL)",
                  true);
  flags.AddString("chat-template", &f.data.chat_template,
                  "decoders: chatml, smollm2, qwen2 or llama3 instead of the model's template");
  flags.SetDefaultText("chat-template", "the adapter's fedlora_adapter.json, else the model's");
  AddEncoderDataFlags(flags, &f.fields);
  flags.AddString("prompt-field", &f.data.prompt_field, "decoders: JSONL field of the prompt");
  flags.AddString("response-field", &f.data.response_field,
                  "decoders: JSONL field of the response");
  flags.AddString("system", &f.data.system, "decoders: a system message before each prompt");
  flags.SetDefaultText("system", "the adapter's fedlora_adapter.json, else none");
  flags.AddBool("exact-match", &f.data.exact_match,
                "decoders: also score greedy generations against the responses");
  flags.AddInt("batch-size", &f.batch_size, "examples per forward pass");
  flags.SetDefaultText("batch-size", "32; decoders 8");
  flags.AddInt("max-seq-len", &f.max_seq_len,
               "tokens per example (decoders: the rendered conversation); longer texts are cut");
  flags.SetDefaultText("max-seq-len", "the adapter's fedlora_adapter.json (the run's), else 128");
  flags.AddInt("threads", &f.threads, "CPU threads (0: all cores)");
  flags.AddBool("bf16", &f.bf16, "hold the frozen base weights in bf16");
  flags.AddBool(
      "bf16-math", &f.bf16_math,
      "also multiply with them in bf16 on CUDA and where the CPU has AVX512_BF16 (implies --bf16)");
  flags.AddString(
      "device", &f.device,
      "cpu, cuda or auto (the GPU when one is usable); int8 math runs on the CPU: auto then takes "
      "it, cuda is refused");
  flags.AddBool("int8-math", &f.int8_math,
                "decoders: hold the frozen base as Q8_0 and run its forward products in int8 where "
                "the CPU has "
                "AVX512-VNNI (not with --bf16)");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (!flags.positional().empty())
    return UsageError(command, "unexpected argument '" + flags.positional()[0] + "'");
  // A decoder plans its activations for the whole batch: a smaller default.
  if (!flags.WasSet("batch-size") && IsDecoderCheckpoint(f.model_dir)) f.batch_size = 8;
  f.max_seq_len_given = flags.WasSet("max-seq-len");
  f.system_given = flags.WasSet("system");
  f.chat_template_given = flags.WasSet("chat-template");
  if (const std::string p =
          EncoderDataFlagsProblem(f.fields, flags, IsDecoderCheckpoint(f.model_dir));
      !p.empty()) {
    return UsageError(command, p);
  }
  if (f.batch_size < 1) return UsageError(command, "--batch-size must be >= 1");
  if (f.max_seq_len < 2) return UsageError(command, "--max-seq-len must be >= 2");
  if (f.threads < 0) return UsageError(command, "--threads must be >= 0");
  if (absl::Status s = Eval(f); !s.ok()) return Fail(command, s);
  return kExitOk;
}

}  // namespace fedlora::tools
