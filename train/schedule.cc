#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace fedlora {

float LearningRateSchedule::LearningRateAt(int64_t step) const {
  step = std::max<int64_t>(step, 0);
  const double base = options_.base_lr;
  const int64_t warmup = options_.warmup_steps, total = options_.total_steps;
  // Ratios in double: step / total for total in the millions must not round in fp32 first.
  if (step < warmup)
    return static_cast<float>(base * static_cast<double>(step) / static_cast<double>(warmup));
  switch (kind_) {
    case ScheduleKind::kConstant:
      return static_cast<float>(base);
    case ScheduleKind::kLinear: {
      const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
      return static_cast<float>(base * std::max(0.0, static_cast<double>(total - step) / span));
    }
    case ScheduleKind::kCosine: {
      const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
      const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
      return static_cast<float>(base * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
    }
  }
  return static_cast<float>(base);
}

absl::StatusOr<LearningRateSchedule> MakeSchedule(std::string_view name,
                                                  const ScheduleOptions& options) {
  const std::string lower = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  ScheduleKind kind;
  if (lower == "constant") {
    kind = ScheduleKind::kConstant;
  } else if (lower == "linear") {
    kind = ScheduleKind::kLinear;
  } else if (lower == "cosine") {
    kind = ScheduleKind::kCosine;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown schedule '", std::string(name),
                                                   "' (expected constant, linear or cosine)"));
  }
  if (!std::isfinite(options.base_lr) || options.base_lr < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate must be finite and >= 0, got ", options.base_lr));
  }
  if (options.warmup_steps < 0 || options.total_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("schedule step counts must be >= 0, got warmup ",
                                                   options.warmup_steps, " total ",
                                                   options.total_steps));
  }
  if (kind != ScheduleKind::kConstant) {
    if (options.total_steps <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(lower, " schedule needs total_steps > 0"));
    }
    if (options.warmup_steps > options.total_steps) {
      return absl::InvalidArgumentError(absl::StrCat("warmup_steps (", options.warmup_steps,
                                                     ") exceeds total_steps (", options.total_steps,
                                                     ")"));
    }
  }
  return LearningRateSchedule(kind, options);
}

}  // namespace fedlora
