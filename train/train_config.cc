#include "train/train_config.h"

namespace fedlora {

const char* OptimizerName(v1::TrainingConfig::Optimizer optimizer) {
  switch (optimizer) {
    case v1::TrainingConfig::LAMB:
      return "lamb";
    case v1::TrainingConfig::SGD:
      return "sgd";
    default:
      return "adamw";
  }
}

const char* ScheduleName(v1::TrainingConfig::Schedule schedule) {
  switch (schedule) {
    case v1::TrainingConfig::LINEAR:
      return "linear";
    case v1::TrainingConfig::COSINE:
      return "cosine";
    default:
      return "constant";
  }
}

TrainOptions TrainOptionsFromConfig(const v1::TrainingConfig& t, int max_seq_len) {
  TrainOptions o;
  o.batch_size = static_cast<int>(t.has_batch_size() ? t.batch_size() : 16);
  o.max_seq_len = max_seq_len;
  o.lr = static_cast<float>(t.has_learning_rate() ? t.learning_rate() : 5e-4);
  o.optimizer = OptimizerName(t.optimizer());
  o.weight_decay = static_cast<float>(t.weight_decay());
  o.warmup_steps = t.warmup_steps();
  o.schedule = ScheduleName(t.schedule());
  o.grad_clip = static_cast<float>(t.has_grad_clip_norm() ? t.grad_clip_norm() : 1.0);
  o.grad_accumulation = static_cast<int>(t.has_grad_accumulation() ? t.grad_accumulation() : 1);
  o.progress = false;
  return o;
}

}  // namespace fedlora
