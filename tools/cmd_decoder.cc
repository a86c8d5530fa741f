// Decoder fine-tuning and evaluation behind `fedlora train` / `fedlora eval`.
//
// train writes into --out: the adapter directory of model/adapter_dir.h (PEFT's files, task_type
// CAUSAL_LM, and fedlora_adapter.json with max_seq_len, the system prompt and the chat template)
// and metrics.json (options,
// per-epoch metrics, the final evaluation); one JSON line per epoch goes to stdout.
// eval prints {"count":..,"tokens":..,"loss":..,"perplexity":..[,"exact_match":..]}.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file.h"
#include "core/status.h"
#include "kernels/context.h"
#include "kernels/gemm.h"
#include "model/adapter_dir.h"
#include "model/decoder.h"
#include "model/decoder_tokenizer.h"
#include "model/peft.h"
#include "tools/common.h"
#include "tools/decoder_commands.h"
#include "train/lm_data.h"
#include "train/lm_trainer.h"
#include "workload/evaluator.h"

namespace fedlora::tools {
namespace {

nlohmann::json LmMetricsJson(const LmEvalResult& r) {
  nlohmann::json j = {
      {"count", r.count}, {"tokens", r.tokens}, {"loss", r.loss}, {"perplexity", r.perplexity}};
  if (r.has_exact_match) j["exact_match"] = r.exact_match;
  return j;
}

absl::Status CheckMathFlags(bool bf16, bool bf16_math, bool int8_math) {
  if (int8_math && (bf16 || bf16_math)) {
    return absl::InvalidArgumentError(
        "--int8-math holds the base as Q8_0: not with --bf16 or --bf16-math");
  }
  return absl::OkStatus();
}

LmDataOptions DataOptions(const DecoderDataFlags& d, int max_seq_len) {
  LmDataOptions o;
  o.prompt_field = d.prompt_field;
  o.response_field = d.response_field;
  o.system = d.system;
  o.max_seq_len = max_seq_len;
  return o;
}

}  // namespace

absl::Status TrainDecoder(DecoderTrainFlags f) {
  if (!IsRegularFile(f.train_path))
    return absl::NotFoundError(absl::StrCat("training data ", f.train_path, " not found"));
  if (!f.eval_path.empty() && !IsRegularFile(f.eval_path))
    return absl::NotFoundError(absl::StrCat("eval data ", f.eval_path, " not found"));
  kernels::SetNumThreads(f.threads);
  FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer tok, LoadChatTokenizer(f.model, f.data.chat_template));
  const LmDataOptions data_options = DataOptions(f.data, f.train.max_seq_len);
  FEDLORA_ASSIGN_OR_RETURN(LmDataset train, LoadLmDataset(f.train_path, tok, data_options));
  LmDataset eval;
  if (!f.eval_path.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(eval, LoadLmDataset(f.eval_path, tok, data_options));
  }

  DecoderOptions options;
  options.lora.rank = f.rank;
  options.lora.alpha = f.alpha;
  options.lora.dropout = f.lora_dropout;
  if (!f.targets.empty()) options.lora.target_modules = SplitList(f.targets);
  FEDLORA_RETURN_IF_ERROR(CheckMathFlags(f.bf16, f.bf16_math, f.int8_math));
  options.weights = f.int8_math             ? WeightStorage::kQ8_0
                    : f.bf16 || f.bf16_math ? WeightStorage::kBF16
                                            : WeightStorage::kAsStored;
  options.bf16_math = f.bf16_math;
  options.int8_math = f.int8_math;
  options.seed = f.train.seed;
  // Evaluation runs in batches of at most the training batch: a decoder's activations are
  // planned for max_batch x max_seq tokens, and a second, larger plan would only cost memory.
  options.max_batch = f.train.batch_size;
  options.max_seq = f.train.max_seq_len;
  options.recompute_activations = f.recompute;
  options.base_model_name = f.model;
  options.device = f.device;
  FEDLORA_RETURN_IF_ERROR(CheckAdapterDirectoryTarget(f.out_dir));
  FEDLORA_ASSIGN_OR_RETURN(auto lm, CausalLm::Load(f.model, options));
  std::error_code ec;
  std::filesystem::create_directories(f.out_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create output directory ", f.out_dir, ": ", ec.message()));
  }
  int64_t trainable = 0, train_tokens = 0;
  for (const Param& p : lm->trainable_params()) trainable += p.numel();
  for (const LmExample& e : train.examples) train_tokens += e.targets();
  FEDLORA_SAY(
      "fedlora train: decoder %s (%s), %lld train / %lld eval conversations, %lld response "
      "tokens, %lld trainable params, %d threads\n",
      f.model.c_str(), lm->base()->storage_summary().c_str(), static_cast<long long>(train.size()),
      static_cast<long long>(eval.size()), static_cast<long long>(train_tokens),
      static_cast<long long>(trainable), kernels::NumThreads());

  LmEvalOptions eval_options{.batch_size = std::min(f.train.eval_batch_size, f.train.batch_size),
                             .exact_match = f.data.exact_match,
                             .tokenizer = tok.tokenizer.get(),
                             .stop_ids = tok.stop_ids()};
  LmTrainer trainer(*lm, f.train);
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
  FEDLORA_RETURN_IF_ERROR(trainer.Train(train, eval.size() > 0 ? &eval : nullptr, eval_options));
  FEDLORA_RETURN_IF_ERROR(SaveAdapterDirectory(*lm,
                                               {.task = AdapterTask::kCausalLm,
                                                .base_model = f.model,
                                                .max_seq_len = f.train.max_seq_len,
                                                .system_prompt = f.data.system,
                                                .chat_template = std::string(tok.chat->name())},
                                               f.out_dir));

  nlohmann::json metrics;
  metrics["model"] = f.model;
  metrics["task"] = "causal_lm";
  metrics["train"] = f.train_path;
  metrics["eval"] = f.eval_path;
  metrics["options"] = TrainOptionsJson(f.train);
  metrics["options"]["rank"] = f.rank;
  metrics["options"]["alpha"] = f.alpha;
  metrics["options"]["lora_dropout"] = f.lora_dropout;
  metrics["options"]["targets"] = lm->options().lora.target_modules;
  metrics["options"]["bf16"] = f.bf16 || f.bf16_math;
  metrics["options"]["bf16_math"] = f.bf16_math;
  metrics["options"]["bf16_math_active"] =
      f.bf16_math && (f.device == Device::kCuda || kernels::Bf16MathAvailable());
  metrics["options"]["int8_math"] = f.int8_math;
  metrics["options"]["int8_math_active"] = f.int8_math && kernels::Int8MathAvailable();
  metrics["options"]["chat_template"] = std::string(tok.chat->name());
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
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(f.out_dir + "/metrics.json", metrics.dump(2) + "\n"));
  FEDLORA_SAY("fedlora train: adapter written to %s\n", f.out_dir.c_str());
  return absl::OkStatus();
}

absl::Status EvalDecoder(const DecoderEvalFlags& f) {
  if (!f.adapter.empty() && !IsDirectory(f.adapter))
    return absl::NotFoundError(absl::StrCat("adapter directory ", f.adapter, " not found"));
  if (!IsRegularFile(f.data_path))
    return absl::NotFoundError(absl::StrCat("data file ", f.data_path, " not found"));
  kernels::SetNumThreads(f.threads);
  FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer tok, LoadChatTokenizer(f.model, f.data.chat_template));
  FEDLORA_ASSIGN_OR_RETURN(LmDataset data,
                           LoadLmDataset(f.data_path, tok, DataOptions(f.data, f.max_seq_len)));
  DecoderOptions options;
  if (!f.adapter.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(options.lora, ReadPeftLoraOptions(f.adapter));
  }
  FEDLORA_RETURN_IF_ERROR(CheckMathFlags(f.bf16, f.bf16_math, f.int8_math));
  options.weights = f.int8_math             ? WeightStorage::kQ8_0
                    : f.bf16 || f.bf16_math ? WeightStorage::kBF16
                                            : WeightStorage::kAsStored;
  options.bf16_math = f.bf16_math;
  options.int8_math = f.int8_math;
  options.max_batch = f.batch_size;
  options.max_seq = f.max_seq_len;
  options.base_model_name = f.model;
  options.device = f.device;
  FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<CausalLm> lm, CausalLm::Load(f.model, options));
  if (!f.adapter.empty()) FEDLORA_RETURN_IF_ERROR(LoadPeftAdapter(f.adapter, lm.get()));
  // The held-out evaluator of the server and the simulator (workload/evaluator.h), on one model.
  FEDLORA_ASSIGN_OR_RETURN(
      auto evaluator, MakeHeldOutEvaluator(
                          std::make_shared<const LmDataset>(std::move(data)),
                          {.batch_size = f.batch_size,
                           .exact_match = f.data.exact_match,
                           .tokenizer = std::make_shared<const DecoderTokenizer>(std::move(tok))}));
  CausalLmModel model(std::move(lm));
  LoraModel* models[] = {&model};
  FEDLORA_ASSIGN_OR_RETURN(EvalFigures result, evaluator->Evaluate(models));
  std::cout << result.json << std::endl;
  return absl::OkStatus();
}

}  // namespace fedlora::tools
