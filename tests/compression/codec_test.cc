#include "compression/codec.h"

#include <zstd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/process_memory.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/compression/kept_check.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

// A small adapter-like update: two LoRA matrices, a bias, a scalar and an empty tensor.
std::vector<UpdateTensor> MakeUpdate(uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<UpdateTensor> u = {
      {"layer.0.query.lora_A.weight", {4, 16}, {}},
      {"layer.0.query.lora_B.weight", {16, 4}, {}},
      {"classifier.bias", {3}, {}},
      {"scalar", {}, {}},
      {"empty", {0, 5}, {}},
  };
  for (UpdateTensor& t : u) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    for (int64_t i = 0; i < n; ++i) t.values.push_back(dist(gen));
  }
  return u;
}

void PutU16At(std::string& s, size_t off, uint16_t v) { std::memcpy(s.data() + off, &v, 2); }
void PutU32At(std::string& s, size_t off, uint32_t v) { std::memcpy(s.data() + off, &v, 4); }
void PutU64At(std::string& s, size_t off, uint64_t v) { std::memcpy(s.data() + off, &v, 8); }

// A header (40 bytes) for hand-made payloads.
std::string Header(CodecId codec, uint32_t flags, uint64_t elements, uint64_t raw,
                   uint64_t payload) {
  std::string h(kUpdateHeaderSize, '\0');
  std::memcpy(h.data(), kUpdateMagic, 4);
  PutU16At(h, 4, kUpdateFormatVersion);
  h[6] = static_cast<char>(codec);
  h[7] = static_cast<char>(kCodecVersion);
  PutU32At(h, 8, flags);
  PutU64At(h, 16, elements);
  PutU64At(h, 24, raw);
  PutU64At(h, 32, payload);
  return h;
}

// Tensor table of a one-tensor update named "w" of shape [n]: 16 bytes.
std::string OneTensorTable(uint64_t n) {
  std::string b;
  uint32_t count = 1;
  b.append(reinterpret_cast<const char*>(&count), 4);
  uint16_t len = 1;
  b.append(reinterpret_cast<const char*>(&len), 2);
  b += "w";
  b.push_back(1);  // rank
  b.append(reinterpret_cast<const char*>(&n), 8);
  return b;
}

// Body of that update, all fp32 zeros: 16 + 4n bytes.
std::string OneTensorBody(uint64_t n) { return OneTensorTable(n) + std::string(n * 4, '\0'); }

// ValidateUpdate must answer exactly as DecodeUpdate does: the same code and message, and on success
// the decoded tensors' names and shapes in wire order. Returns DecodeUpdate's status.
absl::Status DecodeAndValidateAgree(std::string_view wire, const DecodeLimits& limits = {}) {
  const absl::StatusOr<std::vector<UpdateTensor>> decoded = DecodeUpdate(wire, limits);
  const absl::StatusOr<std::vector<UpdateTensorInfo>> validated = ValidateUpdate(wire, limits);
  EXPECT_EQ(validated.status(), decoded.status());
  testing::ExpectKeptMatchesDecode(wire, limits);
  if (decoded.ok() && validated.ok()) {
    EXPECT_EQ(validated->size(), decoded->size());
    for (size_t t = 0; t < std::min(validated->size(), decoded->size()); ++t) {
      EXPECT_EQ((*validated)[t].name, (*decoded)[t].name);
      EXPECT_EQ((*validated)[t].shape, (*decoded)[t].shape);
    }
  }
  return decoded.status();
}

void ExpectBitIdentical(const std::vector<UpdateTensor>& a, const std::vector<UpdateTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].name, b[t].name);
    EXPECT_EQ(a[t].shape, b[t].shape);
    ASSERT_EQ(a[t].values.size(), b[t].values.size());
    for (size_t i = 0; i < a[t].values.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(a[t].values[i]), std::bit_cast<uint32_t>(b[t].values[i]))
          << a[t].name << i;
    }
  }
}

TEST(CodecTest, KnownAnswerLayout) {
  const std::vector<UpdateTensor> u = {{"w", {2}, {1.0f, -2.0f}}};
  auto wire = EncodeUpdate(u, {.codec = CodecId::kRawF32});
  ASSERT_TRUE(wire.ok()) << wire.status();
  // body = u32 count (4) + u16 len (2) + "w" (1) + u8 rank (1) + i64 dim (8) + 2 floats (8) = 24.
  std::string expected = Header(CodecId::kRawF32, 0, 2, 24, 24);
  expected += std::string("\x01\x00\x00\x00", 4) + std::string("\x01\x00", 2) + "w" +
              std::string("\x01", 1) + std::string("\x02\0\0\0\0\0\0\0", 8) +
              std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);
  EXPECT_EQ(*wire, expected);

  // fp16: 1.0 = 0x3C00, -2.0 = 0xC000; two bytes per value.
  auto half = EncodeUpdate(u, {.codec = CodecId::kF16});
  ASSERT_TRUE(half.ok()) << half.status();
  ASSERT_EQ(half->size(), kUpdateHeaderSize + 20);
  EXPECT_EQ(half->substr(kUpdateHeaderSize + 16), std::string("\x00\x3c\x00\xc0", 4));
  // bf16: 1.0 = 0x3F80, -2.0 = 0xC000.
  auto bf = EncodeUpdate(u, {.codec = CodecId::kBF16});
  ASSERT_TRUE(bf.ok()) << bf.status();
  EXPECT_EQ(bf->substr(kUpdateHeaderSize + 16), std::string("\x80\x3f\x00\xc0", 4));
}

TEST(CodecTest, Fp32RoundTripIsExactWithAndWithoutZstd) {
  const auto u = MakeUpdate(7);
  for (bool zstd : {false, true}) {
    auto wire = EncodeUpdate(u, {.codec = CodecId::kRawF32, .zstd = zstd});
    ASSERT_TRUE(wire.ok()) << wire.status();
    auto header = ParseUpdateHeader(*wire, {});
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->zstd(), zstd);
    EXPECT_EQ(header->element_count, 64u + 64u + 3u + 1u);
    auto back = DecodeUpdate(*wire, {});
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectBitIdentical(u, *back);
  }
}

TEST(CodecTest, HalfCastsRoundTripWithinTheirRoundingBound) {
  auto u = MakeUpdate(11, 4.0f);
  // Values spanning many binades, all in fp16's normal range [2^-14, 65504].
  u[2].values = {65504.0f, -1.0e-4f, 3.14159f};
  for (bool zstd : {false, true}) {
    for (CodecId codec : {CodecId::kF16, CodecId::kBF16}) {
      auto wire = EncodeUpdate(u, {.codec = codec, .zstd = zstd});
      ASSERT_TRUE(wire.ok()) << wire.status();
      auto back = DecodeUpdate(*wire, {});
      ASSERT_TRUE(back.ok()) << back.status();
      ASSERT_EQ(back->size(), u.size());
      // Round to nearest: relative error <= half an ulp = 2^-11 (fp16, 11 significant bits) or
      // 2^-8 (bf16, 8 significant bits) for normal numbers.
      const double rel = codec == CodecId::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      for (size_t t = 0; t < u.size(); ++t) {
        ASSERT_EQ((*back)[t].values.size(), u[t].values.size());
        for (size_t i = 0; i < u[t].values.size(); ++i) {
          const double x = u[t].values[i], y = (*back)[t].values[i];
          EXPECT_LE(std::fabs(x - y), rel * std::fabs(x))
              << CodecName(codec) << " " << u[t].name << "[" << i << "]";
        }
      }
    }
  }
}

TEST(CodecTest, ZstdShrinksSparseUpdates) {
  std::vector<UpdateTensor> u = {{"sparse", {1000}, std::vector<float>(1000, 0.0f)}};
  u[0].values[17] = 0.5f;
  auto raw = EncodeUpdate(u, {.codec = CodecId::kRawF32});
  auto z = EncodeUpdate(u, {.codec = CodecId::kRawF32, .zstd = true});
  ASSERT_TRUE(raw.ok() && z.ok());
  EXPECT_LT(z->size() * 10, raw->size());  // 4 KB of mostly zeros compresses > 10x
}

TEST(CodecTest, EncoderRefusesBadInput) {
  auto check = [](std::vector<UpdateTensor> u, CodecId codec, const char* needle) {
    auto s = EncodeUpdate(u, {.codec = codec}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(needle));
  };
  check({}, CodecId::kRawF32, "no tensors");
  check({{"a", {2}, {1.0f}}}, CodecId::kRawF32, "has 1 values but its shape holds 2");
  check({{"a", {1}, {1.0f}}, {"a", {1}, {1.0f}}}, CodecId::kRawF32, "duplicate tensor name 'a'");
  check({{"", {1}, {1.0f}}}, CodecId::kRawF32, "name length 0");
  check({{"a", {1}, {std::numeric_limits<float>::quiet_NaN()}}}, CodecId::kRawF32, "not finite");
  check({{"a", {1}, {std::numeric_limits<float>::infinity()}}}, CodecId::kBF16, "not finite");
  check({{"a", {1}, {70000.0f}}}, CodecId::kF16, "overflows fp16");
  check({{"a", {1, 1, 1, 1, 1, 1, 1, 1, 1}, {1.0f}}}, CodecId::kRawF32, "rank 9");
}

// --- hostile input ---------------------------------------------------------------------------------

class HostileDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto w = EncodeUpdate({{"w", {2}, {1.0f, -2.0f}}}, {.codec = CodecId::kRawF32});
    ASSERT_TRUE(w.ok());
    wire_ = *w;
  }
  void Expect(const std::string& wire, absl::StatusCode code, const char* needle,
              const DecodeLimits& limits = {}) {
    absl::Status s = DecodeAndValidateAgree(wire, limits);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(needle));
  }
  std::string wire_;  // header (40) + body: count@40, len@44, "w"@46, rank@47, dim@48, values@56
};

TEST_F(HostileDecodeTest, HeaderFields) {
  Expect(wire_.substr(0, 39), absl::StatusCode::kDataLoss, "header truncated: 39 bytes, need 40");
  Expect("", absl::StatusCode::kDataLoss, "header truncated");
  std::string w = wire_;
  w[0] = 'X';
  Expect(w, absl::StatusCode::kInvalidArgument, "bad magic");
  w = wire_;
  PutU16At(w, 4, 3);
  Expect(w, absl::StatusCode::kInvalidArgument, "unsupported format version 3");
  w = wire_;
  w[6] = 9;
  Expect(w, absl::StatusCode::kInvalidArgument, "unknown codec id 9");
  w = wire_;
  w[7] = 2;
  Expect(w, absl::StatusCode::kInvalidArgument, "fp32 codec version 2");
  w = wire_;
  PutU32At(w, 8, 0x10);
  Expect(w, absl::StatusCode::kInvalidArgument, "unknown flag bits 0x10");
  w = wire_;
  PutU32At(w, 12, 1);
  Expect(w, absl::StatusCode::kInvalidArgument, "reserved field");
}

TEST_F(HostileDecodeTest, SizesAreCheckedAgainstLimitsBeforeAllocating) {
  std::string w = wire_;
  PutU64At(w, 16, uint64_t{1} << 62);  // element count
  Expect(w, absl::StatusCode::kInvalidArgument,
         "element count 4611686018427387904 exceeds the limit");
  w = wire_;
  PutU64At(w, 24, uint64_t{1} << 40);  // raw size
  Expect(w, absl::StatusCode::kInvalidArgument, "raw size 1099511627776 bytes exceeds the limit");
  Expect(wire_, absl::StatusCode::kInvalidArgument, "element count 2 exceeds the limit of 1",
         DecodeLimits{.max_elements = 1});
  Expect(wire_, absl::StatusCode::kInvalidArgument, "raw size 24 bytes exceeds the limit of 23",
         DecodeLimits{.max_decoded_bytes = 23});
  w = wire_;
  PutU64At(w, 24, 11);  // raw size too small for 2 values
  PutU64At(w, 32, 11);
  Expect(w, absl::StatusCode::kInvalidArgument, "cannot hold 2 fp32 values");
  w = wire_;
  PutU64At(w, 32, 23);  // payload != raw without zstd
  Expect(w, absl::StatusCode::kInvalidArgument, "differs from raw size");
}

TEST_F(HostileDecodeTest, TruncatedAndTrailingPayload) {
  Expect(wire_.substr(0, wire_.size() - 1), absl::StatusCode::kDataLoss,
         "payload truncated: 23 of 24");
  Expect(wire_ + "x", absl::StatusCode::kInvalidArgument,
         "1 trailing bytes after the declared payload");
}

TEST_F(HostileDecodeTest, NonFiniteValues) {
  std::string w = wire_;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(w.data() + 60, &nan, 4);
  Expect(w, absl::StatusCode::kInvalidArgument, "tensor 'w' value 1 is not finite");
  const float inf = -std::numeric_limits<float>::infinity();
  std::memcpy(w.data() + 56, &inf, 4);
  Expect(w, absl::StatusCode::kInvalidArgument, "tensor 'w' value 0 is not finite");

  for (CodecId codec : {CodecId::kF16, CodecId::kBF16}) {
    auto h = EncodeUpdate({{"w", {2}, {1.0f, -2.0f}}}, {.codec = codec});
    ASSERT_TRUE(h.ok());
    std::string hw = *h;
    PutU16At(hw, 58, codec == CodecId::kF16 ? 0x7C00 : 0x7F80);  // +Inf
    Expect(hw, absl::StatusCode::kInvalidArgument, "value 1 is not finite");
    PutU16At(hw, 58, codec == CodecId::kF16 ? 0x7E01 : 0x7FC1);  // NaN
    Expect(hw, absl::StatusCode::kInvalidArgument, "value 1 is not finite");
  }
}

TEST_F(HostileDecodeTest, TableInconsistentWithElementCount) {
  std::string w = wire_;
  PutU64At(w, 48, 3);  // shape [3] but the header says 2 elements
  Expect(w, absl::StatusCode::kInvalidArgument, "past the header's element count 2");
  w = wire_;
  PutU64At(w, 48, 1);  // shape [1]: one element short
  Expect(w, absl::StatusCode::kInvalidArgument,
         "the tensor shapes hold 1 elements but the header declares 2");
  w = wire_;
  PutU64At(w, 48, ~uint64_t{0});  // dim -1
  Expect(w, absl::StatusCode::kInvalidArgument, "dimension 0 is negative");
  w = wire_;
  PutU32At(w, 40, 0);
  Expect(w, absl::StatusCode::kInvalidArgument, "tensor count is 0");
  w = wire_;
  PutU32At(w, 40, 1000000);
  Expect(w, absl::StatusCode::kInvalidArgument, "tensor count 1000000 exceeds the limit");
  w = wire_;
  PutU32At(w, 40, 60000);
  Expect(w, absl::StatusCode::kInvalidArgument, "cannot fit in the 20 remaining body bytes");
  w = wire_;
  PutU16At(w, 44, 0);
  Expect(w, absl::StatusCode::kInvalidArgument, "name length 0");
  w = wire_;
  PutU16At(w, 44, 200);
  Expect(w, absl::StatusCode::kInvalidArgument, "tensor name at offset 6 needs 200 bytes");
  w = wire_;
  w[46] = '\0';
  Expect(w, absl::StatusCode::kInvalidArgument, "NUL byte");
  w = wire_;
  w[47] = 9;
  Expect(w, absl::StatusCode::kInvalidArgument, "rank 9 exceeds 8");

  // Two tensors with the same name.
  auto dup = EncodeUpdate({{"a", {1}, {1.0f}}, {"b", {1}, {2.0f}}}, {});
  ASSERT_TRUE(dup.ok());
  std::string d = *dup;
  const size_t b_pos = d.find('b', kUpdateHeaderSize + 4 + 2 + 1 + 1 + 8 + 2);
  ASSERT_NE(b_pos, std::string::npos);
  d[b_pos] = 'a';
  Expect(d, absl::StatusCode::kInvalidArgument, "duplicate tensor name 'a'");
}

TEST_F(HostileDecodeTest, CorruptZstdStage) {
  const auto u = MakeUpdate(3);
  auto z = EncodeUpdate(u, {.codec = CodecId::kRawF32, .zstd = true});
  ASSERT_TRUE(z.ok());
  auto h = ParseUpdateHeader(*z, {});
  ASSERT_TRUE(h.ok());

  // Frame cut short (header patched to match, so only the frame is short).
  std::string cut = z->substr(0, z->size() - 10);
  PutU64At(cut, 32, h->payload_bytes - 10);
  Expect(cut, absl::StatusCode::kDataLoss, "truncated or corrupt frame");
  // Garbage instead of a frame.
  std::string garbage = *z;
  for (size_t i = kUpdateHeaderSize; i < kUpdateHeaderSize + 8; ++i) garbage[i] = 'x';
  Expect(garbage, absl::StatusCode::kDataLoss, "not a valid zstd frame");
  // The frame's content size disagrees with the header's raw size.
  std::string mismatch = *z;
  PutU64At(mismatch, 24, h->raw_bytes + 4);
  Expect(mismatch, absl::StatusCode::kInvalidArgument, "zstd frame declares");
  // A second frame after the first.
  std::string two = *z + z->substr(kUpdateHeaderSize);
  PutU64At(two, 32, 2 * h->payload_bytes);
  Expect(two, absl::StatusCode::kInvalidArgument, "trailing bytes after the zstd frame");
  // Flipped bits in the (incompressible, so stored raw) block: the frame's content checksum
  // catches what the block parser cannot.
  std::string flipped = *z;
  flipped[flipped.size() - 20] ^= 0x5A;
  Expect(flipped, absl::StatusCode::kDataLoss, "zstd: ");
}

// Streams `prefix` then `total` zero bytes through a zstd compressor without ever holding them: the
// classic bomb. The frame has a content checksum, as our encoder writes.
std::string CompressZeros(uint64_t total, bool pledge_size, const std::string& prefix = "") {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  if (pledge_size) ZSTD_CCtx_setPledgedSrcSize(cctx, prefix.size() + total);
  const std::string zeros(1 << 20, '\0');
  std::string out;
  std::string buf(ZSTD_CStreamOutSize(), '\0');
  for (uint64_t done = 0; done < total;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(zeros.size(), total - done));
    const bool first = done == 0;
    done += n;
    const ZSTD_EndDirective mode = done == total ? ZSTD_e_end : ZSTD_e_continue;
    if (first && !prefix.empty()) {
      ZSTD_inBuffer pin{prefix.data(), prefix.size(), 0};
      while (pin.pos < pin.size) {
        ZSTD_outBuffer o{buf.data(), buf.size(), 0};
        ZSTD_compressStream2(cctx, &o, &pin, ZSTD_e_continue);
        out.append(buf.data(), o.pos);
      }
    }
    ZSTD_inBuffer in{zeros.data(), n, 0};
    for (;;) {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      const size_t rem = ZSTD_compressStream2(cctx, &o, &in, mode);
      out.append(buf.data(), o.pos);
      if (mode == ZSTD_e_end ? rem == 0 : in.pos == in.size) break;
    }
  }
  ZSTD_freeCCtx(cctx);
  return out;
}

TEST(DecompressionBombTest, OneGibibyteOfZerosIsRefusedQuicklyWithoutAllocatingIt) {
  constexpr uint64_t kBomb = uint64_t{1} << 30;
  const std::string unknown_size = CompressZeros(kBomb, /*pledge_size=*/false);
  const std::string known_size = CompressZeros(kBomb, /*pledge_size=*/true);
  ASSERT_LT(unknown_size.size(), 200u * 1024) << "1 GiB of zeros should compress to tens of KB";
  ASSERT_EQ(ZSTD_getFrameContentSize(unknown_size.data(), unknown_size.size()),
            ZSTD_CONTENTSIZE_UNKNOWN);
  ASSERT_EQ(ZSTD_getFrameContentSize(known_size.data(), known_size.size()), kBomb);

  // A server sizes its limits from the adapter: here 1M elements, 8 MiB decoded.
  const DecodeLimits limits{.max_elements = 1 << 20, .max_decoded_bytes = 8 << 20};
  const int64_t rss_before = PeakResidentKib();
  const auto t0 = std::chrono::steady_clock::now();

  // 1. Honest header: refused by the limit before any decompression.
  std::string honest =
      Header(CodecId::kRawF32, kUpdateFlagZstd, 1, kBomb, known_size.size()) + known_size;
  absl::Status s = DecodeAndValidateAgree(honest, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("exceeds the limit"));

  // 2. Lying header, frame declares its size: refused from the frame header alone.
  const uint64_t small_raw = OneTensorBody(4).size();  // a plausible 4-element update
  std::string lying =
      Header(CodecId::kRawF32, kUpdateFlagZstd, 4, small_raw, known_size.size()) + known_size;
  s = DecodeAndValidateAgree(lying, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("zstd frame declares 1073741824 decompressed bytes"));

  // 3. Lying header, frame size unknown: streaming decompression stops at the declared size + 1.
  std::string streaming =
      Header(CodecId::kRawF32, kUpdateFlagZstd, 4, small_raw, unknown_size.size()) + unknown_size;
  s = DecodeAndValidateAgree(streaming, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("decompression bomb refused"));
  // Same with the generous default limits (2 GiB): the cap is the header's raw size, not the limit.
  s = DecodeAndValidateAgree(streaming, DecodeLimits{});
  EXPECT_THAT(std::string(s.message()), HasSubstr("decompression bomb refused"));

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Decompressing 1 GiB would take ~0.3-1 s and 1 GiB of memory; refusing takes microseconds.
  EXPECT_LT(seconds, 0.2);
  EXPECT_LT(PeakResidentKib() - rss_before, 64 * 1024) << "peak RSS grew by more than 64 MiB";
}

TEST(DecompressionBombTest, FrameShorterThanDeclaredIsRefused) {
  // A well-formed frame of an update body whose header claims 8 more raw bytes than it holds.
  const std::string body = OneTensorBody(4);
  std::string frame(ZSTD_compressBound(body.size()), '\0');
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);  // hide the size from the frame header
  const size_t n = ZSTD_compress2(cctx, frame.data(), frame.size(), body.data(), body.size());
  ZSTD_freeCCtx(cctx);
  ASSERT_FALSE(ZSTD_isError(n));
  frame.resize(n);
  std::string wire =
      Header(CodecId::kRawF32, kUpdateFlagZstd, 4, body.size() + 8, frame.size()) + frame;
  absl::Status s = DecodeAndValidateAgree(wire);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("decompresses to 32 bytes but the header declares a raw size of 40"));
  // And with the right size it decodes: the hand-made frame is valid.
  PutU64At(wire, 24, body.size());
  auto ok = DecodeUpdate(wire, {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0].values, std::vector<float>(4, 0.0f));
}

// Random byte flips, truncations and extensions of valid encodings (every codec, with and without
// zstd): the decoder must answer each with OK, InvalidArgument or DataLoss, never crash or hang
// (run under FEDLORA_SANITIZE=ON this also checks for out-of-bounds reads), and ValidateUpdate must
// give the same answer, message included.
TEST(HostileDecodeFuzzTest, RandomCorruptionsAreRefusedCleanly) {
  std::mt19937 gen(1234);
  const auto u = MakeUpdate(9);
  int refused = 0, total = 0;
  for (CodecId codec : {CodecId::kRawF32, CodecId::kF16, CodecId::kBF16}) {
    for (bool zstd : {false, true}) {
      auto wire = EncodeUpdate(u, {.codec = codec, .zstd = zstd});
      ASSERT_TRUE(wire.ok());
      for (int trial = 0; trial < 500; ++trial) {
        std::string w = *wire;
        const int op = trial % 3;
        if (op == 0) {
          for (int k = 0; k < 1 + trial % 4; ++k)
            w[gen() % w.size()] ^= static_cast<char>(1 + gen() % 255);
        } else if (op == 1) {
          w.resize(gen() % w.size());
        } else {
          w += std::string(1 + gen() % 16, static_cast<char>(gen()));
        }
        const absl::Status s = DecodeAndValidateAgree(w);
        ++total;
        if (op != 0) {
          EXPECT_FALSE(s.ok()) << "a truncated or extended update must be refused";
        }
        if (!s.ok()) {
          ++refused;
          EXPECT_TRUE(s.code() == absl::StatusCode::kInvalidArgument ||
                      s.code() == absl::StatusCode::kDataLoss)
              << s;
        }
      }
    }
  }
  // Most flips are refused too (a flip inside a value of a raw payload can still give a valid,
  // different update: integrity of the bytes is the upload's SHA-256's job, not the codec's).
  EXPECT_GT(refused, total * 2 / 3);
}

// ValidateUpdate's memory does not grow with the update. A 1 GiB zstd body (a valid table, then
// 2^28 - 4 fp32 zeros) is validated through the window, and the same frame followed by 4 KiB more
// output than the header declares is refused as a bomb: peak RSS grows by far less than the 1 GiB a
// materialising decoder needs (64 MiB: the window, zstd's history and allocator slack).
TEST(DecompressionBombTest, ValidateStreamsAGibibyteBodyInBoundedMemory) {
  constexpr uint64_t kN = (uint64_t{1} << 28) - 4;
  const std::string table = OneTensorTable(kN);
  const uint64_t raw = table.size() + 4 * kN;
  ASSERT_EQ(raw, uint64_t{1} << 30);
  const std::string exact = CompressZeros(4 * kN, /*pledge_size=*/false, table);
  const std::string bomb = CompressZeros(4 * kN + 4096, /*pledge_size=*/false, table);
  const std::string exact_wire =
      Header(CodecId::kRawF32, kUpdateFlagZstd, kN, raw, exact.size()) + exact;
  const std::string bomb_wire =
      Header(CodecId::kRawF32, kUpdateFlagZstd, kN, raw, bomb.size()) + bomb;

  ResetPeakResident();
  const int64_t rss_before = PeakResidentKib();
  auto ok = ValidateUpdate(exact_wire, DecodeLimits{});
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 1u);
  EXPECT_EQ((*ok)[0].name, "w");
  EXPECT_EQ((*ok)[0].shape, std::vector<int64_t>{static_cast<int64_t>(kN)});
  const absl::Status refused = ValidateUpdate(bomb_wire, DecodeLimits{}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("decompression bomb refused"));
  EXPECT_LT(PeakResidentKib() - rss_before, 64 * 1024) << "peak RSS grew by more than 64 MiB";
}

TEST(ValidateUpdateTest, ReportsTheTableInWireOrder) {
  const auto u = MakeUpdate(5);
  for (CodecId codec : {CodecId::kRawF32, CodecId::kF16, CodecId::kBF16}) {
    for (bool zstd : {false, true}) {
      auto wire = EncodeUpdate(u, {.codec = codec, .zstd = zstd});
      ASSERT_TRUE(wire.ok()) << wire.status();
      auto table = ValidateUpdate(*wire, {});
      ASSERT_TRUE(table.ok()) << table.status();
      ASSERT_EQ(table->size(), u.size());
      for (size_t t = 0; t < u.size(); ++t) {
        EXPECT_EQ((*table)[t].name, u[t].name);
        EXPECT_EQ((*table)[t].shape, u[t].shape);
      }
    }
  }
}

// The zstd stage streams through a 1 MiB window. Here the tensor table alone (1200 names of ~1 KB)
// spans two windows, so table entries straddle refills; the values start at an odd byte offset and
// the last tensor (700001 values) spans several more windows. Decoding must give back exactly what
// was encoded (fp32 bit for bit, fp16/bf16 the same rounding as the encoder's), validation the
// exact table, and a NaN deep in a later window must be reported at its index by both.
TEST(ValidateUpdateTest, ZstdTableAndValuesSpanningManyWindows) {
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<UpdateTensor> u;
  size_t table_bytes = 4;
  for (int t = 0; t < 1200; ++t) {
    const std::string name =
        "tensor." + std::to_string(t) + "." + std::string(1000 + t % 7, 'a' + t % 26);
    u.push_back({name, {2, 3}, {}});
    table_bytes += 2 + name.size() + 1 + 2 * 8;
  }
  constexpr int64_t kBig = 700001;
  u.push_back({"big", {kBig}, {}});
  table_bytes += 2 + 3 + 1 + 8;
  if (table_bytes % 2 == 0) {
    u.push_back({"od", {1}, {}});  // 2 + 2 + 1 + 8 = 13 more bytes: an odd table
    table_bytes += 13;
  }
  ASSERT_EQ(table_bytes % 2, 1u);
  ASSERT_GT(table_bytes, size_t{1} << 20);
  for (UpdateTensor& t : u) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    for (int64_t i = 0; i < n; ++i) t.values.push_back(dist(gen));
  }
  const size_t big = u.size() - (u.back().name == "od" ? 2 : 1);
  ASSERT_EQ(u[big].name, "big");

  for (CodecId codec : {CodecId::kRawF32, CodecId::kF16, CodecId::kBF16}) {
    SCOPED_TRACE(std::string(CodecName(codec)));
    auto wire = EncodeUpdate(u, {.codec = codec, .zstd = true});
    ASSERT_TRUE(wire.ok()) << wire.status();
    ASSERT_TRUE(DecodeAndValidateAgree(*wire).ok());
    auto back = DecodeUpdate(*wire, {});
    ASSERT_TRUE(back.ok()) << back.status();
    std::vector<UpdateTensor> expected = u;
    for (UpdateTensor& t : expected) {
      for (float& x : t.values) {
        if (codec == CodecId::kF16) x = F16ToF32(F32ToF16(x));
        if (codec == CodecId::kBF16) x = BF16ToF32(F32ToBF16(x));
      }
    }
    ExpectBitIdentical(expected, *back);

    // The same update with value 654321 of "big" made NaN, compressed by hand (EncodeUpdate refuses NaN).
    auto plain = EncodeUpdate(u, {.codec = codec});
    ASSERT_TRUE(plain.ok());
    const size_t esize = CodecElementSize(codec);
    const size_t tail_values = static_cast<size_t>(kBig - 654321) + (big + 1 < u.size() ? 1 : 0);
    std::string body = plain->substr(kUpdateHeaderSize);
    const size_t at = body.size() - tail_values * esize;
    if (codec == CodecId::kRawF32) {
      PutU32At(body, at, 0x7FC00000u);
    } else {
      PutU16At(body, at, codec == CodecId::kF16 ? 0x7E00 : 0x7FC0);
    }
    std::string frame(ZSTD_compressBound(body.size()), '\0');
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    const size_t n = ZSTD_compress2(cctx, frame.data(), frame.size(), body.data(), body.size());
    ZSTD_freeCCtx(cctx);
    ASSERT_FALSE(ZSTD_isError(n));
    frame.resize(n);
    const auto h = ParseUpdateHeader(*plain, {});
    ASSERT_TRUE(h.ok());
    const std::string nan_wire =
        Header(codec, kUpdateFlagZstd, h->element_count, body.size(), n) + frame;
    const absl::Status s = DecodeAndValidateAgree(nan_wire);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tensor 'big' value 654321 is not finite"));
  }
}

// The consumed hook: told of progress at least every 8 MiB of input, never going back, and finally
// of the whole update, so a caller can drop a mapped file's pages as validation passes them.
TEST(ValidateUpdateTest, ConsumedHookReportsMonotonicProgressToTheEnd) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<UpdateTensor> u = {{"a", {3'000'000}, {}}, {"b", {2'500'000}, {}}};  // 22 MB of fp32
  for (UpdateTensor& t : u) {
    for (int64_t i = 0; i < t.shape[0]; ++i) t.values.push_back(dist(gen));
  }
  for (bool zstd : {false, true}) {
    auto wire = EncodeUpdate(u, {.codec = CodecId::kRawF32, .zstd = zstd});
    ASSERT_TRUE(wire.ok());
    std::vector<uint64_t> reports;
    auto table = ValidateUpdate(*wire, {}, [&](uint64_t bytes) { reports.push_back(bytes); });
    ASSERT_TRUE(table.ok()) << table.status();
    ASSERT_EQ(table->size(), 2u);
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports.back(), wire->size()) << "zstd " << zstd;
    uint64_t prev = 0;
    for (uint64_t r : reports) {
      EXPECT_GT(r, prev);
      // The documented bound (random fp32 hardly compresses, so zstd's input advances in ~1 MiB
      // steps like its output).
      EXPECT_LE(r - prev, uint64_t{8} << 20) << "zstd " << zstd;
      prev = r;
    }
  }
}

TEST(CodecNamesTest, ParseAndPrint) {
  for (CodecId c : {CodecId::kRawF32, CodecId::kF16, CodecId::kBF16}) {
    auto parsed = ParseCodecName(CodecName(c));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, c);
  }
  EXPECT_EQ(ParseCodecName("BF16").value(), CodecId::kBF16);
  EXPECT_EQ(ParseCodecName("int3").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
