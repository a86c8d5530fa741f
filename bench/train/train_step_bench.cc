// One LoRA training step (forward, backward, clip, AdamW) of our engine, timed. The C++ half of
// bench/train/bench_train_step.sh, which drives it and the PyTorch half
// (scripts/bench_train_step.py) on the same checkpoint, the same initial trainable values and the
// same batch.
//
//   train_step_bench --model DIR --init DIR/init.safetensors --batch DIR/batch.safetensors
//                    [--threads N] [--steps 5] [--warmup 2] [--rank 8] [--alpha 16] [--math fp32|bf16]
//                    [--device cpu|cuda]
//
// Prints one JSON line: the loss and pre-clip gradient norm of the first step (for validation
// against PyTorch), the median / min step time over --steps timed steps after --warmup untimed
// ones, the OpenBLAS sgemm rate at the FFN shape of this geometry (same threads, same run), and
// the peak RSS of this process. --math bf16 holds the base in bf16 and multiplies with it in bf16
// (ModelOptions::bf16_math); the JSON then also carries the rate of that bf16 GEMM at the FFN shape
// through kernels::Gemm (bf16_gemm_gflops), and whether it ran in bf16 (bf16_math_active: always on
// CUDA, on a CPU with AVX512_BF16).
// --device cuda trains on the GPU (ModelOptions::device) and skips the CPU GEMM rates (-1).
//
// Dropout is off (p = 0) so that both engines compute the same function and the losses can be
// compared; dropout's cost is a few elementwise passes, small next to the GEMMs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/train/bench_util.h"
#include "core/process_memory.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/base/context.h"
#include "kernels/gemm.h"
#include "kernels/threads.h"
#include "model/bert.h"
#include "tools/flags.h"

namespace fedlora {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

absl::StatusOr<std::vector<int32_t>> ReadI32(const SafetensorsFile& file, const std::string& name) {
  FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, file.Get(name));
  if (t.dtype != DType::kI32) return absl::InvalidArgumentError(absl::StrCat(name, " must be I32"));
  std::vector<int32_t> out(t.numel());
  std::memcpy(out.data(), t.data, t.size);
  return out;
}

absl::Status Run(int argc, char** argv) {
  std::string model_dir, init_path, batch_path, math = "fp32", device_name = "cpu";
  int threads = 0, steps = 5, warmup = 2, rank = 8;
  float alpha = 16.0f;
  tools::FlagSet flags("train_step_bench", "Times one LoRA training step of the C++ engine.");
  flags.AddString("model", &model_dir, "checkpoint directory (config.json, model.safetensors)",
                  true);
  flags.AddString("init", &init_path, "safetensors with the initial trainable params (PEFT names)",
                  true);
  flags.AddString("batch", &batch_path, "safetensors with input_ids, attention_mask, labels (I32)",
                  true);
  flags.AddInt("threads", &threads, "CPU threads (kernels and OpenBLAS); 0 = all cores");
  flags.AddInt("steps", &steps, "timed steps");
  flags.AddInt("warmup", &warmup, "untimed steps before timing");
  flags.AddInt("rank", &rank, "LoRA rank");
  flags.AddFloat("alpha", &alpha, "LoRA alpha");
  flags.AddString("math", &math, "fp32, or bf16: the base held and multiplied in bf16");
  flags.AddString("device", &device_name, "cpu or cuda");
  FEDLORA_RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return absl::OkStatus();
  }
  if (steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  if (math != "fp32" && math != "bf16")
    return absl::InvalidArgumentError("--math must be fp32 or bf16");
  if (device_name != "cpu" && device_name != "cuda")
    return absl::InvalidArgumentError("--device must be cpu or cuda");
  const Device device = device_name == "cuda" ? Device::kCuda : Device::kCpu;
  const bool bf16_math = math == "bf16";
  kernels::SetNumThreads(threads);

  FEDLORA_ASSIGN_OR_RETURN(auto batch_file, SafetensorsFile::Open(batch_path));
  BertClassifier::Batch batch;
  FEDLORA_ASSIGN_OR_RETURN(batch.input_ids, ReadI32(*batch_file, "input_ids"));
  FEDLORA_ASSIGN_OR_RETURN(batch.attention_mask, ReadI32(*batch_file, "attention_mask"));
  FEDLORA_ASSIGN_OR_RETURN(batch.labels, ReadI32(*batch_file, "labels"));
  FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor ids, batch_file->Get("input_ids"));
  if (ids.shape.size() != 2) return absl::InvalidArgumentError("input_ids must be [batch, seq]");
  batch.batch_size = static_cast<int>(ids.shape[0]);
  batch.seq_len = static_cast<int>(ids.shape[1]);

  ModelOptions opts;
  opts.num_labels = 2;
  opts.lora.rank = rank;
  opts.lora.alpha = alpha;
  opts.hidden_dropout = 0.0f;
  opts.attention_dropout = 0.0f;
  opts.max_batch = batch.batch_size;
  opts.max_seq = batch.seq_len;
  opts.bf16_weights = opts.bf16_math = bf16_math;
  opts.device = device;
  const auto load_start = Clock::now();
  FEDLORA_ASSIGN_OR_RETURN(auto model, BertClassifier::Load(model_dir, opts));
  const double load_s = Seconds(load_start, Clock::now());

  // The PyTorch side starts from the same trainable values: copy them by PEFT name.
  FEDLORA_ASSIGN_OR_RETURN(auto init, SafetensorsFile::Open(init_path));
  int64_t trainable = 0;
  for (Param& p : model->trainable_params()) {
    FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, init->Get(p.name));
    if (t.dtype != DType::kF32 || t.shape != p.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.name, ": init tensor has another dtype or shape"));
    }
    std::memcpy(p.value.data(), t.data, t.size);
    trainable += p.numel();
  }

  FEDLORA_ASSIGN_OR_RETURN(TimedSteps t, TimeLoraSteps(*model, batch, steps, warmup));
  const std::vector<double>& times = t.seconds;
  const BertConfig& cfg = model->config();
  const bool cpu = device == Device::kCpu;
  const double sgemm =
      !cpu ? -1.0
           : SgemmGflops(batch.batch_size * batch.seq_len, static_cast<int>(cfg.intermediate_size),
                         static_cast<int>(cfg.hidden_size), 5);
  const double bf16_gemm = bf16_math && cpu
                               ? Bf16GemmGflops(batch.batch_size * batch.seq_len,
                                                static_cast<int>(cfg.intermediate_size),
                                                static_cast<int>(cfg.hidden_size), 5)
                               : -1.0;
  const double rss_after = ResidentKib() / 1024.0;
  std::cout
      << absl::StrFormat(
             "{\"engine\":\"fedlora\",\"device\":\"%s\",\"math\":\"%s\",\"bf16_math_active\":%s,"
             "\"threads\":%d,"
             "\"load_s\":%.3f,\"first_loss\":%.9g,"
             "\"first_grad_norm\":%.9g,\"trainable_params\":%d,\"step_median_s\":%.6f,"
             "\"step_min_s\":%.6f,\"steps\":%d,\"sgemm_gflops\":%.2f,\"sgemm_shape\":[%d,%d,%d],"
             "\"bf16_gemm_gflops\":%.2f,\"rss_after_mb\":%.1f,\"peak_rss_mb\":%.1f}",
             DeviceName(device), math,
             bf16_math && (!cpu || kernels::Bf16MathAvailable()) ? "true" : "false",
             kernels::NumThreads(), load_s, t.first_loss, t.first_grad_norm, trainable,
             times[times.size() / 2], times.front(), steps, sgemm, batch.batch_size * batch.seq_len,
             cfg.intermediate_size, cfg.hidden_size, bf16_gemm, rss_after,
             PeakResidentKib() / 1024.0)
      << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  fedlora::kernels::RestartForFasterOpenBlas(argv);
  const absl::Status status = fedlora::Run(argc, argv);
  if (!status.ok()) {
    std::cerr << "train_step_bench: " << status << "\n";
    return 1;
  }
  return 0;
}
