// The run config's training section (fedlora.v1.TrainingConfig) as train/'s TrainOptions: the one
// place that maps the config's optimizer and schedule enums to Trainer's names.
//
//   TrainOptions o = TrainOptionsFromConfig(config.training(), /*max_seq_len=*/128);
//   FEDLORA_RETURN_IF_ERROR(o.Validate());
#pragma once

#include "fedlora/v1/config.pb.h"
#include "train/trainer.h"

namespace fedlora {

// "adamw" | "lamb" | "sgd"; OPTIMIZER_UNSPECIFIED is config.proto's default, ADAMW.
const char* OptimizerName(v1::TrainingConfig::Optimizer optimizer);
// "constant" | "linear" | "cosine"; SCHEDULE_UNSPECIFIED is config.proto's default, CONSTANT.
const char* ScheduleName(v1::TrainingConfig::Schedule schedule);

// The options of one local task before the task's own fields apply: batch size, learning rate,
// optimizer, weight decay, warmup, schedule, clipping and accumulation from `training` (unset
// optional fields take config.proto's defaults: batch 16, lr 5e-4, clip 1.0, accumulation 1),
// `max_seq_len` tokens per example, no progress display. Epochs, steps and seed are left at
// TrainOptions' defaults: each task sets them. Not validated: call Validate().
TrainOptions TrainOptionsFromConfig(const v1::TrainingConfig& training, int max_seq_len);

}  // namespace fedlora
