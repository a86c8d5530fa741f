#include "train/metrics.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fedlora {

std::string ClassificationMetrics::ToJson() const {
  // %.17g round-trips a double; NaN/Inf are not JSON, so they are written as null.
  auto num = [](double x) {
    return std::isfinite(x) ? absl::StrFormat("%.17g", x) : std::string("null");
  };
  return absl::StrCat("{\"count\":", count, ",\"loss\":", num(loss),
                      ",\"accuracy\":", num(accuracy), ",\"macro_f1\":", num(macro_f1), "}");
}

MetricsAccumulator::MetricsAccumulator(int num_classes)
    : num_classes_(num_classes < 0 ? 0 : num_classes),
      confusion_(static_cast<size_t>(num_classes_) * num_classes_, 0) {}

absl::Status MetricsAccumulator::AddLogits(std::span<const float> logits,
                                           std::span<const int32_t> labels) {
  const size_t c = static_cast<size_t>(num_classes_);
  if (c == 0) return absl::InvalidArgumentError("metrics: no classes");
  if (logits.size() != labels.size() * c) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: ", logits.size(), " logits for ",
                                                   labels.size(), " labels and ", c, " classes"));
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= num_classes_) {
      return absl::InvalidArgumentError(absl::StrCat("metrics: label ", labels[i], " at row ", i,
                                                     " outside [0, ", num_classes_, ")"));
    }
    for (size_t j = 0; j < c; ++j) {
      if (!std::isfinite(logits[i * c + j])) {
        return absl::InvalidArgumentError(
            absl::StrCat("metrics: non-finite logit at row ", i, " class ", j));
      }
    }
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    const float* row = logits.data() + i * c;
    size_t best = 0;
    for (size_t j = 1; j < c; ++j) {
      if (row[j] > row[best]) best = j;
    }
    // Cross-entropy = logsumexp(row) - row[label], computed around the max for stability.
    double sum = 0.0;
    for (size_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(row[j]) - row[best]);
    const double loss = std::log(sum) + row[best] - row[labels[i]];
    loss_sum_ += loss;
    ++count_;
    ++confusion_[static_cast<size_t>(labels[i]) * c + best];
  }
  return absl::OkStatus();
}

absl::Status MetricsAccumulator::AddPrediction(int32_t label, int32_t predicted, double loss) {
  if (label < 0 || label >= num_classes_ || predicted < 0 || predicted >= num_classes_) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: label ", label, " or prediction ",
                                                   predicted, " outside [0, ", num_classes_, ")"));
  }
  loss_sum_ += loss;
  ++count_;
  ++confusion_[static_cast<size_t>(label) * num_classes_ + predicted];
  return absl::OkStatus();
}

absl::Status MetricsAccumulator::Merge(const MetricsAccumulator& other) {
  if (other.num_classes_ != num_classes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: cannot merge ", other.num_classes_, " classes into ", num_classes_));
  }
  count_ += other.count_;
  loss_sum_ += other.loss_sum_;
  for (size_t i = 0; i < confusion_.size(); ++i) confusion_[i] += other.confusion_[i];
  return absl::OkStatus();
}

ClassificationMetrics MetricsAccumulator::Result() const {
  ClassificationMetrics m;
  m.count = count_;
  m.confusion.assign(num_classes_, std::vector<int64_t>(num_classes_, 0));
  int64_t correct = 0;
  for (int t = 0; t < num_classes_; ++t) {
    for (int p = 0; p < num_classes_; ++p)
      m.confusion[t][p] = confusion_[static_cast<size_t>(t) * num_classes_ + p];
    correct += m.confusion[t][t];
  }
  if (count_ > 0) {
    m.loss = loss_sum_ / static_cast<double>(count_);
    m.accuracy = static_cast<double>(correct) / static_cast<double>(count_);
  }
  m.macro_f1 = MacroF1(m.confusion, &m.f1_per_class);
  return m;
}

double MacroF1(const std::vector<std::vector<int64_t>>& confusion, std::vector<double>* per_class) {
  const size_t c = confusion.size();
  std::vector<double> f1(c, 0.0);
  double sum = 0.0;
  int present = 0;
  for (size_t k = 0; k < c; ++k) {
    int64_t tp = confusion[k].size() > k ? confusion[k][k] : 0, support = 0, predicted = 0;
    for (size_t j = 0; j < confusion[k].size(); ++j) support += confusion[k][j];
    for (size_t i = 0; i < c; ++i) predicted += confusion[i].size() > k ? confusion[i][k] : 0;
    if (support == 0 && predicted == 0)
      continue;  // in neither labels nor predictions: not averaged
    ++present;
    // F1 = 2 tp / (2 tp + fp + fn) = 2 tp / (support + predicted); 0 when tp == 0
    // (zero_division=0).
    f1[k] =
        tp == 0 ? 0.0 : 2.0 * static_cast<double>(tp) / static_cast<double>(support + predicted);
    sum += f1[k];
  }
  if (per_class != nullptr) *per_class = f1;
  return present == 0 ? 0.0 : sum / present;
}

}  // namespace fedlora
