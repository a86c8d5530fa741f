// The low-rank stage (compression/low_rank.h) and its place in the wire format: which tensors are
// factored, exact recovery of a low-rank delta, the warm start across rounds (also through error
// feedback's file). The decoder's refusals are in pipeline_test.cc (HostileV2Test).
#include "compression/low_rank.h"

#include <cmath>
#include <cstring>
#include <random>

#include "compression/codec.h"
#include "compression/error_feedback.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

// A rows x cols matrix of rank `rank` (a sum of outer products), plus `noise` Gaussian noise.
UpdateTensor Matrix(const std::string& name, int64_t rows, int64_t cols, int rank, float noise,
                    uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  UpdateTensor t{name, {rows, cols}, std::vector<float>(static_cast<size_t>(rows * cols), 0.0f)};
  for (int k = 0; k < rank; ++k) {
    std::vector<float> u(rows), v(cols);
    for (float& x : u) x = dist(gen);
    for (float& x : v) x = dist(gen);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) t.values[i * cols + j] += u[i] * v[j];
    }
  }
  for (float& x : t.values) x += noise * dist(gen);
  return t;
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, n = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    e += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    n += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(e / n);
}

CodecOptions LowRank(int64_t rank) {
  CodecOptions o;
  o.sparsifier = Sparsifier::kLowRank;
  o.low_rank = rank;
  o.seed = 11;
  return o;
}

TEST(LowRankTest, OnlyMatricesWhoseFactorsAreSmallerAreFactored) {
  const LowRankLayout a = LowRankLayoutFor({8, 384}, 2);  // a LoRA A factor
  EXPECT_EQ(a.rows, 8);
  EXPECT_EQ(a.cols, 384);
  EXPECT_EQ(a.rank, 2);
  EXPECT_EQ(a.values, 2 * (8 + 384));
  EXPECT_EQ(LowRankLayoutFor({384, 8}, 4).values, 4 * (384 + 8));  // a LoRA B factor
  EXPECT_EQ(LowRankLayoutFor({2, 3, 4}, 1).cols, 12);              // rows x the rest
  EXPECT_FALSE(LowRankLayoutFor({384}, 2).factored());             // a vector
  EXPECT_EQ(LowRankLayoutFor({384}, 2).values, 384);
  EXPECT_FALSE(LowRankLayoutFor({4, 4}, 4).factored());     // 4 x 8 factor values > 16 entries
  EXPECT_FALSE(LowRankLayoutFor({8, 384}, 16).factored());  // rank capped at 8: 3136 > 3072
  EXPECT_FALSE(LowRankLayoutFor({0, 5}, 1).factored());
}

TEST(LowRankTest, ALowRankDeltaRoundTripsThroughTheWireExactly) {
  // One power iteration recovers a matrix of rank <= r exactly (up to rounding); a vector travels
  // dense, bit for bit. With 8-bit factors and zstd the error stays at the quantizer's.
  const std::vector<UpdateTensor> update = {Matrix("a.lora_A.weight", 8, 384, 2, 0.0f, 1),
                                            Matrix("a.lora_B.weight", 384, 8, 2, 0.0f, 2),
                                            {"head.bias", {8}, {1, -2, 3, -4, 5, -6, 7, -8}}};
  auto wire = EncodeUpdate(update, LowRank(2));
  ASSERT_TRUE(wire.ok()) << wire.status();
  auto back = DecodeUpdate(*wire, DecodeLimits{});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_LT(RelativeError((*back)[0].values, update[0].values), 1e-5);
  EXPECT_LT(RelativeError((*back)[1].values, update[1].values), 1e-5);
  EXPECT_EQ((*back)[2].values, update[2].values);
  auto table = ValidateUpdate(*wire, DecodeLimits{});
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*table)[0].kept, 2 * (8 + 384));
  EXPECT_EQ((*table)[2].kept, 8);
  // 2 x 392 fp32 values per factor instead of 3072: about 3.9x fewer bytes.
  EXPECT_LT(wire->size() * 3, update[0].values.size() * 4 * 2 + 32);

  CodecOptions packed = LowRank(2);
  packed.codec = CodecId::kQuant;
  packed.quant_stochastic = false;
  packed.zstd = true;
  auto small = EncodeUpdate(update, packed);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_LT(small->size() * 3, wire->size());
  auto approx = DecodeUpdate(*small, DecodeLimits{});
  ASSERT_TRUE(approx.ok()) << approx.status();
  EXPECT_LT(RelativeError((*approx)[0].values, update[0].values), 0.03);
  EXPECT_EQ(CodecOptions(packed).Describe(), "low-rank 2 + quant 8 bit/256 nearest + zstd");
}

TEST(LowRankTest, TheWarmStartContinuesThePowerIterationAcrossRounds) {
  // A full-rank matrix with a dominant rank-2 part: each round's iteration starts from the last
  // Q, so the rank-2 approximation improves round over round towards the dominant part, while a
  // cold start (no warm start) stays at its first, worse, approximation.
  const UpdateTensor m = Matrix("w", 64, 96, 2, 0.3f, 5);
  LowRankWarmStart warm;
  CodecOptions o = LowRank(2);
  o.warm_start = &warm;
  std::vector<double> error;
  for (int round = 0; round < 4; ++round) {
    auto wire = EncodeUpdate({m}, o);
    ASSERT_TRUE(wire.ok());
    error.push_back(RelativeError((*DecodeUpdate(*wire, DecodeLimits{}))[0].values, m.values));
  }
  ASSERT_EQ(warm.count("w"), 1u);
  EXPECT_EQ(warm["w"].size(), 96u * 2);
  auto cold = EncodeUpdate({m}, LowRank(2));
  const double cold_error =
      RelativeError((*DecodeUpdate(*cold, DecodeLimits{}))[0].values, m.values);
  EXPECT_NEAR(cold_error, error[0], 1e-9) << "the first warm round starts from the same seeded Q0";
  EXPECT_LT(error[3], error[0]);
  for (size_t i = 1; i < error.size(); ++i)
    EXPECT_LE(error[i], error[i - 1] + 1e-6) << "round " << i;
}

TEST(LowRankTest, ErrorFeedbackKeepsTheResidualAndTheWarmStartOnlyOnCommit) {
  const std::vector<UpdateTensor> delta = {Matrix("w", 32, 48, 6, 0.1f, 8)};
  const CodecOptions o = LowRank(1);
  ErrorFeedback ef;
  std::vector<float> sent(delta[0].values.size(), 0.0f), raw = sent;
  for (int round = 0; round < 3; ++round) {
    auto wire = ef.Encode(delta, o);
    ASSERT_TRUE(wire.ok()) << wire.status();
    const auto decoded = DecodeUpdate(*wire, DecodeLimits{});
    ASSERT_TRUE(decoded.ok());
    ef.Commit();
    for (size_t i = 0; i < raw.size(); ++i) {
      raw[i] += delta[0].values[i];
      sent[i] += (*decoded)[0].values[i];
    }
  }
  // What was sent plus what is kept is the raw sum (the low-rank stage is biased; nothing is lost).
  ASSERT_EQ(ef.residual().size(), 1u);
  for (size_t i = 0; i < raw.size(); ++i)
    EXPECT_NEAR(sent[i] + ef.residual()[0].values[i], raw[i], 1e-4) << i;
  ASSERT_EQ(ef.warm_start().count("w"), 1u);
  const std::vector<float> q = ef.warm_start().at("w");
  ASSERT_TRUE(ef.Encode(delta, o).ok());  // refused by the server: no Commit
  EXPECT_EQ(ef.warm_start().at("w"), q);

  const std::string path = ::testing::TempDir() + "/low_rank_ef.safetensors";
  ASSERT_TRUE(ef.Save(path, "run-1").ok());
  auto loaded = ErrorFeedback::Load(path, "run-1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->residual().size(), 1u);
  EXPECT_EQ(loaded->residual()[0].name, "w");
  EXPECT_EQ(loaded->residual()[0].values, ef.residual()[0].values);
  ASSERT_EQ(loaded->warm_start().count("w"), 1u);
  EXPECT_EQ(loaded->warm_start().at("w"), q);
}

}  // namespace
}  // namespace fedlora
