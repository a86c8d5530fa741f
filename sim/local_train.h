// The simulator's bridge to train/: loading and tokenizing the run's data, and evaluation, behind
// plain structs and forward declarations. Local training of a virtual client is the SDK's
// built-in trainer (client/lora/lora_trainer.h) on the client's subset of SimData::train.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fedlora/v1/config.pb.h"

namespace fedlora {

struct TokenizedDataset;  // train/trainer.h
struct TrainOptions;      // train/trainer.h
struct LmDataset;         // train/lm_data.h
struct DecoderTokenizer;  // model/decoder_tokenizer.h
class BertClassifier;     // model/bert.h
class CausalLm;           // model/decoder.h

namespace sim {

// The run's data, tokenized once and shared read-only by every virtual client and the evaluator.
// A SEQUENCE_CLASSIFICATION run fills train and eval, a CAUSAL_LM run lm_train, lm_eval and
// tokenizer.
struct SimData {
  bool causal_lm = false;
  std::shared_ptr<const TokenizedDataset> train;
  std::shared_ptr<const TokenizedDataset> eval;
  std::shared_ptr<const LmDataset> lm_train;
  std::shared_ptr<const LmDataset> lm_eval;
  std::shared_ptr<const DecoderTokenizer> tokenizer;
  bool exact_match = false;  // CAUSAL_LM: task.exact_match
  // Label of each training example, for partitioning (CAUSAL_LM: all 0, one pseudo-label).
  std::vector<int> train_labels;
  std::vector<std::string> label_names;  // class order (= config task.labels; CAUSAL_LM: none)
  // The partition key of each training example (simulation.partition_key_field), when BY_KEY.
  std::vector<std::string> train_keys;
  // Local training settings from config.training (the task's own fields override them per round).
  std::shared_ptr<const TrainOptions> train_options;
  int max_seq_len = 0;  // tokens per example after clamping to the model's positions

  int64_t train_size() const { return static_cast<int64_t>(train_labels.size()); }
  int64_t eval_size() const;
  // Labels the partitioner sees: label_names' count, at least 1.
  int num_partition_labels() const;
};

// Loads data.train_path and data.eval_path (both required). SEQUENCE_CLASSIFICATION: with the
// task's fields and labels, tokenized with the model directory's tokenizer (tokenizer.json, else
// vocab.txt). CAUSAL_LM: conversations (train/lm_data.h) with the task's fields, system prompt and
// chat template, tokenized with the decoder checkpoint's tokenizer.
absl::StatusOr<SimData> LoadSimData(const v1::RunConfig& config);

struct EvalFigures {
  int64_t count = 0;
  double loss = 0;
  double accuracy = 0;
  double macro_f1 = 0;
  double perplexity = std::nan("");  // CAUSAL_LM only
};

// Evaluates on data.eval, `batch_size` examples per forward pass. The batches are split into
// models.size() contiguous slices evaluated concurrently, one thread per model (the models must
// hold the same adapter); the slices' counts are merged in order, so the result depends only on
// the data, the adapter and the number of models.
absl::StatusOr<EvalFigures> EvaluateOnHeldOut(std::span<BertClassifier* const> models,
                                              const SimData& data, int batch_size);
// The same for a CAUSAL_LM run on data.lm_eval: loss and perplexity per response token, accuracy
// the exact-match rate when data.exact_match (else NaN), macro_f1 NaN.
absl::StatusOr<EvalFigures> EvaluateOnHeldOut(std::span<CausalLm* const> models,
                                              const SimData& data, int batch_size);

}  // namespace sim
}  // namespace fedlora
