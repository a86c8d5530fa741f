// fedlora eval: scores a model with a LoRA adapter on a labelled dataset (encoders) or on
// conversations (decoders).
//
//   fedlora eval --model models/all-MiniLM-L6-v2 --adapter runs/central --data
//   data/fortunes/test.jsonl
//
// The adapter directory is what fedlora (train, simulate, server --out, export) or PEFT wrote:
// adapter_config.json gives the LoRA shape (r, lora_alpha, target_modules), the classifier's rows
// in adapter_model.safetensors the number of labels, and labels.json the label order: a
// classifier adapter without it is refused (the order is never guessed from the data).
// fedlora_adapter.json gives the defaults of --max-seq-len (and for decoders --system and
// --chat-template): the run's values; a flag that differs wins and is said on stderr. The model,
// the data and the evaluator come from workload/factory.h LoadWorkload (the flags as a run config,
// tools/common.h CommandRunConfig), as the server's and the simulator's do. Prints one JSON line
// on stdout: {"count":..,"loss":..,"accuracy":..,"macro_f1":..}, for a decoder
// {"count":..,"tokens":..,"loss":..,"perplexity":..[,"exact_match":..]}.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/base/context.h"
#include "kernels/threads.h"
#include "model/decoder.h"
#include "tools/common.h"
#include "train/training_defaults.h"
#include "workload/evaluator.h"
#include "workload/factory.h"

namespace fedlora::tools {
namespace {

struct EvalFlags {
  std::string model_dir, adapter_dir, data_path;
  DecoderDataFlags data;
  EncoderDataFlags fields;
  int batch_size = kDefaultEvalBatchSize;
  int max_seq_len = kDefaultMaxSeqLen;
  int threads = 0;
  bool bf16 = false;
  bool bf16_math = false;      // implies bf16
  bool int8_math = false;      // decoders
  std::string device = "cpu";  // --device: cpu, cuda, auto
  // Which of the settings an adapter records were given on the command line.
  bool max_seq_len_given = false, system_given = false, chat_template_given = false;
};

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
  if (!decoder) {
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
  }
  if (!f.adapter_dir.empty() && !IsDirectory(f.adapter_dir)) {
    return absl::NotFoundError(absl::StrCat("adapter directory ", f.adapter_dir, " not found"));
  }
  if (!IsRegularFile(f.data_path))
    return absl::NotFoundError(absl::StrCat("data file ", f.data_path, " not found"));
  const PrecisionFlags precision{
      .bf16 = f.bf16, .bf16_math = f.bf16_math, .int8_math = f.int8_math};
  FEDLORA_RETURN_IF_ERROR(CheckPrecisionFlags(precision));
  kernels::SetNumThreads(f.threads);
  // One model, planned for --batch-size examples per pass: the evaluator's batch (decoders plan
  // theirs by the training batch).
  v1::RunConfig config =
      CommandRunConfig(f.model_dir, decoder, f.max_seq_len, precision, f.data, f.fields);
  config.mutable_training()->set_batch_size(static_cast<uint32_t>(f.batch_size));
  config.mutable_data()->set_eval_batch_size(static_cast<uint32_t>(f.batch_size));
  FEDLORA_ASSIGN_OR_RETURN(Workload w, LoadWorkload(config, {.model_path = f.model_dir,
                                                             .eval_path = f.data_path,
                                                             .device = device,
                                                             .role = ModelRole::kEvaluate,
                                                             .adapter_path = f.adapter_dir,
                                                             .bf16_weights = f.bf16}));
  // The held-out evaluator of the server and the simulator (workload/evaluator.h), on one model.
  LoraModel* models[] = {w.models[0].get()};
  FEDLORA_ASSIGN_OR_RETURN(EvalFigures result, w.evaluator->Evaluate(models));
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
