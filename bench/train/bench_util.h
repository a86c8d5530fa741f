// What the training-step benchmarks share: the timed loop of LoRA steps (AdamW, clip 1.0), and the
// GEMM rates they report beside the step, measured in the same run and thread count: the OpenBLAS
// sgemm rate at a given shape (what either engine's GEMMs can reach) and the rate of the bf16-math
// GEMM (kernels/gemm.h) at that shape, the ceiling of a bf16-math step.
#ifndef FEDLORA_BENCH_TRAIN_BENCH_UTIL_H_
#define FEDLORA_BENCH_TRAIN_BENCH_UTIL_H_

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/base/context.h"
#include "kernels/gemm.h"
#include "model/device_params.h"
#include "train/device_step.h"
#include "train/optim.h"

namespace fedlora {

struct TimedSteps {
  float first_loss = 0.0f;
  float first_grad_norm = 0.0f;  // before clipping
  std::vector<double> seconds;   // the timed steps, sorted
};

// One untimed first step (its loss and gradient norm are the run's check values), `warmup` more
// untimed, then `steps` timed: ZeroGrad, ForwardBackward, clip to 1.0, AdamW (lr 1e-4, weight
// decay 0.01). Model is BertModel or CausalLm. A model on a GPU steps as the training loop does
// there: params, gradients and AdamW's moments held on the device (train/device_step.h), each
// step timed to the end of its last kernel.
template <typename Model, typename Batch>
absl::StatusOr<TimedSteps> TimeLoraSteps(Model& model, const Batch& batch, int steps, int warmup) {
  using Clock = std::chrono::steady_clock;
  OptimizerOptions adamw_opts;
  adamw_opts.weight_decay = 0.01f;
  FEDLORA_ASSIGN_OR_RETURN(auto adamw, MakeOptimizer("adamw", adamw_opts));
  TimedSteps out;
  DeviceParams& device = model.device_params();
  std::unique_ptr<DeviceAdamW> on_device;
  if (!device.on_host()) {
    FEDLORA_RETURN_IF_ERROR(device.Acquire());
    FEDLORA_ASSIGN_OR_RETURN(on_device, DeviceAdamW::Create(device, *adamw, /*proximal=*/false));
  }
  for (int i = 0; i < 1 + warmup + steps; ++i) {
    const auto t0 = Clock::now();
    float loss = 0.0f, norm = 0.0f;
    if (on_device != nullptr) {
      FEDLORA_RETURN_IF_ERROR(device.ZeroGrads());
      FEDLORA_ASSIGN_OR_RETURN(loss, model.ForwardBackward(batch, /*dropout_seed=*/0));
      FEDLORA_ASSIGN_OR_RETURN(norm, on_device->GradNorm());
      FEDLORA_RETURN_IF_ERROR(on_device->Step(1e-4f, norm > 1.0f ? 1.0f / norm : 1.0f));
      FEDLORA_RETURN_IF_ERROR(device.backend().Synchronize());
    } else {
      model.ZeroGrad();
      FEDLORA_ASSIGN_OR_RETURN(loss, model.ForwardBackward(batch, /*dropout_seed=*/0));
      norm = ClipGradNorm(model.trainable_params(), 1.0f);
      FEDLORA_RETURN_IF_ERROR(adamw->Step(model.trainable_params(), 1e-4f));
    }
    if (i == 0) {
      out.first_loss = loss;
      out.first_grad_norm = norm;
    } else if (i > warmup) {
      out.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  if (on_device != nullptr) FEDLORA_RETURN_IF_ERROR(device.Release());
  std::sort(out.seconds.begin(), out.seconds.end());
  return out;
}

// Median GFLOP/s of C[m,n] = A[m,k] W[n,k]^T (row-major), the call a linear layer's forward makes;
// -1 when the known answer is wrong.
inline double SgemmGflops(int m, int n, int k, int repeats) {
  using Clock = std::chrono::steady_clock;
  std::vector<float> a(static_cast<size_t>(m) * k, 0.5f), b(static_cast<size_t>(n) * k, 0.25f),
      c(static_cast<size_t>(m) * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
              0.0f, c.data(), n);
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
                0.0f, c.data(), n);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  // Known answer: every element is k * 0.5 * 0.25.
  if (c[0] != 0.125f * k || c.back() != 0.125f * k) return -1.0;
  return 2.0 * m * n * k / times[times.size() / 2] / 1e9;
}

// Median GFLOP/s of the same product through kernels::Gemm with a bf16 W and bf16 math; -1 when
// the product fails or its known answer is wrong.
inline double Bf16GemmGflops(int m, int n, int k, int repeats) {
  using Clock = std::chrono::steady_clock;
  std::vector<float> a(static_cast<size_t>(m) * k, 0.5f), c(static_cast<size_t>(m) * n);
  std::vector<uint16_t> w(static_cast<size_t>(n) * k, F32ToBF16(0.25f));
  kernels::GemmArgs g{.trans_b = true,
                      .m = m,
                      .n = n,
                      .k = k,
                      .a = a.data(),
                      .b_bf16 = w.data(),
                      .c = c.data(),
                      .bf16_math = true};
  std::vector<float> ws(kernels::GemmWorkspaceBytes(g) / sizeof(float) + 1);
  g.workspace = ws.data();
  g.workspace_bytes = ws.size() * sizeof(float);
  const kernels::ExecContext ctx;
  if (!kernels::Gemm(ctx, g).ok()) return -1.0;
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    if (!kernels::Gemm(ctx, g).ok()) return -1.0;
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  if (c[0] != 0.125f * k || c.back() != 0.125f * k) return -1.0;  // 0.5 and 0.25 are exact in bf16
  return 2.0 * m * n * k / times[times.size() / 2] / 1e9;
}

}  // namespace fedlora

#endif  // FEDLORA_BENCH_TRAIN_BENCH_UTIL_H_
