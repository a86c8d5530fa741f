// The held-out evaluator of a run, one per task kind: a classifier's loss, accuracy and macro-F1 on
// labelled examples, a decoder's response loss and perplexity (and the exact-match rate) on
// conversations. Used by `fedlora server` (each new global adapter), `fedlora simulate` (each
// round, over its whole model pool) and built by workload/factory.h.
//
//   std::unique_ptr<HeldOutEvaluator> e = MakeHeldOutEvaluator(eval_data, {.batch_size = 64});
//   FEDLORA_RETURN_IF_ERROR(LoadAdapter(adapter, *model));
//   LoraModel* models[] = {model.get()};
//   FEDLORA_ASSIGN_OR_RETURN(EvalFigures f, e->Evaluate(models));
//   std::map<std::string, double> metrics = e->Metrics(f);
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "model/decoder_tokenizer.h"
#include "workload/lora_model.h"

namespace fedlora {

struct EvalFigures {
  int64_t count = 0;
  double loss = 0;
  double accuracy = 0;               // CAUSAL_LM: the exact-match rate, NaN without exact_match
  double macro_f1 = 0;               // CAUSAL_LM: NaN
  double perplexity = std::nan("");  // CAUSAL_LM only
  std::string json;                  // the figures as train/'s result writes them (a log line)
};

struct HeldOutOptions {
  int batch_size = 64;  // examples per forward pass (clamped to the models' max_batch)
  // CAUSAL_LM: also generate greedily and score exact matches (task.exact_match); needs
  // `tokenizer`.
  bool exact_match = false;
  std::shared_ptr<const DecoderTokenizer> tokenizer;
  // The name Metrics gives a classifier's macro-F1: the simulator's round records say
  // "eval_macro_f1", the server's stored round metrics "macro_f1".
  std::string macro_f1_key = "eval_macro_f1";
};

class HeldOutEvaluator {
 public:
  virtual ~HeldOutEvaluator() = default;
  // Evaluates the adapter the models hold (every model the same one) on the held-out set. The
  // set is split into models.size() contiguous slices evaluated concurrently, one thread per
  // model; the slices' counts are merged in order, so the result depends only on the data, the
  // adapter and the number of models. InvalidArgument for no model, an empty set, or models of
  // another task kind.
  virtual absl::StatusOr<EvalFigures> Evaluate(std::span<LoraModel* const> models) const = 0;
  // The round metrics: eval_loss, eval_accuracy and macro-F1 (classifiers); eval_loss,
  // eval_perplexity and, with exact_match, eval_accuracy (decoders).
  virtual std::map<std::string, double> Metrics(const EvalFigures& figures) const = 0;
  // Examples in the held-out set.
  virtual int64_t size() const = 0;
};

// The evaluator of `eval`'s kind (examples: a classifier's; conversations: a decoder's).
// InvalidArgument when `eval` holds neither.
absl::StatusOr<std::unique_ptr<HeldOutEvaluator>> MakeHeldOutEvaluator(TaskData eval,
                                                                       HeldOutOptions options);

}  // namespace fedlora
