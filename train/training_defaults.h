// The training, LoRA and sequence-length defaults of the run config (config.proto's
// TrainingConfig, LoraConfig, ModelConfig.max_seq_len and DataConfig.eval_batch_size), each written
// once: config/ fills a run config with them, train/train_config.h falls back to them for a config
// built by hand, and the options structs of train/ (TrainOptions, ScheduleOptions, LmDataOptions,
// OptimizerOptions) and the commands' flags start from them.
#pragma once

#include <cstdint>

namespace fedlora {

// training.learning_rate unless set: 5e-4 for SEQUENCE_CLASSIFICATION; 2e-3 for CAUSAL_LM, the
// best measured on both decoder tasks (docs/results.md).
inline constexpr double kDefaultLearningRate = 5e-4;
inline constexpr double kDecoderDefaultLearningRate = 2e-3;
inline constexpr uint32_t kDefaultLocalEpochs = 1;
inline constexpr uint32_t kDefaultBatchSize = 16;
inline constexpr double kDefaultGradClipNorm = 1.0;
inline constexpr uint32_t kDefaultGradAccumulation = 1;
inline constexpr double kDefaultAdamBeta1 = 0.9;
inline constexpr double kDefaultAdamBeta2 = 0.999;
inline constexpr double kDefaultAdamEpsilon = 1e-8;

// A centralized run's (`fedlora train`, TrainOptions) unless given: passes over the data, and the
// best learning rate measured for MiniLM on fortunes and SmolLM2 on fortunes and WordNet
// (docs/results.md). A round's local work is kDefaultLocalEpochs.
inline constexpr int kCentralizedEpochs = 3;
inline constexpr double kCentralizedLearningRate = 2e-3;

// lora.rank and lora.alpha unless set.
inline constexpr uint32_t kDefaultLoraRank = 8;
inline constexpr double kDefaultLoraAlpha = 16.0;

// model.max_seq_len unless set: 128 tokens for an encoder task, 256 for CAUSAL_LM.
inline constexpr uint32_t kDefaultMaxSeqLen = 128;
inline constexpr uint32_t kDecoderDefaultMaxSeqLen = 256;
// data.eval_batch_size unless set.
inline constexpr uint32_t kDefaultEvalBatchSize = 64;

}  // namespace fedlora
