// `fedlora train` and `fedlora eval` on decoder checkpoints (tools/cmd_decoder.cc): the commands
// parse the flags and call these when --model is a decoder (IsDecoderCheckpoint).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "train/trainer.h"

namespace fedlora::tools {

// What both commands read the data with.
struct DecoderDataFlags {
  std::string chat_template;  // "" : the checkpoint's
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  std::string system;        // system message before each prompt ("": none)
  bool exact_match = false;  // also score greedy generations
};

struct DecoderTrainFlags {
  std::string model, train_path, eval_path, out_dir;
  TrainOptions train;
  DecoderDataFlags data;
  int rank = 8;
  float alpha = 16.0f;
  float lora_dropout = 0.0f;
  std::string targets;  // "" : all seven projections
  int threads = 0;
  bool bf16 = false;
  bool bf16_math = false;  // implies bf16
  bool int8_math = false;  // the base held as Q8_0; not with bf16
  bool recompute = false;
  Device device =
      Device::kCpu;  // config/device_plan.h DeviceForRun: never kCuda with CPU-only work
};
absl::Status TrainDecoder(DecoderTrainFlags f);

struct DecoderEvalFlags {
  std::string model, adapter, data_path;  // adapter "" : the untuned base model
  DecoderDataFlags data;
  int batch_size = 8;
  int max_seq_len = 128;
  int threads = 0;
  bool bf16 = false;
  bool bf16_math = false;        // implies bf16
  bool int8_math = false;        // the base held as Q8_0; not with bf16
  Device device = Device::kCpu;  // as DecoderTrainFlags::device
};
absl::Status EvalDecoder(const DecoderEvalFlags& f);

}  // namespace fedlora::tools
