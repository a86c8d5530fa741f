// LoRA linear forward + backward at BERT-base shape against the OpenBLAS sgemm it is built on,
// measured in the same run with the same threads. Validates first, then times.
//
//   kernels_lora_bench [threads] [iterations]
//
// Napkin math: one 1024 x 768 x 768 sgemm is 1.21 GFLOP. LoRA forward = 1 such sgemm + 50 MFLOP
// of adapter work + one pass over y for the bias; backward (dx, dA, dB; no dW) = 1 sgemm + 50
// MFLOP + small GEMMs. So the floor for forward + backward is 2 sgemm times; the ratio printed
// as "overhead" is (LoRA fwd+bwd time) / (2 x sgemm time), 1.0 being perfect.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "kernels/base/context.h"
#include "kernels/lora_linear.h"
#include "kernels/threads.h"

namespace fk = fedlora::kernels;
using fedlora::bench::Check;
using fedlora::bench::Random;

namespace {

constexpr int64_t kRows = 1024, kIn = 768, kOut = 768, kRank = 8;

}  // namespace

int main(int argc, char** argv) {
  fedlora::kernels::RestartForFasterOpenBlas(argv);
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 10;
  fk::SetNumThreads(threads);
  const fk::ExecContext ctx;
  std::printf("threads %d, iterations %d, shape rows=%lld in=%lld out=%lld rank=%lld\n",
              fk::NumThreads(), iters, static_cast<long long>(kRows), static_cast<long long>(kIn),
              static_cast<long long>(kOut), static_cast<long long>(kRank));

  const auto x = Random(kRows * kIn, 1), w = Random(kOut * kIn, 2), b = Random(kOut, 3),
             A = Random(kRank * kIn, 4), B = Random(kOut * kRank, 5), dy = Random(kRows * kOut, 6);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &w[i], 4);
    w16[i] = static_cast<uint16_t>(u >> 16);
  }
  std::vector<float> y(kRows * kOut), h(kRows * kRank), dx(kRows * kIn), da(kRank * kIn),
      db(kOut * kRank);
  const float scaling = 16.0f / kRank;

  auto fwd_args = [&](fk::WeightPtr wp, std::vector<float>& ws) {
    fk::LoraLinearForwardArgs f{.rows = kRows,
                                .in_features = kIn,
                                .out_features = kOut,
                                .rank = kRank,
                                .x = x.data(),
                                .w = wp,
                                .bias = b.data(),
                                .lora_a = A.data(),
                                .lora_b = B.data(),
                                .scaling = scaling,
                                .y = y.data(),
                                .h = h.data()};
    ws.resize(fk::LoraLinearWorkspaceBytes(f) / 4 + 1);
    f.workspace = ws.data();
    f.workspace_bytes = ws.size() * 4;
    return f;
  };
  auto bwd_args = [&](fk::WeightPtr wp, std::vector<float>& ws) {
    fk::LoraLinearBackwardArgs g{.rows = kRows,
                                 .in_features = kIn,
                                 .out_features = kOut,
                                 .rank = kRank,
                                 .x = x.data(),
                                 .w = wp,
                                 .lora_a = A.data(),
                                 .lora_b = B.data(),
                                 .scaling = scaling,
                                 .h = h.data(),
                                 .dy = dy.data(),
                                 .dx = dx.data(),
                                 .da = da.data(),
                                 .db = db.data()};
    ws.resize(fk::LoraLinearWorkspaceBytes(g) / 4 + 1);
    g.workspace = ws.data();
    g.workspace_bytes = ws.size() * 4;
    return g;
  };

  // --- Validate: the forward against an independent composition of raw cblas calls. ---
  std::vector<float> fws, bws;
  Check(fk::LoraLinearForward(ctx, fwd_args(fk::WeightPtr::F32(w.data()), fws)), "forward");
  std::vector<float> ref(kRows * kOut), href(kRows * kRank);
  for (int64_t t = 0; t < kRows; ++t) std::memcpy(&ref[t * kOut], b.data(), kOut * 4);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kRows, kOut, kIn, 1.0f, x.data(), kIn,
              w.data(), kIn, 1.0f, ref.data(), kOut);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kRows, kRank, kIn, 1.0f, x.data(), kIn,
              A.data(), kIn, 0.0f, href.data(), kRank);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kRows, kOut, kRank, scaling, href.data(),
              kRank, B.data(), kRank, 1.0f, ref.data(), kOut);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(double(ref[i]) - y[i]));
  // Same library, same products, possibly different blocking: 1e-3 on values of size ~30.
  if (worst > 1e-3) {
    std::fprintf(stderr, "validation failed: max |diff| %g\n", worst);
    return 1;
  }
  std::printf("validated: forward matches raw cblas composition (max |diff| %.2g)\n", worst);

  // --- Time. --- Interleaved: every round times the sgemm baseline and each LoRA variant back to
  // back, and the medians over rounds are compared, so that load from other processes on a
  // shared machine hits baseline and candidate alike.
  std::vector<float> c(kRows * kOut);
  const fk::WeightPtr w32 = fk::WeightPtr::F32(w.data()), w16p = fk::WeightPtr::BF16(w16.data());
  std::vector<float> fws16, bws16;
  const auto f32 = fwd_args(w32, fws), f16 = fwd_args(w16p, fws16);
  const auto b32 = bwd_args(w32, bws), b16 = bwd_args(w16p, bws16);
  auto sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kRows, kOut, kIn, 1.0f, x.data(), kIn,
                w.data(), kIn, 0.0f, c.data(), kOut);
  };
  auto time_once = [](auto&& f) {
    const auto a = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  };
  std::vector<double> t_gemm, t_f32, t_b32, t_f16, t_b16;
  for (int round = -2; round < iters; ++round) {  // two warm-up rounds: page faults, thread start
    const double g = time_once(sgemm);
    const double f1 = time_once([&] { Check(fk::LoraLinearForward(ctx, f32), "forward"); });
    const double b1 = time_once([&] { Check(fk::LoraLinearBackward(ctx, b32), "backward"); });
    const double f2 = time_once([&] { Check(fk::LoraLinearForward(ctx, f16), "forward bf16"); });
    const double b2 = time_once([&] { Check(fk::LoraLinearBackward(ctx, b16), "backward bf16"); });
    if (round < 0) continue;
    t_gemm.push_back(g);
    t_f32.push_back(f1);
    t_b32.push_back(b1);
    t_f16.push_back(f2);
    t_b16.push_back(b2);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double gemm_flops = 2.0 * kRows * kIn * kOut;
  const double t_sgemm = median(t_gemm);
  std::printf("openblas sgemm  %8.3f ms  %7.1f GFLOP/s\n", t_sgemm * 1e3,
              gemm_flops / t_sgemm * 1e-9);
  const double flops = fk::LoraLinearForwardFlops(kRows, kIn, kOut, kRank) +
                       fk::LoraLinearBackwardFlops(kRows, kIn, kOut, kRank);
  for (bool bf16 : {false, true}) {
    const double t_f = median(bf16 ? t_f16 : t_f32), t_b = median(bf16 ? t_b16 : t_b32);
    std::printf(
        "lora %s fwd %8.3f ms  bwd %8.3f ms  fwd+bwd %7.1f GFLOP/s  overhead vs 2 sgemm %.2fx\n",
        bf16 ? "bf16 W" : "fp32 W", t_f * 1e3, t_b * 1e3, flops / (t_f + t_b) * 1e-9,
        (t_f + t_b) / (2 * t_sgemm));
  }
  return 0;
}
