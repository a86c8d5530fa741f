#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/ggml_quant.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/base/context.h"
#include "kernels/base/device.h"
#include "kernels/threads.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::AllClose;
using testing::Cpu;
using testing::Guarded;
using testing::Random;

// Double-precision reference for one (possibly transposed, padded) product.
std::vector<float> NaiveGemm(const GemmArgs& g, const std::vector<float>& c0) {
  const int64_t lda = g.lda ? g.lda : (g.trans_a ? g.m : g.k),
                ldb = g.ldb ? g.ldb : (g.trans_b ? g.k : g.n), ldc = g.ldc ? g.ldc : g.n;
  std::vector<float> c = c0;
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double a = g.trans_a ? g.a[p * lda + i] : g.a[i * lda + p];
        const double b = g.trans_b ? g.b[j * ldb + p] : g.b[p * ldb + j];
        s += a * b;
      }
      c[i * ldc + j] =
          static_cast<float>(g.alpha * s + (g.beta == 0.0f ? 0.0 : g.beta * c0[i * ldc + j]));
    }
  }
  return c;
}

TEST(Gemm, SmallIntegersExact) {
  // [1 2 3; 4 5 6] x [1 0; 0 1; 2 -1] = [7 -1; 16 -1]
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {1, 0, 0, 1, 2, -1};
  Guarded c(4);
  ASSERT_TRUE(
      Gemm(Cpu(), GemmArgs{.m = 2, .n = 2, .k = 3, .a = a.data(), .b = b.data(), .c = c.data()})
          .ok());
  EXPECT_EQ(c.values(), (std::vector<float>{7, -1, 16, -1}));
  EXPECT_TRUE(c.GuardsIntact());
  // Transposed A (stored [3, 2]) and B (stored [2, 3]): A^T B^T with A^T = [1 3 5; 2 4 6].
  const std::vector<float> at = {1, 2, 3, 4, 5, 6}, bt = {1, 0, 2, 0, 1, -1};
  Guarded d(4, 1.0f);
  ASSERT_TRUE(Gemm(Cpu(), GemmArgs{.trans_a = true,
                                   .trans_b = true,
                                   .m = 2,
                                   .n = 2,
                                   .k = 3,
                                   .alpha = 2.0f,
                                   .beta = 1.0f,
                                   .a = at.data(),
                                   .b = bt.data(),
                                   .c = d.data()})
                  .ok());
  // A^T B = [1+10, 3-5; 2+12, 4-6] = [11 -2; 14 -2]; 2x + 1
  EXPECT_EQ(d.values(), (std::vector<float>{23, -3, 29, -3}));
  EXPECT_TRUE(d.GuardsIntact());
}

TEST(Gemm, TransposesPaddingAlphaBetaMatchReference) {
  const int64_t m = 13, n = 7, k = 9;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5;
      const auto a = Random((ta ? k : m) * lda, 1), b = Random((tb ? n : k) * ldb, 2),
                 c0 = Random(m * ldc, 3);
      GemmArgs g{.trans_a = ta,
                 .trans_b = tb,
                 .m = m,
                 .n = n,
                 .k = k,
                 .alpha = 0.5f,
                 .beta = -1.5f,
                 .a = a.data(),
                 .lda = lda,
                 .b = b.data(),
                 .ldb = ldb,
                 .ldc = ldc};
      const auto want = NaiveGemm(g, c0);
      Guarded c(c0);
      g.c = c.data();
      ASSERT_TRUE(Gemm(Cpu(), g).ok());
      // fp32 sums of 9 products of O(1) values: errors ~1e-6; 1e-5 leaves margin.
      EXPECT_TRUE(AllClose(c.values(), want, 1e-5, 1e-5)) << "ta=" << ta << " tb=" << tb;
      EXPECT_TRUE(c.GuardsIntact());
    }
  }
}

// LoRA's thin shapes (k or n = rank), large enough that BLAS takes its blocked paths, against
// the double reference, for every transpose and beta.
TEST(Gemm, ThinShapesMatchReference) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{300, 1100, 8}, Shape{300, 8, 1100}, Shape{700, 16, 1030}, Shape{5, 3, 1}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const int64_t lda = (ta ? s.m : s.k) + 1, ldb = (tb ? s.k : s.n) + 3, ldc = s.n + 2;
        const auto a = Random((ta ? s.k : s.m) * lda, 8), b = Random((tb ? s.n : s.k) * ldb, 9),
                   c0 = Random(s.m * ldc, 10);
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          GemmArgs g{.trans_a = ta,
                     .trans_b = tb,
                     .m = s.m,
                     .n = s.n,
                     .k = s.k,
                     .alpha = 1.5f,
                     .beta = beta,
                     .a = a.data(),
                     .lda = lda,
                     .b = b.data(),
                     .ldb = ldb,
                     .ldc = ldc};
          const auto want = NaiveGemm(g, c0);
          Guarded c(c0);
          g.c = c.data();
          ASSERT_TRUE(Gemm(Cpu(), g).ok());
          // Depth up to 1100 of O(1) terms: fp32 rounding ~1100 * 6e-8 * 30 ~ 2e-3 worst case;
          // observed errors are ~1e-5. 1e-3 absolute + 1e-4 relative.
          EXPECT_TRUE(AllClose(c.values(), want, 1e-3, 1e-4))
              << "m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta << " tb=" << tb
              << " beta=" << beta;
          EXPECT_TRUE(c.GuardsIntact());
        }
      }
    }
  }
}

TEST(Gemm, StridedBatchAndBroadcast) {
  const int64_t batch = 3, m = 4, n = 5, k = 6;
  const auto a = Random(batch * m * k, 4), b = Random(k * n, 5);
  Guarded c(batch * m * n);
  // stride_b = 0: one B for every batch entry.
  ASSERT_TRUE(Gemm(Cpu(), GemmArgs{.m = m,
                                   .n = n,
                                   .k = k,
                                   .a = a.data(),
                                   .b = b.data(),
                                   .c = c.data(),
                                   .batch = batch,
                                   .stride_a = m * k,
                                   .stride_b = 0,
                                   .stride_c = m * n})
                  .ok());
  for (int64_t i = 0; i < batch; ++i) {
    std::vector<float> ai(a.begin() + i * m * k, a.begin() + (i + 1) * m * k);
    const auto want = NaiveGemm(GemmArgs{.m = m, .n = n, .k = k, .a = ai.data(), .b = b.data()},
                                std::vector<float>(m * n));
    EXPECT_TRUE(AllClose(c.data() + i * m * n, want.data(), m * n, 1e-5, 1e-5)) << "batch " << i;
  }
  EXPECT_TRUE(c.GuardsIntact());
}

TEST(Gemm, ZeroKAppliesBeta) {
  Guarded c(std::vector<float>{1, 2, 3, 4});
  ASSERT_TRUE(Gemm(Cpu(), GemmArgs{.m = 2, .n = 2, .k = 0, .beta = 3.0f, .c = c.data()}).ok());
  EXPECT_EQ(c.values(), (std::vector<float>{3, 6, 9, 12}));
}

// bf16 weights whose values are exactly representable: the panelled bf16 GEMM must equal the
// fp32 GEMM on the same values (up to summation order across k panels).
std::vector<uint16_t> ToBf16Exact(std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    u &= 0xffff0000u;  // truncate to a bf16 value, then use that value on both sides
    std::memcpy(&v[i], &u, 4);
    bits[i] = static_cast<uint16_t>(u >> 16);
  }
  return bits;
}

TEST(Gemm, Bf16WeightMatchesFp32AcrossPanels) {
  // 600 stored rows > kGemmBf16PanelRows, so the minimum workspace forces 3 panels.
  for (bool tb : {true, false}) {
    const int64_t m = 5, n = tb ? 600 : 17, k = tb ? 19 : 600;
    auto b = Random(n * k, 6);
    const auto bits = ToBf16Exact(b);
    const auto a = Random(m * k, 7);
    GemmArgs g{.trans_b = tb, .m = m, .n = n, .k = k, .a = a.data(), .b = b.data()};
    const auto want = NaiveGemm(g, std::vector<float>(m * n));
    g.b = nullptr;
    g.b_bf16 = bits.data();
    const size_t ws_bytes = GemmWorkspaceBytes(g);
    EXPECT_EQ(ws_bytes, static_cast<size_t>(kGemmBf16PanelRows * (tb ? k : n) * 4));
    std::vector<float> ws(ws_bytes / 4);
    g.workspace = ws.data();
    g.workspace_bytes = ws_bytes;
    Guarded c(m * n);
    g.c = c.data();
    ASSERT_TRUE(Gemm(Cpu(), g).ok());
    // k = 600 sums: fp32 rounding ~600 * 6e-8 * |terms|; 1e-4 absolute covers it.
    EXPECT_TRUE(AllClose(c.values(), want, 1e-4, 1e-5)) << "trans_b=" << tb;
    EXPECT_TRUE(c.GuardsIntact());
  }
}

TEST(Gemm, QuantizedWeightMatchesFp32OnItsValuesAcrossPanels) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    for (bool tb : {true, false}) {
      // 600 stored rows of 64 elements (2 blocks): three panels at the minimum workspace.
      const int64_t m = 5, n = tb ? 600 : 64, k = tb ? 64 : 600;
      std::vector<float> b;
      const auto q = testing::RandomQuantMatrix(type, tb ? n : k, tb ? k : n, 8, &b);
      const auto a = Random(m * k, 9);
      const auto want =
          NaiveGemm(GemmArgs{.trans_b = tb, .m = m, .n = n, .k = k, .a = a.data(), .b = b.data()},
                    std::vector<float>(m * n));
      GemmArgs g{.trans_b = tb,
                 .m = m,
                 .n = n,
                 .k = k,
                 .a = a.data(),
                 .b_quant = q.data(),
                 .b_quant_type = type};
      const size_t ws_bytes = GemmWorkspaceBytes(g);
      EXPECT_EQ(ws_bytes, static_cast<size_t>(kGemmBf16PanelRows * (tb ? k : n) * 4));
      std::vector<float> ws(ws_bytes / 4);
      g.workspace = ws.data();
      g.workspace_bytes = ws_bytes;
      Guarded c(m * n);
      g.c = c.data();
      ASSERT_TRUE(Gemm(Cpu(), g).ok());
      EXPECT_TRUE(AllClose(c.values(), want, 1e-4, 1e-5))
          << GgmlTypeName(type) << " trans_b=" << tb;
      EXPECT_TRUE(c.GuardsIntact());
    }
  }
}

TEST(Gemm, RefusesQuantizedWeightsItCannotRead) {
  std::vector<float> a(64 * 2), c(4), ws(64 * 2);
  std::vector<uint8_t> q(4 * 40);
  GemmArgs g{.trans_b = true,
             .m = 2,
             .n = 2,
             .k = 48,
             .a = a.data(),
             .b_quant = q.data(),
             .b_quant_type = GgmlType::kQ4_1,
             .c = c.data(),
             .workspace = ws.data(),
             .workspace_bytes = ws.size() * 4};
  absl::Status st = Gemm(Cpu(), g);  // 48 is not a whole number of 32-element blocks
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  g.k = 64;
  g.ldb = 65;  // quantized rows are packed
  EXPECT_EQ(Gemm(Cpu(), g).code(), absl::StatusCode::kInvalidArgument);
  g.ldb = 0;
  g.b_quant_type = GgmlType::kIQ2_XXS;
  st = Gemm(Cpu(), g);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  g.b_quant_type = GgmlType::kQ4_1;
  EXPECT_TRUE(Gemm(Cpu(), g).ok());
}

// bf16 math: A rounded to bf16 (nearest even), times the bf16 B, accumulated in fp32. The
// reference rounds A the same way (core/tensor.h's F32ToBF16) and sums the exact products in
// double, so only the fp32 accumulation separates the two.
std::vector<float> RoundedToBf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = BF16ToF32(F32ToBF16(v[i]));
  return out;
}

TEST(GemmBf16Math, MatchesTheProductOfTheRoundedOperands) {
  if (!Bf16MathAvailable()) GTEST_SKIP() << "this CPU has no bf16 dot products (AVX512_BF16)";
  struct Case {
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
  };
  // The model's shapes (forward x W^T, input gradient dy W) and padded, scaled, transposed variants.
  for (const Case& cs : {Case{false, true, 64, 96, 80, 0, 0, 0, 1.0f, 0.0f},
                         Case{false, false, 64, 80, 96, 0, 0, 0, 1.0f, 1.0f},
                         Case{false, true, 7, 33, 129, 131, 130, 40, 0.5f, 0.0f},
                         Case{true, false, 9, 17, 31, 12, 20, 0, 2.0f, -1.0f}}) {
    const int64_t lda = cs.lda ? cs.lda : (cs.ta ? cs.m : cs.k),
                  ldb = cs.ldb ? cs.ldb : (cs.tb ? cs.k : cs.n), ldc = cs.ldc ? cs.ldc : cs.n;
    const auto a = Random((cs.ta ? cs.k : cs.m) * lda, 21);
    auto b = Random((cs.tb ? cs.n : cs.k) * ldb, 22);
    const auto bits = ToBf16Exact(b);
    const auto c0 = Random(cs.m * ldc, 23);
    const auto a_rounded = RoundedToBf16(a);
    GemmArgs g{.trans_a = cs.ta,
               .trans_b = cs.tb,
               .m = cs.m,
               .n = cs.n,
               .k = cs.k,
               .alpha = cs.alpha,
               .beta = cs.beta,
               .a = a_rounded.data(),
               .lda = cs.lda,
               .b = b.data(),
               .ldb = cs.ldb,
               .ldc = cs.ldc};
    auto want = NaiveGemm(g, c0);
    g.a = a.data();
    g.b = nullptr;
    g.b_bf16 = bits.data();
    g.bf16_math = true;
    const size_t ws_bytes = GemmWorkspaceBytes(g);
    EXPECT_GE(ws_bytes, static_cast<size_t>(cs.m * cs.k * 2));
    std::vector<float> ws(ws_bytes / 4 + 1);
    g.workspace = ws.data();
    g.workspace_bytes = ws_bytes;
    // beta == 0 must ignore what C held: poison it (the padding columns must stay as they were).
    std::vector<float> c_init = c0;
    for (int64_t i = 0; i < cs.m && cs.beta == 0.0f; ++i)
      std::fill_n(c_init.begin() + i * ldc, cs.n, std::nanf(""));
    Guarded c(c_init);
    g.c = c.data();
    ASSERT_TRUE(Gemm(Cpu(), g).ok()) << cs.m << "x" << cs.n << "x" << cs.k;
    // Exact bf16 products summed in fp32 over up to 129 terms of magnitude <= 1.
    EXPECT_TRUE(AllClose(c.values(), want, 2e-5, 1e-5)) << cs.m << "x" << cs.n << "x" << cs.k;
    EXPECT_TRUE(c.GuardsIntact());
  }
}

TEST(GemmBf16Math, StaysWithinBf16RoundingOfTheFp32Product) {
  if (!Bf16MathAvailable()) GTEST_SKIP() << "this CPU has no bf16 dot products (AVX512_BF16)";
  const int64_t m = 32, n = 48, k = 256;
  const auto a = Random(m * k, 31);
  auto b = Random(n * k, 32);
  const auto bits = ToBf16Exact(b);
  GemmArgs g{.trans_b = true, .m = m, .n = n, .k = k, .a = a.data(), .b = b.data()};
  const auto fp32 = NaiveGemm(g, std::vector<float>(m * n));
  g.b = nullptr;
  g.b_bf16 = bits.data();
  g.bf16_math = true;
  std::vector<float> ws(GemmWorkspaceBytes(g) / 4);
  g.workspace = ws.data();
  g.workspace_bytes = ws.size() * 4;
  std::vector<float> c(m * n);
  g.c = c.data();
  ASSERT_TRUE(Gemm(Cpu(), g).ok());
  // Each a rounded by up to 2^-9 relative: a sum of 256 terms of |a b| <= 1 moves by about
  // 2^-9 * sqrt(256) * E|ab| ~ 0.01; and it must move at all, or A was not rounded.
  double worst = 0.0;
  for (size_t i = 0; i < c.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(c[i]) - fp32[i]));
  EXPECT_LT(worst, 0.05);
  EXPECT_GT(worst, 1e-5);
}

TEST(GemmBf16Math, RunsTheExactFp32PathWhereBf16IsUnavailable) {
  const int64_t m = 6, n = 40, k = 300;
  const auto a = Random(m * k, 41);
  auto b = Random(n * k, 42);
  const auto bits = ToBf16Exact(b);
  internal::SetBf16MathAllowedForTesting(false);
  EXPECT_FALSE(Bf16MathAvailable());
  GemmArgs g{.trans_b = true,
             .m = m,
             .n = n,
             .k = k,
             .a = a.data(),
             .b_bf16 = bits.data(),
             .bf16_math = true};
  const size_t ws_bytes = GemmWorkspaceBytes(g);
  // The fp32 panel (n * k * 4 = 48000 bytes) is smaller than what CUDA's bf16 math needs:
  // cuBLASLt's 4 MiB, A as bf16 (6 * 300 * 2 = 3600, rounded up to 3840) and 256 for alignment.
  EXPECT_EQ(ws_bytes, static_cast<size_t>((4 << 20) + 3840 + 256));
  std::vector<float> ws(ws_bytes / 4), c(m * n), want(m * n);
  g.workspace = ws.data();
  g.workspace_bytes = ws_bytes;
  g.c = c.data();
  ASSERT_TRUE(Gemm(Cpu(), g).ok());
  GemmArgs plain = g;
  plain.bf16_math = false;
  plain.c = want.data();
  ASSERT_TRUE(Gemm(Cpu(), plain).ok());
  internal::SetBf16MathAllowedForTesting(true);
  EXPECT_EQ(c, want);
}

TEST(GemmBf16Math, AppliesToBf16WeightsOnly) {
  std::vector<float> a(6), b(6), c(4);
  GemmArgs g{
      .m = 2, .n = 2, .k = 3, .a = a.data(), .b = b.data(), .c = c.data(), .bf16_math = true};
  const absl::Status st = Gemm(Cpu(), g);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("bf16_math"), std::string::npos) << st;
}

TEST(GemmBf16Math, WorkspaceCoversTheCudaBf16Copies) {
  std::vector<float> a(1), b(1);
  // fp32 B [k, n] = [70, 50], A [m, k] = [30, 70]: 4 MiB for cuBLASLt, A as bf16 (4200 bytes ->
  // 4352), B as bf16 (7000 -> 7168), 256 for aligning the base.
  GemmArgs g{.m = 30, .n = 50, .k = 70, .a = a.data(), .b = b.data(), .bf16_math = true};
  EXPECT_EQ(GemmWorkspaceBytes(g), static_cast<size_t>((4 << 20) + 4352 + 7168 + 256));
  const internal::CudaBf16MathLayout l = internal::CudaBf16MathWorkspace(g);
  EXPECT_EQ(l.a_offset, kGemmCublasLtWorkspaceBytes);
  EXPECT_EQ(l.b_offset, kGemmCublasLtWorkspaceBytes + 4352);
  // Batch 3 with a broadcast B: three copies of A, one of B.
  GemmArgs batched = g;
  batched.batch = 3;
  batched.stride_a = 30 * 70;
  batched.stride_c = 30 * 50;
  EXPECT_EQ(GemmWorkspaceBytes(batched),
            static_cast<size_t>((4 << 20) + 12800 + 7168 + 256));  // 12600 -> 12800
  // A bf16 B is multiplied in place: no copy of it (the CPU's fp32 panel, 70 * 50 * 4 bytes, is
  // smaller).
  std::vector<uint16_t> bits(1);
  GemmArgs bf16 = g;
  bf16.b = nullptr;
  bf16.b_bf16 = bits.data();
  EXPECT_EQ(GemmWorkspaceBytes(bf16), static_cast<size_t>((4 << 20) + 4352 + 256));
  // A quantized B [n, k] = [50, 64] (trans_b) is dequantized to bf16: 50 * 64 * 2 = 6400 bytes.
  std::vector<uint8_t> q(1);
  GemmArgs quant{.trans_b = true,
                 .m = 30,
                 .n = 50,
                 .k = 64,
                 .a = a.data(),
                 .b_quant = q.data(),
                 .b_quant_type = GgmlType::kQ8_0,
                 .bf16_math = true};
  EXPECT_EQ(GemmWorkspaceBytes(quant),
            static_cast<size_t>((4 << 20) + 3840 + 6400 + 256));  // 3840 = 30 * 64 * 2
  // An empty product needs none; without bf16 math an fp32 B needs none.
  GemmArgs empty = g;
  empty.k = 0;
  EXPECT_EQ(GemmWorkspaceBytes(empty), 0u);
  g.bf16_math = false;
  EXPECT_EQ(GemmWorkspaceBytes(g), 0u);
}

TEST(GemmBf16Math, RefusesATooSmallWorkspace) {
  const int64_t m = 4, n = 8, k = 16;
  std::vector<float> a(m * k), c(m * n), ws(1024);
  std::vector<uint16_t> bits(n * k);
  GemmArgs g{.trans_b = true,
             .m = m,
             .n = n,
             .k = k,
             .a = a.data(),
             .b_bf16 = bits.data(),
             .c = c.data(),
             .bf16_math = true,
             .workspace = ws.data(),
             .workspace_bytes = ws.size() * 4};
  const absl::Status st = Gemm(Cpu(), g);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("bf16 B needs a workspace of"), std::string::npos) << st;
}

// int8 math, computed here as kernels/gemm.h defines it: A quantized per block of 32, exact int
// block dots, blocks summed in order with one fma each, then alpha and beta.
std::vector<float> Int8MathReference(const GemmArgs& g, const std::vector<float>& a,
                                     const std::vector<uint8_t>& w, const std::vector<float>& c0) {
  const int64_t kb = g.k / 32, lda = g.lda ? g.lda : g.k, ldc = g.ldc ? g.ldc : g.n;
  std::vector<float> c = c0;
  std::vector<BlockQ8_0> wb(static_cast<size_t>(g.n * kb));
  std::memcpy(wb.data(), w.data(), wb.size() * sizeof(BlockQ8_0));
  for (int64_t r = 0; r < g.m; ++r) {
    std::vector<int> q(g.k);
    std::vector<float> d(kb);
    for (int64_t b = 0; b < kb; ++b) {
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(a[r * lda + b * 32 + i]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      d[b] = amax / 127.0f;
      for (int i = 0; i < 32; ++i)
        q[b * 32 + i] = static_cast<int>(std::nearbyint(a[r * lda + b * 32 + i] * inv));
    }
    for (int64_t j = 0; j < g.n; ++j) {
      float acc = 0.0f;
      for (int64_t b = 0; b < kb; ++b) {
        const BlockQ8_0& blk = wb[j * kb + b];
        int dot = 0;
        for (int i = 0; i < 32; ++i) dot += q[b * 32 + i] * blk.qs[i];
        const float s = F16ToF32(blk.d) * d[b];
        acc = std::fma(static_cast<float>(dot), s, acc);
      }
      const float out = g.alpha * acc;
      c[r * ldc + j] = g.beta == 0.0f ? out : out + g.beta * c0[r * ldc + j];
    }
  }
  return c;
}

GemmArgs Int8Args(int64_t m, int64_t n, int64_t k, const std::vector<float>& a,
                  const std::vector<uint8_t>& w) {
  return GemmArgs{.trans_b = true,
                  .m = m,
                  .n = n,
                  .k = k,
                  .a = a.data(),
                  .b_quant = w.data(),
                  .b_quant_type = GgmlType::kQ8_0,
                  .int8_math = true};
}

TEST(GemmInt8Math, MatchesItsDefinitionBitForBit) {
  if (!Int8MathAvailable()) GTEST_SKIP() << "this CPU has no int8 dot products (AVX512-VNNI)";
  struct Case {
    int64_t m, n, k, lda, ldc;
    float alpha, beta;
  };
  // Row tails (not a multiple of 4), column tails (not a multiple of 16 or 32), several chunks of
  // 256 columns, padded A and C, alpha and beta.
  for (const Case& cs : {Case{37, 45, 96, 0, 0, 1.0f, 0.0f}, Case{34, 300, 64, 0, 0, 1.0f, 1.0f},
                         Case{64, 32, 576, 580, 40, 0.5f, -1.0f}, Case{33, 7, 32, 0, 0, 2.0f, 0.0f},
                         Case{130, 600, 128, 0, 0, 1.0f, 0.0f}}) {
    const int64_t lda = cs.lda ? cs.lda : cs.k, ldc = cs.ldc ? cs.ldc : cs.n;
    auto a = Random(cs.m * lda, 51);
    a[0] = 0.0f;  // an exact zero, and an all-zero block when k allows it
    if (cs.m > 1 && cs.k >= 64) std::fill_n(a.begin() + lda + 32, 32, 0.0f);
    const auto wf = Random(cs.n * cs.k, 52);
    std::vector<uint8_t> w(cs.n * *GgmlRowBytes(GgmlType::kQ8_0, cs.k));
    ASSERT_TRUE(QuantizeRowsQ8_0(wf.data(), cs.n, cs.k, w.data()).ok());
    const auto c0 = Random(cs.m * ldc, 53);
    GemmArgs g = Int8Args(cs.m, cs.n, cs.k, a, w);
    g.lda = cs.lda;
    g.ldc = cs.ldc;
    g.alpha = cs.alpha;
    g.beta = cs.beta;
    const auto want = Int8MathReference(g, a, w, c0);
    const size_t ws_bytes = GemmWorkspaceBytes(g);
    EXPECT_GE(ws_bytes, static_cast<size_t>(cs.m * cs.k));  // A quantized
    std::vector<float> ws(ws_bytes / 4 + 1);
    g.workspace = ws.data();
    g.workspace_bytes = ws_bytes;
    std::vector<float> c_init = c0;
    for (int64_t i = 0; i < cs.m && cs.beta == 0.0f; ++i)
      std::fill_n(c_init.begin() + i * ldc, cs.n, std::nanf(""));
    Guarded c(c_init);
    g.c = c.data();
    ASSERT_TRUE(Gemm(Cpu(), g).ok()) << cs.m << "x" << cs.n << "x" << cs.k;
    ASSERT_EQ(c.values().size(), want.size());
    EXPECT_EQ(std::memcmp(c.values().data(), want.data(), want.size() * sizeof(float)), 0)
        << cs.m << "x" << cs.n << "x" << cs.k;
    EXPECT_TRUE(c.GuardsIntact());
  }
}

TEST(GemmInt8Math, StaysWithinInt8RoundingOfTheFp32Product) {
  if (!Int8MathAvailable()) GTEST_SKIP() << "this CPU has no int8 dot products (AVX512-VNNI)";
  const int64_t m = 32, n = 48, k = 256;
  const auto a = Random(m * k, 61), wf = Random(n * k, 62);
  std::vector<uint8_t> w(n * *GgmlRowBytes(GgmlType::kQ8_0, k));
  ASSERT_TRUE(QuantizeRowsQ8_0(wf.data(), n, k, w.data()).ok());
  std::vector<float> wd(n * k);  // the weight the exact path multiplies with
  ASSERT_TRUE(DequantizeRows(GgmlType::kQ8_0, w.data(), n, k, wd.data(), k).ok());
  GemmArgs g{.trans_b = true, .m = m, .n = n, .k = k, .a = a.data(), .b = wd.data()};
  const auto fp32 = NaiveGemm(g, std::vector<float>(m * n));
  g = Int8Args(m, n, k, a, w);
  std::vector<float> ws(GemmWorkspaceBytes(g) / 4 + 1), c(m * n);
  g.workspace = ws.data();
  g.workspace_bytes = ws.size() * 4;
  g.c = c.data();
  ASSERT_TRUE(Gemm(Cpu(), g).ok());
  // Each a moves by up to half a step (max|a| / 254 per block): with |a|, |w| <= 1 over 256 terms
  // a sum of independent errors of about sqrt(256) / 254 / sqrt(3) ~ 0.04 at most a few times that.
  double worst = 0.0, moved = 0.0;
  for (int64_t i = 0; i < m * n; ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(c[i]) - fp32[i]));
    moved += c[i] != fp32[i];
  }
  EXPECT_LT(worst, 0.15);
  EXPECT_GT(moved, m * n / 2);  // int8 math ran: most results differ from the exact product
}

TEST(GemmInt8Math, SameBitsAtEveryWidth) {
  if (!Int8MathAvailable()) GTEST_SKIP() << "this CPU has no int8 dot products (AVX512-VNNI)";
  const int64_t m = 203, n = 576, k = 576;  // SmolLM2's attention projection, odd rows
  const auto a = Random(m * k, 71), wf = Random(n * k, 72);
  std::vector<uint8_t> w(n * *GgmlRowBytes(GgmlType::kQ8_0, k));
  ASSERT_TRUE(QuantizeRowsQ8_0(wf.data(), n, k, w.data()).ok());
  ThreadPool pool(4);
  auto run = [&](int width) {
    pool.SetWidth(width);
    GemmArgs g = Int8Args(m, n, k, a, w);
    std::vector<float> ws(GemmWorkspaceBytes(g) / 4 + 1), c(m * n);
    g.workspace = ws.data();
    g.workspace_bytes = ws.size() * 4;
    g.c = c.data();
    EXPECT_TRUE(Gemm(ExecContext{.pool = &pool}, g).ok());
    return c;
  };
  const auto want = run(1);
  for (int width : {2, 3, 4}) EXPECT_EQ(run(width), want) << "width " << width;
}

TEST(GemmInt8Math, NonFiniteInputsReachTheOutput) {
  if (!Int8MathAvailable()) GTEST_SKIP() << "this CPU has no int8 dot products (AVX512-VNNI)";
  const int64_t m = 35, n = 16, k = 64;
  auto a = Random(m * k, 81);
  a[5] = std::nanf("");                                // row 0
  a[k + 40] = std::numeric_limits<float>::infinity();  // row 1
  const auto wf = Random(n * k, 82);
  std::vector<uint8_t> w(n * *GgmlRowBytes(GgmlType::kQ8_0, k));
  ASSERT_TRUE(QuantizeRowsQ8_0(wf.data(), n, k, w.data()).ok());
  GemmArgs g = Int8Args(m, n, k, a, w);
  std::vector<float> ws(GemmWorkspaceBytes(g) / 4 + 1), c(m * n);
  g.workspace = ws.data();
  g.workspace_bytes = ws.size() * 4;
  g.c = c.data();
  ASSERT_TRUE(Gemm(Cpu(), g).ok());
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_TRUE(std::isnan(c[j])) << j;
    EXPECT_TRUE(std::isnan(c[n + j])) << j;
    for (int64_t r = 2; r < m; ++r) EXPECT_TRUE(std::isfinite(c[r * n + j])) << r << " " << j;
  }
}

TEST(GemmInt8Math, RunsTheExactPathElsewhere) {
  const int64_t m = 40, n = 40, k = 64;
  const auto a = Random(m * k, 91), dy = Random(m * n, 93), wf = Random(n * k, 92);
  std::vector<uint8_t> w(n * *GgmlRowBytes(GgmlType::kQ8_0, k));
  ASSERT_TRUE(QuantizeRowsQ8_0(wf.data(), n, k, w.data()).ok());
  auto run = [&](GemmArgs g, bool int8) {
    g.int8_math = int8;
    std::vector<float> ws(GemmWorkspaceBytes(g) / 4 + 1), c(g.m * g.n);
    g.workspace = ws.data();
    g.workspace_bytes = ws.size() * 4;
    g.c = c.data();
    EXPECT_TRUE(Gemm(Cpu(), g).ok());
    return c;
  };
  // Fewer than kGemmInt8MinRows rows (generation) run exactly.
  const GemmArgs few = Int8Args(kGemmInt8MinRows - 1, n, k, a, w);
  EXPECT_EQ(run(few, true), run(few, false));
  // The input gradient dy W (no trans_b) is exact whatever int8_math says.
  const GemmArgs backward{
      .m = m, .n = k, .k = n, .a = dy.data(), .b_quant = w.data(), .b_quant_type = GgmlType::kQ8_0};
  EXPECT_EQ(run(backward, true), run(backward, false));
  // Without VNNI (or when tests turn it off) the forward product is exact too.
  internal::SetInt8MathAllowedForTesting(false);
  EXPECT_FALSE(Int8MathAvailable());
  const GemmArgs forward = Int8Args(m, n, k, a, w);
  EXPECT_EQ(GemmWorkspaceBytes(forward), static_cast<size_t>(n * k * 4));  // the fp32 panel only
  const auto off = run(forward, true);
  EXPECT_EQ(off, run(forward, false));
  internal::SetInt8MathAllowedForTesting(true);
  if (Int8MathAvailable()) {
    EXPECT_NE(run(forward, true), off);
  }
}

TEST(GemmInt8Math, AppliesToQ8_0WeightsOnly) {
  std::vector<float> a(64), c(4);
  std::vector<uint8_t> w(2 * *GgmlRowBytes(GgmlType::kQ4_0, 32));
  GemmArgs g{.trans_b = true,
             .m = 2,
             .n = 2,
             .k = 32,
             .a = a.data(),
             .b_quant = w.data(),
             .b_quant_type = GgmlType::kQ4_0,
             .c = c.data(),
             .int8_math = true};
  std::vector<float> ws(GemmWorkspaceBytes(g) / 4 + 1);
  g.workspace = ws.data();
  g.workspace_bytes = ws.size() * 4;
  absl::Status st = Gemm(Cpu(), g);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("int8_math applies to a Q8_0 B only"), std::string::npos) << st;
  std::vector<float> b(64);
  GemmArgs f32{.trans_b = true,
               .m = 2,
               .n = 2,
               .k = 32,
               .a = a.data(),
               .b = b.data(),
               .c = c.data(),
               .int8_math = true};
  st = Gemm(Cpu(), f32);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

TEST(Gemm, RejectsBadArguments) {
  std::vector<float> a(6), b(6), c(4);
  GemmArgs ok{.m = 2, .n = 2, .k = 3, .a = a.data(), .b = b.data(), .c = c.data()};
  EXPECT_TRUE(CanRun(Cpu(), ok).ok());
  GemmArgs bad = ok;
  bad.lda = 2;  // < k
  EXPECT_EQ(Gemm(Cpu(), bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.c = nullptr;
  EXPECT_EQ(Gemm(Cpu(), bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.m = -1;
  EXPECT_EQ(Gemm(Cpu(), bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  std::vector<uint16_t> bits(6);
  bad.b_bf16 = bits.data();  // both b and b_bf16
  EXPECT_EQ(Gemm(Cpu(), bad).code(), absl::StatusCode::kInvalidArgument);
  bad.b = nullptr;  // bf16 without workspace
  EXPECT_EQ(Gemm(Cpu(), bad).code(), absl::StatusCode::kInvalidArgument);
  if (!CudaAvailable()) {
    EXPECT_EQ(Gemm(testing::Gpu(), ok).code(), absl::StatusCode::kFailedPrecondition);
  }
}

// The simulator's setting (kernels/gemm.h): OpenBLAS on one thread, products split over the pool.
// Every width gives the bits of a one-thread pool, for the products the models make:
// MiniLM-L6 (hidden 384, FFN 1536, 12 heads of 32, 16 x 64 tokens), SmolLM2-135M (576, 1536,
// 9 heads of 64, vocabulary 49152), LoRA rank 8, row counts that are not multiples of 16.
TEST(Gemm, SplitOnThePoolMatchesOneThreadBitForBit) {
  SetNumThreads(1);
  ASSERT_EQ(openblas_get_num_threads(), 1);
  struct Shape {
    bool ta, tb;
    int64_t m, n, k, batch;
    float alpha, beta;
    int64_t pad;  // added to lda
    bool split;   // expect more than one row block
  };
  const std::vector<Shape> shapes = {
      {false, true, 1024, 384, 384, 1, 1.0f, 0.0f, 0, true},    // frozen linear forward y = x W^T
      {false, true, 1024, 1536, 384, 1, 1.0f, 1.0f, 0, true},   // ... FFN up, accumulating
      {false, true, 1024, 384, 1536, 1, 1.0f, 0.0f, 0, true},   // ... FFN down
      {false, false, 1024, 384, 1536, 1, 1.0f, 0.0f, 0, true},  // backward dx = dy W
      {false, false, 1024, 1536, 384, 1, 1.0f, 1.0f, 0, true},  // ... accumulating
      {true, false, 384, 1536, 1024, 1, 1.0f, 0.0f, 0, true},   // dW = dy^T x
      {false, true, 1000, 576, 576, 1, 1.0f, 0.0f, 5, true},    // odd rows, padded A
      {false, true, 1023, 1536, 576, 1, 0.5f, 1.0f, 0, true},
      {false, false, 1023, 576, 1536, 1, 1.0f, 0.0f, 0, true},
      {true, true, 1017, 576, 576, 1, 1.0f, 0.0f, 3, true},
      {false, true, 64, 49152, 576, 1, 1.0f, 0.0f, 0, true},  // LM head
      {false, true, 1024, 8, 384, 1, 1.0f, 0.0f, 0, false},   // LoRA x A^T
      {false, true, 1024, 384, 8, 1, 2.0f, 1.0f, 0, false},   // LoRA (x A^T) B^T, scaled, added
      {true, false, 8, 384, 1024, 1, 1.0f, 0.0f, 0, false},   // LoRA dA
      {false, true, 64, 64, 32, 192, 0.17f, 0.0f, 0, false},  // attention scores per head
      {false, false, 64, 32, 64, 192, 1.0f, 0.0f, 0, false},  // P V per head
      {true, false, 64, 64, 64, 144, 1.0f, 0.0f, 0, false},   // backward per head
  };
  ThreadPool one(1), four(4);
  for (const Shape& s : shapes) {
    const int64_t lda = (s.ta ? s.m : s.k) + s.pad, a_rows = s.ta ? s.k : s.m;
    const int64_t b_size = s.n * s.k, c_size = s.m * s.n;
    const auto a = Random(s.batch * a_rows * lda, 11), b = Random(s.batch * b_size, 12),
               c0 = Random(s.batch * c_size, 13);
    auto run = [&](ThreadPool& pool) {
      std::vector<float> c = c0;
      GemmArgs g{.trans_a = s.ta,
                 .trans_b = s.tb,
                 .m = s.m,
                 .n = s.n,
                 .k = s.k,
                 .alpha = s.alpha,
                 .beta = s.beta,
                 .a = a.data(),
                 .lda = lda,
                 .b = b.data(),
                 .c = c.data(),
                 .batch = s.batch,
                 .stride_a = a_rows * lda,
                 .stride_b = b_size,
                 .stride_c = c_size};
      EXPECT_EQ(internal::GemmCpuRowBlocks(g) > 1, s.split);
      EXPECT_TRUE(Gemm(ExecContext{.pool = &pool}, g).ok());
      return c;
    };
    const std::vector<float> want = run(one);
    for (int width : {2, 3, 4}) {
      four.SetWidth(width);
      const std::vector<float> got = run(four);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
          << "m " << s.m << " n " << s.n << " k " << s.k << " batch " << s.batch << " trans "
          << s.ta << s.tb << " width " << width;
    }
  }
}

}  // namespace
}  // namespace fedlora::kernels
