// Classification metrics: mean cross-entropy loss, accuracy, macro-F1 and the confusion matrix,
// accumulated batch by batch from logits.
//
//   MetricsAccumulator acc(num_labels);
//   for (...) FEDLORA_RETURN_IF_ERROR(acc.AddLogits(logits, labels));
//   ClassificationMetrics m = acc.Result();   // m.loss, m.accuracy, m.macro_f1, m.confusion
//
// Macro-F1 matches scikit-learn's f1_score(y_true, y_pred, average="macro") with its defaults:
// the average runs over the classes that occur in the labels or in the predictions; a class in
// that set with no true positives (precision or recall 0/0) scores F1 = 0 (zero_division=0); a
// class that occurs in neither is left out of the average (its per-class F1 is reported as 0).
// The prediction is the arg-max logit, ties going to the lowest class index (numpy's argmax).
// Not thread-safe; use one accumulator per thread and Merge.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fedlora {

struct ClassificationMetrics {
  int64_t count = 0;                 // examples seen
  double loss = 0.0;                 // mean cross-entropy, nats per example
  double accuracy = 0.0;             // fraction of arg-max predictions equal to the label
  double macro_f1 = 0.0;             // see the header comment for the averaging rule
  std::vector<double> f1_per_class;  // num_classes entries
  std::vector<std::vector<int64_t>> confusion;  // confusion[true][predicted]

  // One JSON object: {"count":..,"loss":..,"accuracy":..,"macro_f1":..}.
  std::string ToJson() const;
};

class MetricsAccumulator {
 public:
  explicit MetricsAccumulator(int num_classes);

  int num_classes() const { return num_classes_; }

  // Adds labels.size() examples; `logits` is row-major [labels.size(), num_classes].
  // InvalidArgument (adding nothing) when the sizes disagree, a label is outside
  // [0, num_classes), or a logit is not finite.
  absl::Status AddLogits(std::span<const float> logits, std::span<const int32_t> labels);

  // Adds one example with a known prediction and per-example loss (nats).
  absl::Status AddPrediction(int32_t label, int32_t predicted, double loss);

  // Adds another accumulator's counts (same num_classes, else InvalidArgument).
  absl::Status Merge(const MetricsAccumulator& other);

  ClassificationMetrics Result() const;

 private:
  int num_classes_;
  int64_t count_ = 0;
  double loss_sum_ = 0.0;
  std::vector<int64_t> confusion_;  // row-major [true][predicted]
};

// Macro-F1 of a confusion matrix (confusion[true][predicted]) under the rule in the header
// comment. Fills `per_class` (when not null) with each class's F1.
double MacroF1(const std::vector<std::vector<int64_t>>& confusion,
               std::vector<double>* per_class = nullptr);

}  // namespace fedlora
