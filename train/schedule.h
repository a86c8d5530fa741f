// Learning-rate schedules, indexed by optimizer step (0-based: the step about to be taken).
//
//   FEDLORA_ASSIGN_OR_RETURN(auto schedule, MakeSchedule("linear", {.base_lr = 5e-4f,
//                                                                   .warmup_steps = 10,
//                                                                   .total_steps = 1000}));
//   optimizer->Step(params, schedule.LearningRateAt(step));
//
// The formulas are Hugging Face transformers' (get_*_schedule_with_warmup), so a run here and a
// PyTorch run with the same settings see the same learning rate at every step:
//   warmup   (step < W):  base * step / W            (so step 0 has lr 0 when W > 0)
//   constant (step >= W): base
//   linear   (step >= W): base * max(0, (T - step) / (T - W))
//   cosine   (step >= W): base * 0.5 * (1 + cos(pi * min(1, (step - W) / (T - W))))
// with W = warmup_steps and T = total_steps. Past T, linear and cosine stay at 0.
// Thread-safe (immutable after construction).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "train/training_defaults.h"

namespace fedlora {

enum class ScheduleKind { kConstant, kLinear, kCosine };

struct ScheduleOptions {
  // Peak learning rate, reached at the end of warmup.
  float base_lr = static_cast<float>(kDefaultLearningRate);
  int64_t warmup_steps = 0;  // linear ramp from 0 over this many steps
  int64_t total_steps = 0;   // optimizer steps in the whole run (needed by linear and cosine)
};

class LearningRateSchedule {
 public:
  LearningRateSchedule(ScheduleKind kind, const ScheduleOptions& options)
      : kind_(kind), options_(options) {}

  // The learning rate for 0-based optimizer step `step` (negative steps are treated as 0).
  float LearningRateAt(int64_t step) const;

  ScheduleKind kind() const { return kind_; }
  const ScheduleOptions& options() const { return options_; }

 private:
  ScheduleKind kind_;
  ScheduleOptions options_;
};

// "constant", "linear" or "cosine" (case-insensitive). InvalidArgument for any other name, a
// negative or non-finite base_lr, negative step counts, or (for linear/cosine) total_steps <= 0
// or warmup_steps > total_steps.
absl::StatusOr<LearningRateSchedule> MakeSchedule(std::string_view name,
                                                  const ScheduleOptions& options);

}  // namespace fedlora
