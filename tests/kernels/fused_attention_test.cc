// FusedAttentionForward/Backward on the CPU against the materialising attention of
// kernels/attention.h, called once per sequence as the padding-free encoder calls it: packed
// sequences of lengths 5, 1, 0, 13 and 9, grouped-query heads, causal or not, with dropout whose
// indices the two ops must share. Plus the log-sum-exp against a double-precision sum and the
// argument checks.
#include "kernels/fused_attention.h"

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::AllClose;
using testing::Cpu;
using testing::Random;

const std::vector<int32_t> kStarts = {0, 5, 6, 6, 19, 28};  // lengths 5, 1, 0, 13, 9
constexpr int64_t kTokens = 28, kSeqs = 5, kDim = 16;

struct Case {
  int64_t heads, kv_heads;
  bool causal, masked;
};

TEST(FusedAttention, MatchesPerSequenceAttention) {
  // Padding keys (mask -1e30) at the ends of the first and fourth sequences and the start of the last.
  std::vector<float> mask(kTokens, 0.0f);
  for (int64_t t : {3, 4, 17, 18, 19}) mask[t] = -1e30f;
  for (Case c : {Case{4, 0, false, false}, Case{6, 2, true, false}, Case{4, 1, true, false},
                 Case{4, 2, false, true}}) {
    const int64_t kvh = c.kv_heads == 0 ? c.heads : c.kv_heads;
    const int64_t E = kTokens * c.heads * kDim, EK = kTokens * kvh * kDim;
    const auto q = Random(E, 1), k = Random(EK, 2), v = Random(EK, 3), dout = Random(E, 4);
    const DropoutSpec drop{.p = 0.2f, .seed = 9, .offset = 7, .stream = 3};
    const FusedAttentionDims dims{.tokens = kTokens,
                                  .num_seqs = kSeqs,
                                  .heads = c.heads,
                                  .head_dim = kDim,
                                  .kv_heads = c.kv_heads,
                                  .causal = c.causal,
                                  .seq_start = kStarts.data(),
                                  .mask = c.masked ? mask.data() : nullptr};
    std::vector<float> out(E, NAN), lse(kTokens * c.heads, NAN), dq(E, NAN), dk(EK, NAN),
        dv(EK, NAN);
    ASSERT_TRUE(FusedAttentionForward(Cpu(), {.dims = dims,
                                              .q = q.data(),
                                              .k = k.data(),
                                              .v = v.data(),
                                              .dropout = drop,
                                              .out = out.data(),
                                              .lse = lse.data()})
                    .ok());
    std::vector<float> ws(FusedAttentionBackwardWorkspaceBytes(dims) / sizeof(float));
    ASSERT_TRUE(FusedAttentionBackward(Cpu(), {.dims = dims,
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
                                               .workspace_bytes = ws.size() * sizeof(float)})
                    .ok());
    // The reference: one AttentionForward/Backward per non-empty sequence, dropout offset advanced
    // by heads * n^2 per sequence.
    std::vector<float> ro(E, NAN), rdq(E, NAN), rdk(EK, NAN), rdv(EK, NAN);
    uint64_t offset = drop.offset;
    for (int64_t s = 0; s < kSeqs; ++s) {
      const int64_t b = kStarts[s], n = kStarts[s + 1] - b;
      if (n == 0) continue;
      const AttentionDims ad{.batch = 1,
                             .heads = c.heads,
                             .seq = n,
                             .head_dim = kDim,
                             .layout = AttentionLayout::kBSHD,
                             .kv_heads = c.kv_heads,
                             .causal = c.causal};
      DropoutSpec d = drop;
      d.offset = offset;
      offset += static_cast<uint64_t>(c.heads * n * n);
      std::vector<float> probs(c.heads * n * n);
      AttentionForwardArgs f{.dims = ad,
                             .q = q.data() + b * c.heads * kDim,
                             .k = k.data() + b * kvh * kDim,
                             .v = v.data() + b * kvh * kDim,
                             .mask = c.masked ? mask.data() + b : nullptr,
                             .dropout = d,
                             .probs = probs.data(),
                             .out = ro.data() + b * c.heads * kDim};
      std::vector<float> fws(AttentionWorkspaceBytes(f) / 4 + 1);
      f.workspace = fws.data();
      f.workspace_bytes = fws.size() * 4;
      ASSERT_TRUE(AttentionForward(Cpu(), f).ok());
      AttentionBackwardArgs bw{.dims = ad,
                               .q = f.q,
                               .k = f.k,
                               .v = f.v,
                               .probs = probs.data(),
                               .dropout = d,
                               .dout = dout.data() + b * c.heads * kDim,
                               .dq = rdq.data() + b * c.heads * kDim,
                               .dk = rdk.data() + b * kvh * kDim,
                               .dv = rdv.data() + b * kvh * kDim};
      std::vector<float> bws(AttentionWorkspaceBytes(bw) / 4 + 1);
      bw.workspace = bws.data();
      bw.workspace_bytes = bws.size() * 4;
      ASSERT_TRUE(AttentionBackward(Cpu(), bw).ok());
    }
    const std::string tag = "heads " + std::to_string(c.heads) + "/" + std::to_string(kvh) +
                            (c.causal ? " causal" : "") + (c.masked ? " masked" : "");
    EXPECT_TRUE(AllClose(out, ro, 1e-5, 1e-4)) << tag << " out";
    EXPECT_TRUE(AllClose(dq, rdq, 1e-5, 1e-4)) << tag << " dq";
    EXPECT_TRUE(AllClose(dk, rdk, 1e-5, 1e-4)) << tag << " dk";
    EXPECT_TRUE(AllClose(dv, rdv, 1e-5, 1e-4)) << tag << " dv";

    // lse of the last token of the fourth sequence, head 1, in double.
    const int64_t t = 18, b = 6, h = 1, g = h / (c.heads / kvh);
    const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    double sum = 0.0;
    for (int64_t j = b; j <= t; ++j) {
      if (c.masked && mask[j] != 0.0f) continue;
      double dot = 0.0;
      for (int64_t e = 0; e < kDim; ++e)
        dot += double(q[(t * c.heads + h) * kDim + e]) * k[(j * kvh + g) * kDim + e];
      sum += std::exp(scale * dot);
    }
    EXPECT_NEAR(lse[t * c.heads + h], std::log(sum), 1e-5) << tag;
  }
}

TEST(FusedAttention, RefusesBadArguments) {
  const std::vector<float> x(kTokens * 4 * kDim);
  std::vector<float> out(x.size()), lse(kTokens * 4);
  FusedAttentionForwardArgs f{.dims = {.tokens = kTokens,
                                       .num_seqs = kSeqs,
                                       .heads = 4,
                                       .head_dim = kDim,
                                       .seq_start = kStarts.data()},
                              .q = x.data(),
                              .k = x.data(),
                              .v = x.data(),
                              .out = out.data(),
                              .lse = lse.data()};
  ASSERT_TRUE(CanRun(Cpu(), f).ok());
  auto refused = [](const FusedAttentionForwardArgs& a, const std::string& what) {
    const absl::Status s = CanRun(Cpu(), a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  };
  FusedAttentionForwardArgs a = f;
  a.dims.tokens = 27;
  refused(a, "seq_start must run from 0 to tokens");
  const std::vector<int32_t> down = {0, 5, 4, 6, 19, 28};
  a = f;
  a.dims.seq_start = down.data();
  refused(a, "must not decrease");
  a = f;
  a.dims.kv_heads = 3;
  refused(a, "kv_heads must divide heads");
  a = f;
  a.dims.head_dim = 300;
  refused(a, "head_dim 300 above 256");
  a = f;
  a.lse = nullptr;
  refused(a, "lse is null");
  a = f;
  a.dropout.p = 1.0f;
  refused(a, "dropout p");
  FusedAttentionBackwardArgs b{.dims = f.dims,
                               .q = x.data(),
                               .k = x.data(),
                               .v = x.data(),
                               .out = out.data(),
                               .lse = lse.data(),
                               .dout = x.data(),
                               .dq = out.data(),
                               .dk = out.data(),
                               .dv = out.data(),
                               .workspace = out.data(),
                               .workspace_bytes = 4};
  const absl::Status s = CanRun(Cpu(), b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("workspace of 4 bytes"), std::string::npos) << s;
}

}  // namespace
}  // namespace fedlora::kernels
