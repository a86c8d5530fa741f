#include "kernels/base/block_quant.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;
using testing::Random;

std::vector<uint8_t> Quantize(const std::vector<float>& x, int bits, int64_t block, bool stochastic,
                              uint64_t seed = 0, uint64_t stream = 0) {
  std::vector<uint8_t> out(BlockQuantizedBytes(x.size(), bits, block), 0xAB);
  const absl::Status s = BlockQuantize(Cpu(), {.n = static_cast<int64_t>(x.size()),
                                               .x = x.data(),
                                               .bits = bits,
                                               .block_size = block,
                                               .stochastic = stochastic,
                                               .seed = seed,
                                               .stream = stream,
                                               .out = out.data()});
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Code i of a block whose codes start at `codes` (least significant bits first).
uint32_t CodeAt(const uint8_t* codes, int bits, int64_t i) {
  const int64_t bit = i * bits;
  return (codes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
}

float ScaleAt(const uint8_t* p) {
  float s;
  std::memcpy(&s, p, 4);
  return s;
}

TEST(BlockQuantize, HandWorkedNearestBytes) {
  // s = 1, levels -1, -1/3, 1/3, 1 (step 2/3): codes 0 1 2 3, 0 -> 1.5 rounds up to 2, 0.5 -> 2.25
  // to 2, -0.5 -> 0.75 to 1, 0.9 -> 2.85 to 3.
  const std::vector<float> x = {-1.0f, -1.0f / 3, 1.0f / 3, 1.0f, 0.0f, 0.5f, -0.5f, 0.9f};
  const std::vector<uint8_t> want = {0x00,
                                     0x00,
                                     0x80,
                                     0x3F,  // 1.0f
                                     0 | 1 << 2 | 2 << 4 | 3 << 6,
                                     2 | 2 << 2 | 1 << 4 | 3 << 6};
  EXPECT_EQ(Quantize(x, 2, 8, false), want);
}

TEST(BlockQuantize, HandWorkedScaledSign) {
  // 1 bit, nearest: s = mean |x| = 11 / 8, q = (x >= 0) with -0 counting as >= 0.
  const std::vector<float> x = {1.0f, -2.0f, 3.0f, -4.0f, 0.0f, -0.0f, 0.5f, -0.5f};
  std::vector<uint8_t> want(5);
  const float s = 1.375f;
  std::memcpy(want.data(), &s, 4);
  want[4] = 0b01110101;
  EXPECT_EQ(Quantize(x, 1, 8, false), want);
}

TEST(BlockQuantize, ShortLastBlockHasZeroPadding) {
  const std::vector<float> x = Random(11, 3);
  const std::vector<uint8_t> q = Quantize(x, 4, 8, false);
  ASSERT_EQ(q.size(), (4u + 4u) + (4u + 2u));  // 8 values, then 3 values in 2 bytes
  EXPECT_EQ(q.back() >> 4, 0);                 // the 4th code slot of the last block
  float max3 = 0;
  for (int i = 8; i < 11; ++i) max3 = std::max(max3, std::abs(x[i]));
  EXPECT_EQ(ScaleAt(q.data() + 8), max3);
}

TEST(BlockQuantize, NearestPicksTheNearestLevel) {
  const std::vector<float> x = Random(1000, 4, -3.0f, 3.0f);
  for (int bits : {2, 4, 8}) {
    const int64_t block = 64;
    const std::vector<uint8_t> q = Quantize(x, bits, block, false);
    const uint64_t top = (1u << bits) - 1, block_bytes = QuantBlockBytes(block, bits);
    for (int64_t i = 0; i < 1000; ++i) {
      const uint8_t* blk = q.data() + (i / block) * block_bytes;
      const double s = ScaleAt(blk), step = 2 * s / top;
      const double level = -s + CodeAt(blk + 4, bits, i % block) * step;
      EXPECT_LE(std::abs(level - x[i]), step / 2 + 1e-6) << "bits " << bits << " value " << i;
    }
  }
}

TEST(BlockQuantize, StochasticDrawsTheStreamInOrder) {
  // Each value whose code can round up takes the next word of stream (seed, stream): it rounds up
  // iff that uniform is below its distance past the lower level. Zeros of an all-zero block
  // (s = 0) and values at the top code draw nothing.
  std::vector<float> x = Random(700, 8, -2.0f, 2.0f);
  for (int i = 64; i < 128; ++i) x[i] = 0.0f;  // block 1: s = 0
  const int bits = 4;
  const int64_t block = 64;
  const uint64_t seed = 0x5eed, stream = 77;
  const std::vector<uint8_t> q = Quantize(x, bits, block, true, seed, stream);
  Rng rng(seed, stream);
  const uint32_t top = (1u << bits) - 1;
  int64_t ups = 0;
  for (int64_t i = 0; i < 700; ++i) {
    const uint8_t* blk = q.data() + (i / block) * QuantBlockBytes(block, bits);
    const double s = ScaleAt(blk);
    const uint32_t code = CodeAt(blk + 4, bits, i % block);
    if (s == 0) {
      EXPECT_EQ(code, 0u) << i;
      continue;
    }
    const double pos = (x[i] + s) * (top / (2 * s));  // t as kernels/base/block_quant.h defines it
    const uint32_t lower = static_cast<uint32_t>(std::floor(std::min<double>(pos, top)));
    if (lower == top) {
      EXPECT_EQ(code, top) << i;
      continue;
    }
    const bool up = rng.UniformFloat() < static_cast<float>(pos - lower);
    EXPECT_EQ(code, lower + (up ? 1 : 0)) << i;
    ups += up;
  }
  EXPECT_GT(ups, 100);
}

TEST(BlockQuantize, RefusesBadSpecs) {
  const std::vector<float> x(8, 1.0f);
  std::vector<uint8_t> out(16);
  BlockQuantizeArgs a{.n = 8, .x = x.data(), .bits = 3, .block_size = 8, .out = out.data()};
  EXPECT_NE(CanRun(Cpu(), a).message().find("bits 3"), std::string::npos) << CanRun(Cpu(), a);
  a.bits = 8;
  a.block_size = 12;
  EXPECT_NE(CanRun(Cpu(), a).message().find("block_size 12"), std::string::npos);
  a.block_size = 8;
  a.out = nullptr;
  EXPECT_NE(CanRun(Cpu(), a).message().find("out"), std::string::npos);
}

}  // namespace
}  // namespace fedlora::kernels
