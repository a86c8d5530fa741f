#include "kernels/decode_attention.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::AllClose;
using testing::Cpu;
using testing::Guarded;
using testing::Random;

// Softmax attention of one query row per head over `len` cached rows, written from the definition
// in double precision: out_h = sum_j e^{s_j} v_j / sum_j e^{s_j}, s_j = q_h . k_j / sqrt(D), K/V
// head h * kv_heads / heads.
std::vector<float> Naive(int64_t heads, int64_t kv_heads, int64_t D, int64_t len,
                         const std::vector<float>& q, const std::vector<float>& k,
                         const std::vector<float>& v) {
  std::vector<float> out(heads * D);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t g = h * kv_heads / heads;
    std::vector<double> s(len);
    double top = -INFINITY;
    for (int64_t j = 0; j < len; ++j) {
      double dot = 0.0;
      for (int64_t e = 0; e < D; ++e)
        dot += static_cast<double>(q[h * D + e]) * k[(j * kv_heads + g) * D + e];
      s[j] = dot / std::sqrt(static_cast<double>(D));
      top = std::max(top, s[j]);
    }
    double z = 0.0;
    for (double& x : s) z += (x = std::exp(x - top));
    for (int64_t e = 0; e < D; ++e) {
      double acc = 0.0;
      for (int64_t j = 0; j < len; ++j) acc += s[j] * v[(j * kv_heads + g) * D + e];
      out[h * D + e] = static_cast<float>(acc / z);
    }
  }
  return out;
}

DecodeAttentionArgs Args(int64_t heads, int64_t kv_heads, int64_t D, int64_t len) {
  return {.heads = heads, .kv_heads = kv_heads, .head_dim = D, .len = len};
}

TEST(DecodeAttention, MatchesNaiveSoftmaxAttention) {
  struct Case {
    int64_t heads, kv_heads, D, len;
    float q_range;  // large q makes the softmax peaked: the max subtraction must keep it finite
  };
  for (Case c : {Case{4, 4, 8, 1, 1.0f}, Case{6, 2, 16, 37, 1.0f}, Case{8, 1, 32, 300, 1.0f},
                 Case{4, 2, 64, kDecodeAttentionChunk + 1, 1.0f}, Case{2, 1, 16, 50, 40.0f}}) {
    const std::string tag = std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " D " +
                            std::to_string(c.D) + " len " + std::to_string(c.len);
    const auto q = Random(c.heads * c.D, 11, -c.q_range, c.q_range);
    const auto k = Random(c.len * c.kv_heads * c.D, 12), v = Random(c.len * c.kv_heads * c.D, 13);
    DecodeAttentionArgs a = Args(c.heads, c.kv_heads, c.D, c.len);
    std::vector<float> ws(DecodeAttentionWorkspaceBytes(a) / 4);
    Guarded out(c.heads * c.D, NAN);
    a.q = q.data();
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.out = out.data();
    a.workspace = ws.data();
    a.workspace_bytes = ws.size() * 4;
    ASSERT_TRUE(DecodeAttention(Cpu(), a).ok()) << tag;
    EXPECT_TRUE(out.GuardsIntact()) << tag;
    // fp32 dot products of D <= 64 terms and a softmax over <= 300: ~1e-6 relative.
    EXPECT_TRUE(AllClose(out.values(), Naive(c.heads, c.kv_heads, c.D, c.len, q, k, v), 2e-6, 2e-5))
        << tag;
  }
}

TEST(DecodeAttention, OnePositionReturnsItsValueRow) {
  const int64_t heads = 6, kv = 3, D = 4;
  const auto q = Random(heads * D, 21), k = Random(kv * D, 22), v = Random(kv * D, 23);
  DecodeAttentionArgs a = Args(heads, kv, D, 1);
  std::vector<float> ws(DecodeAttentionWorkspaceBytes(a) / 4), out(heads * D);
  a.q = q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.out = out.data();
  a.workspace = ws.data();
  a.workspace_bytes = ws.size() * 4;
  ASSERT_TRUE(DecodeAttention(Cpu(), a).ok());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t e = 0; e < D; ++e) EXPECT_EQ(out[h * D + e], v[(h / 2) * D + e]) << h << " " << e;
  }
}

TEST(DecodeAttention, WorkspaceHoldsEachChunksStatistics) {
  // heads * chunks * (head_dim + 2) floats, 256-byte aligned.
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(Args(4, 2, 62, 1)), 4u * 1 * 64 * 4);
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(Args(4, 2, 62, kDecodeAttentionChunk)), 4u * 1 * 64 * 4);
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(Args(4, 2, 62, kDecodeAttentionChunk + 1)),
            4u * 2 * 64 * 4);
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(Args(4, 2, 62, 0)), 0u);
}

TEST(DecodeAttention, RefusesBadArguments) {
  std::vector<float> buf(4096);
  auto valid = [&] {
    DecodeAttentionArgs a = Args(4, 2, 8, 3);
    a.q = a.k_cache = a.v_cache = buf.data();
    a.out = buf.data() + 1024;
    a.workspace = buf.data() + 2048;
    a.workspace_bytes = DecodeAttentionWorkspaceBytes(a);
    return a;
  };
  ASSERT_TRUE(CanRun(Cpu(), valid()).ok());
  auto refused = [&](DecodeAttentionArgs a, const std::string& field) {
    const absl::Status s = DecodeAttention(Cpu(), a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  DecodeAttentionArgs a = valid();
  a.kv_heads = 3;
  refused(a, "kv_heads");
  a = valid();
  a.kv_heads = 0;
  refused(a, "kv_heads");
  a = valid();
  a.len = 0;
  refused(a, "len");
  a = valid();
  a.q = nullptr;
  refused(a, "q is null");
  a = valid();
  a.v_cache = nullptr;
  refused(a, "v_cache");
  a = valid();
  a.workspace_bytes -= 4;
  refused(a, "workspace");
}

}  // namespace
}  // namespace fedlora::kernels
