// The local trainer and evaluator: fine-tunes a BertClassifier's trainable parameters (LoRA
// matrices and the classifier) on a tokenized dataset, and measures loss / accuracy / macro-F1.
//
//   FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset train, TokenizeDataset(raw_train, tokenizer, 128));
//   TrainOptions opts;  opts.epochs = 3;  opts.seed = 7;
//   Trainer trainer(*model, opts);
//   trainer.on_epoch = [](const EpochReport& r) { std::cout << r.ToJson() << "\n"; };
//   FEDLORA_RETURN_IF_ERROR(trainer.Train(train, &eval));
//   FEDLORA_ASSIGN_OR_RETURN(EvalResult result, Evaluate(*model, eval, /*batch_size=*/32));
//
// One optimizer step = grad_accumulation micro-batches of batch_size examples: ZeroGrad, then
// ForwardBackward on each micro-batch (the model adds grads), grads scaled by 1/(micro-batches
// in the group), global-norm clipping, one optimizer step at the schedule's learning rate.
// Each epoch visits the training set in a fresh order drawn from the seeded RNG; a batch is
// padded to its longest sequence, not to max_seq_len.
//
// Reproducibility: the order of examples, the dropout masks (seeded per micro-batch from
// (seed, micro-batch index)) and the optimizer depend only on the options and the data, so the
// same seed, data, config and model give bit-identical parameters on the same backend and
// thread count (and on any thread count when the kernels are thread-count invariant).
//
// Not thread-safe: a Trainer drives one model from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/bert.h"
#include "model/tokenizer.h"
#include "train/dataset.h"
#include "train/metrics.h"
#include "train/optim.h"
#include "train/schedule.h"
#include "train/training_defaults.h"

namespace fedlora {

// One example after tokenization: unpadded ids (length <= max_seq_len, [CLS] ... [SEP]).
struct TokenizedExample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> token_type_ids;  // same length as input_ids
  int32_t label = 0;
};

struct TokenizedDataset {
  std::vector<TokenizedExample> examples;
  int num_labels = 0;                    // labels are in [0, num_labels)
  std::vector<std::string> label_names;  // num_labels names when known, else empty

  int64_t size() const { return static_cast<int64_t>(examples.size()); }
};

// Tokenizes every example once: [CLS] text [SEP] (pair [SEP]) cut to max_seq_len tokens (HF's
// longest_first truncation). Labels and label names are carried over. InvalidArgument when
// max_seq_len < 2.
absl::StatusOr<TokenizedDataset> TokenizeDataset(const Dataset& data,
                                                 const WordPieceTokenizer& tokenizer,
                                                 int max_seq_len);

// Pads examples[indices] to the longest of them: input ids with `pad_id`, token types with 0,
// attention mask 1 for tokens and 0 for padding; labels filled.
BertClassifier::Batch MakeBatch(const TokenizedDataset& data, std::span<const int64_t> indices,
                                int32_t pad_id);

struct TrainOptions {
  int epochs = kCentralizedEpochs;  // passes over the training set
  int64_t max_steps = 0;            // > 0: stop after this many optimizer steps (overrides epochs,
                                    // running more epochs if needed, as Hugging Face's Trainer)
  int batch_size = kDefaultBatchSize;  // examples per micro-batch
  // Examples per forward pass when evaluating (no grads kept).
  int eval_batch_size = kDefaultEvalBatchSize;
  // Tokens per sequence, [CLS] and [SEP] included (tokenizer side).
  int max_seq_len = kDefaultMaxSeqLen;
  // Peak learning rate; LoRA tolerates ~10x full fine-tuning's.
  float lr = static_cast<float>(kDefaultLearningRate);
  std::string optimizer = "adamw";  // adamw | lamb | sgd
  float weight_decay = 0.01f;
  float adam_beta1 = static_cast<float>(kDefaultAdamBeta1);  // AdamW / LAMB, in [0, 1)
  float adam_beta2 = static_cast<float>(kDefaultAdamBeta2);  // AdamW / LAMB, in [0, 1)
  float adam_epsilon = -1.0f;       // AdamW / LAMB denominator epsilon; < 0: the optimizer's own
                                    // default (AdamW 1e-8, LAMB 1e-6)
  float momentum = 0.0f;            // SGD momentum, in [0, 1)
  int64_t warmup_steps = 0;         // linear warmup from 0 over this many optimizer steps
  std::string schedule = "linear";  // constant | linear | cosine (see train/schedule.h)
  // Max global grad norm; <= 0 disables clipping.
  float grad_clip = static_cast<float>(kDefaultGradClipNorm);
  int grad_accumulation = kDefaultGradAccumulation;  // micro-batches per optimizer step
  uint64_t seed = 0;                                 // shuffling and dropout
  // Batch examples of similar length (Hugging Face's group_by_length): the shuffled epoch is cut
  // into chunks of 50 batches, each chunk sorted by length, and the batches' order shuffled. On
  // short-text corpora this removes most padding (fortunes: ~3x fewer tokens per epoch at 128).
  bool group_by_length = false;
  // Logit adjustment for label-skewed training data (balanced softmax; FedLC for federated label
  // skew): the training loss sees each logit plus logit_adjustment * log(prior of its class), the
  // prior being the training set's label frequencies with add-one smoothing. 0 (the default) is
  // plain cross-entropy; 1 is the usual strength. On a balanced training set it changes nothing.
  // Evaluation and inference never adjust. >= 0 and finite.
  float logit_adjustment = 0.0f;
  // FedProx (Li et al. 2020): the local loss gains (proximal_mu / 2) * ||w - w_start||^2 over the
  // trainable params, w_start being their values when Train starts (the global adapter a client
  // received), so each step's gradient gains proximal_mu * (w - w_start) before clipping. 0 (the
  // default) is none. >= 0 and finite.
  float proximal_mu = 0.0f;
  bool progress = true;  // per-epoch progress display (core/progress.h): a bar on a
                         // terminal, a log line every 10 s elsewhere

  // InvalidArgument naming the field for out-of-range values.
  absl::Status Validate() const;
};

// The order in which epoch `epoch` (1-based) visits the examples: a permutation of
// [0, data.size()) drawn from (options.seed, epoch); consecutive runs of options.batch_size form
// the micro-batches (the last may be shorter). Exposed for tests.
std::vector<int64_t> EpochOrder(const TokenizedDataset& data, const TrainOptions& options,
                                int epoch);

// The per-class logit offsets TrainOptions::logit_adjustment gives on `data`:
// tau * log((count_c + 1) / (size + num_labels)); empty when tau is 0. Exposed for tests.
std::vector<float> LogitAdjustmentOffsets(const TokenizedDataset& data, float tau);

struct StepReport {
  int64_t step = 0;  // 1-based optimizer step just taken
  int64_t total_steps = 0;
  int epoch = 0;           // 1-based
  float loss = 0.0f;       // mean micro-batch loss of this step
  float lr = 0.0f;         // learning rate used
  float grad_norm = 0.0f;  // global norm before clipping
  int64_t examples = 0;    // examples in this step's micro-batches (an epoch's last may be short)
};

using EvalResult = ClassificationMetrics;

struct EpochReport {
  int epoch = 0;            // 1-based
  int64_t steps = 0;        // optimizer steps taken so far in the run
  double train_loss = 0.0;  // mean over the epoch's examples (dropout on, weights moving)
  double seconds = 0.0;     // wall time of the epoch, evaluation excluded
  bool has_eval = false;
  EvalResult eval;  // valid when has_eval

  // {"epoch":..,"steps":..,"train_loss":..,"seconds":..[,"eval":{...}]}
  std::string ToJson() const;
};

class Trainer {
 public:
  // `model` must outlive the Trainer.
  Trainer(BertClassifier& model, TrainOptions options);

  // Trains on `train`, evaluating on `eval` (may be null) after each epoch. InvalidArgument for
  // bad options, an empty training set, labels outside the model's num_labels, or a batch or
  // sequence larger than the model was planned for; FailedPrecondition when the loss or the
  // gradient norm becomes non-finite (the message names the step: lower the learning rate).
  absl::Status Train(const TokenizedDataset& train, const TokenizedDataset* eval);

  // Called after every optimizer step and after every epoch (when set).
  std::function<void(const StepReport&)> on_step;
  std::function<void(const EpochReport&)> on_epoch;

  const std::vector<EpochReport>& history() const { return history_; }
  // The optimizer (null before Train); its state can be exported for a checkpoint.
  Optimizer* optimizer() { return optimizer_.get(); }
  // Optimizer steps per epoch for a training set of `n` examples under these options.
  int64_t StepsPerEpoch(int64_t n) const;

 private:
  BertClassifier& model_;
  TrainOptions options_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<EpochReport> history_;
};

// Eval mode (no dropout), in dataset order, `batch_size` examples per forward pass.
// InvalidArgument for an empty dataset, labels outside the model's num_labels, or a batch the
// model cannot take.
absl::StatusOr<EvalResult> Evaluate(BertClassifier& model, const TokenizedDataset& data,
                                    int batch_size);

}  // namespace fedlora
