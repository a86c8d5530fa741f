#include "kernels/embedding.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;
using testing::Guarded;

// Tables with integer entries: word[v][j] = 100 v + j, position[p][j] = 10 p, type[t][j] = 1000 t.
struct Tables {
  int64_t V = 6, P = 4, T = 2, H = 3;
  std::vector<float> word, pos, type;
  Tables() {
    for (int64_t v = 0; v < V; ++v)
      for (int64_t j = 0; j < H; ++j) word.push_back(100.0f * v + j);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < H; ++j) pos.push_back(10.0f * p);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) type.push_back(1000.0f * t);
  }
  EmbeddingForwardArgs Args(const std::vector<int32_t>& ids, float* out) const {
    return EmbeddingForwardArgs{.tokens = static_cast<int64_t>(ids.size()),
                                .hidden = H,
                                .seq_len = 2,
                                .vocab = V,
                                .max_positions = P,
                                .type_vocab = T,
                                .input_ids = ids.data(),
                                .word = WeightPtr::F32(word.data()),
                                .position = WeightPtr::F32(pos.data()),
                                .token_type = WeightPtr::F32(type.data()),
                                .out = out};
  }
};

TEST(Embedding, SumsThreeLookupsExactly) {
  const Tables t;
  const std::vector<int32_t> ids = {5, 1, 2, 0}, types = {0, 1, 1, 0};
  Guarded out(4 * 3);
  auto a = t.Args(ids, out.data());
  a.token_type_ids = types.data();
  ASSERT_TRUE(EmbeddingForward(Cpu(), a).ok());
  // Default positions restart per sequence of 2: 0 1 0 1.
  EXPECT_EQ(out.values(),
            (std::vector<float>{500, 501, 502, 1110, 1111, 1112, 1200, 1201, 1202, 10, 11, 12}));
  EXPECT_TRUE(out.GuardsIntact());
  // Explicit positions, no token-type table (DistilBERT).
  const std::vector<int32_t> positions = {3, 3, 0, 1};
  a.position_ids = positions.data();
  a.token_type_ids = nullptr;
  a.token_type = WeightPtr{};
  ASSERT_TRUE(EmbeddingForward(Cpu(), a).ok());
  EXPECT_EQ(out.values(),
            (std::vector<float>{530, 531, 532, 130, 131, 132, 200, 201, 202, 10, 11, 12}));
}

TEST(Embedding, Bf16TablesGiveTheSameSums) {
  const Tables t;
  // The position and type tables hold 0, 10, 20, 30, 1000: all exact in bf16 (8 significant
  // bits), so the high half of their fp32 bits is their bf16 encoding.
  auto to_bf16 = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return static_cast<uint16_t>(u >> 16);
  };
  std::vector<uint16_t> pos16, type16;
  for (float v : t.pos) pos16.push_back(to_bf16(v));
  for (float v : t.type) type16.push_back(to_bf16(v));
  const std::vector<int32_t> ids = {5, 1};
  Guarded a32(6), a16(6);
  ASSERT_TRUE(EmbeddingForward(Cpu(), t.Args(ids, a32.data())).ok());
  auto args = t.Args(ids, a16.data());
  args.position = WeightPtr::BF16(pos16.data());
  args.token_type = WeightPtr::BF16(type16.data());
  ASSERT_TRUE(EmbeddingForward(Cpu(), args).ok());
  EXPECT_EQ(a16.values(), a32.values());
}

TEST(Embedding, RejectsOutOfRangeIds) {
  const Tables t;
  Guarded out(2 * 3);
  EXPECT_EQ(EmbeddingForward(Cpu(), t.Args({0, 6}, out.data())).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingForward(Cpu(), t.Args({-1, 0}, out.data())).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> ids2 = {0, 1}, ids3 = {0, 1, 2};
  auto a = t.Args(ids2, out.data());  // Args keeps a pointer: the ids must outlive it
  const std::vector<int32_t> bad_types = {0, 2};
  a.token_type_ids = bad_types.data();
  EXPECT_EQ(EmbeddingForward(Cpu(), a).code(), absl::StatusCode::kInvalidArgument);
  a = t.Args(ids3, out.data());  // 3 tokens, seq_len 2
  EXPECT_EQ(EmbeddingForward(Cpu(), a).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora::kernels
