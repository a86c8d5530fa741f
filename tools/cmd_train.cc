// fedlora train: central (non-federated) LoRA fine-tuning of a model on one dataset.
//
//   fedlora train --model models/all-MiniLM-L6-v2 --train data/fortunes/train.jsonl
//       --eval data/fortunes/test.jsonl --out runs/central --epochs 3 --group-by-length
//
// The model and the data come from workload/factory.h LoadWorkload (the flags as a run config,
// tools/common.h CommandRunConfig); the loop is the family's own (train/trainer.h for a
// classifier, train/lm_trainer.h for a decoder). Writes into --out: the adapter directory of
// model/adapter_dir.h (PEFT's adapter_config.json and adapter_model.safetensors; for a classifier
// labels.json with the label order it was trained with, for a decoder task_type CAUSAL_LM; and
// fedlora_adapter.json with max_seq_len, and a decoder's system prompt and chat template:
// `fedlora eval` reads them back) and metrics.json (options, per-epoch metrics, final evaluation).
// Prints one JSON line per epoch on stdout; the progress display and human-readable lines go to
// stderr.
#include <algorithm>
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
#include "kernels/base/context.h"
#include "kernels/gemm.h"
#include "kernels/threads.h"
#include "model/adapter_dir.h"
#include "model/bert.h"
#include "model/decoder.h"
#include "tools/common.h"
#include "train/lm_data.h"
#include "train/lm_trainer.h"
#include "train/trainer.h"
#include "train/training_defaults.h"
#include "workload/factory.h"

namespace fedlora::tools {
namespace {

struct TrainFlags {
  std::string model_dir, train_path, eval_path, out_dir;
  TrainOptions train;
  int rank = kDefaultLoraRank;
  float alpha = static_cast<float>(kDefaultLoraAlpha);
  float lora_dropout = 0.0f;
  bool freeze_a = false;  // FFA-LoRA (lora.freeze_a)
  std::string targets;    // "": the family's default (query,value; all seven decoder projections)
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

nlohmann::json LmMetricsJson(const LmEvalResult& r) {
  nlohmann::json j = {
      {"count", r.count}, {"tokens", r.tokens}, {"loss", r.loss}, {"perplexity", r.perplexity}};
  if (r.has_exact_match) j["exact_match"] = r.exact_match;
  return j;
}

// What metrics.json records of every run: the paths, the options, the precision, the threads.
nlohmann::json RunJson(const TrainFlags& f, const std::vector<std::string>& targets,
                       Device device) {
  nlohmann::json metrics;
  metrics["model"] = f.model_dir;
  metrics["train"] = f.train_path;
  metrics["eval"] = f.eval_path;
  metrics["options"] = TrainOptionsJson(f.train);
  metrics["options"]["rank"] = f.rank;
  metrics["options"]["alpha"] = f.alpha;
  metrics["options"]["lora_dropout"] = f.lora_dropout;
  metrics["options"]["freeze_a"] = f.freeze_a;
  metrics["options"]["targets"] = targets;
  metrics["options"]["bf16"] = f.bf16 || f.bf16_math;
  metrics["options"]["bf16_math"] = f.bf16_math;
  metrics["options"]["bf16_math_active"] =
      f.bf16_math && (device == Device::kCuda || kernels::Bf16MathAvailable());
  return metrics;
}

// A classifier on labelled examples: train/trainer.h's loop, scored after every epoch.
absl::Status TrainClassifier(const TrainFlags& f, const Workload& w, BertClassifier& model,
                             Device device) {
  const TokenizedDataset& train = *w.train.examples;
  const TokenizedDataset* eval = w.eval.size() > 0 ? w.eval.examples.get() : nullptr;
  int64_t trainable = 0;
  for (const Param& p : model.trainable_params()) trainable += p.numel();
  FEDLORA_SAY(
      "fedlora train: %lld train / %lld eval examples, %zu labels, %lld trainable params, "
      "%d threads, device %s\n",
      static_cast<long long>(train.size()), static_cast<long long>(w.eval.size()),
      w.label_names.size(), static_cast<long long>(trainable), kernels::NumThreads(),
      std::string(DeviceName(device)).c_str());

  Trainer trainer(model, f.train);
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
  FEDLORA_RETURN_IF_ERROR(trainer.Train(train, eval));

  FEDLORA_RETURN_IF_ERROR(SaveAdapterDirectory(model,
                                               {.task = AdapterTask::kSequenceClassification,
                                                .base_model = f.model_dir,
                                                .label_names = w.label_names,
                                                .max_seq_len = f.train.max_seq_len},
                                               f.out_dir));
  nlohmann::json metrics = RunJson(f, model.options().lora.target_modules, device);
  metrics["label_names"] = w.label_names;
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
  return WriteFileAtomically(f.out_dir + "/metrics.json", metrics.dump(2) + "\n");
}

// A decoder on conversations: train/lm_trainer.h's loop, scored after every epoch in batches of
// at most the training batch (the activations are planned for it).
absl::Status TrainCausalLm(const TrainFlags& f, const Workload& w, CausalLm& lm, Device device) {
  const LmDataset& train = *w.train.conversations;
  const LmDataset* eval = w.eval.size() > 0 ? w.eval.conversations.get() : nullptr;
  int64_t trainable = 0, train_tokens = 0;
  for (const Param& p : lm.trainable_params()) trainable += p.numel();
  for (const LmExample& e : train.examples) train_tokens += e.targets();
  FEDLORA_SAY(
      "fedlora train: decoder %s (%s), %lld train / %lld eval conversations, %lld response "
      "tokens, %lld trainable params, %d threads\n",
      f.model_dir.c_str(), lm.base()->storage_summary().c_str(),
      static_cast<long long>(train.size()), static_cast<long long>(w.eval.size()),
      static_cast<long long>(train_tokens), static_cast<long long>(trainable),
      kernels::NumThreads());

  const DecoderTokenizer& tok = *w.chat_tokenizer;
  LmEvalOptions eval_options{.batch_size = std::min(f.train.eval_batch_size, f.train.batch_size),
                             .exact_match = f.data.exact_match,
                             .tokenizer = tok.tokenizer.get(),
                             .stop_ids = tok.stop_ids()};
  LmTrainer trainer(lm, f.train);
  trainer.on_epoch = [](const LmEpochReport& r) {
    std::string line =
        absl::StrFormat("epoch %d: train loss %.4f (%.1f s)", r.epoch, r.train_loss, r.seconds);
    if (r.has_eval) {
      absl::StrAppend(&line, absl::StrFormat(", eval loss %.4f perplexity %.3f", r.eval.loss,
                                             r.eval.perplexity));
      if (r.eval.has_exact_match)
        absl::StrAppend(&line, absl::StrFormat(" exact match %.4f", r.eval.exact_match));
    }
    FEDLORA_SAY("%s", line);
    std::cout << r.ToJson() << std::endl;
  };
  FEDLORA_RETURN_IF_ERROR(trainer.Train(train, eval, eval_options));
  FEDLORA_RETURN_IF_ERROR(SaveAdapterDirectory(lm,
                                               {.task = AdapterTask::kCausalLm,
                                                .base_model = f.model_dir,
                                                .max_seq_len = f.train.max_seq_len,
                                                .system_prompt = f.data.system,
                                                .chat_template = w.chat_template_name()},
                                               f.out_dir));

  nlohmann::json metrics = RunJson(f, lm.options().lora.target_modules, device);
  metrics["task"] = "causal_lm";
  metrics["options"]["int8_math"] = f.int8_math;
  metrics["options"]["int8_math_active"] = f.int8_math && kernels::Int8MathAvailable();
  metrics["options"]["chat_template"] = w.chat_template_name();
  metrics["options"]["system"] = f.data.system;
  metrics["options"]["threads"] = kernels::NumThreads();
  nlohmann::json epochs = nlohmann::json::array();
  for (const LmEpochReport& r : trainer.history()) {
    nlohmann::json e = {{"epoch", r.epoch},
                        {"steps", r.steps},
                        {"train_loss", r.train_loss},
                        {"seconds", r.seconds}};
    if (r.has_eval) e["eval"] = LmMetricsJson(r.eval);
    epochs.push_back(e);
  }
  metrics["epochs"] = epochs;
  if (!trainer.history().empty() && trainer.history().back().has_eval) {
    metrics["final_eval"] = LmMetricsJson(trainer.history().back().eval);
  }
  return WriteFileAtomically(f.out_dir + "/metrics.json", metrics.dump(2) + "\n");
}

// The flags as the run config LoadWorkload reads (tools/common.h CommandRunConfig).
v1::RunConfig TrainRunConfig(const TrainFlags& f, bool decoder) {
  v1::RunConfig config = CommandRunConfig(
      f.model_dir, decoder, f.train.max_seq_len,
      {.bf16 = f.bf16, .bf16_math = f.bf16_math, .int8_math = f.int8_math}, f.data, f.fields);
  config.set_seed(f.train.seed);
  v1::LoraConfig& lora = *config.mutable_lora();
  lora.set_rank(static_cast<uint32_t>(f.rank));
  lora.set_alpha(f.alpha);
  lora.set_dropout(f.lora_dropout);
  lora.set_freeze_a(f.freeze_a);
  for (const std::string& t : SplitList(f.targets)) lora.add_target_modules(t);
  // A classifier is planned for the larger of the two batches, a decoder for the training batch.
  config.mutable_training()->set_batch_size(static_cast<uint32_t>(f.train.batch_size));
  config.mutable_data()->set_eval_batch_size(static_cast<uint32_t>(f.train.eval_batch_size));
  return config;
}

absl::Status Train(TrainFlags f) {
  FEDLORA_ASSIGN_OR_RETURN(const Device resolved, ResolveDevice(f.device));
  // An encoder refuses --int8-math and --exact-match below, with its own message.
  const bool decoder = IsDecoderCheckpoint(f.model_dir);
  FEDLORA_ASSIGN_OR_RETURN(const Device device,
                           DeviceForRun(f.device, resolved, CpuOnlyWork(decoder && f.int8_math)));
  if (!decoder) {
    if (f.data.exact_match || f.recompute || !f.data.chat_template.empty() ||
        !f.data.system.empty() || f.int8_math) {
      return absl::InvalidArgumentError(
          "--exact-match, --recompute, --chat-template, --system and --int8-math apply to decoder "
          "models only");
    }
    if (!IsDirectory(f.model_dir))
      return absl::NotFoundError(absl::StrCat("model directory ", f.model_dir, " not found"));
  }
  if (!IsRegularFile(f.train_path))
    return absl::NotFoundError(absl::StrCat("training data ", f.train_path, " not found"));
  if (!f.eval_path.empty() && !IsRegularFile(f.eval_path)) {
    return absl::NotFoundError(absl::StrCat("eval data ", f.eval_path, " not found"));
  }
  FEDLORA_RETURN_IF_ERROR(
      CheckPrecisionFlags({.bf16 = f.bf16, .bf16_math = f.bf16_math, .int8_math = f.int8_math}));
  kernels::SetNumThreads(f.threads);
  // Fail before hours of training rather than at the end: the output directory must be writable,
  // and not a directory of other files (the adapter replaces it whole).
  FEDLORA_RETURN_IF_ERROR(CheckAdapterDirectoryTarget(f.out_dir));
  FEDLORA_ASSIGN_OR_RETURN(
      Workload w, LoadWorkload(TrainRunConfig(f, decoder), {.model_path = f.model_dir,
                                                            .train_path = f.train_path,
                                                            .eval_path = f.eval_path,
                                                            .device = device,
                                                            .role = ModelRole::kTrainAndEvaluate,
                                                            .bf16_weights = f.bf16,
                                                            .recompute = f.recompute}));
  std::error_code ec;
  std::filesystem::create_directories(f.out_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create output directory ", f.out_dir, ": ", ec.message()));
  }
  f.train.max_seq_len = w.max_seq_len;  // clamped to the checkpoint's positions
  LoraModel& model = *w.models[0];
  if (model.kind() == v1::TaskConfig::CAUSAL_LM) {
    FEDLORA_RETURN_IF_ERROR(
        TrainCausalLm(f, w, static_cast<CausalLmModel&>(model).model(), device));
  } else {
    FEDLORA_RETURN_IF_ERROR(
        TrainClassifier(f, w, static_cast<ClassifierModel&>(model).model(), device));
  }
  FEDLORA_SAY("fedlora train: adapter written to %s\n", f.out_dir.c_str());
  return absl::OkStatus();
}

// The training options' flags (training.* in a run config).
void AddTrainingFlags(FlagSet& flags, TrainFlags* f) {
  flags.AddInt("epochs", &f->train.epochs, "passes over the training data");
  flags.AddInt("max-steps", &f->train.max_steps,
               "stop after this many optimizer steps (0: run all epochs)");
  flags.AddInt("batch-size", &f->train.batch_size, "examples per micro-batch");
  flags.AddInt("grad-accumulation", &f->train.grad_accumulation,
               "micro-batches per optimizer step");
  flags.AddInt(
      "max-seq-len", &f->train.max_seq_len,
      "tokens per example ([CLS]/[SEP] included; decoders: the rendered conversation); longer "
      "texts are cut (a decoder prompt loses its middle, so that the response stays whole)");
  // TrainOptions' own default is the run config's (5e-4), for a round's local training.
  f->train.lr = static_cast<float>(kCentralizedLearningRate);
  flags.AddFloat("lr", &f->train.lr, "peak learning rate (the best measured: docs/results.md)");
  flags.AddChoice("optimizer", &f->train.optimizer, {"adamw", "lamb", "sgd"},
                  "optimizer (training.optimizer)");
  flags.AddFloat("weight-decay", &f->train.weight_decay,
                 "decoupled weight decay (not on 1-D params)");
  flags.AddInt("warmup-steps", &f->train.warmup_steps, "linear learning-rate warmup steps");
  flags.AddChoice("schedule", &f->train.schedule, {"constant", "linear", "cosine"},
                  "learning-rate schedule (training.schedule)");
  flags.AddFloat("grad-clip", &f->train.grad_clip, "max global gradient norm (0: no clipping)");
  flags.AddFloat("momentum", &f->train.momentum, "SGD momentum, in [0, 1)");
  flags.AddFloat("logit-adjustment", &f->train.logit_adjustment,
                 "logit adjustment strength for skewed labels (0: off, 1: balanced softmax)");
}

// The flags of the LoRA shape, precision and device, batching, and the data's fields.
void AddModelAndDataFlags(FlagSet& flags, TrainFlags* f) {
  flags.AddInt("rank", &f->rank, "LoRA rank r");
  flags.AddFloat("alpha", &f->alpha, "LoRA alpha (updates are scaled by alpha / r)");
  flags.AddFloat("lora-dropout", &f->lora_dropout, "dropout on the LoRA input");
  flags.AddBool("freeze-a", &f->freeze_a,
                "FFA-LoRA: keep every lora_A at its seeded initialisation, train lora_B and the "
                "head only (lora.freeze_a)");
  flags.AddString("targets", &f->targets,
                  "LoRA target modules: encoders query,key,value,attn_out,intermediate,output; "
                  "decoders q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
  flags.SetDefaultText("targets", "encoders query,value; decoders all seven");
  flags.AddUint("seed", &f->train.seed, "seed for initialisation, shuffling and dropout");
  flags.AddInt("threads", &f->threads, "CPU threads (0: all cores)");
  flags.AddBool("bf16", &f->bf16, "hold the frozen base weights in bf16 (half the memory)");
  flags.AddBool("bf16-math", &f->bf16_math,
                "also multiply with them in bf16, fp32 accumulation, on CUDA and where the CPU has "
                "AVX512_BF16 (implies --bf16)");
  flags.AddString(
      "device", &f->device,
      "cpu, cuda or auto (the GPU when one is usable); int8 math runs on the CPU: auto then takes "
      "it, cuda is refused");
  flags.AddBool("int8-math", &f->int8_math,
                "decoders: hold the frozen base as Q8_0 and run its forward products in int8 where "
                "the CPU has "
                "AVX512-VNNI (not with --bf16)");
  flags.AddBool("group-by-length", &f->train.group_by_length,
                "batch examples of similar length together (less padding, faster epochs)");
  flags.AddBool("progress", &f->train.progress, "show per-epoch progress on stderr");
  flags.AddInt("eval-batch-size", &f->train.eval_batch_size,
               "examples per forward pass when evaluating (decoders: at most --batch-size)");
  flags.AddString("chat-template", &f->data.chat_template,
                  "decoders: chatml, smollm2, qwen2 or llama3 instead of the model's template");
  AddEncoderDataFlags(flags, &f->fields);
  flags.AddString("prompt-field", &f->data.prompt_field, "decoders: JSONL field of the prompt");
  flags.AddString("response-field", &f->data.response_field,
                  "decoders: JSONL field of the response (a label works: classification by "
                  "generation)");
  flags.AddString("system", &f->data.system, "decoders: a system message before each prompt");
  flags.AddBool("exact-match", &f->data.exact_match,
                "decoders: also score greedy generations against the eval responses");
  flags.AddBool("recompute", &f->recompute,
                "decoders: keep only each layer's input and recompute it in the backward (less "
                "memory, one more forward)");
}

// What is wrong with the parsed flags, for a usage error; empty when nothing is.
std::string TrainFlagsProblem(const TrainFlags& f, const FlagSet& flags) {
  if (!flags.positional().empty()) return "unexpected argument '" + flags.positional()[0] + "'";
  if (absl::Status s = f.train.Validate(); !s.ok()) return std::string(s.message());
  if (f.threads < 0) return "--threads must be >= 0";
  if (flags.WasSet("targets") && SplitList(f.targets).empty()) return "--targets names no module";
  const bool decoder = IsDecoderCheckpoint(f.model_dir);
  for (const std::string& t : SplitList(f.targets)) {
    const absl::Status parsed =
        decoder ? ParseDecoderTarget(t).status() : ParseLoraTarget(t).status();
    if (!parsed.ok()) return std::string(parsed.message());
  }
  if (!decoder && (f.data.prompt_field != "prompt" || f.data.response_field != "response"))
    return "--prompt-field and --response-field apply to decoder models only";
  return EncoderDataFlagsProblem(f.fields, flags, decoder);
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
  AddTrainingFlags(flags, &f);
  AddModelAndDataFlags(flags, &f);
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  // A json log holds json only: the redrawn progress line is off unless asked for.
  if (GetLogFormat() == LogFormat::kJson && !flags.WasSet("progress")) f.train.progress = false;
  if (const std::string p = TrainFlagsProblem(f, flags); !p.empty()) return UsageError(command, p);
  if (absl::Status s = Train(f); !s.ok()) return Fail(command, s);
  return kExitOk;
}

}  // namespace fedlora::tools
