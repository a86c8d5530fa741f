// The forward product of a frozen Q8_0 weight, y = x W^T, three ways at SmolLM2-135M's shapes
// (1024 tokens): int8 math (AVX512-VNNI, kernels/gemm.h), the exact path (W dequantized panel by
// panel, OpenBLAS sgemm) and, as the baseline, OpenBLAS sgemm on an fp32 W of the same shape,
// all in the same run with the same threads. Validates int8 math against the exact product first.
//
//   kernels_gemm_int8_bench [threads] [iterations]
//
// Prints GFLOP/s (2 m n k per product) and the ratios against the sgemm in the same run.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "core/ggml_quant.h"
#include "kernels/base/context.h"
#include "kernels/gemm.h"
#include "kernels/threads.h"

namespace fk = fedlora::kernels;
using fedlora::bench::Check;
using fedlora::bench::MedianSeconds;
using fedlora::bench::Random;

int main(int argc, char** argv) {
  fk::RestartForFasterOpenBlas(argv);
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 10;
  fk::SetNumThreads(threads);
  const fk::ExecContext ctx;
  std::printf("threads %d, iterations %d, int8 math available: %s, OpenBLAS core %s\n",
              fk::NumThreads(), iters, fk::Int8MathAvailable() ? "yes" : "no",
              fk::OpenBlasCoreName().c_str());
  std::printf(
      "| m x n x k | sgemm fp32 W GFLOP/s | exact Q8_0 GFLOP/s | int8 math GFLOP/s | int8 / sgemm "
      "| int8 / exact "
      "| max rel. error |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  struct Shape {
    int64_t m, n, k;
  };
  // Attention projections, FFN gate/up, FFN down.
  for (const Shape& s : {Shape{1024, 576, 576}, Shape{1024, 1536, 576}, Shape{1024, 576, 1536}}) {
    const auto x = Random(s.m * s.k, 1), wf = Random(s.n * s.k, 2);
    std::vector<uint8_t> wq(s.n * *fedlora::GgmlRowBytes(fedlora::GgmlType::kQ8_0, s.k));
    Check(fedlora::QuantizeRowsQ8_0(wf.data(), s.n, s.k, wq.data()), "quantize");
    std::vector<float> y_sgemm(s.m * s.n), y_exact(s.m * s.n), y_int8(s.m * s.n);
    fk::GemmArgs exact{.trans_b = true,
                       .m = s.m,
                       .n = s.n,
                       .k = s.k,
                       .a = x.data(),
                       .b_quant = wq.data(),
                       .b_quant_type = fedlora::GgmlType::kQ8_0,
                       .c = y_exact.data()};
    fk::GemmArgs int8 = exact;
    int8.int8_math = true;
    int8.c = y_int8.data();
    std::vector<float> ws(
        std::max(fk::GemmWorkspaceBytes(exact), fk::GemmWorkspaceBytes(int8)) / 4 + 1);
    for (fk::GemmArgs* g : {&exact, &int8}) {
      g->workspace = ws.data();
      g->workspace_bytes = ws.size() * 4;
    }
    const double t_sgemm = MedianSeconds(iters, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.n, s.k, 1.0f, x.data(), s.k,
                  wf.data(), s.k, 0.0f, y_sgemm.data(), s.n);
    });
    const double t_exact = MedianSeconds(iters, [&] { Check(fk::Gemm(ctx, exact), "exact"); });
    const double t_int8 = MedianSeconds(iters, [&] { Check(fk::Gemm(ctx, int8), "int8"); });
    // Validation: int8 math within int8 rounding of the exact product (relative to the row scale).
    double worst = 0.0;
    for (int64_t r = 0; r < s.m; ++r) {
      double scale = 0.0;
      for (int64_t j = 0; j < s.n; ++j)
        scale = std::max(scale, std::fabs(static_cast<double>(y_exact[r * s.n + j])));
      for (int64_t j = 0; j < s.n; ++j) {
        worst = std::max(
            worst,
            std::fabs(static_cast<double>(y_int8[r * s.n + j]) - y_exact[r * s.n + j]) / scale);
      }
    }
    if (!(worst < 0.05)) {
      std::fprintf(stderr,
                   "int8 math is %.3g (relative to the row's largest) from the exact product\n",
                   worst);
      return 1;
    }
    const double flop = 2.0 * s.m * s.n * s.k;
    std::printf("| %lld x %lld x %lld | %.1f | %.1f | %.1f | %.2f | %.2f | %.1e |\n",
                static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k), flop / t_sgemm * 1e-9, flop / t_exact * 1e-9,
                flop / t_int8 * 1e-9, t_sgemm / t_int8, t_exact / t_int8, worst);
  }
  return 0;
}
