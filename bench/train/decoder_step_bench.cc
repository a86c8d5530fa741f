// One LoRA training step (forward, backward, clip, AdamW) of fedlora's decoder at SmolLM2-135M
// geometry, and greedy generation, timed. The C++ half of bench/train/bench_decoder_step.sh,
// which runs it and the PyTorch half (scripts/bench_decoder_step.py) on the same model and batch.
//
//   decoder_step_bench --model FILE.gguf|DIR --batch BATCH.safetensors [--weights q4|q8|f32|bf16] [--math fp32|bf16|int8]
//                      [--threads N] [--steps 3] [--warmup 1] [--rank 8] [--recompute]
//                      [--generate 64] [--targets q_proj,v_proj] [--init INIT.safetensors] [--device cpu|cuda]
//
// --weights q4 keeps the GGUF's Q4_1 / Q8_0 blocks (the 4-bit base); f32 and bf16 widen them; q8
// holds every matrix as Q8_0 (WeightStorage::kQ8_0). --math bf16 multiplies with the base in bf16
// (DecoderOptions::bf16_math; bf16 weights), --math int8 the forward products in int8
// (DecoderOptions::int8_math; q8 weights). LoRA r8
// (alpha 2r) on --targets (default: all seven projections), dropout off, lr 1e-4; --init sets the
// LoRA values by PEFT name (scripts/bench_hf_step.py starts both engines from the same ones).
// Prints one JSON line: the first step's loss and pre-clip gradient norm, the median and min step
// time, generation tokens/s (prompt: the batch's first 32 tokens), the OpenBLAS sgemm rate at the
// FFN shape (batch*seq x intermediate x hidden, same threads, same run) and the peak RSS of this
// process (VmHWM: this program's own, not a parent's before exec). With --math bf16 also the rate
// of the bf16-math GEMM at that shape (bf16_gemm_gflops). reduced_math_active: whether bf16 or
// int8 math ran (bf16: on CUDA, or this CPU has AVX512_BF16; int8: AVX512-VNNI). --device cuda trains on the GPU
// (DecoderOptions::device; generation stays on the CPU, so it needs --generate 0) and skips the
// CPU sgemm rate (-1).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/train/bench_util.h"
#include "core/process_memory.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "kernels/base/context.h"
#include "kernels/threads.h"
#include "model/decoder.h"
#include "tools/flags.h"

namespace fedlora {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Copies the initial trainable values from `path` by PEFT name.
absl::Status LoadInit(const std::string& path, std::vector<Param>& params) {
  FEDLORA_ASSIGN_OR_RETURN(auto init, SafetensorsFile::Open(path));
  for (Param& p : params) {
    FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, init->Get(p.name));
    if (t.dtype != DType::kF32 || t.shape != p.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.name, ": init tensor has another dtype or shape"));
    }
    std::memcpy(p.value.data(), t.data, t.size);
  }
  return absl::OkStatus();
}

absl::Status Run(const std::string& model_path, const std::string& batch_path,
                 const std::string& weights, const std::string& math, int threads, int steps,
                 int warmup, int rank, bool recompute, int generate, const std::string& targets,
                 const std::string& init_path, Device device) {
  kernels::SetNumThreads(threads);
  FEDLORA_ASSIGN_OR_RETURN(auto bf, SafetensorsFile::Open(batch_path));
  FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor ids, bf->Get("input_ids"));
  CausalLm::Batch batch;
  batch.batch_size = static_cast<int>(ids.shape[0]);
  batch.seq_len = static_cast<int>(ids.shape[1]);
  batch.input_ids.resize(ids.numel());
  std::memcpy(batch.input_ids.data(), ids.data, ids.size);
  batch.labels = batch.input_ids;  // loss on every token, as the PyTorch half

  DecoderOptions o;
  o.lora.rank = rank;
  o.lora.alpha = 2.0f * rank;
  o.weights = weights == "q4"     ? WeightStorage::kAsStored
              : weights == "q8"   ? WeightStorage::kQ8_0
              : weights == "bf16" ? WeightStorage::kBF16
                                  : WeightStorage::kF32;
  const bool bf16_math = math == "bf16";
  o.bf16_math = bf16_math;
  o.int8_math = math == "int8";
  const bool reduced_active = bf16_math ? device == Device::kCuda || kernels::Bf16MathAvailable()
                                        : o.int8_math && kernels::Int8MathAvailable();
  o.max_batch = batch.batch_size;
  o.max_seq = batch.seq_len;
  o.recompute_activations = recompute;
  o.device = device;
  if (!targets.empty()) o.lora.target_modules = absl::StrSplit(targets, ',');
  const auto t_load = Clock::now();
  FEDLORA_ASSIGN_OR_RETURN(auto lm, CausalLm::Load(model_path, o));
  const double load_s = Seconds(t_load, Clock::now());
  if (!init_path.empty()) FEDLORA_RETURN_IF_ERROR(LoadInit(init_path, lm->trainable_params()));
  int64_t trainable = 0;
  for (const Param& p : lm->trainable_params()) trainable += p.numel();

  FEDLORA_ASSIGN_OR_RETURN(TimedSteps t, TimeLoraSteps(*lm, batch, steps, warmup));
  const std::vector<double>& times = t.seconds;

  double gen_tps = 0.0;
  if (generate > 0) {
    // A separate model planned for one sequence (the training one is planned for the batch).
    DecoderOptions g = o;
    g.max_batch = 1;
    g.max_seq = 32 + generate;
    FEDLORA_ASSIGN_OR_RETURN(auto gen, CausalLm::Create(lm->base(), g));
    std::vector<int32_t> prompt(batch.input_ids.begin(), batch.input_ids.begin() + 32);
    CausalLm::GenerateOptions go;
    go.max_new_tokens = generate;
    const auto t0 = Clock::now();
    FEDLORA_ASSIGN_OR_RETURN(auto out, gen->Generate(prompt, go));
    gen_tps = static_cast<double>(out.size()) / Seconds(t0, Clock::now());
  }
  const DecoderConfig& cfg = lm->base()->config();
  const int tokens = batch.batch_size * batch.seq_len;
  const double sgemm = device == Device::kCpu
                           ? SgemmGflops(tokens, static_cast<int>(cfg.intermediate_size),
                                         static_cast<int>(cfg.hidden_size), 5)
                           : -1.0;
  const double bf16_gemm = bf16_math && device == Device::kCpu
                               ? Bf16GemmGflops(tokens, static_cast<int>(cfg.intermediate_size),
                                                static_cast<int>(cfg.hidden_size), 5)
                               : -1.0;
  std::cout << absl::StrFormat(
                   "{\"engine\":\"fedlora\",\"device\":\"%s\",\"weights\":\"%s\",\"math\":\"%s\","
                   "\"reduced_math_active\":%s,"
                   "\"recompute\":%s,\"threads\":%d,\"load_s\":%.2f,"
                   "\"first_loss\":%.9g,\"first_grad_norm\":%.9g,\"trainable_params\":%d,\"step_s_"
                   "median\":%.4f,"
                   "\"step_s_min\":%.4f,\"steps\":%d,\"gen_tokens_per_s\":%.2f,\"weight_mb\":%.1f,"
                   "\"sgemm_gflops\":%.2f,\"sgemm_shape\":[%d,%d,%d],\"bf16_gemm_gflops\":%.2f,"
                   "\"peak_rss_mb\":%.1f}",
                   DeviceName(device), weights, math, reduced_active ? "true" : "false",
                   recompute ? "true" : "false", threads, load_s, t.first_loss, t.first_grad_norm,
                   trainable, times[times.size() / 2], times.front(), steps, gen_tps,
                   lm->base()->weight_bytes() / 1048576.0, sgemm, tokens, cfg.intermediate_size,
                   cfg.hidden_size, bf16_gemm, PeakResidentKib() / 1024.0)
            << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  fedlora::kernels::RestartForFasterOpenBlas(argv);
  std::string model, batch, weights, math = "fp32", targets, init, device = "cpu";
  int threads = 2, steps = 3, warmup = 1, rank = 8, generate = 64;
  bool recompute = false;
  fedlora::tools::FlagSet flags("decoder_step_bench",
                                "Times one decoder LoRA training step and generation.");
  flags.AddString("model", &model, "SmolLM2 .gguf file", true);
  flags.AddString("batch", &batch, "safetensors with input_ids I32 [B, S]", true);
  flags.AddString(
      "weights", &weights,
      "q4 (as stored), q8, f32 or bf16 (default q4; bf16 with --math bf16, q8 with --math int8)");
  flags.AddString("math", &math,
                  "fp32; bf16: GEMMs with the base in bf16 (bf16 weights); int8: forward GEMMs in "
                  "int8 (q8 weights)");
  flags.AddInt("threads", &threads, "CPU threads");
  flags.AddInt("steps", &steps, "timed steps");
  flags.AddInt("warmup", &warmup, "untimed steps after the first");
  flags.AddInt("rank", &rank, "LoRA rank");
  flags.AddBool("recompute", &recompute, "recompute activations in the backward");
  flags.AddInt("generate", &generate, "new tokens to generate (0: skip)");
  flags.AddString("targets", &targets, "LoRA target modules, comma-separated (default: all seven)");
  flags.AddString("init", &init, "safetensors with the initial LoRA values (PEFT names)");
  flags.AddString("device", &device, "cpu or cuda (training only: cuda needs --generate 0)");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok() || flags.help_requested()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), flags.Help().c_str());
    return 2;
  }
  if (weights.empty()) weights = math == "bf16" ? "bf16" : math == "int8" ? "q8" : "q4";
  if ((weights != "q4" && weights != "q8" && weights != "f32" && weights != "bf16") ||
      (math != "fp32" && math != "bf16" && math != "int8") ||
      (math == "bf16" && weights != "bf16") || (math == "int8" && weights != "q8") || steps < 1) {
    std::fprintf(stderr,
                 "--weights q4|q8|f32|bf16, --math fp32|bf16|int8 (bf16 math needs bf16 weights, "
                 "int8 math q8 "
                 "weights), --steps >= 1\n");
    return 2;
  }
  if ((device != "cpu" && device != "cuda") || (device == "cuda" && generate != 0)) {
    std::fprintf(
        stderr,
        "--device cpu|cuda; generation computes on the CPU, so --device cuda needs --generate 0\n");
    return 2;
  }
  const absl::Status st = fedlora::Run(
      model, batch, weights, math, threads, steps, warmup, rank, recompute, generate, targets, init,
      device == "cuda" ? fedlora::Device::kCuda : fedlora::Device::kCpu);
  if (!st.ok()) {
    std::fprintf(stderr, "decoder_step_bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
