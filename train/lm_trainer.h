// The causal-LM trainer and evaluator: fine-tunes a CausalLm's LoRA adapters on instruction data
// (train/lm_data.h) and measures response perplexity and, optionally, greedy-generation exact
// match (classification by generation: the response is a label).
//
//   LmTrainer trainer(*lm, options);            // TrainOptions as for the classifier
//   trainer.on_epoch = [](const LmEpochReport& r) { std::cout << r.ToJson() << "\n"; };
//   FEDLORA_RETURN_IF_ERROR(trainer.Train(train, &eval, eval_options));
//   FEDLORA_ASSIGN_OR_RETURN(LmEvalResult r, EvaluateLm(*lm, eval, eval_options));
//
// The steps are the classifier Trainer's (train/train_loop.h): same seeds, accumulation, FedProx,
// clipping and schedule; each micro-batch's loss is the mean over its response tokens.
// logit_adjustment is a classification option and is refused.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/bpe_tokenizer.h"
#include "model/decoder.h"
#include "train/lm_data.h"
#include "train/optim.h"
#include "train/trainer.h"

namespace fedlora {

struct LmEvalOptions {
  int batch_size = 8;  // examples per forward pass (clamped to the model's max_batch)
  // Also generate greedily from each prompt and compare the completion (decoded, surrounding
  // whitespace trimmed) with the response. Needs `tokenizer`.
  bool exact_match = false;
  const BpeTokenizer* tokenizer = nullptr;
  std::vector<int32_t> stop_ids;  // end-of-turn / end-of-sequence ids that end a generation
};

struct LmEvalResult {
  int64_t count = 0;        // examples
  int64_t tokens = 0;       // response tokens scored
  double loss = 0.0;        // mean negative log-likelihood per response token
  double perplexity = 0.0;  // exp(loss)
  bool has_exact_match = false;
  double exact_match = 0.0;  // fraction of examples whose completion equals the response

  // {"count":..,"tokens":..,"loss":..,"perplexity":..[,"exact_match":..]}
  std::string ToJson() const;
};

struct LmEpochReport {
  int epoch = 0;
  int64_t steps = 0;
  double train_loss = 0.0;  // mean over the epoch's examples of their micro-batch's mean loss
  double seconds = 0.0;
  bool has_eval = false;
  LmEvalResult eval;

  std::string ToJson() const;
};

class LmTrainer {
 public:
  LmTrainer(CausalLm& model, TrainOptions options);

  // InvalidArgument for bad options, logit_adjustment > 0, an empty training set, a batch or an
  // example longer than the model was planned for; FailedPrecondition on a non-finite loss.
  absl::Status Train(const LmDataset& train, const LmDataset* eval,
                     const LmEvalOptions& eval_options);

  std::function<void(const StepReport&)> on_step;
  std::function<void(const LmEpochReport&)> on_epoch;
  const std::vector<LmEpochReport>& history() const { return history_; }
  Optimizer* optimizer() { return optimizer_.get(); }

 private:
  CausalLm& model_;
  TrainOptions options_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<LmEpochReport> history_;
};

// Eval mode, in dataset order. InvalidArgument for an empty dataset, an example longer than the
// model's max_seq, or exact_match without a tokenizer.
absl::StatusOr<LmEvalResult> EvaluateLm(CausalLm& model, const LmDataset& data,
                                        const LmEvalOptions& options);

}  // namespace fedlora
