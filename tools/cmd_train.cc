// fedlora train: central (non-federated) LoRA fine-tuning of a model on one dataset.
//
//   fedlora train --model models/all-MiniLM-L6-v2 --train data/fortunes/train.jsonl
//       --eval data/fortunes/test.jsonl --out runs/central --epochs 3 --group-by-length
//
// Writes into --out: the adapter directory of model/adapter_dir.h (PEFT's adapter_config.json and
// adapter_model.safetensors, labels.json with the label order the classifier was trained with,
// fedlora_adapter.json with max_seq_len; `fedlora eval` reads them back) and metrics.json (options, per-epoch metrics, final evaluation). Prints one JSON line per
// epoch on stdout; the progress display and human-readable lines go to stderr.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file.h"
#include "core/status.h"
#include "kernels/context.h"
#include "kernels/gemm.h"
#include "model/adapter_dir.h"
#include "model/bert.h"
#include "model/decoder.h"
#include "tools/common.h"
#include "tools/decoder_commands.h"
#include "train/trainer.h"
#include "workload/factory.h"

namespace fedlora::tools {
namespace {

struct TrainFlags {
  std::string model_dir, train_path, eval_path, out_dir;
  TrainOptions train;
  int rank = 8;
  float alpha = 16.0f;
  float lora_dropout = 0.0f;
  std::string targets;  // "": the family's default (query,value; all seven decoder projections)
  int threads = 0;
  bool bf16 = false;
  bool bf16_math = false;      // implies bf16
  bool int8_math = false;      // decoders
  std::string device = "cpu";  // --device: cpu, cuda, auto
  bool recompute = false;
  DecoderDataFlags data;
  EncoderDataFlags fields;
};

nlohmann::json MetricsJson(const EvalResult& m) {
  return {{"count", m.count},
          {"loss", m.loss},
          {"accuracy", m.accuracy},
          {"macro_f1", m.macro_f1},
          {"f1_per_class", m.f1_per_class},
          {"confusion", m.confusion}};
}

absl::Status Train(TrainFlags f) {
  FEDLORA_ASSIGN_OR_RETURN(const Device resolved, ResolveDevice(f.device));
  // An encoder refuses --int8-math and --exact-match below, with its own message.
  const bool decoder = IsDecoderCheckpoint(f.model_dir);
  FEDLORA_ASSIGN_OR_RETURN(const Device device,
                           DeviceForRun(f.device, resolved, CpuOnlyWork(decoder && f.int8_math)));
  if (decoder) {
    return TrainDecoder({.model = f.model_dir,
                         .train_path = f.train_path,
                         .eval_path = f.eval_path,
                         .out_dir = f.out_dir,
                         .train = f.train,
                         .data = f.data,
                         .rank = f.rank,
                         .alpha = f.alpha,
                         .lora_dropout = f.lora_dropout,
                         .targets = f.targets,
                         .threads = f.threads,
                         .bf16 = f.bf16,
                         .bf16_math = f.bf16_math,
                         .int8_math = f.int8_math,
                         .recompute = f.recompute,
                         .device = device});
  }
  if (f.data.exact_match || f.recompute || !f.data.chat_template.empty() ||
      !f.data.system.empty() || f.int8_math) {
    return absl::InvalidArgumentError(
        "--exact-match, --recompute, --chat-template, --system and --int8-math apply to decoder "
        "models only");
  }
  if (f.targets.empty()) f.targets = "query,value";
  if (!IsDirectory(f.model_dir))
    return absl::NotFoundError(absl::StrCat("model directory ", f.model_dir, " not found"));
  if (!IsRegularFile(f.train_path))
    return absl::NotFoundError(absl::StrCat("training data ", f.train_path, " not found"));
  if (!f.eval_path.empty() && !IsRegularFile(f.eval_path)) {
    return absl::NotFoundError(absl::StrCat("eval data ", f.eval_path, " not found"));
  }
  kernels::SetNumThreads(f.threads);
  FEDLORA_ASSIGN_OR_RETURN(f.train.max_seq_len, EncoderMaxSeqLen(f.model_dir, f.train.max_seq_len));

  FEDLORA_ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizer(f.model_dir));
  std::vector<std::string> label_names;
  FEDLORA_ASSIGN_OR_RETURN(
      TokenizedDataset train,
      LoadTokenizedDataset(f.train_path, *tokenizer, f.train.max_seq_len, label_names, f.fields));
  TokenizedDataset eval;
  if (!f.eval_path.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(
        eval,
        LoadTokenizedDataset(f.eval_path, *tokenizer, f.train.max_seq_len, label_names, f.fields));
  }
  if (label_names.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.train_path, " has ", label_names.size(),
                     " distinct label(s); classification needs >= 2"));
  }

  ModelOptions options;
  options.num_labels = static_cast<int>(label_names.size());
  options.lora.rank = f.rank;
  options.lora.alpha = f.alpha;
  options.lora.dropout = f.lora_dropout;
  options.lora.target_modules = SplitList(f.targets);
  options.bf16_weights = f.bf16 || f.bf16_math;
  options.bf16_math = f.bf16_math;
  options.seed = f.train.seed;
  options.max_batch = std::max(f.train.batch_size, f.train.eval_batch_size);
  options.max_seq = f.train.max_seq_len;
  options.base_model_name = f.model_dir;
  options.device = device;
  FEDLORA_ASSIGN_OR_RETURN(auto model, BertClassifier::Load(f.model_dir, options));
  // Fail before hours of training rather than at the end: the output directory must be writable,
  // and not a directory of other files (the adapter replaces it whole).
  FEDLORA_RETURN_IF_ERROR(CheckAdapterDirectoryTarget(f.out_dir));
  std::error_code ec;
  std::filesystem::create_directories(f.out_dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create output directory ", f.out_dir, ": ", ec.message()));

  int64_t trainable = 0;
  for (const Param& p : model->trainable_params()) trainable += p.numel();
  FEDLORA_SAY(
      "fedlora train: %lld train / %lld eval examples, %zu labels, %lld trainable params, "
      "%d threads, device %s\n",
      static_cast<long long>(train.size()), static_cast<long long>(eval.size()), label_names.size(),
      static_cast<long long>(trainable), kernels::NumThreads(),
      std::string(DeviceName(device)).c_str());

  Trainer trainer(*model, f.train);
  trainer.on_epoch = [](const EpochReport& r) {
    std::string line =
        absl::StrFormat("epoch %d: train loss %.4f (%.1f s)", r.epoch, r.train_loss, r.seconds);
    if (r.has_eval) {
      absl::StrAppend(&line, absl::StrFormat(", eval loss %.4f accuracy %.4f macro-F1 %.4f",
                                             r.eval.loss, r.eval.accuracy, r.eval.macro_f1));
    }
    FEDLORA_SAY("%s", line);
    std::cout << r.ToJson() << std::endl;
  };
  FEDLORA_RETURN_IF_ERROR(trainer.Train(train, eval.size() > 0 ? &eval : nullptr));

  FEDLORA_RETURN_IF_ERROR(SaveAdapterDirectory(*model,
                                               {.task = AdapterTask::kSequenceClassification,
                                                .base_model = f.model_dir,
                                                .label_names = label_names,
                                                .max_seq_len = f.train.max_seq_len},
                                               f.out_dir));
  nlohmann::json metrics;
  metrics["model"] = f.model_dir;
  metrics["train"] = f.train_path;
  metrics["eval"] = f.eval_path;
  metrics["label_names"] = label_names;
  metrics["options"] = TrainOptionsJson(f.train);
  metrics["options"]["rank"] = f.rank;
  metrics["options"]["alpha"] = f.alpha;
  metrics["options"]["lora_dropout"] = f.lora_dropout;
  metrics["options"]["targets"] = SplitList(f.targets);
  metrics["options"]["bf16"] = f.bf16 || f.bf16_math;
  metrics["options"]["bf16_math"] = f.bf16_math;
  metrics["options"]["bf16_math_active"] =
      f.bf16_math && (device == Device::kCuda || kernels::Bf16MathAvailable());
  metrics["options"]["threads"] = kernels::NumThreads();
  metrics["options"]["device"] = std::string(DeviceName(device));
  metrics["openblas_core"] = kernels::OpenBlasCoreName();
  nlohmann::json epochs = nlohmann::json::array();
  for (const EpochReport& r : trainer.history()) {
    nlohmann::json e = {{"epoch", r.epoch},
                        {"steps", r.steps},
                        {"train_loss", r.train_loss},
                        {"seconds", r.seconds}};
    if (r.has_eval) e["eval"] = MetricsJson(r.eval);
    epochs.push_back(e);
  }
  metrics["epochs"] = epochs;
  if (!trainer.history().empty() && trainer.history().back().has_eval) {
    metrics["final_eval"] = MetricsJson(trainer.history().back().eval);
  }
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(f.out_dir + "/metrics.json", metrics.dump(2) + "\n"));
  FEDLORA_SAY("fedlora train: adapter written to %s\n", f.out_dir.c_str());
  return absl::OkStatus();
}

}  // namespace

int RunTrain(int argc, char** argv) {
  const std::string command = argv[0];
  TrainFlags f;
  FlagSet flags(
      command,
      "Fine-tunes LoRA adapters of a model, writing a PEFT adapter and metrics.json into --out.\n"
      "A BERT-family encoder (and its classifier) learns a labelled dataset (JSONL/CSV/TSV with\n"
      "text and label); a decoder (a .gguf file, or a LLaMA/Qwen2 directory) learns the responses\n"
      "of JSONL conversations ({\"prompt\", \"response\"} or {\"messages\": [...]}).");
  flags.AddString(
      "model", &f.model_dir,
      "encoder directory (config.json, model.safetensors, tokenizer.json or vocab.txt), "
      "or a decoder: a .gguf file or a directory with config.json and safetensors",
      true);
  flags.AddString("train", &f.train_path, "training data file", true);
  flags.AddString("eval", &f.eval_path, "evaluation data file, scored after every epoch");
  flags.AddString("out", &f.out_dir, "output directory for the adapter and metrics", true);
  flags.AddInt("epochs", &f.train.epochs, "passes over the training data");
  flags.AddInt("max-steps", &f.train.max_steps,
               "stop after this many optimizer steps (0: run all epochs)");
  flags.AddInt("batch-size", &f.train.batch_size, "examples per micro-batch");
  flags.AddInt("grad-accumulation", &f.train.grad_accumulation, "micro-batches per optimizer step");
  flags.AddInt(
      "max-seq-len", &f.train.max_seq_len,
      "tokens per example ([CLS]/[SEP] included; decoders: the rendered conversation); longer "
      "texts are cut (a decoder prompt loses its middle, so that the response stays whole)");
  // The best centralized learning rate measured, for MiniLM on fortunes and for SmolLM2 on
  // fortunes and WordNet (docs/results.md); TrainOptions' own default is 5e-4.
  f.train.lr = 2e-3f;
  flags.AddFloat("lr", &f.train.lr, "peak learning rate (the best measured: docs/results.md)");
  flags.AddChoice("optimizer", &f.train.optimizer, {"adamw", "lamb", "sgd"},
                  "optimizer (training.optimizer)");
  flags.AddFloat("weight-decay", &f.train.weight_decay,
                 "decoupled weight decay (not on 1-D params)");
  flags.AddInt("warmup-steps", &f.train.warmup_steps, "linear learning-rate warmup steps");
  flags.AddChoice("schedule", &f.train.schedule, {"constant", "linear", "cosine"},
                  "learning-rate schedule (training.schedule)");
  flags.AddFloat("grad-clip", &f.train.grad_clip, "max global gradient norm (0: no clipping)");
  flags.AddFloat("momentum", &f.train.momentum, "SGD momentum, in [0, 1)");
  flags.AddFloat("logit-adjustment", &f.train.logit_adjustment,
                 "logit adjustment strength for skewed labels (0: off, 1: balanced softmax)");
  flags.AddInt("rank", &f.rank, "LoRA rank r");
  flags.AddFloat("alpha", &f.alpha, "LoRA alpha (updates are scaled by alpha / r)");
  flags.AddFloat("lora-dropout", &f.lora_dropout, "dropout on the LoRA input");
  flags.AddString("targets", &f.targets,
                  "LoRA target modules: encoders query,key,value,attn_out,intermediate,output; "
                  "decoders q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
  flags.SetDefaultText("targets", "encoders query,value; decoders all seven");
  flags.AddUint("seed", &f.train.seed, "seed for initialisation, shuffling and dropout");
  flags.AddInt("threads", &f.threads, "CPU threads (0: all cores)");
  flags.AddBool("bf16", &f.bf16, "hold the frozen base weights in bf16 (half the memory)");
  flags.AddBool("bf16-math", &f.bf16_math,
                "also multiply with them in bf16, fp32 accumulation, on CUDA and where the CPU has "
                "AVX512_BF16 (implies --bf16)");
  flags.AddString(
      "device", &f.device,
      "cpu, cuda or auto (the GPU when one is usable); int8 math runs on the CPU: auto then takes "
      "it, cuda is refused");
  flags.AddBool("int8-math", &f.int8_math,
                "decoders: hold the frozen base as Q8_0 and run its forward products in int8 where "
                "the CPU has "
                "AVX512-VNNI (not with --bf16)");
  flags.AddBool("group-by-length", &f.train.group_by_length,
                "batch examples of similar length together (less padding, faster epochs)");
  flags.AddBool("progress", &f.train.progress, "show per-epoch progress on stderr");
  flags.AddInt("eval-batch-size", &f.train.eval_batch_size,
               "examples per forward pass when evaluating (decoders: at most --batch-size)");
  flags.AddString("chat-template", &f.data.chat_template,
                  "decoders: chatml, smollm2, qwen2 or llama3 instead of the model's template");
  AddEncoderDataFlags(flags, &f.fields);
  flags.AddString("prompt-field", &f.data.prompt_field, "decoders: JSONL field of the prompt");
  flags.AddString("response-field", &f.data.response_field,
                  "decoders: JSONL field of the response (a label works: classification by "
                  "generation)");
  flags.AddString("system", &f.data.system, "decoders: a system message before each prompt");
  flags.AddBool("exact-match", &f.data.exact_match,
                "decoders: also score greedy generations against the eval responses");
  flags.AddBool("recompute", &f.recompute,
                "decoders: keep only each layer's input and recompute it in the backward (less "
                "memory, one more forward)");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  // A json log holds json only: the redrawn progress line is off unless asked for.
  if (GetLogFormat() == LogFormat::kJson && !flags.WasSet("progress")) f.train.progress = false;
  if (!flags.positional().empty())
    return UsageError(command, "unexpected argument '" + flags.positional()[0] + "'");
  if (absl::Status s = f.train.Validate(); !s.ok())
    return UsageError(command, std::string(s.message()));
  if (f.threads < 0) return UsageError(command, "--threads must be >= 0");
  if (flags.WasSet("targets") && SplitList(f.targets).empty())
    return UsageError(command, "--targets names no module");
  const bool decoder = IsDecoderCheckpoint(f.model_dir);
  for (const std::string& t : SplitList(f.targets)) {
    const absl::Status parsed =
        decoder ? ParseDecoderTarget(t).status() : ParseLoraTarget(t).status();
    if (!parsed.ok()) return UsageError(command, std::string(parsed.message()));
  }
  if (!decoder && (f.data.prompt_field != "prompt" || f.data.response_field != "response"))
    return UsageError(command, "--prompt-field and --response-field apply to decoder models only");
  if (const std::string p = EncoderDataFlagsProblem(f.fields, flags, decoder); !p.empty()) {
    return UsageError(command, p);
  }
  if (absl::Status s = Train(f); !s.ok()) return Fail(command, s);
  return kExitOk;
}

}  // namespace fedlora::tools
