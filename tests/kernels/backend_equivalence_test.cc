// Every op's CUDA backend against its CPU reference on random inputs with fixed seeds (in the
// spirit of ggml's test-backend-ops). Skips itself without a GPU. Each device output buffer has
// kGuard guard floats after it that must survive the kernel. Tolerances are stated per op: the
// backends differ only in summation order and in libm vs CUDA math functions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/base/block_quant.h"
#include "kernels/base/device.h"
#include "kernels/base/fixed_point.h"
#include "kernels/base/topk.h"
#include "kernels/cross_entropy.h"
#include "kernels/decode_attention.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fused_attention.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/lora_linear.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::AllClose;
using testing::Cpu;
using testing::DeviceMirror;
using testing::Gpu;
using testing::Guarded;
using testing::Random;

// Compares a device output (with guards) against the CPU result.
::testing::AssertionResult SameAsCpu(const float* dev, const Guarded& cpu, double atol,
                                     double rtol) {
  const Guarded got = DeviceMirror::Download(dev, cpu.size());
  if (!got.GuardsIntact())
    return ::testing::AssertionFailure() << "device kernel wrote past the end of its output";
  return AllClose(got.values(), cpu.values(), atol, rtol);
}

std::vector<uint16_t> TruncateToBf16(std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    u &= 0xffff0000u;
    std::memcpy(&v[i], &u, 4);
    bits[i] = static_cast<uint16_t>(u >> 16);
  }
  return bits;
}

class BackendEquivalence : public ::testing::Test {
 protected:
  void SetUp() override { FEDLORA_SKIP_WITHOUT_GPU(); }
  DeviceMirror dev_;
};

// fp32 GEMMs with k <= 600 of O(1) values: reassociation error ~k * 6e-8 * |sum| < 1e-4.
constexpr double kGemmTol = 1e-4;

TEST_F(BackendEquivalence, Gemm) {
  const int64_t m = 37, n = 29, k = 41;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const auto a = Random(m * k, 1), b = Random(k * n, 2), c0 = Random(m * n, 3);
      GemmArgs g{.trans_a = ta,
                 .trans_b = tb,
                 .m = m,
                 .n = n,
                 .k = k,
                 .alpha = 0.7f,
                 .beta = 0.3f,
                 .a = a.data(),
                 .b = b.data()};
      Guarded c(c0);
      g.c = c.data();
      ASSERT_TRUE(Gemm(Cpu(), g).ok());
      GemmArgs d = g;
      d.a = dev_.Upload(a);
      d.b = dev_.Upload(b);
      d.c = dev_.Upload(Guarded(c0));
      ASSERT_TRUE(Gemm(Gpu(), d).ok());
      EXPECT_TRUE(SameAsCpu(d.c, c, kGemmTol, kGemmTol)) << "ta=" << ta << " tb=" << tb;
    }
  }
  // Strided batch with a broadcast B.
  const int64_t batch = 4;
  const auto a = Random(batch * m * k, 4), b = Random(k * n, 5);
  GemmArgs g{.m = m,
             .n = n,
             .k = k,
             .a = a.data(),
             .b = b.data(),
             .batch = batch,
             .stride_a = m * k,
             .stride_b = 0,
             .stride_c = m * n};
  Guarded c(batch * m * n);
  g.c = c.data();
  ASSERT_TRUE(Gemm(Cpu(), g).ok());
  GemmArgs d = g;
  d.a = dev_.Upload(a);
  d.b = dev_.Upload(b);
  d.c = dev_.Upload(Guarded(batch * m * n));
  ASSERT_TRUE(Gemm(Gpu(), d).ok());
  EXPECT_TRUE(SameAsCpu(d.c, c, kGemmTol, kGemmTol)) << "batched";
  // Entries sharing one C (stride_c 0) accumulate into it in order.
  const auto c0 = Random(m * n, 6);
  GemmArgs shared = g;
  shared.beta = 1.0f;
  shared.stride_c = 0;
  Guarded sc(c0);
  shared.c = sc.data();
  ASSERT_TRUE(Gemm(Cpu(), shared).ok());
  GemmArgs ds = shared;
  ds.a = d.a;
  ds.b = d.b;
  ds.c = dev_.Upload(Guarded(c0));
  ASSERT_TRUE(Gemm(Gpu(), ds).ok());
  EXPECT_TRUE(SameAsCpu(ds.c, sc, kGemmTol, kGemmTol)) << "batched, one C";
}

TEST_F(BackendEquivalence, GemmBf16Panels) {
  for (bool tb : {true, false}) {
    const int64_t m = 9, n = tb ? 600 : 23, k = tb ? 31 : 600;
    auto b = Random(n * k, 6);
    const auto bits = TruncateToBf16(b);
    const auto a = Random(m * k, 7);
    GemmArgs g{.trans_b = tb, .m = m, .n = n, .k = k, .a = a.data(), .b_bf16 = bits.data()};
    const size_t ws = GemmWorkspaceBytes(g);
    std::vector<float> hws(ws / 4);
    g.workspace = hws.data();
    g.workspace_bytes = ws;
    Guarded c(m * n);
    g.c = c.data();
    ASSERT_TRUE(Gemm(Cpu(), g).ok());
    GemmArgs d = g;
    d.a = dev_.Upload(a);
    d.b_bf16 = dev_.Upload(bits);
    d.workspace = dev_.Workspace(ws);
    d.c = dev_.Upload(Guarded(m * n));
    ASSERT_TRUE(Gemm(Gpu(), d).ok());
    EXPECT_TRUE(SameAsCpu(d.c, c, kGemmTol, kGemmTol)) << "trans_b=" << tb;
  }
}

TEST_F(BackendEquivalence, GemmQuantizedPanels) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    for (bool tb : {true, false}) {
      const int64_t m = 9, n = tb ? 600 : 64, k = tb ? 64 : 600;
      std::vector<float> values;
      const auto q = testing::RandomQuantMatrix(type, tb ? n : k, tb ? k : n, 16, &values);
      const auto a = Random(m * k, 17);
      GemmArgs g{.trans_b = tb,
                 .m = m,
                 .n = n,
                 .k = k,
                 .a = a.data(),
                 .b_quant = q.data(),
                 .b_quant_type = type};
      const size_t ws = GemmWorkspaceBytes(g);
      std::vector<float> hws(ws / 4);
      g.workspace = hws.data();
      g.workspace_bytes = ws;
      Guarded c(m * n);
      g.c = c.data();
      ASSERT_TRUE(Gemm(Cpu(), g).ok());
      GemmArgs d = g;
      d.a = dev_.Upload(a);
      d.b_quant = dev_.Upload(q);
      d.workspace = dev_.Workspace(ws);
      d.c = dev_.Upload(Guarded(m * n));
      ASSERT_TRUE(Gemm(Gpu(), d).ok());
      EXPECT_TRUE(SameAsCpu(d.c, c, kGemmTol, kGemmTol)) << GgmlTypeName(type) << " trans_b=" << tb;
    }
  }
}

// bf16 math on CUDA against the exact fp32 product on the CPU: operands rounded to bf16 (2^-8
// relative each) over k <= 96 terms of O(1) values stay within 1e-2 of the largest |C|.
::testing::AssertionResult WithinBf16OfCpu(const float* dev, const Guarded& cpu) {
  double largest = 0.0;
  for (float v : cpu.values()) largest = std::max(largest, std::fabs(static_cast<double>(v)));
  return SameAsCpu(dev, cpu, 1e-2 * largest, 0.0);
}

TEST_F(BackendEquivalence, GemmBf16MathAgainstFp32) {
  const int64_t m = 37, n = 64, k = 96;  // n and k whole 32-element blocks for the quantized B
  enum class BKind { kF32, kBf16, kQ4_1 };
  for (BKind kind : {BKind::kF32, BKind::kBf16, BKind::kQ4_1}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
        const auto a = Random(m * k, 101), c0 = Random(m * n, 103);
        auto b = Random(k * n, 102);
        const auto bits = TruncateToBf16(b);
        std::vector<float> q_values;
        const auto q = testing::RandomQuantMatrix(GgmlType::kQ4_1, b_rows, b_cols, 104, &q_values);
        GemmArgs g{.trans_a = ta,
                   .trans_b = tb,
                   .m = m,
                   .n = n,
                   .k = k,
                   .alpha = 0.7f,
                   .beta = 0.3f,
                   .a = a.data()};
        if (kind == BKind::kF32) g.b = b.data();
        if (kind == BKind::kBf16) g.b_bf16 = bits.data();
        if (kind == BKind::kQ4_1) {
          g.b_quant = q.data();
          g.b_quant_type = GgmlType::kQ4_1;
        }
        // The CPU reference: the exact fp32 product (with the panel workspace a bf16 or quantized B needs).
        std::vector<float> hws(GemmWorkspaceBytes(g) / 4 + 1);
        g.workspace = hws.data();
        g.workspace_bytes = hws.size() * 4;
        Guarded c(c0);
        g.c = c.data();
        ASSERT_TRUE(Gemm(Cpu(), g).ok());
        GemmArgs d = g;
        d.bf16_math = true;
        d.a = dev_.Upload(a);
        if (kind == BKind::kF32) d.b = dev_.Upload(b);
        if (kind == BKind::kBf16) d.b_bf16 = dev_.Upload(bits);
        if (kind == BKind::kQ4_1) d.b_quant = dev_.Upload(q);
        d.workspace_bytes = GemmWorkspaceBytes(d);
        d.workspace = dev_.Workspace(d.workspace_bytes);
        d.c = dev_.Upload(Guarded(c0));
        const absl::Status st = Gemm(Gpu(), d);
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_TRUE(WithinBf16OfCpu(d.c, c))
            << "B kind " << static_cast<int>(kind) << " ta=" << ta << " tb=" << tb;
      }
    }
  }
  // Padded leading dimensions, beta == 0 over a NaN-poisoned C, and a strided batch with a broadcast B.
  const int64_t batch = 3, lda = k + 5, ldc = n + 3;
  const auto a = Random(batch * m * lda, 105), b = Random(k * n, 106);
  GemmArgs g{.m = m,
             .n = n,
             .k = k,
             .a = a.data(),
             .lda = lda,
             .b = b.data(),
             .ldc = ldc,
             .batch = batch,
             .stride_a = m * lda,
             .stride_b = 0,
             .stride_c = m * ldc};
  std::vector<float> c0(batch * m * ldc, std::nanf(""));
  for (int64_t i = 0; i < batch * m; ++i)
    std::fill_n(c0.begin() + i * ldc + n, ldc - n, 5.0f);  // padding survives
  Guarded c(c0);
  g.c = c.data();
  ASSERT_TRUE(Gemm(Cpu(), g).ok());
  GemmArgs d = g;
  d.bf16_math = true;
  d.a = dev_.Upload(a);
  d.b = dev_.Upload(b);
  d.workspace_bytes = GemmWorkspaceBytes(d);
  d.workspace = dev_.Workspace(d.workspace_bytes);
  d.c = dev_.Upload(Guarded(c0));
  const absl::Status st = Gemm(Gpu(), d);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(WithinBf16OfCpu(d.c, c)) << "batched";
}

TEST_F(BackendEquivalence, LinearForwardBackward) {
  const int64_t R = 33, I = 48, O = 40;
  const auto x = Random(R * I, 11), w = Random(O * I, 12), b = Random(O, 13),
             dy = Random(R * O, 14);
  Guarded y(R * O), dx(R * I), dw(O * I), db(O);
  ASSERT_TRUE(LinearForward(Cpu(), LinearForwardArgs{.rows = R,
                                                     .in_features = I,
                                                     .out_features = O,
                                                     .x = x.data(),
                                                     .w = WeightPtr::F32(w.data()),
                                                     .bias = b.data(),
                                                     .y = y.data()})
                  .ok());
  ASSERT_TRUE(LinearBackward(Cpu(), LinearBackwardArgs{.rows = R,
                                                       .in_features = I,
                                                       .out_features = O,
                                                       .x = x.data(),
                                                       .w = WeightPtr::F32(w.data()),
                                                       .dy = dy.data(),
                                                       .dx = dx.data(),
                                                       .dw = dw.data(),
                                                       .dbias = db.data()})
                  .ok());
  float *dx_d = dev_.Upload(x), *dw_d = dev_.Upload(w), *db_d = dev_.Upload(b),
        *ddy = dev_.Upload(dy);
  float *y_d = dev_.Upload(Guarded(R * O)), *gx = dev_.Upload(Guarded(R * I)),
        *gw = dev_.Upload(Guarded(O * I)), *gb = dev_.Upload(Guarded(O));
  ASSERT_TRUE(LinearForward(Gpu(), LinearForwardArgs{.rows = R,
                                                     .in_features = I,
                                                     .out_features = O,
                                                     .x = dx_d,
                                                     .w = WeightPtr::F32(dw_d),
                                                     .bias = db_d,
                                                     .y = y_d})
                  .ok());
  ASSERT_TRUE(LinearBackward(Gpu(), LinearBackwardArgs{.rows = R,
                                                       .in_features = I,
                                                       .out_features = O,
                                                       .x = dx_d,
                                                       .w = WeightPtr::F32(dw_d),
                                                       .dy = ddy,
                                                       .dx = gx,
                                                       .dw = gw,
                                                       .dbias = gb})
                  .ok());
  EXPECT_TRUE(SameAsCpu(y_d, y, kGemmTol, kGemmTol));
  EXPECT_TRUE(SameAsCpu(gx, dx, kGemmTol, kGemmTol));
  EXPECT_TRUE(SameAsCpu(gw, dw, kGemmTol, kGemmTol));
  EXPECT_TRUE(SameAsCpu(gb, db, kGemmTol, kGemmTol));
}

TEST_F(BackendEquivalence, LoraLinearWithDropoutAndBf16Weight) {
  const int64_t R = 40, I = 64, O = 300, r = 8;
  auto w = Random(O * I, 21);
  const auto wbits = TruncateToBf16(w);
  const auto x = Random(R * I, 22), b = Random(O, 23), A = Random(r * I, 24), B = Random(O * r, 25),
             dy = Random(R * O, 26);
  const DropoutSpec drop{.p = 0.1f, .seed = 77, .offset = 1000};
  // CPU
  Guarded y(R * O), h(R * r), dx(R * I), da(r * I), db(O * r);
  LoraLinearForwardArgs f{.rows = R,
                          .in_features = I,
                          .out_features = O,
                          .rank = r,
                          .x = x.data(),
                          .w = WeightPtr::BF16(wbits.data()),
                          .bias = b.data(),
                          .lora_a = A.data(),
                          .lora_b = B.data(),
                          .scaling = 2.0f,
                          .dropout = drop,
                          .y = y.data(),
                          .h = h.data()};
  std::vector<float> fws(LoraLinearWorkspaceBytes(f) / 4);
  f.workspace = fws.data();
  f.workspace_bytes = fws.size() * 4;
  ASSERT_TRUE(LoraLinearForward(Cpu(), f).ok());
  LoraLinearBackwardArgs bw{.rows = R,
                            .in_features = I,
                            .out_features = O,
                            .rank = r,
                            .x = x.data(),
                            .w = WeightPtr::BF16(wbits.data()),
                            .lora_a = A.data(),
                            .lora_b = B.data(),
                            .scaling = 2.0f,
                            .dropout = drop,
                            .h = h.data(),
                            .dy = dy.data(),
                            .dx = dx.data(),
                            .da = da.data(),
                            .db = db.data()};
  std::vector<float> bws(LoraLinearWorkspaceBytes(bw) / 4);
  bw.workspace = bws.data();
  bw.workspace_bytes = bws.size() * 4;
  ASSERT_TRUE(LoraLinearBackward(Cpu(), bw).ok());
  // GPU
  LoraLinearForwardArgs fd = f;
  fd.x = dev_.Upload(x);
  fd.w = WeightPtr::BF16(dev_.Upload(wbits));
  fd.bias = dev_.Upload(b);
  fd.lora_a = dev_.Upload(A);
  fd.lora_b = dev_.Upload(B);
  fd.y = dev_.Upload(Guarded(R * O));
  fd.h = dev_.Upload(Guarded(R * r));
  fd.workspace = dev_.Workspace(f.workspace_bytes);
  ASSERT_TRUE(LoraLinearForward(Gpu(), fd).ok());
  LoraLinearBackwardArgs bd = bw;
  bd.x = fd.x;
  bd.w = fd.w;
  bd.lora_a = fd.lora_a;
  bd.lora_b = fd.lora_b;
  bd.h = fd.h;
  bd.dy = dev_.Upload(dy);
  bd.dx = dev_.Upload(Guarded(R * I));
  bd.da = dev_.Upload(Guarded(r * I));
  bd.db = dev_.Upload(Guarded(O * r));
  bd.workspace = dev_.Workspace(bw.workspace_bytes);
  ASSERT_TRUE(LoraLinearBackward(Gpu(), bd).ok());
  EXPECT_TRUE(SameAsCpu(fd.y, y, kGemmTol, kGemmTol)) << "y";
  EXPECT_TRUE(SameAsCpu(fd.h, h, kGemmTol, kGemmTol)) << "h";
  EXPECT_TRUE(SameAsCpu(bd.dx, dx, kGemmTol, kGemmTol)) << "dx";
  // dA, dB sum over 40 rows of products of GEMM outputs: 1e-4 relative still covers it.
  EXPECT_TRUE(SameAsCpu(bd.da, da, kGemmTol, kGemmTol)) << "dA";
  EXPECT_TRUE(SameAsCpu(bd.db, db, kGemmTol, kGemmTol)) << "dB";
}

TEST_F(BackendEquivalence, LayerNormForwardBackward) {
  const int64_t R = 50, C = 768;
  const auto x = Random(R * C, 31, -3, 3), gamma = Random(C, 32, 0.5f, 1.5f), beta = Random(C, 33),
             dy = Random(R * C, 34);
  Guarded y(R * C), mean(R), rstd(R), dx(R * C), dg(C), db(C);
  ASSERT_TRUE(LayerNormForward(Cpu(), LayerNormForwardArgs{.rows = R,
                                                           .cols = C,
                                                           .x = x.data(),
                                                           .gamma = gamma.data(),
                                                           .beta = beta.data(),
                                                           .y = y.data(),
                                                           .mean = mean.data(),
                                                           .rstd = rstd.data()})
                  .ok());
  ASSERT_TRUE(LayerNormBackward(Cpu(), LayerNormBackwardArgs{.rows = R,
                                                             .cols = C,
                                                             .x = x.data(),
                                                             .gamma = gamma.data(),
                                                             .mean = mean.data(),
                                                             .rstd = rstd.data(),
                                                             .dy = dy.data(),
                                                             .dx = dx.data(),
                                                             .dgamma = dg.data(),
                                                             .dbeta = db.data()})
                  .ok());
  float *xd = dev_.Upload(x), *gd = dev_.Upload(gamma), *bd = dev_.Upload(beta),
        *dyd = dev_.Upload(dy);
  float *yd = dev_.Upload(Guarded(R * C)), *md = dev_.Upload(Guarded(R)),
        *rd = dev_.Upload(Guarded(R)), *dxd = dev_.Upload(Guarded(R * C)),
        *dgd = dev_.Upload(Guarded(C)), *dbd = dev_.Upload(Guarded(C));
  ASSERT_TRUE(LayerNormForward(Gpu(), LayerNormForwardArgs{.rows = R,
                                                           .cols = C,
                                                           .x = xd,
                                                           .gamma = gd,
                                                           .beta = bd,
                                                           .y = yd,
                                                           .mean = md,
                                                           .rstd = rd})
                  .ok());
  ASSERT_TRUE(LayerNormBackward(Gpu(), LayerNormBackwardArgs{.rows = R,
                                                             .cols = C,
                                                             .x = xd,
                                                             .gamma = gd,
                                                             .mean = md,
                                                             .rstd = rd,
                                                             .dy = dyd,
                                                             .dx = dxd,
                                                             .dgamma = dgd,
                                                             .dbeta = dbd})
                  .ok());
  // Row sums of 768 terms in a different order (warp tree vs sequential): ~1e-5 relative.
  EXPECT_TRUE(SameAsCpu(yd, y, 1e-4, 1e-4));
  EXPECT_TRUE(SameAsCpu(md, mean, 1e-5, 1e-5));
  EXPECT_TRUE(SameAsCpu(rd, rstd, 1e-5, 1e-4));
  EXPECT_TRUE(SameAsCpu(dxd, dx, 1e-4, 1e-4));
  EXPECT_TRUE(SameAsCpu(dgd, dg, 1e-4, 1e-4));
  EXPECT_TRUE(SameAsCpu(dbd, db, 1e-4, 1e-4));
  // No rows: the parameter gradients are zeros on both.
  Guarded dg0(C, 7.0f), db0(C, 7.0f);
  ASSERT_TRUE(LayerNormBackward(Cpu(), LayerNormBackwardArgs{.rows = 0,
                                                             .cols = C,
                                                             .x = x.data(),
                                                             .gamma = gamma.data(),
                                                             .mean = mean.data(),
                                                             .rstd = rstd.data(),
                                                             .dy = dy.data(),
                                                             .dgamma = dg0.data(),
                                                             .dbeta = db0.data()})
                  .ok());
  float *dg0d = dev_.Upload(Guarded(C, 7.0f)), *db0d = dev_.Upload(Guarded(C, 7.0f));
  ASSERT_TRUE(LayerNormBackward(Gpu(), LayerNormBackwardArgs{.rows = 0,
                                                             .cols = C,
                                                             .x = xd,
                                                             .gamma = gd,
                                                             .mean = md,
                                                             .rstd = rd,
                                                             .dy = dyd,
                                                             .dgamma = dg0d,
                                                             .dbeta = db0d})
                  .ok());
  EXPECT_TRUE(SameAsCpu(dg0d, dg0, 0, 0));
  EXPECT_TRUE(SameAsCpu(db0d, db0, 0, 0));
}

TEST_F(BackendEquivalence, Activations) {
  const int64_t n = 10007;
  const auto x = Random(n, 41, -5, 5), dy = Random(n, 42);
  for (Activation kind : {Activation::kGelu, Activation::kTanh}) {
    Guarded y(n), dx(n);
    ASSERT_TRUE(
        ActivationForward(Cpu(),
                          ActivationForwardArgs{.kind = kind, .n = n, .x = x.data(), .y = y.data()})
            .ok());
    const std::vector<float> saved = kind == Activation::kGelu ? x : y.values();
    ASSERT_TRUE(
        ActivationBackward(
            Cpu(),
            ActivationBackwardArgs{
                .kind = kind, .n = n, .saved = saved.data(), .dy = dy.data(), .dx = dx.data()})
            .ok());
    float *xd = dev_.Upload(x), *sd = dev_.Upload(saved), *dyd = dev_.Upload(dy);
    float *yd = dev_.Upload(Guarded(n)), *dxd = dev_.Upload(Guarded(n));
    ASSERT_TRUE(
        ActivationForward(Gpu(), ActivationForwardArgs{.kind = kind, .n = n, .x = xd, .y = yd})
            .ok());
    ASSERT_TRUE(
        ActivationBackward(
            Gpu(), ActivationBackwardArgs{.kind = kind, .n = n, .saved = sd, .dy = dyd, .dx = dxd})
            .ok());
    // CUDA's erff/expf/tanhf are within 2 ulp of libm's: 1e-6 absolute for |values| <= 5.
    EXPECT_TRUE(SameAsCpu(yd, y, 1e-6, 1e-6));
    EXPECT_TRUE(SameAsCpu(dxd, dx, 1e-6, 1e-6));
  }
}

TEST_F(BackendEquivalence, DropoutMaskIsIdentical) {
  const int64_t n = 10001;  // odd offset and length: partial Philox blocks at both ends
  const auto x = Random(n, 51);
  const DropoutSpec spec{.p = 0.37f, .seed = 0x123456789abcull, .offset = 7};
  Guarded y(n);
  ASSERT_TRUE(
      Dropout(Cpu(), DropoutArgs{.n = n, .spec = spec, .x = x.data(), .out = y.data()}).ok());
  float* yd = dev_.Upload(Guarded(n));
  ASSERT_TRUE(
      Dropout(Gpu(), DropoutArgs{.n = n, .spec = spec, .x = dev_.Upload(x), .out = yd}).ok());
  // Same mask bit for bit, same x / (1 - p) product: exact.
  EXPECT_TRUE(SameAsCpu(yd, y, 0, 0));
}

TEST_F(BackendEquivalence, AttentionForwardBackward) {
  struct Heads {
    int64_t heads, kv_heads;
    bool causal;
  };
  for (auto layout : {AttentionLayout::kBHSD, AttentionLayout::kBSHD}) {
    for (Heads hc : {Heads{4, 0, false}, Heads{6, 2, true}, Heads{4, 1, true}}) {
      const AttentionDims dims{.batch = 3,
                               .heads = hc.heads,
                               .seq = 37,
                               .head_dim = 16,
                               .layout = layout,
                               .kv_heads = hc.kv_heads,
                               .causal = hc.causal};
      const int64_t kvh = hc.kv_heads == 0 ? hc.heads : hc.kv_heads;
      const int64_t E = 3 * hc.heads * 37 * 16, EK = 3 * kvh * 37 * 16, P = 3 * hc.heads * 37 * 37;
      const auto q = Random(E, 61), k = Random(EK, 62), v = Random(EK, 63), dout = Random(E, 64);
      std::vector<float> mask(3 * 37, 0.0f);
      for (int64_t j = 30; j < 37; ++j) mask[37 + j] = -std::numeric_limits<float>::max();
      const DropoutSpec drop{.p = 0.1f, .seed = 3, .offset = 0};
      Guarded out(E), probs(P), dq(E), dk(EK), dv(EK);
      AttentionForwardArgs f{.dims = dims,
                             .q = q.data(),
                             .k = k.data(),
                             .v = v.data(),
                             .mask = mask.data(),
                             .dropout = drop,
                             .probs = probs.data(),
                             .out = out.data()};
      std::vector<float> fws(AttentionWorkspaceBytes(f) / 4);
      f.workspace = fws.data();
      f.workspace_bytes = fws.size() * 4;
      ASSERT_TRUE(AttentionForward(Cpu(), f).ok());
      AttentionBackwardArgs b{.dims = dims,
                              .q = q.data(),
                              .k = k.data(),
                              .v = v.data(),
                              .probs = probs.data(),
                              .dropout = drop,
                              .dout = dout.data(),
                              .dq = dq.data(),
                              .dk = dk.data(),
                              .dv = dv.data()};
      std::vector<float> bws(AttentionWorkspaceBytes(b) / 4);
      b.workspace = bws.data();
      b.workspace_bytes = bws.size() * 4;
      ASSERT_TRUE(AttentionBackward(Cpu(), b).ok());

      AttentionForwardArgs fd = f;
      fd.q = dev_.Upload(q);
      fd.k = dev_.Upload(k);
      fd.v = dev_.Upload(v);
      fd.mask = dev_.Upload(mask);
      fd.probs = dev_.Upload(Guarded(P));
      fd.out = dev_.Upload(Guarded(E));
      fd.workspace = dev_.Workspace(f.workspace_bytes);
      ASSERT_TRUE(AttentionForward(Gpu(), fd).ok());
      AttentionBackwardArgs bd = b;
      bd.q = fd.q;
      bd.k = fd.k;
      bd.v = fd.v;
      bd.probs = fd.probs;
      bd.dout = dev_.Upload(dout);
      bd.dq = dev_.Upload(Guarded(E));
      bd.dk = dev_.Upload(Guarded(EK));
      bd.dv = dev_.Upload(Guarded(EK));
      bd.workspace = dev_.Workspace(b.workspace_bytes);
      ASSERT_TRUE(AttentionBackward(Gpu(), bd).ok());
      const std::string tag = std::string(layout == AttentionLayout::kBHSD ? "BHSD" : "BSHD") +
                              " heads " + std::to_string(hc.heads) + "/" + std::to_string(kvh) +
                              (hc.causal ? " causal" : "");
      // Probabilities: exp and a 37-term sum; then GEMMs over 37..16 terms: 1e-5 / 1e-4.
      EXPECT_TRUE(SameAsCpu(fd.probs, probs, 1e-5, 1e-4)) << tag << " probs";
      EXPECT_TRUE(SameAsCpu(fd.out, out, kGemmTol, kGemmTol)) << tag << " out";
      EXPECT_TRUE(SameAsCpu(bd.dq, dq, kGemmTol, kGemmTol)) << tag << " dq";
      EXPECT_TRUE(SameAsCpu(bd.dk, dk, kGemmTol, kGemmTol)) << tag << " dk";
      EXPECT_TRUE(SameAsCpu(bd.dv, dv, kGemmTol, kGemmTol)) << tag << " dv";
    }
  }
}

// Memory-efficient attention over packed sequences (one longer than a warp's 32 keys, one of a
// single token, one empty), with dropout: the CPU sums in order, the GPU online; 1e-5 / 1e-4.
TEST_F(BackendEquivalence, FusedAttentionForwardBackward) {
  const std::vector<int32_t> starts = {0, 45, 46, 46, 59, 70};
  const int64_t T = 70, D = 24;
  struct Heads {
    int64_t heads, kv_heads;
    bool causal, masked;
  };
  std::vector<float> mask(T, 0.0f);
  for (int64_t t : {40, 41, 44, 58, 59}) mask[t] = -1e30f;
  for (Heads hc : {Heads{4, 0, false, true}, Heads{6, 2, true, false}}) {
    const int64_t kvh = hc.kv_heads == 0 ? hc.heads : hc.kv_heads, E = T * hc.heads * D,
                  EK = T * kvh * D;
    const auto q = Random(E, 71), k = Random(EK, 72), v = Random(EK, 73), dout = Random(E, 74);
    const FusedAttentionDims dims{.tokens = T,
                                  .num_seqs = 5,
                                  .heads = hc.heads,
                                  .head_dim = D,
                                  .kv_heads = hc.kv_heads,
                                  .causal = hc.causal,
                                  .seq_start = starts.data(),
                                  .mask = hc.masked ? mask.data() : nullptr};
    const DropoutSpec drop{.p = 0.1f, .seed = 5, .offset = 3, .stream = 2};
    Guarded out(E), lse(T * hc.heads), dq(E), dk(EK), dv(EK);
    FusedAttentionForwardArgs f{.dims = dims,
                                .q = q.data(),
                                .k = k.data(),
                                .v = v.data(),
                                .dropout = drop,
                                .out = out.data(),
                                .lse = lse.data()};
    ASSERT_TRUE(FusedAttentionForward(Cpu(), f).ok());
    std::vector<float> ws(FusedAttentionBackwardWorkspaceBytes(dims) / 4);
    FusedAttentionBackwardArgs b{.dims = dims,
                                 .q = q.data(),
                                 .k = k.data(),
                                 .v = v.data(),
                                 .out = out.data(),
                                 .lse = lse.data(),
                                 .dropout = drop,
                                 .dout = dout.data(),
                                 .dq = dq.data(),
                                 .dk = dk.data(),
                                 .dv = dv.data(),
                                 .workspace = ws.data(),
                                 .workspace_bytes = ws.size() * 4};
    ASSERT_TRUE(FusedAttentionBackward(Cpu(), b).ok());

    FusedAttentionForwardArgs fd = f;
    fd.dims.seq_start = dev_.Upload(starts);
    if (hc.masked) fd.dims.mask = dev_.Upload(mask);
    fd.q = dev_.Upload(q);
    fd.k = dev_.Upload(k);
    fd.v = dev_.Upload(v);
    fd.out = dev_.Upload(Guarded(E));
    fd.lse = dev_.Upload(Guarded(T * hc.heads));
    ASSERT_TRUE(FusedAttentionForward(Gpu(), fd).ok());
    FusedAttentionBackwardArgs bd = b;
    bd.dims = fd.dims;
    bd.q = fd.q;
    bd.k = fd.k;
    bd.v = fd.v;
    bd.out = fd.out;
    bd.lse = fd.lse;
    bd.dout = dev_.Upload(dout);
    bd.dq = dev_.Upload(Guarded(E));
    bd.dk = dev_.Upload(Guarded(EK));
    bd.dv = dev_.Upload(Guarded(EK));
    bd.workspace = dev_.Workspace(b.workspace_bytes);
    ASSERT_TRUE(FusedAttentionBackward(Gpu(), bd).ok());
    const std::string tag = "heads " + std::to_string(hc.heads) + "/" + std::to_string(kvh);
    EXPECT_TRUE(SameAsCpu(fd.lse, lse, 1e-5, 1e-5)) << tag << " lse";
    EXPECT_TRUE(SameAsCpu(fd.out, out, 1e-5, 1e-4)) << tag << " out";
    EXPECT_TRUE(SameAsCpu(bd.dq, dq, 1e-5, 1e-4)) << tag << " dq";
    EXPECT_TRUE(SameAsCpu(bd.dk, dk, 1e-5, 1e-4)) << tag << " dk";
    EXPECT_TRUE(SameAsCpu(bd.dv, dv, 1e-5, 1e-4)) << tag << " dv";
  }
}

// The fused softmax pieces on their own, with a mask, causal rows and dropout: a 45-term row sum
// and exp, then the backward's row dot product: 1e-6 absolute on values of at most 1.
TEST_F(BackendEquivalence, AttentionSoftmaxPieces) {
  for (bool causal : {false, true}) {
    const int64_t batch = 2, heads = 3, seq = 45, P = batch * heads * seq * seq;
    const auto scores = Random(P, 71), dprobs = Random(P, 72);
    std::vector<float> mask(batch * seq, 0.0f);
    for (int64_t j = 40; j < seq; ++j) mask[seq + j] = -1e30f;
    const DropoutSpec drop{.p = 0.2f, .seed = 9, .offset = 5};
    Guarded probs(scores), dropped(P), grad(dprobs);
    ASSERT_TRUE(AttentionSoftmaxForward(Cpu(), {.batch = batch,
                                                .heads = heads,
                                                .seq = seq,
                                                .mask = mask.data(),
                                                .causal = causal,
                                                .scores = probs.data(),
                                                .dropout = drop,
                                                .dropped = dropped.data()})
                    .ok());
    ASSERT_TRUE(AttentionSoftmaxBackward(Cpu(), {.batch = batch,
                                                 .heads = heads,
                                                 .seq = seq,
                                                 .probs = probs.data(),
                                                 .dropout = drop,
                                                 .grad = grad.data()})
                    .ok());
    float* probs_d = dev_.Upload(Guarded(scores));
    float* dropped_d = dev_.Upload(Guarded(P));
    float* grad_d = dev_.Upload(Guarded(dprobs));
    ASSERT_TRUE(AttentionSoftmaxForward(Gpu(), {.batch = batch,
                                                .heads = heads,
                                                .seq = seq,
                                                .mask = dev_.Upload(mask),
                                                .causal = causal,
                                                .scores = probs_d,
                                                .dropout = drop,
                                                .dropped = dropped_d})
                    .ok());
    ASSERT_TRUE(AttentionSoftmaxBackward(Gpu(), {.batch = batch,
                                                 .heads = heads,
                                                 .seq = seq,
                                                 .probs = probs_d,
                                                 .dropout = drop,
                                                 .grad = grad_d})
                    .ok());
    const char* tag = causal ? "causal" : "bidirectional";
    EXPECT_TRUE(SameAsCpu(probs_d, probs, 1e-6, 1e-5)) << tag << " probs";
    EXPECT_TRUE(SameAsCpu(dropped_d, dropped, 1e-6, 1e-5)) << tag << " dropped";
    EXPECT_TRUE(SameAsCpu(grad_d, grad, 1e-6, 1e-5)) << tag << " dscores";
  }
}

// One decoding step against a KV cache: lengths 1, within one chunk, exactly one chunk, and
// several chunks (the split and combine), with multi-head and grouped-query heads. The output is
// poisoned with NaN first.
TEST_F(BackendEquivalence, DecodeAttention) {
  struct Case {
    int64_t heads, kv_heads, D, len;
  };
  for (Case c : {Case{4, 4, 16, 1}, Case{6, 2, 16, 37}, Case{8, 2, 64, kDecodeAttentionChunk},
                 Case{8, 1, 64, 2 * kDecodeAttentionChunk + 45},
                 Case{3, 3, 128, kDecodeAttentionChunk + 1}}) {
    const std::string tag = std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " D " +
                            std::to_string(c.D) + " len " + std::to_string(c.len);
    const int64_t E = c.heads * c.D, EK = c.len * c.kv_heads * c.D;
    const auto q = Random(E, 81), k = Random(EK, 82), v = Random(EK, 83);
    DecodeAttentionArgs a{.heads = c.heads,
                          .kv_heads = c.kv_heads,
                          .head_dim = c.D,
                          .len = c.len,
                          .q = q.data(),
                          .k_cache = k.data(),
                          .v_cache = v.data()};
    const size_t ws = DecodeAttentionWorkspaceBytes(a);
    std::vector<float> hws(ws / 4);
    Guarded out(E, NAN);
    a.out = out.data();
    a.workspace = hws.data();
    a.workspace_bytes = ws;
    ASSERT_TRUE(DecodeAttention(Cpu(), a).ok()) << tag;
    DecodeAttentionArgs d = a;
    d.q = dev_.Upload(q);
    d.k_cache = dev_.Upload(k);
    d.v_cache = dev_.Upload(v);
    d.out = dev_.Upload(Guarded(E, NAN));
    d.workspace = dev_.Workspace(ws);
    ASSERT_TRUE(DecodeAttention(Gpu(), d).ok()) << tag;
    // Dot products of D <= 128 terms, a softmax and weighted sum over <= 557 positions, summed in
    // another order (per chunk, then combined): 1e-5 on outputs of at most 1.
    EXPECT_TRUE(SameAsCpu(d.out, out, 1e-5, 1e-4)) << tag;
  }
}

TEST_F(BackendEquivalence, RmsNormForwardBackward) {
  const int64_t R = 50, C = 576;
  const auto x = Random(R * C, 131, -3, 3), gamma = Random(C, 132, 0.5f, 1.5f),
             dy = Random(R * C, 134);
  Guarded y(R * C), rstd(R), dx(R * C), dg(C);
  ASSERT_TRUE(RmsNormForward(Cpu(), {.rows = R,
                                     .cols = C,
                                     .eps = 1e-5f,
                                     .x = x.data(),
                                     .gamma = gamma.data(),
                                     .y = y.data(),
                                     .rstd = rstd.data()})
                  .ok());
  ASSERT_TRUE(RmsNormBackward(Cpu(), {.rows = R,
                                      .cols = C,
                                      .x = x.data(),
                                      .gamma = gamma.data(),
                                      .rstd = rstd.data(),
                                      .dy = dy.data(),
                                      .dx = dx.data(),
                                      .dgamma = dg.data()})
                  .ok());
  float *xd = dev_.Upload(x), *gd = dev_.Upload(gamma), *dyd = dev_.Upload(dy);
  float *yd = dev_.Upload(Guarded(R * C)), *rd = dev_.Upload(Guarded(R)),
        *dxd = dev_.Upload(Guarded(R * C)), *dgd = dev_.Upload(Guarded(C));
  ASSERT_TRUE(
      RmsNormForward(
          Gpu(), {.rows = R, .cols = C, .eps = 1e-5f, .x = xd, .gamma = gd, .y = yd, .rstd = rd})
          .ok());
  ASSERT_TRUE(RmsNormBackward(Gpu(), {.rows = R,
                                      .cols = C,
                                      .x = xd,
                                      .gamma = gd,
                                      .rstd = rd,
                                      .dy = dyd,
                                      .dx = dxd,
                                      .dgamma = dgd})
                  .ok());
  EXPECT_TRUE(SameAsCpu(yd, y, 1e-4, 1e-4));
  EXPECT_TRUE(SameAsCpu(rd, rstd, 1e-5, 1e-4));
  EXPECT_TRUE(SameAsCpu(dxd, dx, 1e-4, 1e-4));
  EXPECT_TRUE(SameAsCpu(dgd, dg, 1e-4, 1e-4));
}

TEST_F(BackendEquivalence, Rope) {
  const int64_t T = 70, H = 9, D = 64, P = 300;
  const RopeTables tables = MakeRopeTables(100000.0, D, P);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>((t * 37) % P);
  const auto x = Random(T * H * D, 141);
  for (bool inverse : {false, true}) {
    Guarded cpu(x);
    ASSERT_TRUE(Rope(Cpu(), {.tokens = T,
                             .heads = H,
                             .head_dim = D,
                             .max_positions = P,
                             .positions = pos.data(),
                             .cos = tables.cos.data(),
                             .sin = tables.sin.data(),
                             .x = cpu.data(),
                             .inverse = inverse})
                    .ok());
    float* xd = dev_.Upload(Guarded(x));
    ASSERT_TRUE(Rope(Gpu(), {.tokens = T,
                             .heads = H,
                             .head_dim = D,
                             .max_positions = P,
                             .positions = dev_.Upload(pos),
                             .cos = dev_.Upload(tables.cos),
                             .sin = dev_.Upload(tables.sin),
                             .x = xd,
                             .inverse = inverse})
                    .ok());
    // Two products and a sum per element, the same table: exact up to contraction.
    EXPECT_TRUE(SameAsCpu(xd, cpu, 1e-6, 1e-6)) << "inverse=" << inverse;
  }
}

TEST_F(BackendEquivalence, SwiGlu) {
  const int64_t n = 10007;
  const auto gate = Random(n, 151, -8, 8), up = Random(n, 152), dy = Random(n, 153);
  Guarded y(n), dg(n), du(n);
  ASSERT_TRUE(
      SwiGluForward(Cpu(), {.n = n, .gate = gate.data(), .up = up.data(), .y = y.data()}).ok());
  ASSERT_TRUE(SwiGluBackward(Cpu(), {.n = n,
                                     .gate = gate.data(),
                                     .up = up.data(),
                                     .dy = dy.data(),
                                     .dgate = dg.data(),
                                     .dup = du.data()})
                  .ok());
  float *gd = dev_.Upload(gate), *ud = dev_.Upload(up), *dyd = dev_.Upload(dy);
  float *yd = dev_.Upload(Guarded(n)), *dgd = dev_.Upload(Guarded(n)),
        *dud = dev_.Upload(Guarded(n));
  ASSERT_TRUE(SwiGluForward(Gpu(), {.n = n, .gate = gd, .up = ud, .y = yd}).ok());
  ASSERT_TRUE(
      SwiGluBackward(Gpu(), {.n = n, .gate = gd, .up = ud, .dy = dyd, .dgate = dgd, .dup = dud})
          .ok());
  // The CPU's polynomial exp against CUDA's expf: a few ulp.
  EXPECT_TRUE(SameAsCpu(yd, y, 1e-6, 1e-5));
  EXPECT_TRUE(SameAsCpu(dgd, dg, 1e-6, 1e-5));
  EXPECT_TRUE(SameAsCpu(dud, du, 1e-6, 1e-5));
}

TEST_F(BackendEquivalence, Embedding) {
  const int64_t V = 100, Pmax = 64, T = 2, H = 96, tokens = 48;
  auto word = Random(V * H, 71);
  const auto wbits = TruncateToBf16(word);
  const auto pos = Random(Pmax * H, 72), type = Random(T * H, 73);
  std::vector<int32_t> ids(tokens), types(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    ids[t] = static_cast<int32_t>((t * 37) % V);
    types[t] = static_cast<int32_t>(t % 2);
  }
  EmbeddingForwardArgs a{.tokens = tokens,
                         .hidden = H,
                         .seq_len = 16,
                         .vocab = V,
                         .max_positions = Pmax,
                         .type_vocab = T,
                         .input_ids = ids.data(),
                         .token_type_ids = types.data(),
                         .word = WeightPtr::BF16(wbits.data()),
                         .position = WeightPtr::F32(pos.data()),
                         .token_type = WeightPtr::F32(type.data())};
  Guarded out(tokens * H);
  a.out = out.data();
  ASSERT_TRUE(EmbeddingForward(Cpu(), a).ok());
  EmbeddingForwardArgs d = a;
  d.input_ids = dev_.Upload(ids);
  d.token_type_ids = dev_.Upload(types);
  d.word = WeightPtr::BF16(dev_.Upload(wbits));
  d.position = WeightPtr::F32(dev_.Upload(pos));
  d.token_type = WeightPtr::F32(dev_.Upload(type));
  d.out = dev_.Upload(Guarded(tokens * H));
  ASSERT_TRUE(EmbeddingForward(Gpu(), d).ok());
  // Three-term sums in the same order: exact.
  EXPECT_TRUE(SameAsCpu(d.out, out, 0, 0));
}

TEST_F(BackendEquivalence, CrossEntropy) {
  const int64_t B = 17, C = 300;
  const auto logits = Random(B * C, 81, -4, 4);
  std::vector<int32_t> labels(B);
  for (int64_t b = 0; b < B; ++b)
    labels[b] = b == 5 ? kIgnoreIndex : static_cast<int32_t>((b * 31) % C);
  Guarded loss(1), dl(B * C);
  ASSERT_TRUE(SoftmaxCrossEntropy(Cpu(), CrossEntropyArgs{.batch = B,
                                                          .classes = C,
                                                          .logits = logits.data(),
                                                          .labels = labels.data(),
                                                          .loss = loss.data(),
                                                          .dlogits = dl.data()})
                  .ok());
  float *ld = dev_.Upload(Guarded(1)), *dld = dev_.Upload(Guarded(B * C));
  ASSERT_TRUE(SoftmaxCrossEntropy(Gpu(), CrossEntropyArgs{.batch = B,
                                                          .classes = C,
                                                          .logits = dev_.Upload(logits),
                                                          .labels = dev_.Upload(labels),
                                                          .loss = ld,
                                                          .dlogits = dld})
                  .ok());
  // 300-term exp sums in a different order: 1e-5 relative on the loss, 1e-6 on probabilities.
  EXPECT_TRUE(SameAsCpu(ld, loss, 1e-5, 1e-5));
  EXPECT_TRUE(SameAsCpu(dld, dl, 1e-6, 1e-4));
}

TEST_F(BackendEquivalence, AdamW) {
  const int64_t n = 5003;
  auto p = Random(n, 91), m = Random(n, 92, 0, 0.1f), v = Random(n, 93, 0, 0.01f);
  const auto g = Random(n, 94);
  const AdamWArgs base{.n = n, .lr = 1e-3f, .weight_decay = 0.01f, .step = 7, .grad_scale = 0.8f};
  Guarded pc(p), mc(m), vc(v);
  AdamWArgs c = base;
  c.param = pc.data();
  c.grad = g.data();
  c.m = mc.data();
  c.v = vc.data();
  ASSERT_TRUE(AdamWStep(Cpu(), c).ok());
  AdamWArgs d = base;
  d.param = dev_.Upload(Guarded(p));
  d.grad = dev_.Upload(g);
  d.m = dev_.Upload(Guarded(m));
  d.v = dev_.Upload(Guarded(v));
  ASSERT_TRUE(AdamWStep(Gpu(), d).ok());
  // Elementwise with possibly fused multiply-adds on the GPU: a few ulp.
  EXPECT_TRUE(SameAsCpu(d.param, pc, 1e-6, 1e-6));
  EXPECT_TRUE(SameAsCpu(d.m, mc, 1e-7, 1e-6));
  EXPECT_TRUE(SameAsCpu(d.v, vc, 1e-8, 1e-6));
}

// Federated averaging's exact accumulator: integer sums, so the bits must be the CPU's exactly,
// the rolled-back update included.
TEST_F(BackendEquivalence, FixedPointAccumulateIsBitIdentical) {
  const int64_t n = 300007;
  std::vector<u128> cpu(n);
  for (int64_t i = 0; i < n; ++i)
    cpu[i] = (static_cast<u128>(i) << 70) - static_cast<u128>(i * 977);
  u128* dev = dev_.Upload(cpu);
  for (uint64_t w : {uint64_t{1}, uint64_t{37}, uint64_t{1} << 32}) {
    std::vector<float> x = Random(n, static_cast<uint32_t>(w), -3.0f, 3.0f);
    x[11] = std::ldexp(1.0f, -80);  // rounds to 0 or 1 unit depending on w
    int64_t bad_cpu = 0, bad_gpu = 0;
    ASSERT_TRUE(
        FixedPointAccumulate(
            Cpu(), {.n = n, .x = x.data(), .weight = w, .sums = cpu.data(), .first_bad = &bad_cpu})
            .ok());
    ASSERT_TRUE(
        FixedPointAccumulate(
            Gpu(), {.n = n, .x = dev_.Upload(x), .weight = w, .sums = dev, .first_bad = &bad_gpu})
            .ok());
    EXPECT_EQ(bad_cpu, -1);
    EXPECT_EQ(bad_gpu, -1);
  }
  // An update with bad values in two places: both report the first, add the rest; subtracting
  // it again restores the bits.
  std::vector<float> x = Random(n, 99);
  x[250000] = std::numeric_limits<float>::infinity();
  x[123457] = std::ldexp(1.0f, 44);
  for (int sign : {1, -1}) {
    int64_t bad_cpu = 0, bad_gpu = 0;
    ASSERT_TRUE(FixedPointAccumulate(Cpu(), {.n = n,
                                             .x = x.data(),
                                             .weight = 2,
                                             .sign = sign,
                                             .sums = cpu.data(),
                                             .first_bad = &bad_cpu})
                    .ok());
    ASSERT_TRUE(FixedPointAccumulate(Gpu(), {.n = n,
                                             .x = dev_.Upload(x),
                                             .weight = 2,
                                             .sign = sign,
                                             .sums = dev,
                                             .first_bad = &bad_gpu})
                    .ok());
    EXPECT_EQ(bad_cpu, 123457);
    EXPECT_EQ(bad_gpu, 123457);
  }
  // A sparse update: every third sum, in scattered order, through the index array.
  std::vector<int64_t> index;
  for (int64_t i = n - 1; i >= 0; i -= 3) index.push_back(i);
  std::swap(index[5], index[index.size() / 2]);
  const int64_t k = static_cast<int64_t>(index.size());
  const std::vector<float> kept = Random(k, 98, -5.0f, 5.0f);
  int64_t bad_cpu = 0, bad_gpu = 0;
  ASSERT_TRUE(FixedPointAccumulate(Cpu(), {.n = k,
                                           .x = kept.data(),
                                           .weight = 3,
                                           .sums = cpu.data(),
                                           .index = index.data(),
                                           .first_bad = &bad_cpu})
                  .ok());
  ASSERT_TRUE(FixedPointAccumulate(Gpu(), {.n = k,
                                           .x = dev_.Upload(kept),
                                           .weight = 3,
                                           .sums = dev,
                                           .index = dev_.Upload(index),
                                           .first_bad = &bad_gpu})
                  .ok());
  EXPECT_EQ(bad_cpu, -1);
  EXPECT_EQ(bad_gpu, -1);
  std::vector<u128> got(n);
  ASSERT_TRUE(CopyToHost(got.data(), dev, n * sizeof(u128)).ok());
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += got[i] != cpu[i] ? 1 : 0;
  EXPECT_EQ(differ, 0) << "sums that differ from the CPU's";
}

// Top-k selection: the GPU's indices must be the CPU's exactly, ties (and -0 against +0) included.
// The index buffer is poisoned, with poisoned guard entries after the k that must survive.
TEST_F(BackendEquivalence, TopKIndicesAreIdentical) {
  constexpr size_t kGuardIdx = 16;
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300007}}) {
    std::vector<float> x = Random(static_cast<size_t>(n), static_cast<uint32_t>(61 + n));
    for (int64_t i = 0; i < n; i += 3)
      x[i] = std::round(x[i] * 8.0f) / 8.0f;  // ties, zeros of both signs
    const float* xd = dev_.Upload(x);
    for (int64_t k : {int64_t{1}, n / 100 + 1, n / 2, n}) {
      if (k < 1) continue;
      std::vector<int64_t> cpu(static_cast<size_t>(k));
      TopKArgs a{.n = n, .k = k, .x = x.data(), .indices = cpu.data()};
      auto cpu_ws = TopKWorkspaceBytes(Cpu(), a);
      ASSERT_TRUE(cpu_ws.ok());
      std::vector<uint8_t> ws(*cpu_ws);
      a.workspace = ws.data();
      a.workspace_bytes = ws.size();
      ASSERT_TRUE(TopK(Cpu(), a).ok());
      int64_t* idx = dev_.Upload(std::vector<int64_t>(static_cast<size_t>(k) + kGuardIdx, -1));
      TopKArgs d{.n = n, .k = k, .x = xd, .indices = idx};
      auto gpu_ws = TopKWorkspaceBytes(Gpu(), d);
      ASSERT_TRUE(gpu_ws.ok()) << gpu_ws.status();
      d.workspace = dev_.Workspace(*gpu_ws);
      d.workspace_bytes = *gpu_ws;
      const absl::Status st = TopK(Gpu(), d);
      ASSERT_TRUE(st.ok()) << st;
      std::vector<int64_t> got(static_cast<size_t>(k) + kGuardIdx);
      ASSERT_TRUE(CopyToHost(got.data(), idx, got.size() * sizeof(int64_t)).ok());
      for (size_t g = 0; g < kGuardIdx; ++g)
        ASSERT_EQ(got[static_cast<size_t>(k) + g], -1) << "wrote past k";
      got.resize(static_cast<size_t>(k));
      EXPECT_EQ(got, cpu) << "n " << n << " k " << k;
    }
  }
}

// Blockwise quantization: the GPU writes the CPU's bytes, scales, codes, padding and (stochastic)
// the same random draws, for every bit width, with a short last block and an all-zero block.
TEST_F(BackendEquivalence, BlockQuantizeBytesAreIdentical) {
  constexpr size_t kGuardBytes = 64;
  const int64_t n = 100003;
  std::vector<float> x = Random(static_cast<size_t>(n), 71, -2.0f, 2.0f);
  for (int64_t i = 256; i < 512; ++i) x[static_cast<size_t>(i)] = 0.0f;  // s = 0 blocks: no draws
  const float* xd = dev_.Upload(x);
  for (int bits : {1, 2, 4, 8}) {
    for (bool stochastic : {false, true}) {
      for (int64_t block : {int64_t{8}, int64_t{264}}) {
        const size_t bytes = BlockQuantizedBytes(static_cast<uint64_t>(n), bits, block);
        std::vector<uint8_t> cpu(bytes, 0xAB);
        BlockQuantizeArgs a{.n = n,
                            .x = x.data(),
                            .bits = bits,
                            .block_size = block,
                            .stochastic = stochastic,
                            .seed = 0x0123456789abcdefull,
                            .stream = 5,
                            .out = cpu.data()};
        ASSERT_TRUE(BlockQuantize(Cpu(), a).ok());
        uint8_t* out = dev_.Upload(std::vector<uint8_t>(bytes + kGuardBytes, 0xAB));
        BlockQuantizeArgs d = a;
        d.x = xd;
        d.out = out;
        auto ws = BlockQuantizeWorkspaceBytes(Gpu(), d);
        ASSERT_TRUE(ws.ok()) << ws.status();
        d.workspace = dev_.Workspace(*ws);
        d.workspace_bytes = *ws;
        const absl::Status st = BlockQuantize(Gpu(), d);
        ASSERT_TRUE(st.ok()) << st;
        std::vector<uint8_t> got(bytes + kGuardBytes);
        ASSERT_TRUE(CopyToHost(got.data(), out, got.size()).ok());
        for (size_t g = 0; g < kGuardBytes; ++g)
          ASSERT_EQ(got[bytes + g], 0xAB) << "wrote past the end";
        got.resize(bytes);
        size_t first_diff = bytes;
        for (size_t i = 0; i < bytes && first_diff == bytes; ++i)
          first_diff = got[i] != cpu[i] ? i : bytes;
        EXPECT_EQ(first_diff, bytes) << "bits " << bits << " stochastic " << stochastic << " block "
                                     << block << ": first differing byte";
      }
    }
  }
}

TEST_F(BackendEquivalence, ReductionsAndElementwise) {
  const int64_t R = 129, C = 77, n = R * C;
  const auto x = Random(n, 101), bias = Random(C, 102), other = Random(n, 103);
  float* xd = dev_.Upload(x);
  // SumSquares (double accumulation on both sides: equal after the fp32 rounding, or 1 ulp).
  Guarded ss(1);
  ASSERT_TRUE(SumSquares(Cpu(), SumSquaresArgs{.n = n, .x = x.data(), .result = ss.data()}).ok());
  float* ssd = dev_.Upload(Guarded(1));
  ASSERT_TRUE(SumSquares(Gpu(), SumSquaresArgs{.n = n, .x = xd, .result = ssd}).ok());
  EXPECT_TRUE(SameAsCpu(ssd, ss, 0, 1e-7));
  // SumSquaresMany over three tensors (one empty), accumulating onto a start value.
  const auto x2 = Random(5000, 104);
  const std::vector<const float*> host_ptrs = {x.data(), x2.data(), x.data()};
  const std::vector<const float*> dev_ptrs = {xd, dev_.Upload(x2), xd};
  const std::vector<int64_t> lens = {n, 5000, 0};
  Guarded many(std::vector<float>{0.75f});
  ASSERT_TRUE(SumSquaresMany(Cpu(), SumSquaresManyArgs{.tensors = 3,
                                                       .x = host_ptrs.data(),
                                                       .n = lens.data(),
                                                       .result = many.data(),
                                                       .accumulate = true})
                  .ok());
  float* manyd = dev_.Upload(Guarded(std::vector<float>{0.75f}));
  ASSERT_TRUE(SumSquaresMany(Gpu(), SumSquaresManyArgs{.tensors = 3,
                                                       .x = dev_ptrs.data(),
                                                       .n = lens.data(),
                                                       .result = manyd,
                                                       .accumulate = true})
                  .ok());
  EXPECT_TRUE(SameAsCpu(manyd, many, 0, 1e-7));
  // ColumnSum (129 terms, different order): 1e-5.
  Guarded cs(C);
  ASSERT_TRUE(
      ColumnSum(Cpu(), ColumnSumArgs{.rows = R, .cols = C, .x = x.data(), .out = cs.data()}).ok());
  float* csd = dev_.Upload(Guarded(C));
  ASSERT_TRUE(ColumnSum(Gpu(), ColumnSumArgs{.rows = R, .cols = C, .x = xd, .out = csd}).ok());
  EXPECT_TRUE(SameAsCpu(csd, cs, 1e-5, 1e-5));
  // BiasAdd, Add, Scale: one rounding each, exact.
  Guarded y(other);
  ASSERT_TRUE(
      BiasAdd(Cpu(), BiasAddArgs{.rows = R, .cols = C, .bias = bias.data(), .y = y.data()}).ok());
  ASSERT_TRUE(
      Add(Cpu(), AddArgs{.n = n, .a = y.data(), .b = x.data(), .alpha = -0.5f, .out = y.data()})
          .ok());
  ASSERT_TRUE(Scale(Cpu(), ScaleArgs{.n = n, .alpha = 3.0f, .x = y.data()}).ok());
  float* yd = dev_.Upload(Guarded(other));
  ASSERT_TRUE(
      BiasAdd(Gpu(), BiasAddArgs{.rows = R, .cols = C, .bias = dev_.Upload(bias), .y = yd}).ok());
  ASSERT_TRUE(Add(Gpu(), AddArgs{.n = n, .a = yd, .b = xd, .alpha = -0.5f, .out = yd}).ok());
  ASSERT_TRUE(Scale(Gpu(), ScaleArgs{.n = n, .alpha = 3.0f, .x = yd}).ok());
  // a + alpha * b may be one fused multiply-add on the GPU: 1 ulp.
  EXPECT_TRUE(SameAsCpu(yd, y, 1e-6, 1e-6));
}

}  // namespace
}  // namespace fedlora::kernels
