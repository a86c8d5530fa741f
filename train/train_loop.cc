#include "train/train_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/status.h"
#include "train/device_step.h"
#include "train/schedule.h"

namespace fedlora {
namespace {

// Rng streams (core/rng.h): one per purpose so that shuffling and dropout never share bits.
// Shuffling of epoch e uses stream MakeStream(kShuffleStream, e); the 64-bit dropout seed of
// micro-batch i is words 2i and 2i+1 of stream kDropoutStream.
constexpr uint32_t kShuffleStream = 0x53484646;  // "SHFF"
constexpr uint64_t kDropoutStream = 0x44524f50;  // "DROP"

uint64_t DropoutSeed(uint64_t seed, uint64_t micro_batch) {
  return static_cast<uint64_t>(U32At(seed, kDropoutStream, 2 * micro_batch)) |
         (static_cast<uint64_t>(U32At(seed, kDropoutStream, 2 * micro_batch + 1)) << 32);
}

}  // namespace

int64_t StepsPerEpochOf(const TrainOptions& options, int64_t n) {
  const int64_t micro = (n + options.batch_size - 1) / options.batch_size;
  return (micro + options.grad_accumulation - 1) / options.grad_accumulation;
}

std::vector<int64_t> EpochOrderOfLengths(std::span<const int64_t> lengths,
                                         const TrainOptions& options, int epoch) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  Rng rng(options.seed, MakeStream(kShuffleStream, static_cast<uint32_t>(epoch)));
  rng.Shuffle(order);
  if (!options.group_by_length || options.batch_size <= 1) return order;
  // HF's LengthGroupedSampler: chunks of 50 batches, each sorted by decreasing length (stable, so
  // ties keep the shuffled order), then the full batches in a random order. The chunk size is a
  // multiple of batch_size, so only the very last batch can be short; it stays last so that every
  // other batch remains full.
  const int64_t bs = options.batch_size, chunk = 50 * bs;
  auto longer = [&lengths](int64_t a, int64_t b) { return lengths[a] > lengths[b]; };
  for (int64_t begin = 0; begin < n; begin += chunk) {
    std::stable_sort(order.begin() + begin, order.begin() + std::min(n, begin + chunk), longer);
  }
  const int64_t full_batches = n / bs;
  std::vector<int64_t> batch_ids(full_batches);
  std::iota(batch_ids.begin(), batch_ids.end(), 0);
  rng.Shuffle(batch_ids);
  std::vector<int64_t> grouped;
  grouped.reserve(n);
  for (int64_t b : batch_ids)
    grouped.insert(grouped.end(), order.begin() + b * bs, order.begin() + (b + 1) * bs);
  grouped.insert(grouped.end(), order.begin() + full_batches * bs, order.end());
  return grouped;
}

absl::Status RunTrainLoop(const TrainOptions& options, const TrainLoop& loop,
                          std::unique_ptr<Optimizer>* optimizer_out) {
  const int64_t n = static_cast<int64_t>(loop.lengths.size());
  OptimizerOptions opt;
  opt.weight_decay = options.weight_decay;
  opt.beta1 = options.adam_beta1;
  opt.momentum = options.momentum;
  opt.beta2 = options.adam_beta2;
  opt.eps = options.adam_epsilon;
  FEDLORA_ASSIGN_OR_RETURN(*optimizer_out, MakeOptimizer(options.optimizer, opt));
  Optimizer& optimizer = **optimizer_out;
  const int64_t steps_per_epoch = StepsPerEpochOf(options, n);
  const int64_t total_steps =
      options.max_steps > 0 ? options.max_steps : options.epochs * steps_per_epoch;
  FEDLORA_ASSIGN_OR_RETURN(
      LearningRateSchedule schedule,
      MakeSchedule(options.schedule, {.base_lr = options.lr,
                                      .warmup_steps = std::min(options.warmup_steps, total_steps),
                                      .total_steps = total_steps}));
  std::vector<Param>& params = *loop.params;
  // The device step (train/device_step.h) holds the params on the model's device for the run and
  // lets them go around each epoch's callback (which may evaluate) and at the end, on any exit.
  std::unique_ptr<DeviceAdamW> on_device;
  if (loop.step_on_device && loop.device != nullptr && optimizer.name() == "adamw") {
    FEDLORA_RETURN_IF_ERROR(loop.device->Acquire());
    auto made = DeviceAdamW::Create(*loop.device, optimizer, options.proximal_mu > 0.0f);
    if (!made.ok()) {
      loop.device->Release().IgnoreError();
      return made.status();
    }
    on_device = *std::move(made);
  }
  absl::Cleanup release = [&] {
    if (on_device != nullptr) loop.device->Release().IgnoreError();
  };
  // Hands the params (and the optimizer's state) back to the host.
  auto to_host = [&]() -> absl::Status {
    if (on_device == nullptr) return absl::OkStatus();
    FEDLORA_RETURN_IF_ERROR(on_device->ExportTo(optimizer));
    return loop.device->Release();
  };
  // FedProx's anchor: the params as this run found them (kept on the device by DeviceAdamW).
  std::vector<std::vector<float>> anchor;
  if (options.proximal_mu > 0.0f && on_device == nullptr) {
    anchor.reserve(params.size());
    for (const Param& p : params) anchor.push_back(p.value);
  }
  // The parts of a step that read or change the gradients, where they are.
  auto zero_grad = [&]() -> absl::Status {
    if (on_device != nullptr) return loop.device->ZeroGrads();
    loop.zero_grad();
    return absl::OkStatus();
  };
  auto average = [&](float inv) -> absl::Status {
    if (on_device != nullptr) return on_device->Average(inv);
    for (Param& p : params) {
      for (float& g : p.grad) g *= inv;
    }
    return absl::OkStatus();
  };
  auto add_proximal = [&](float mu) -> absl::Status {
    if (on_device != nullptr) return on_device->AddProximal(mu);
    for (size_t i = 0; i < params.size(); ++i) {
      Param& p = params[i];
      const std::vector<float>& w0 = anchor[i];
      for (size_t j = 0; j < p.grad.size(); ++j) p.grad[j] += mu * (p.value[j] - w0[j]);
    }
    return absl::OkStatus();
  };
  // Clips by the global norm and steps; returns the norm before clipping (non-finite: no step).
  auto clip_and_step = [&](float lr) -> absl::StatusOr<float> {
    if (on_device == nullptr) {
      const float norm = ClipGradNorm(params, options.grad_clip);
      if (std::isfinite(norm)) FEDLORA_RETURN_IF_ERROR(optimizer.Step(params, lr));
      return norm;
    }
    FEDLORA_ASSIGN_OR_RETURN(const float norm, on_device->GradNorm());
    if (!std::isfinite(norm)) return norm;
    const float max_norm = options.grad_clip;
    // ClipGradNorm's factor, applied by AdamW as it reads each gradient.
    const float scale = max_norm > 0.0f && norm > max_norm
                            ? static_cast<float>(static_cast<double>(max_norm) / norm)
                            : 1.0f;
    FEDLORA_RETURN_IF_ERROR(on_device->Step(lr, scale));
    return norm;
  };

  int64_t step = 0;          // optimizer steps taken
  uint64_t micro_index = 0;  // micro-batches run, for dropout seeds
  for (int epoch = 1; step < total_steps; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int64_t> order = EpochOrderOfLengths(loop.lengths, options, epoch);
    std::optional<Progress> progress;
    const int64_t epoch_start_step = step;
    if (options.progress) {
      ProgressOptions progress_options;
      progress_options.unit = "step";
      progress.emplace(absl::StrCat("epoch ", epoch), std::min(steps_per_epoch, total_steps - step),
                       progress_options);
    }
    double loss_sum = 0.0;  // sum over examples of the micro-batch mean loss
    int64_t seen = 0;
    int64_t pos = 0;
    while (pos < n && step < total_steps) {
      FEDLORA_RETURN_IF_ERROR(zero_grad());
      const int64_t step_start = pos;
      int micro = 0;
      double step_loss = 0.0;
      for (; micro < options.grad_accumulation && pos < n; ++micro) {
        const int64_t end = std::min<int64_t>(pos + options.batch_size, n);
        FEDLORA_ASSIGN_OR_RETURN(
            float loss,
            loop.forward_backward(std::span<const int64_t>(order).subspan(pos, end - pos),
                                  DropoutSeed(options.seed, micro_index++)));
        if (!std::isfinite(loss)) {
          return absl::FailedPreconditionError(absl::StrCat("training loss became ", loss,
                                                            " at step ", step + 1, " (epoch ",
                                                            epoch, "); try a lower learning rate"));
        }
        step_loss += loss;
        loss_sum += static_cast<double>(loss) * (end - pos);
        seen += end - pos;
        pos = end;
      }
      // The model added the gradient of each micro-batch's mean loss; average them so the step
      // sees the gradient of the mean, whatever the accumulation.
      if (micro > 1) FEDLORA_RETURN_IF_ERROR(average(1.0f / static_cast<float>(micro)));
      if (options.proximal_mu > 0.0f) FEDLORA_RETURN_IF_ERROR(add_proximal(options.proximal_mu));
      const float lr = schedule.LearningRateAt(step);
      FEDLORA_ASSIGN_OR_RETURN(const float norm, clip_and_step(lr));
      if (!std::isfinite(norm)) {
        return absl::FailedPreconditionError(absl::StrCat("gradient norm became ", norm,
                                                          " at step ", step + 1, " (epoch ", epoch,
                                                          "); try a lower learning rate"));
      }
      ++step;
      if (progress) {
        progress->Update(step - epoch_start_step, absl::StrFormat("loss=%.4f lr=%.2e |g|=%.3f",
                                                                  step_loss / micro, lr, norm));
      }
      if (loop.on_step) {
        loop.on_step({.step = step,
                      .total_steps = total_steps,
                      .epoch = epoch,
                      .loss = static_cast<float>(step_loss / micro),
                      .lr = lr,
                      .grad_norm = norm,
                      .examples = pos - step_start});
      }
    }
    if (progress) progress->Finish();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (loop.after_epoch) {
      FEDLORA_RETURN_IF_ERROR(to_host());
      FEDLORA_RETURN_IF_ERROR(loop.after_epoch(
          epoch, step, seen > 0 ? loss_sum / static_cast<double>(seen) : 0.0, seconds));
      if (on_device != nullptr) FEDLORA_RETURN_IF_ERROR(loop.device->Acquire());
    }
  }
  return to_host();
}

}  // namespace fedlora
