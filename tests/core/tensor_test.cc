#include "core/tensor.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

float F(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(DType, SizesAndNamesRoundTrip) {
  const std::vector<std::pair<DType, size_t>> expected = {
      {DType::kF32, 4}, {DType::kF16, 2}, {DType::kBF16, 2}, {DType::kI8, 1},  {DType::kU8, 1},
      {DType::kI16, 2}, {DType::kI32, 4}, {DType::kI64, 8},  {DType::kF64, 8}, {DType::kBool, 1}};
  for (const auto& [dt, size] : expected) {
    EXPECT_EQ(DTypeSize(dt), size) << DTypeName(dt);
    auto parsed = ParseDType(DTypeName(dt));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, dt);
  }
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeName(DType::kBool), "BOOL");
}

TEST(DType, ParseRejectsUnknownNamingIt) {
  for (const char* bad : {"f32", "U16", "F8_E4M3", "", "FLOAT"}) {
    auto r = ParseDType(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(std::string("'") + bad + "'"));
  }
}

TEST(TensorView, ContiguousBasics) {
  float buf[24];
  auto v = TensorView::Create(buf, DType::kF32, {2, 3, 4});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->numel(), 24);
  EXPECT_EQ(v->nbytes(), 96);
  EXPECT_EQ(v->rank(), 3);
  EXPECT_EQ(v->dim(-1), 4);
  EXPECT_EQ(v->strides(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_TRUE(v->is_contiguous());
  EXPECT_EQ(v->mutable_data_as<float>(), buf);
  EXPECT_EQ(v->device(), Device::kCpu);
}

TEST(TensorView, ScalarAndEmpty) {
  int32_t x = 0;
  auto scalar = TensorView::Create(&x, DType::kI32, {});
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->numel(), 1);
  EXPECT_EQ(scalar->nbytes(), 4);
  auto empty = TensorView::Create(nullptr, DType::kBF16, {3, 0, 5});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(empty->nbytes(), 0);
}

TEST(TensorView, StridedTransposeIsNotContiguous) {
  float buf[6];
  auto t = TensorView::CreateStrided(buf, DType::kF32, {3, 2}, {1, 3});
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->is_contiguous());
  EXPECT_EQ(t->numel(), 6);
  // Size-1 dimensions may carry any stride and still be contiguous (as in PyTorch).
  auto u = TensorView::CreateStrided(buf, DType::kF32, {1, 6}, {999, 1});
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->is_contiguous());
}

TEST(TensorView, RejectsNegativeDimsAndOverflow) {
  EXPECT_EQ(TensorView::Create(nullptr, DType::kF32, {2, -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // 2^32 * 2^32 elements overflows int64.
  EXPECT_EQ(
      TensorView::Create(nullptr, DType::kU8, {int64_t{1} << 32, int64_t{1} << 32}).status().code(),
      absl::StatusCode::kInvalidArgument);
  // 2^62 elements fit, but 2^62 * 4 bytes does not.
  auto bytes = TensorView::Create(nullptr, DType::kF32, {int64_t{1} << 62});
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("overflows"));
  EXPECT_TRUE(TensorView::Create(nullptr, DType::kU8, {int64_t{1} << 62}).ok());
  // A zero dimension makes the product 0 even with huge others.
  EXPECT_TRUE(TensorView::Create(nullptr, DType::kF32, {0, INT64_MAX, INT64_MAX}).ok());
  EXPECT_EQ(*CheckedNumel(std::vector<int64_t>{INT64_MAX, INT64_MAX, 0}), 0);
  EXPECT_EQ(TensorView::CreateStrided(nullptr, DType::kF32, {2, 2}, {1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorView::CreateStrided(nullptr, DType::kF32, {2, 2}, {-1, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      TensorView::CreateStrided(nullptr, DType::kF32, {3, 2}, {INT64_MAX / 2, 1}).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(TensorView, ConstViewRefusesMutableAccess) {
  const float buf[2] = {1, 2};
  auto v = TensorView::CreateConst(buf, DType::kF32, {2});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->read_only());
  EXPECT_EQ(v->data_as<float>()[1], 2.0f);
  EXPECT_DEATH((void)v->mutable_data(), "FEDLORA_CHECK");
}

TEST(CheckedNumel, Values) {
  EXPECT_EQ(*CheckedNumel(std::vector<int64_t>{}), 1);
  EXPECT_EQ(*CheckedNumel(std::vector<int64_t>{7, 11}), 77);
  EXPECT_EQ(*CheckedNbytes(DType::kF64, std::vector<int64_t>{7, 11}), 616);
  EXPECT_FALSE(CheckedNumel(std::vector<int64_t>{INT64_MAX, 2}).ok());
}

// --- bf16 ------------------------------------------------------------------------------------------

TEST(BF16, ExactBitPatterns) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToBF16(F(0x3dcccccd)), 0x3dcd);  // 0.1: rounds up (dropped 0xcccd > half)
  EXPECT_EQ(F32ToBF16(F(0x40490fdb)), 0x4049);  // pi: rounds down
  EXPECT_EQ(F32ToBF16(F(0x3f808000)), 0x3f80);  // tie, even neighbour below
  EXPECT_EQ(F32ToBF16(F(0x3f818000)), 0x3f82);  // tie, even neighbour above
  EXPECT_EQ(F32ToBF16(F(0x3f808001)), 0x3f81);  // just above the tie
  EXPECT_EQ(F32ToBF16(F(0x7f7fffff)), 0x7f80);  // FLT_MAX overflows to +Inf
  EXPECT_EQ(F32ToBF16(F(0x00018000)), 0x0002);  // fp32 subnormal tie to even
  EXPECT_EQ(F32ToBF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBF16(-0.0f), 0x8000);
  // Values above checked against torch 1.13 (tensor.to(torch.bfloat16)).
}

TEST(BF16, InfAndNaNPreserved) {
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBF16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(F32ToBF16(F(0x7fc00000)), 0x7fc0);
  EXPECT_EQ(F32ToBF16(F(0xffc00000)), 0xffc0);
  // A NaN whose payload lies only in the dropped bits must not become Inf.
  EXPECT_EQ(F32ToBF16(F(0x7f800001)), 0x7fc0);
  EXPECT_TRUE(std::isnan(BF16ToF32(0x7fc0)));
  EXPECT_TRUE(std::isinf(BF16ToF32(0xff80)));
  EXPECT_EQ(BF16ToF32(0x4049), 3.140625f);
}

TEST(BF16, EveryValueRoundTripsAndMidpointsTieToEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = BF16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(f))));
      continue;
    }
    ASSERT_EQ(F32ToBF16(f), h) << std::hex << h;
  }
  // Between consecutive positive finite bf16 values a < b: the exact midpoint goes to the one with
  // an even mantissa, anything one fp32 ulp off the midpoint to the nearer one.
  for (uint32_t a = 0; a < 0x7f7f; ++a) {
    const uint32_t mid = (a << 16) | 0x8000;  // exactly halfway in fp32 bits
    const uint16_t even = (a & 1) ? a + 1 : a;
    ASSERT_EQ(F32ToBF16(F(mid)), even) << std::hex << a;
    ASSERT_EQ(F32ToBF16(F(mid - 1)), a);
    ASSERT_EQ(F32ToBF16(F(mid + 1)), a + 1);
  }
}

// --- fp16 ------------------------------------------------------------------------------------------

TEST(F16, ExactBitPatterns) {
  // Checked against numpy 1.24 (np.float32(x).astype(np.float16)).
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(0.5f), 0x3800);
  EXPECT_EQ(F32ToF16(F(0x3dcccccd)), 0x2e66);  // 0.1
  EXPECT_EQ(F32ToF16(F(0xbdcccccd)), 0xae66);  // -0.1
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);       // largest finite half
  EXPECT_EQ(F32ToF16(F(0x477fefff)), 0x7bff);  // just below the overflow tie
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);       // the tie rounds to even = Inf
  EXPECT_EQ(F32ToF16(1e10f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xfc00);
  EXPECT_EQ(F32ToF16(F(0x38800000)), 0x0400);  // 2^-14, smallest normal
  EXPECT_EQ(F32ToF16(F(0x387fc000)), 0x03ff);  // largest subnormal
  EXPECT_EQ(F32ToF16(F(0x387fe000)), 0x0400);  // subnormal tie rounds up into the normals
  EXPECT_EQ(F32ToF16(F(0x33800000)), 0x0001);  // 2^-24, smallest subnormal
  EXPECT_EQ(F32ToF16(F(0x33000000)), 0x0000);  // 2^-25: tie, even is 0
  EXPECT_EQ(F32ToF16(F(0x33000001)), 0x0001);  // just above the tie
  EXPECT_EQ(F32ToF16(F(0x33c00000)), 0x0002);  // 1.5 * 2^-24: tie, even is 2
  EXPECT_EQ(F32ToF16(1e-10f), 0x0000);
  EXPECT_EQ(F32ToF16(-1e-10f), 0x8000);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
}

TEST(F16, InfAndNaNPreserved) {
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(F32ToF16(F(0x7f800001)), 0x7e00);  // payload only in dropped bits: still NaN
  EXPECT_EQ(F32ToF16(F(0xffc00000)), 0xfe00);
  EXPECT_TRUE(std::isnan(F16ToF32(0x7c01)));
  EXPECT_EQ(Bits(F16ToF32(0x7c00)), 0x7f800000u);
  EXPECT_EQ(Bits(F16ToF32(0xfc00)), 0xff800000u);
  EXPECT_EQ(F16ToF32(0x0001), 0x1p-24f);
  EXPECT_EQ(F16ToF32(0x83ff), -1023 * 0x1p-24f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(Bits(F16ToF32(0x8000)), 0x80000000u);
}

TEST(F16, EveryValueRoundTripsAndMidpointsTieToEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      const uint16_t back = F32ToF16(f);
      EXPECT_TRUE((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0) << std::hex << h;
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << std::hex << h;
  }
  // Midpoints between consecutive positive finite halves (subnormal and normal), computed in
  // double and exact in fp32 (12 significant bits needed, 24 available).
  for (uint16_t a = 0; a < 0x7bff; ++a) {
    const float lo = F16ToF32(a), hi = F16ToF32(a + 1);
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + hi) / 2);
    const uint16_t even = (a & 1) ? a + 1 : a;
    ASSERT_EQ(F32ToF16(mid), even) << std::hex << a;
    ASSERT_EQ(F32ToF16(std::nextafter(mid, 0.0f)), a) << std::hex << a;
    ASSERT_EQ(F32ToF16(std::nextafter(mid, 1e9f)), a + 1) << std::hex << a;
  }
}

TEST(Conversion, BulkMatchesScalar) {
  std::vector<float> src;
  for (int i = -300; i <= 300; ++i)
    src.push_back(std::ldexp(static_cast<float>(i) * 1.37f, i / 20));
  src.push_back(std::numeric_limits<float>::quiet_NaN());
  src.push_back(std::numeric_limits<float>::infinity());
  std::vector<uint16_t> bf(src.size()), hf(src.size());
  std::vector<float> back_bf(src.size()), back_hf(src.size());
  ConvertF32ToBF16(src.data(), bf.data(), src.size());
  ConvertF32ToF16(src.data(), hf.data(), src.size());
  ConvertBF16ToF32(bf.data(), back_bf.data(), bf.size());
  ConvertF16ToF32(hf.data(), back_hf.data(), hf.size());
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(bf[i], F32ToBF16(src[i]));
    EXPECT_EQ(hf[i], F32ToF16(src[i]));
    EXPECT_EQ(Bits(back_bf[i]), Bits(BF16ToF32(bf[i])));
    EXPECT_EQ(Bits(back_hf[i]), Bits(F16ToF32(hf[i])));
  }
  // Relative error of bf16 is at most 2^-8: 8 significant bits (7 stored), half an ulp.
  for (size_t i = 0; i + 2 < src.size(); ++i) {
    if (src[i] != 0) {
      EXPECT_LE(std::fabs(back_bf[i] - src[i]) / std::fabs(src[i]), 0x1p-8f);
    }
  }
}

}  // namespace
}  // namespace fedlora
