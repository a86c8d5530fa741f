// The version 2 stages of the update wire format: top-k and random-k sparsification, blockwise
// quantization, their compositions with zstd, and a decoder that refuses every malformed section.
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "compression/codec.h"
#include "compression/error_feedback.h"
#include "compression/quantize.h"
#include "compression/sparsify.h"
#include "compression/update_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/compression/kept_check.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

std::vector<UpdateTensor> Gaussian(
    uint32_t seed, std::vector<std::pair<std::string, std::vector<int64_t>>> shapes) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<UpdateTensor> u;
  for (auto& [name, shape] : shapes) {
    UpdateTensor t{name, shape, {}};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (int64_t i = 0; i < n; ++i) t.values.push_back(dist(gen));
    u.push_back(std::move(t));
  }
  return u;
}

std::vector<UpdateTensor> LoraLike(uint32_t seed) {
  return Gaussian(
      seed,
      {{"a.lora_A.weight", {8, 300}}, {"a.lora_B.weight", {300, 8}}, {"b.lora_A.weight", {8, 77}}});
}

std::vector<UpdateTensor> RoundTrip(const std::vector<UpdateTensor>& u, const CodecOptions& o,
                                    std::string* wire = nullptr) {
  absl::StatusOr<std::string> enc = EncodeUpdate(u, o);
  EXPECT_TRUE(enc.ok()) << enc.status();
  if (!enc.ok()) return {};
  if (wire != nullptr) *wire = *enc;
  absl::StatusOr<std::vector<UpdateTensor>> dec = DecodeUpdate(*enc, DecodeLimits{});
  EXPECT_TRUE(dec.ok()) << dec.status();
  absl::StatusOr<std::vector<UpdateTensorInfo>> table = ValidateUpdate(*enc, DecodeLimits{});
  EXPECT_TRUE(table.ok()) << table.status();
  testing::ExpectKeptMatchesDecode(*enc);
  return dec.ok() ? *dec : std::vector<UpdateTensor>{};
}

int64_t NonZeros(const UpdateTensor& t) {
  int64_t n = 0;
  for (float v : t.values) n += v != 0.0f;
  return n;
}

TEST(SparsifyTest, KeptCountRoundsToNearestAndKeepsAtLeastOne) {
  EXPECT_EQ(KeptCount(100, 0.01), 1);  // 0.01 * 100 is 1.0000000000000002 in double
  EXPECT_EQ(KeptCount(2400, 0.01), 24);
  EXPECT_EQ(KeptCount(10, 0.01), 1);
  EXPECT_EQ(KeptCount(10, 1.0), 10);
  EXPECT_EQ(KeptCount(0, 0.5), 0);
  EXPECT_EQ(KeptCount(7, 0.5), 4);  // 3.5 rounds up
}

TEST(SparsifyTest, TopKKeepsTheLargestMagnitudesWithTiesToTheLowerIndex) {
  const std::vector<float> x = {0.5f, -3.0f, 2.0f, -2.0f, 0.0f, 2.0f, 1.0f};
  EXPECT_EQ(TopKIndices(x.data(), 7, 1), (std::vector<int64_t>{1}));
  EXPECT_EQ(TopKIndices(x.data(), 7, 3),
            (std::vector<int64_t>{1, 2, 3}));  // |2| ties: 2 and 3 before 5
  EXPECT_EQ(TopKIndices(x.data(), 7, 4), (std::vector<int64_t>{1, 2, 3, 5}));
  EXPECT_EQ(TopKIndices(x.data(), 7, 7).size(), 7u);
}

TEST(SparsifyTest, GlobalTopKSpendsTheBudgetWhereTheMagnitudesAre) {
  const std::vector<float> big = {5, -6, 7, 8}, small = {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  const auto idx = GlobalTopKIndices({&big, &small}, 0.5);  // 5 of 10
  EXPECT_EQ(idx[0], (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(idx[1], (std::vector<int64_t>{5}));
  const std::vector<float> ties = {1, 1, 1, 1};
  const auto tied = GlobalTopKIndices({&ties, &ties}, 0.25);  // 2 of 8, all equal: the first two
  EXPECT_EQ(tied[0], (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(tied[1].empty());
}

TEST(SparsifyTest, RandomKIsUniformDistinctAndAscending) {
  constexpr int64_t kN = 20, kK = 5, kDraws = 20000;
  std::vector<int> hits(kN, 0);
  for (uint64_t seed = 0; seed < kDraws; ++seed) {
    const auto idx = RandomKIndices(seed, kN, kK);
    ASSERT_EQ(idx.size(), static_cast<size_t>(kK));
    for (size_t j = 0; j < idx.size(); ++j) {
      ASSERT_TRUE(idx[j] >= 0 && idx[j] < kN);
      if (j > 0) {
        ASSERT_LT(idx[j - 1], idx[j]);
      }
      ++hits[idx[j]];
    }
  }
  // Each index is kept with probability k/n = 1/4: 5000 of 20000, standard deviation ~61. Six
  // standard deviations leave a false alarm far below one in a million runs.
  for (int64_t i = 0; i < kN; ++i)
    EXPECT_NEAR(hits[i], kDraws * kK / kN, 6 * 61.3) << "index " << i;
  EXPECT_EQ(RandomKIndices(7, kN, kK), RandomKIndices(7, kN, kK));
  EXPECT_NE(RandomKIndices(7, 1000, 10), RandomKIndices(8, 1000, 10));
  EXPECT_EQ(RandomKIndices(3, 6, 6), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST(QuantizeTest, NearestRoundingIsWithinHalfAStepAndSignModeSendsTheMeanMagnitude) {
  std::mt19937 gen(3);
  std::normal_distribution<float> dist;
  std::vector<float> x(1000);
  for (float& v : x) v = dist(gen);
  for (int bits : {2, 4, 8}) {
    std::string enc;
    QuantizeAppend(x.data(), 1000, {.bits = bits, .block_size = 64, .stochastic = false}, enc);
    ASSERT_EQ(enc.size(), QuantizedBytes(1000, bits, 64));
    for (int64_t b = 0, off = 0; b < 1000; b += 64) {
      const int64_t m = std::min<int64_t>(64, 1000 - b);
      std::vector<float> out(m);
      const std::string_view block(enc.data() + off, QuantBlockBytes(m, bits));
      ASSERT_TRUE(DequantizeBlock(block, m, bits, out.data(), "t", b).ok());
      float s = 0;
      for (int64_t i = 0; i < m; ++i) s = std::max(s, std::fabs(x[b + i]));
      const double step = 2.0 * s / ((1 << bits) - 1);
      for (int64_t i = 0; i < m; ++i)
        EXPECT_LE(std::fabs(out[i] - x[b + i]), step / 2 * (1 + 1e-6)) << bits;
      off += block.size();
    }
  }
  // One bit, nearest: sign(x) * mean |x| of the block (EF-SignSGD's compressor).
  const std::vector<float> y = {1, -2, 3, -4, 5, -6, 7, -8};
  std::string enc;
  QuantizeAppend(y.data(), 8, {.bits = 1, .block_size = 8, .stochastic = false}, enc);
  ASSERT_EQ(enc.size(), 5u);
  std::vector<float> out(8);
  ASSERT_TRUE(DequantizeBlock(enc, 8, 1, out.data(), "t", 0).ok());
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(out[i], y[i] > 0 ? 4.5f : -4.5f);
}

TEST(QuantizeTest, SubnormalAndHugeScalesStayFinite) {
  // A block whose largest magnitude is subnormal makes 1 / step overflow in float (a fuzzer found
  // the NaN this gave); one near FLT_MAX makes 2s overflow.
  const float tiny = 1e-45f, huge = 3e38f;
  for (const std::vector<float>& x : {std::vector<float>{tiny, -tiny, 0, tiny, 0, 0, -tiny, tiny},
                                      std::vector<float>{huge, -huge, 1, 0, -1, huge / 3, 0, 2}}) {
    for (bool stochastic : {true, false}) {
      std::string enc;
      QuantizeAppend(x.data(), 8, {.bits = 8, .block_size = 8, .stochastic = stochastic, .seed = 1},
                     enc);
      std::vector<float> out(8);
      ASSERT_TRUE(DequantizeBlock(enc, 8, 8, out.data(), "t", 0).ok());
      float s = 0;
      for (float v : x) s = std::max(s, std::fabs(v));
      for (int i = 0; i < 8; ++i) {
        EXPECT_TRUE(std::isfinite(out[i]));
        EXPECT_LE(std::fabs(out[i] - x[i]), 2.0 * s / 255 * (1 + 1e-6)) << i;
      }
    }
  }
}

TEST(QuantizeTest, StochasticRoundingIsUnbiased) {
  // Each value is decoded many times with different seeds; the mean must approach it. One value's
  // error is at most one step (2s / (2^bits - 1)), its variance at most step^2 / 4; over 4000 draws
  // the mean's standard deviation is at most step / 126. Tolerance: 6 of those.
  const std::vector<float> x = {0.9f, -0.37f, 0.001f, 0.5f, -1.0f, 0.123f, 0.77f, -0.61f};
  for (int bits : {1, 2, 4, 8}) {
    const double step = 2.0 / ((1 << bits) - 1);  // s = max |x| = 1
    std::vector<double> sum(x.size(), 0.0);
    constexpr int kDraws = 4000;
    for (int d = 0; d < kDraws; ++d) {
      std::string enc;
      QuantizeAppend(
          x.data(), 8,
          {.bits = bits, .block_size = 8, .stochastic = true, .seed = 11, .stream = uint64_t(d)},
          enc);
      std::vector<float> out(8);
      ASSERT_TRUE(DequantizeBlock(enc, 8, bits, out.data(), "t", 0).ok());
      for (size_t i = 0; i < x.size(); ++i) sum[i] += out[i];
    }
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(sum[i] / kDraws, x[i], 6 * step / 126) << bits << " bits, value " << i;
    }
  }
}

TEST(PipelineTest, TopKSendsExactlyTheLargestEntriesOfEachTensor) {
  const auto u = LoraLike(1);
  const CodecOptions o{.sparsifier = Sparsifier::kTopK, .fraction = 0.05};
  const auto back = RoundTrip(u, o);
  ASSERT_EQ(back.size(), u.size());
  for (size_t t = 0; t < u.size(); ++t) {
    const int64_t n = static_cast<int64_t>(u[t].values.size());
    const auto idx = TopKIndices(u[t].values.data(), n, KeptCount(n, 0.05));
    const std::set<int64_t> kept(idx.begin(), idx.end());
    EXPECT_EQ(back[t].shape, u[t].shape);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(back[t].values[i], kept.count(i) ? u[t].values[i] : 0.0f) << u[t].name << " " << i;
    }
  }
}

TEST(PipelineTest, GlobalTopKAndRandomKRoundTrip) {
  const auto u = LoraLike(2);
  const auto g =
      RoundTrip(u, {.sparsifier = Sparsifier::kTopK, .fraction = 0.02, .global_top_k = true});
  int64_t total = 0, kept = 0;
  for (size_t t = 0; t < u.size(); ++t) {
    total += static_cast<int64_t>(u[t].values.size());
    kept += NonZeros(g[t]);
    for (size_t i = 0; i < u[t].values.size(); ++i) {
      if (g[t].values[i] != 0.0f) {
        EXPECT_EQ(g[t].values[i], u[t].values[i]);
      }
    }
  }
  EXPECT_EQ(kept, KeptCount(total, 0.02));

  const CodecOptions r{.sparsifier = Sparsifier::kRandomK, .fraction = 0.1, .seed = 99};
  std::string wire1, wire2;
  const auto back = RoundTrip(u, r, &wire1);
  RoundTrip(u, r, &wire2);
  EXPECT_EQ(wire1, wire2) << "the same seed gives the same bytes";
  for (size_t t = 0; t < u.size(); ++t) {
    const int64_t n = static_cast<int64_t>(u[t].values.size());
    EXPECT_EQ(NonZeros(back[t]), KeptCount(n, 0.1));
    for (int64_t i = 0; i < n; ++i) {
      if (back[t].values[i] != 0.0f) {
        EXPECT_EQ(back[t].values[i], u[t].values[i]);
      }
    }
  }
  const auto table = ValidateUpdate(wire1, DecodeLimits{});
  ASSERT_TRUE(table.ok());
  EXPECT_EQ((*table)[0].kept, KeptCount(2400, 0.1));
}

TEST(PipelineTest, TopKThenQuantThenZstdIsOverTenTimesSmallerThanFp32) {
  const auto u = Gaussian(5, {{"w.lora_A.weight", {8, 4096}}, {"w.lora_B.weight", {4096, 8}}});
  std::string dense, small;
  RoundTrip(u, {}, &dense);
  const CodecOptions o{.sparsifier = Sparsifier::kTopK,
                       .fraction = 0.01,
                       .codec = CodecId::kQuant,
                       .quant_bits = 8,
                       .zstd = true};
  const auto back = RoundTrip(u, o, &small);
  // 65,536 values: 262 KB in fp32; 1% kept = 656 entries of about 1 index byte, 1 code byte and a
  // 4-byte scale per 256.
  EXPECT_LT(small.size() * 50, dense.size()) << small.size() << " vs " << dense.size();
  for (size_t t = 0; t < u.size(); ++t) {
    float s = 0;  // no block's scale exceeds the tensor's largest magnitude
    for (float v : u[t].values) s = std::max(s, std::fabs(v));
    for (size_t i = 0; i < u[t].values.size(); ++i) {
      if (back[t].values[i] != 0.0f) {
        EXPECT_NEAR(back[t].values[i], u[t].values[i], 2.0 * s / 255)
            << "within one step of the scale";
      }
    }
  }
}

TEST(PipelineTest, DenseQuantKeepsEveryEntryAndSmallTensors) {
  const auto u = Gaussian(6, {{"a", {3}}, {"b", {0, 4}}, {"c", {17}}});
  for (int bits : {1, 2, 4, 8}) {
    const auto back =
        RoundTrip(u, {.codec = CodecId::kQuant, .quant_bits = bits, .quant_block_size = 8});
    ASSERT_EQ(back.size(), 3u);
    EXPECT_EQ(back[1].values.size(), 0u);
    EXPECT_EQ(back[2].values.size(), 17u);
  }
}

TEST(PipelineTest, EncoderRefusesOptionsOutOfRange) {
  const auto u = LoraLike(3);
  for (const CodecOptions& o :
       {CodecOptions{.sparsifier = Sparsifier::kTopK, .fraction = 0.0},
        CodecOptions{.sparsifier = Sparsifier::kRandomK, .fraction = 1.5},
        CodecOptions{.global_top_k = true}, CodecOptions{.codec = CodecId::kQuant, .quant_bits = 3},
        CodecOptions{.codec = CodecId::kQuant, .quant_block_size = 12},
        CodecOptions{.codec = CodecId::kQuant, .quant_block_size = 1 << 17}}) {
    EXPECT_EQ(EncodeUpdate(u, o).status().code(), absl::StatusCode::kInvalidArgument)
        << o.Describe();
  }
}

// Hand-edited version 2 payloads: every malformed section is refused by DecodeUpdate and by
// ValidateUpdate with the same InvalidArgument.
class HostileV2Test : public ::testing::Test {
 protected:
  // One tensor "w" of 64 entries, top-k 4 entries in fp32 (indices 3, 10, 11, 60).
  static std::vector<UpdateTensor> One() {
    UpdateTensor t{"w", {64}, std::vector<float>(64, 0.0f)};
    t.values[3] = 4;
    t.values[10] = -3;
    t.values[11] = 2;
    t.values[60] = -5;
    return {t};
  }
  static std::string TopK() {
    return *EncodeUpdate(One(), {.sparsifier = Sparsifier::kTopK, .fraction = 4.0 / 64});
  }
  // Body offset of the tensor's section: header 48, count 4, name length 2, "w", rank 1, dim 8.
  static constexpr size_t kSection = 48 + 4 + 2 + 1 + 1 + 8;
  // Sets the header's raw and payload sizes to what follows the header (no zstd stage).
  static void FixSizes(std::string& w) {
    const uint64_t n = w.size() - kUpdateHeaderSizeV2;
    std::memcpy(w.data() + 24, &n, 8);
    std::memcpy(w.data() + 32, &n, 8);
  }
  static void Expect(const std::string& wire, const std::string& want) {
    const absl::Status d = DecodeUpdate(wire, DecodeLimits{}).status();
    const absl::Status v = ValidateUpdate(wire, DecodeLimits{}).status();
    EXPECT_EQ(d.code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(std::string(d.message()), HasSubstr(want));
    EXPECT_EQ(d, v) << "ValidateUpdate and DecodeUpdate disagree";
    testing::ExpectKeptMatchesDecode(wire);
  }
};

TEST_F(HostileV2Test, TheKnownLayout) {
  const std::string w = TopK();
  uint64_t k, bytes;
  std::memcpy(&k, w.data() + kSection, 8);
  std::memcpy(&bytes, w.data() + kSection + 8, 8);
  EXPECT_EQ(k, 4u);
  EXPECT_EQ(bytes, 4u);
  EXPECT_EQ(w.substr(kSection + 16, 4),
            std::string("\x03\x06\x00\x30", 4));  // 3, 10, 11, 60 as gaps
  EXPECT_EQ(w.size(), kSection + 16 + 4 + 16);
  const auto back = DecodeUpdate(w, DecodeLimits{});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)[0].values, One()[0].values);
}

TEST_F(HostileV2Test, MalformedSections) {
  std::string w = TopK();
  w[kSection] = 65;  // k > entries
  Expect(w, "keeps 65 of its 64 entries");
  w = TopK();
  w[kSection + 16 + 3] = 0x3F;  // 11 + 1 + 63 = 75: past the end
  Expect(w, "outside the tensor's 64 entries");
  w = TopK();
  w[kSection + 16 + 3] = static_cast<char>(0x80);  // last varint cut off
  Expect(w, "cut off");
  w = TopK();
  w[kSection + 8] = 3;  // 3 index bytes for 4 indices
  Expect(w, "declares 3 index bytes for 4 indices");
  w = TopK();
  float nan = std::nanf("");
  std::memcpy(w.data() + kSection + 20, &nan, 4);
  Expect(w, "is not finite");
  w = TopK() + "x";
  FixSizes(w);
  Expect(w, "bytes follow the last tensor's values");
}

TEST_F(HostileV2Test, OverlongVarintAndBadQuantBlocks) {
  // Gaps 3, 6, 0, 48 with the 0 written as 0x80 0x00 (overlong): 5 index bytes.
  std::string w = TopK();
  std::string section = w.substr(kSection);
  uint64_t five = 5;
  std::memcpy(section.data() + 8, &five, 8);
  section.replace(16, 4, std::string("\x03\x06\x80\x00\x30", 5));
  w = w.substr(0, kSection) + section;
  FixSizes(w);
  Expect(w, "not in its shortest form");

  const std::vector<UpdateTensor> u = {{"w", {8}, {1, -1, 0.5f, 0, 0, 0, 0, 0.25f}}};
  const std::string q =
      *EncodeUpdate(u, {.codec = CodecId::kQuant, .quant_bits = 2, .quant_block_size = 8});
  const size_t scale = 48 + 4 + 2 + 1 + 1 + 8;
  std::string bad = q;
  const float neg = -1.0f;
  std::memcpy(bad.data() + scale, &neg, 4);
  Expect(bad, "has scale -1");
  const std::vector<UpdateTensor> u5 = {{"w", {5}, {1, -1, 0.5f, 0, 0.25f}}};
  bad = *EncodeUpdate(u5, {.codec = CodecId::kQuant, .quant_bits = 2, .quant_block_size = 8});
  bad[scale + 4 + 1] |=
      static_cast<char>(0x80);  // 5 x 2 bits: the top 6 bits of byte 2 are padding
  Expect(bad, "non-zero padding bits");
}

TEST_F(HostileV2Test, HeaderFieldsOfVersionTwo) {
  std::string w = TopK();
  w[40] = 4;
  Expect(w, "unknown sparsifier id 4");
  w = TopK();
  w[42] = 1;  // a low-rank rank with top-k
  Expect(w, "low-rank rank 1 with sparsifier top-k");
  w = TopK();
  w[41] = 8;  // bits without the quant codec
  Expect(w, "without the quant codec");
  w = TopK();
  w[40] = 0;  // a dense fp32 update in version 2
  Expect(w, "format version 2 for a dense fp32 update");
  const std::vector<UpdateTensor> u = {{"w", {8}, {1, 2, 3, 4, 5, 6, 7, 8}}};
  std::string q =
      *EncodeUpdate(u, {.codec = CodecId::kQuant, .quant_bits = 4, .quant_block_size = 8});
  q[41] = 3;
  Expect(q, "bits 3 must be 1, 2, 4 or 8");
  q = *EncodeUpdate(u, {.codec = CodecId::kQuant, .quant_bits = 4, .quant_block_size = 8});
  q[4] = 1;  // the quant codec in a version 1 header
  Expect(q, "needs format version 2");
  const std::string truncated = TopK().substr(0, 44);
  EXPECT_EQ(DecodeUpdate(truncated, DecodeLimits{}).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(HostileV2Test, LowRankLiesAboutCountsRanksAndFactorsAreRefused) {
  // One tensor "w" [4, 64] of rank 1 at low-rank rank 1: 68 fp32 values (P 4, Q 64).
  UpdateTensor m{"w", {4, 64}, std::vector<float>(256)};
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 64; ++j)
      m.values[i * 64 + j] = static_cast<float>((i + 1) * (j - 30)) / 64.0f;
  }
  auto wire = [&] {
    return *EncodeUpdate({m}, {.sparsifier = Sparsifier::kLowRank, .low_rank = 1});
  };
  constexpr size_t kLowRankSection = kSection + 8;  // two dims
  std::string w = wire();
  uint64_t k;
  std::memcpy(&k, w.data() + kLowRankSection, 8);
  ASSERT_EQ(k, 68u);
  ASSERT_TRUE(DecodeUpdate(w, DecodeLimits{}).ok());

  w[kLowRankSection] = 67;
  Expect(w, "sends 67 values; at rank 1 it travels as 68");
  w = wire();
  w[42] = 0;  // rank 0 with the low-rank sparsifier
  Expect(w, "low-rank rank 0 with sparsifier low-rank");
  w = wire();
  w[42] = 2;  // rank 2: the section's count no longer fits
  Expect(w, "at rank 2 it travels as 136");
  w = wire();
  w[40] = static_cast<char>(Sparsifier::kRandomK);  // a rank with another sparsifier
  Expect(w, "low-rank rank 1 with sparsifier random-k");
  w = wire();
  // P's first value and Q's first value both 1e30: finite factors whose product overflows.
  const float big = 1e30f;
  std::memcpy(w.data() + kLowRankSection + 8, &big, 4);
  std::memcpy(w.data() + kLowRankSection + 8 + 4 * 4, &big, 4);
  Expect(w, "whose product may overflow");
}

TEST(PipelineTest, CodecOptionsFromSpecCarriesEveryParameter) {
  v1::CodecSpec spec;
  v1::CodecStage* s = spec.add_stages();
  s->set_id(v1::CodecStage::RANDOMK);
  s->mutable_random_k()->set_fraction(0.25);
  s->mutable_random_k()->set_error_feedback(false);
  s = spec.add_stages();
  s->set_id(v1::CodecStage::QUANT);
  s->mutable_quant()->set_bits(2);
  s->mutable_quant()->set_block_size(64);
  s->mutable_quant()->set_stochastic(true);
  s->mutable_quant()->set_error_feedback(false);
  s = spec.add_stages();
  s->set_id(v1::CodecStage::ZSTD);
  s->mutable_zstd()->set_level(5);
  absl::StatusOr<CodecOptions> o = CodecOptionsFromSpec(spec);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->sparsifier, Sparsifier::kRandomK);
  EXPECT_EQ(o->fraction, 0.25);
  EXPECT_EQ(o->codec, CodecId::kQuant);
  EXPECT_EQ(o->quant_bits, 2);
  EXPECT_EQ(o->quant_block_size, 64);
  EXPECT_TRUE(o->quant_stochastic);
  EXPECT_FALSE(o->error_feedback);
  EXPECT_TRUE(o->zstd);
  EXPECT_EQ(o->zstd_level, 5);
  EXPECT_EQ(o->Describe(), "random-k 25% + quant 2 bit/64 + zstd");

  spec.mutable_stages(1)->mutable_quant()->set_error_feedback(
      true);  // any stage asking turns it on
  EXPECT_TRUE(CodecOptionsFromSpec(spec)->error_feedback);
  spec.mutable_stages(0)->set_id(v1::CodecStage::TOPK);
  spec.mutable_stages(0)->mutable_top_k()->set_fraction(0.5);
  spec.mutable_stages(0)->mutable_top_k()->set_global(true);
  o = CodecOptionsFromSpec(spec);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->sparsifier, Sparsifier::kTopK);
  EXPECT_EQ(o->fraction, 0.5);
  EXPECT_TRUE(o->global_top_k);
  spec.mutable_stages(1)->mutable_quant()->set_block_size(100);
  EXPECT_EQ(CodecOptionsFromSpec(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.mutable_stages(1)->mutable_quant()->set_block_size(64);
  spec.mutable_stages(1)->mutable_quant()->set_error_feedback(false);
  spec.mutable_stages(0)->set_id(v1::CodecStage::LOWRANK);
  spec.mutable_stages(0)->mutable_low_rank()->set_rank(2);
  o = CodecOptionsFromSpec(spec);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->sparsifier, Sparsifier::kLowRank);
  EXPECT_EQ(o->low_rank, 2);
  EXPECT_TRUE(o->error_feedback) << "low-rank always keeps its residual";
  EXPECT_EQ(o->Describe(), "low-rank 2 + quant 2 bit/64 + zstd");
  CodecOptions rank3 = *o;
  rank3.low_rank = 3;
  EXPECT_FALSE(o->SameWireFormat(rank3));
  spec.mutable_stages(0)->mutable_low_rank()->set_rank(5000);
  EXPECT_EQ(CodecOptionsFromSpec(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

// Values on the 1/64 grid with small magnitudes: every sum and difference below is exact in
// fp32, so the bookkeeping can be checked bit for bit.
std::vector<UpdateTensor> GridUpdate(uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-256, 256);
  std::vector<UpdateTensor> u = {{"x.lora_A.weight", {4, 50}, {}},
                                 {"x.lora_B.weight", {50, 4}, {}}};
  for (UpdateTensor& t : u) {
    for (int i = 0; i < 200; ++i) t.values.push_back(dist(gen) / 64.0f);
  }
  return u;
}

TEST(ErrorFeedbackTest, SentPlusResidualEqualsTheRawSumExactly) {
  ErrorFeedback ef;
  const CodecOptions o{.sparsifier = Sparsifier::kTopK, .fraction = 0.1};
  std::vector<std::vector<float>> raw(2, std::vector<float>(200, 0.0f)), sent = raw;
  for (uint32_t round = 0; round < 6; ++round) {
    const auto delta = GridUpdate(round);
    auto wire = ef.Encode(delta, o);
    ASSERT_TRUE(wire.ok()) << wire.status();
    const auto decoded = DecodeUpdate(*wire, DecodeLimits{});
    ASSERT_TRUE(decoded.ok());
    ef.Commit();
    for (size_t t = 0; t < 2; ++t) {
      for (size_t i = 0; i < 200; ++i) {
        raw[t][i] += delta[t].values[i];
        sent[t][i] += (*decoded)[t].values[i];
      }
    }
  }
  ASSERT_EQ(ef.residual().size(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    for (size_t i = 0; i < 200; ++i)
      EXPECT_EQ(sent[t][i] + ef.residual()[t].values[i], raw[t][i]) << t << " " << i;
  }
}

TEST(ErrorFeedbackTest, AnUpdateNeverCommittedLeavesTheResidualAndTheFileRoundTrips) {
  ErrorFeedback ef;
  const CodecOptions o{.sparsifier = Sparsifier::kTopK, .fraction = 0.05};
  ASSERT_TRUE(ef.Encode(GridUpdate(1), o).ok());
  ef.Commit();
  const std::vector<UpdateTensor> before = ef.residual();
  ASSERT_TRUE(ef.Encode(GridUpdate(2), o).ok());  // refused by the server: no Commit
  ASSERT_EQ(ef.residual().size(), before.size());
  for (size_t t = 0; t < before.size(); ++t) EXPECT_EQ(ef.residual()[t].values, before[t].values);

  const std::string path = ::testing::TempDir() + "/ef_residual.safetensors";
  ASSERT_TRUE(ef.Save(path, "run-1").ok());
  auto same = ErrorFeedback::Load(path, "run-1");
  ASSERT_TRUE(same.ok()) << same.status();
  ASSERT_EQ(same->residual().size(), before.size());
  for (size_t t = 0; t < before.size(); ++t) {
    EXPECT_EQ(same->residual()[t].name, before[t].name);
    EXPECT_EQ(same->residual()[t].values, before[t].values);
  }
  auto other = ErrorFeedback::Load(path, "run-2");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->residual().empty()) << "a residual of another run is not carried over";
  auto missing = ErrorFeedback::Load(path + ".missing", "run-1");
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->residual().empty());
}

}  // namespace
}  // namespace fedlora
