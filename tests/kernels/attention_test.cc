#include "kernels/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::AllClose;
using testing::Cpu;
using testing::ExpectGradient;
using testing::Guarded;
using testing::Random;

constexpr float kMaskMin = -std::numeric_limits<float>::max();  // HF: torch.finfo(float32).min

struct Case {
  AttentionDims d;
  std::vector<float> q, k, v, mask;
  DropoutSpec dropout;
  int64_t Kv() const { return d.kv_heads == 0 ? d.heads : d.kv_heads; }
  int64_t Elems() const { return d.batch * d.heads * d.seq * d.head_dim; }
  int64_t KvElems() const { return d.batch * Kv() * d.seq * d.head_dim; }
  int64_t ProbElems() const { return d.batch * d.heads * d.seq * d.seq; }
  // Index of (b, h, s, e) in the layout.
  int64_t At(int64_t b, int64_t h, int64_t s, int64_t e) const {
    if (d.layout == AttentionLayout::kBHSD) return ((b * d.heads + h) * d.seq + s) * d.head_dim + e;
    return ((b * d.seq + s) * d.heads + h) * d.head_dim + e;
  }
  // Index of K/V head `kh` of (b, s, e).
  int64_t AtKv(int64_t b, int64_t kh, int64_t s, int64_t e) const {
    if (d.layout == AttentionLayout::kBHSD) return ((b * Kv() + kh) * d.seq + s) * d.head_dim + e;
    return ((b * d.seq + s) * Kv() + kh) * d.head_dim + e;
  }
  std::vector<float> Forward(std::vector<float>* probs_out = nullptr) const {
    std::vector<float> out(Elems()), probs(ProbElems());
    AttentionForwardArgs f{.dims = d,
                           .q = q.data(),
                           .k = k.data(),
                           .v = v.data(),
                           .mask = mask.empty() ? nullptr : mask.data(),
                           .dropout = dropout,
                           .probs = probs.data(),
                           .out = out.data()};
    std::vector<float> ws(AttentionWorkspaceBytes(f) / 4 + 1);
    f.workspace = ws.data();
    f.workspace_bytes = ws.size() * 4;
    EXPECT_TRUE(AttentionForward(Cpu(), f).ok());
    if (probs_out != nullptr) *probs_out = probs;
    return out;
  }
};

Case MakeCase(AttentionLayout layout, bool with_mask, float p, int64_t heads = 3,
              int64_t kv_heads = 0, bool causal = false) {
  Case c;
  c.d = AttentionDims{.batch = 2,
                      .heads = heads,
                      .seq = 5,
                      .head_dim = 4,
                      .layout = layout,
                      .kv_heads = kv_heads,
                      .causal = causal};
  c.q = Random(c.Elems(), 71);
  c.k = Random(c.KvElems(), 72);
  c.v = Random(c.KvElems(), 73);
  if (with_mask) {
    c.mask.assign(c.d.batch * c.d.seq, 0.0f);
    c.mask[0 * c.d.seq + 4] = kMaskMin;  // sequence 0: last token is padding
    c.mask[1 * c.d.seq + 3] = kMaskMin;  // sequence 1: last two
    c.mask[1 * c.d.seq + 4] = kMaskMin;
  }
  c.dropout = DropoutSpec{.p = p, .seed = 5, .offset = 0};
  return c;
}

TEST(Attention, ForwardMatchesNaiveReference) {
  for (auto layout : {AttentionLayout::kBHSD, AttentionLayout::kBSHD}) {
    const Case c = MakeCase(layout, /*with_mask=*/true, 0.0f);
    std::vector<float> probs;
    const auto out = c.Forward(&probs);
    const auto& d = c.d;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t h = 0; h < d.heads; ++h) {
        for (int64_t i = 0; i < d.seq; ++i) {
          std::vector<double> s(d.seq);
          double m = -1e300, sum = 0;
          for (int64_t j = 0; j < d.seq; ++j) {
            double dot = 0;
            for (int64_t e = 0; e < d.head_dim; ++e)
              dot += double(c.q[c.At(b, h, i, e)]) * c.k[c.At(b, h, j, e)];
            s[j] = dot * scale + (c.mask[b * d.seq + j] != 0 ? -1e30 : 0.0);
            m = std::max(m, s[j]);
          }
          for (auto& x : s) sum += (x = std::exp(x - m));
          for (int64_t j = 0; j < d.seq; ++j) {
            s[j] /= sum;
            // Masked keys get exactly zero probability.
            if (c.mask[b * d.seq + j] != 0) {
              EXPECT_EQ(probs[((b * d.heads + h) * d.seq + i) * d.seq + j], 0.0f);
            }
            EXPECT_NEAR(probs[((b * d.heads + h) * d.seq + i) * d.seq + j], s[j], 1e-6);
          }
          for (int64_t e = 0; e < d.head_dim; ++e) {
            double o = 0;
            for (int64_t j = 0; j < d.seq; ++j) o += s[j] * c.v[c.At(b, h, j, e)];
            EXPECT_NEAR(out[c.At(b, h, i, e)], o, 1e-5);
          }
        }
      }
    }
  }
}

TEST(Attention, FullyMaskedRowIsUniformAsInHuggingFace) {
  Case c = MakeCase(AttentionLayout::kBHSD, true, 0.0f);
  for (int64_t j = 0; j < c.d.seq; ++j) c.mask[j] = kMaskMin;  // every key of sequence 0 masked
  std::vector<float> probs;
  c.Forward(&probs);
  for (int64_t j = 0; j < c.d.seq; ++j) EXPECT_FLOAT_EQ(probs[j], 1.0f / c.d.seq);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (auto layout : {AttentionLayout::kBHSD, AttentionLayout::kBSHD}) {
    for (float p : {0.0f, 0.2f}) {
      Case c = MakeCase(layout, true, p);
      std::vector<float> probs;
      c.Forward(&probs);
      const auto dout = Random(c.Elems(), 74);
      Guarded dq(c.Elems()), dk(c.Elems()), dv(c.Elems());
      AttentionBackwardArgs bw{.dims = c.d,
                               .q = c.q.data(),
                               .k = c.k.data(),
                               .v = c.v.data(),
                               .probs = probs.data(),
                               .dropout = c.dropout,
                               .dout = dout.data(),
                               .dq = dq.data(),
                               .dk = dk.data(),
                               .dv = dv.data()};
      std::vector<float> ws(AttentionWorkspaceBytes(bw) / 4);
      bw.workspace = ws.data();
      bw.workspace_bytes = ws.size() * 4;
      ASSERT_TRUE(AttentionBackward(Cpu(), bw).ok());
      EXPECT_TRUE(dq.GuardsIntact() && dk.GuardsIntact() && dv.GuardsIntact());
      auto fwd = [&] { return c.Forward(); };
      const std::string tag = std::string(layout == AttentionLayout::kBHSD ? "BHSD" : "BSHD") +
                              " p=" + std::to_string(p);
      ExpectGradient(fwd, c.q, dout, dq.values(), tag + " dQ");
      ExpectGradient(fwd, c.k, dout, dk.values(), tag + " dK");
      ExpectGradient(fwd, c.v, dout, dv.values(), tag + " dV");
    }
  }
}

// Grouped-query heads (6 query heads on 2 or 3 K/V heads, and 1: multi-query) with the causal
// mask and padding, against a naive double-precision reference written from the definition.
TEST(Attention, GroupedCausalForwardMatchesNaiveReference) {
  for (auto layout : {AttentionLayout::kBHSD, AttentionLayout::kBSHD}) {
    for (int64_t kv : {1, 2, 3, 6}) {
      const Case c = MakeCase(layout, /*with_mask=*/true, 0.0f, /*heads=*/6, kv, /*causal=*/true);
      std::vector<float> probs;
      const auto out = c.Forward(&probs);
      const auto& d = c.d;
      const int64_t group = d.heads / kv;
      const double scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
      for (int64_t b = 0; b < d.batch; ++b) {
        for (int64_t h = 0; h < d.heads; ++h) {
          const int64_t kh = h / group;
          for (int64_t i = 0; i < d.seq; ++i) {
            std::vector<double> s(d.seq, 0.0);
            double m = -1e300, sum = 0;
            for (int64_t j = 0; j <= i; ++j) {
              double dot = 0;
              for (int64_t e = 0; e < d.head_dim; ++e)
                dot += double(c.q[c.At(b, h, i, e)]) * c.k[c.AtKv(b, kh, j, e)];
              s[j] = dot * scale + (c.mask[b * d.seq + j] != 0 ? -1e30 : 0.0);
              m = std::max(m, s[j]);
            }
            for (int64_t j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - m));
            for (int64_t j = 0; j < d.seq; ++j) {
              const float got = probs[((b * d.heads + h) * d.seq + i) * d.seq + j];
              if (j > i) {
                EXPECT_EQ(got, 0.0f) << "key after the query";
                continue;
              }
              s[j] /= sum;
              EXPECT_NEAR(got, s[j], 1e-6);
            }
            for (int64_t e = 0; e < d.head_dim; ++e) {
              double o = 0;
              for (int64_t j = 0; j <= i; ++j) o += s[j] * c.v[c.AtKv(b, kh, j, e)];
              EXPECT_NEAR(out[c.At(b, h, i, e)], o, 1e-5) << "kv_heads " << kv;
            }
          }
        }
      }
    }
  }
}

TEST(Attention, GroupedCausalBackwardMatchesFiniteDifferences) {
  for (auto layout : {AttentionLayout::kBHSD, AttentionLayout::kBSHD}) {
    for (int64_t kv : {1, 2}) {
      for (float p : {0.0f, 0.2f}) {
        Case c = MakeCase(layout, true, p, /*heads=*/4, kv, /*causal=*/true);
        std::vector<float> probs;
        c.Forward(&probs);
        const auto dout = Random(c.Elems(), 74);
        Guarded dq(c.Elems()), dk(c.KvElems(), 7.0f),
            dv(c.KvElems(), 7.0f);  // poisoned: must be overwritten
        AttentionBackwardArgs bw{.dims = c.d,
                                 .q = c.q.data(),
                                 .k = c.k.data(),
                                 .v = c.v.data(),
                                 .probs = probs.data(),
                                 .dropout = c.dropout,
                                 .dout = dout.data(),
                                 .dq = dq.data(),
                                 .dk = dk.data(),
                                 .dv = dv.data()};
        std::vector<float> ws(AttentionWorkspaceBytes(bw) / 4);
        bw.workspace = ws.data();
        bw.workspace_bytes = ws.size() * 4;
        ASSERT_TRUE(AttentionBackward(Cpu(), bw).ok());
        EXPECT_TRUE(dq.GuardsIntact() && dk.GuardsIntact() && dv.GuardsIntact());
        auto fwd = [&] { return c.Forward(); };
        const std::string tag = std::string(layout == AttentionLayout::kBHSD ? "BHSD" : "BSHD") +
                                " kv=" + std::to_string(kv) + " p=" + std::to_string(p);
        ExpectGradient(fwd, c.q, dout, dq.values(), tag + " dQ");
        ExpectGradient(fwd, c.k, dout, dk.values(), tag + " dK");
        ExpectGradient(fwd, c.v, dout, dv.values(), tag + " dV");
      }
    }
  }
}

// With out null the forward computes P alone (a backward that recomputes P rather than keeping
// it relies on this): the same P bit for bit, with dropout on too, and it needs no workspace
// and no V.
TEST(Attention, ProbsOnlyForwardEqualsFullForward) {
  for (auto layout : {AttentionLayout::kBHSD, AttentionLayout::kBSHD}) {
    for (float p : {0.0f, 0.2f}) {
      const Case c =
          MakeCase(layout, /*with_mask=*/true, p, /*heads=*/6, /*kv_heads=*/2, /*causal=*/true);
      std::vector<float> full;
      c.Forward(&full);
      Guarded probs(c.ProbElems(), 7.0f);  // poisoned: every entry must be written
      AttentionForwardArgs f{.dims = c.d,
                             .q = c.q.data(),
                             .k = c.k.data(),
                             .mask = c.mask.data(),
                             .dropout = c.dropout,
                             .probs = probs.data()};
      EXPECT_EQ(AttentionWorkspaceBytes(f), 0u);
      ASSERT_TRUE(AttentionForward(Cpu(), f).ok());
      EXPECT_TRUE(probs.GuardsIntact());
      EXPECT_EQ(probs.values(), full) << "p=" << p;
    }
  }
}

TEST(Attention, RefusesKvHeadsThatDoNotDivideHeads) {
  Case c = MakeCase(AttentionLayout::kBSHD, false, 0.0f, /*heads=*/6, /*kv_heads=*/4);
  std::vector<float> out(c.Elems()), probs(c.ProbElems());
  AttentionForwardArgs f{.dims = c.d,
                         .q = c.q.data(),
                         .k = c.k.data(),
                         .v = c.v.data(),
                         .probs = probs.data(),
                         .out = out.data()};
  const absl::Status st = AttentionForward(Cpu(), f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("kv_heads 4 does not divide heads 6"), std::string::npos)
      << st;
}

TEST(Attention, RejectsBadArguments) {
  Case c = MakeCase(AttentionLayout::kBSHD, false, 0.0f);
  std::vector<float> out(c.Elems()), probs(c.ProbElems());
  AttentionForwardArgs f{.dims = c.d,
                         .q = c.q.data(),
                         .k = c.k.data(),
                         .v = c.v.data(),
                         .probs = probs.data(),
                         .out = out.data()};
  EXPECT_TRUE(CanRun(Cpu(), f).ok());
  f.probs = nullptr;
  EXPECT_EQ(AttentionForward(Cpu(), f).code(), absl::StatusCode::kInvalidArgument);
  f.probs = probs.data();
  f.dropout.p = 0.1f;  // needs a workspace now
  EXPECT_EQ(AttentionForward(Cpu(), f).code(), absl::StatusCode::kInvalidArgument);
  f.dropout.p = 0.0f;
  f.dims.heads = -1;
  EXPECT_EQ(AttentionForward(Cpu(), f).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora::kernels
