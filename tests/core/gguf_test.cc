#include "core/gguf.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/ggml_quant.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// --- A GGUF image builder, written from the spec (not from the reader) ---------------------------

template <class T>
std::string Le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
std::string Str(const std::string& s) { return Le<uint64_t>(s.size()) + s; }
std::string F32s(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
// An array value: element type, count, then the packed elements.
std::string Arr(GgufType elem, uint64_t count, const std::string& elems) {
  return Le<uint32_t>(static_cast<uint32_t>(elem)) + Le<uint64_t>(count) + elems;
}

struct Builder {
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::string data;
    int64_t offset = -1;  // -1: the next aligned offset
  };
  std::string magic = "GGUF";
  uint32_t version = 3;
  int64_t tensor_count = -1, kv_count = -1;  // -1: the real counts
  uint64_t alignment = 32;                   // for the layout; write general.alignment yourself
  std::vector<std::pair<std::string, std::string>> kvs;  // key -> type u32 + value bytes
  std::vector<Tensor> tensors;

  Builder& Kv(const std::string& key, GgufType type, const std::string& value) {
    kvs.emplace_back(key, Le<uint32_t>(static_cast<uint32_t>(type)) + value);
    return *this;
  }
  Builder& T(const std::string& name, std::vector<uint64_t> ne, GgmlType type, std::string data,
             int64_t off = -1) {
    tensors.push_back({name, std::move(ne), static_cast<uint32_t>(type), std::move(data), off});
    return *this;
  }

  std::string Build() const {
    std::string out = magic + Le<uint32_t>(version);
    out += Le<uint64_t>(tensor_count >= 0 ? tensor_count : tensors.size());
    out += Le<uint64_t>(kv_count >= 0 ? kv_count : kvs.size());
    for (const auto& [k, v] : kvs) out += Str(k) + v;
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const Tensor& t : tensors) {
      const uint64_t off = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : next;
      offsets.push_back(off);
      next = (off + t.data.size() + alignment - 1) / alignment * alignment;
      out += Str(t.name) + Le<uint32_t>(t.ne.size());
      for (uint64_t d : t.ne) out += Le<uint64_t>(d);
      out += Le<uint32_t>(t.type) + Le<uint64_t>(off);
    }
    out.append((alignment - out.size() % alignment) % alignment, '\0');
    std::string data;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].data.empty()) continue;  // an offset far past the end stays a claim
      if (data.size() < offsets[i] + tensors[i].data.size())
        data.resize(offsets[i] + tensors[i].data.size());
      std::memcpy(data.data() + offsets[i], tensors[i].data.data(), tensors[i].data.size());
    }
    return out + data;
  }
};

absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const std::string& bytes) {
  return GgufFile::FromBytes(bytes, "test.gguf");
}

void ExpectRejected(const std::string& bytes, absl::StatusCode code,
                    std::vector<std::string> fragments) {
  const absl::Status s = Parse(bytes).status();
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("test.gguf"));
  for (const auto& f : fragments) EXPECT_THAT(std::string(s.message()), HasSubstr(f)) << s;
}

std::vector<float> Dequantized(const GgufFile& file, const std::string& name) {
  auto t = file.Get(name);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  std::vector<float> out(t->numel());
  absl::Status s = t->DequantizeRows(0, t->rows(), out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::string F16(float v) { return Le<uint16_t>(F32ToF16(v)); }

// --- Valid files and known values ------------------------------------------------------------------

TEST(Gguf, ReadsHeaderMetadataAndF32Tensor) {
  Builder b;
  b.Kv("general.architecture", GgufType::kString, Str("llama"))
      .Kv("llama.block_count", GgufType::kUint32, Le<uint32_t>(30))
      .T("w", {3, 2}, GgmlType::kF32, F32s({1.5f, -2, 0.25f, 3, 4, -0.5f}))
      .T("norm", {3}, GgmlType::kF32, F32s({7, 8, 9}));
  auto f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& file = **f;
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.data_offset() % 32, 0u);
  EXPECT_THAT(file.keys(), ElementsAre("general.architecture", "llama.block_count"));
  EXPECT_THAT(file.names(), ElementsAre("w", "norm"));
  EXPECT_EQ(*file.GetString("general.architecture"), "llama");
  EXPECT_EQ(*file.GetUint("llama.block_count"), 30u);
  auto w = file.Get("w");
  ASSERT_TRUE(w.ok());
  EXPECT_THAT(w->ne, ElementsAre(3, 2));
  EXPECT_THAT(w->shape(), ElementsAre(2, 3));
  EXPECT_EQ(w->numel(), 6);
  EXPECT_EQ(w->rows(), 2);
  EXPECT_EQ(w->row_bytes(), 12);
  EXPECT_EQ(w->size, 24u);
  EXPECT_EQ(w->offset, 0u);
  EXPECT_EQ(file.Get("norm")->offset, 32u);  // 24 bytes padded to the alignment
  EXPECT_THAT(Dequantized(file, "w"), ElementsAre(1.5f, -2, 0.25f, 3, 4, -0.5f));
  std::vector<float> row(3);
  ASSERT_TRUE(w->DequantizeRows(1, 1, row.data()).ok());
  EXPECT_THAT(row, ElementsAre(3, 4, -0.5f));
  EXPECT_EQ(w->DequantizeRows(1, 2, row.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(w->DequantizeRows(-1, 1, row.data()).code(), absl::StatusCode::kOutOfRange);
  const absl::Status missing = file.Get("nope").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("'nope'"));
  EXPECT_THAT(std::string(missing.message()), HasSubstr("test.gguf"));
  EXPECT_FALSE(file.Contains("nope"));
  EXPECT_TRUE(file.Contains("w"));
}

TEST(Gguf, ReadsVersion2AndEmptyFile) {
  Builder b;
  b.version = 2;
  auto f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_TRUE((*f)->tensors().empty());
  EXPECT_TRUE((*f)->keys().empty());
}

TEST(Gguf, HalfTypes) {
  const std::string f16 = Le<uint16_t>(0x3C00) + Le<uint16_t>(0xC000) + Le<uint16_t>(0x3800) +
                          Le<uint16_t>(0x7BFF) + Le<uint16_t>(0x0001) + Le<uint16_t>(0x8000);
  const std::string bf16 =
      Le<uint16_t>(0x3F80) + Le<uint16_t>(0xC040) + Le<uint16_t>(0x4049) + Le<uint16_t>(0);
  Builder b;
  b.T("h", {6}, GgmlType::kF16, f16).T("b", {2, 2}, GgmlType::kBF16, bf16);
  auto f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(Dequantized(**f, "h"),
              ElementsAre(1.0f, -2.0f, 0.5f, 65504.0f, std::ldexp(1.0f, -24), -0.0f));
  EXPECT_THAT(Dequantized(**f, "b"), ElementsAre(1.0f, -3.0f, 3.140625f, 0.0f));
  EXPECT_EQ((*f)->Get("b")->row_bytes(), 4);
}

TEST(Gguf, Q8_0) {
  std::string block = F16(0.5f);
  std::vector<float> want;
  for (int j = 0; j < 32; ++j) {
    const int8_t q = static_cast<int8_t>(j * 9 - 128);  // -128 .. 151 wraps: covers both signs
    block.push_back(static_cast<char>(q));
    want.push_back(q * 0.5f);
  }
  Builder b;
  b.T("q", {32}, GgmlType::kQ8_0, block);
  auto f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Dequantized(**f, "q"), want);
  EXPECT_EQ((*f)->Get("q")->size, 34u);
}

TEST(Gguf, Q4_0AndQ4_1) {
  // Low nibble j, high nibble 15 - j: element j is j, element j + 16 is 15 - j.
  std::string nibbles;
  for (int j = 0; j < 16; ++j) nibbles.push_back(static_cast<char>(j | ((15 - j) << 4)));
  std::vector<float> want0(32), want1(32);
  for (int j = 0; j < 16; ++j) {
    want0[j] = (j - 8) * 2.0f;
    want0[j + 16] = (15 - j - 8) * 2.0f;
    want1[j] = j * 0.5f - 1.0f;
    want1[j + 16] = (15 - j) * 0.5f - 1.0f;
  }
  Builder b;
  b.T("q40", {32}, GgmlType::kQ4_0, F16(2.0f) + nibbles)
      .T("q41", {32}, GgmlType::kQ4_1, F16(0.5f) + F16(-1.0f) + nibbles);
  auto f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Dequantized(**f, "q40"), want0);
  EXPECT_EQ(Dequantized(**f, "q41"), want1);
}

TEST(Gguf, Q5_0AndQ5_1) {
  const uint32_t qh = 0xA5C3F00Fu;
  std::string qs;
  for (int j = 0; j < 16; ++j) qs.push_back(static_cast<char>((j * 7 + 3) & 0xFF));
  std::vector<float> want0(32), want1(32);
  for (int i = 0; i < 32; ++i) {
    const int byte = static_cast<uint8_t>(qs[i % 16]);
    const int nib = i < 16 ? byte & 15 : byte >> 4;
    const int q = nib + 16 * static_cast<int>((qh >> i) & 1);
    want0[i] = (q - 16) * 0.25f;
    want1[i] = q * 0.25f + 3.0f;
  }
  Builder b;
  b.T("q50", {32}, GgmlType::kQ5_0, F16(0.25f) + Le(qh) + qs)
      .T("q51", {32}, GgmlType::kQ5_1, F16(0.25f) + F16(3.0f) + Le(qh) + qs);
  auto f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Dequantized(**f, "q50"), want0);
  EXPECT_EQ(Dequantized(**f, "q51"), want1);
}

// The K-quant expectations are computed element by element from the layout in ggml's
// block_q4_K / block_q5_K / block_q6_K (tests/core/gguf_reference_test.py checks the same
// formats against gguf-py's dequantizer).
int ScaleK4(const std::string& s, int j, bool min) {
  auto u = [&](int i) { return static_cast<int>(static_cast<uint8_t>(s[i])); };
  if (j < 4) return min ? u(j + 4) & 63 : u(j) & 63;
  return min ? (u(j + 4) >> 4) | ((u(j) >> 6) << 4) : (u(j + 4) & 15) | ((u(j - 4) >> 6) << 4);
}

TEST(Gguf, Q4_KAndQ5_K) {
  std::string scales, qh, qs;
  for (int i = 0; i < 12; ++i) scales.push_back(static_cast<char>(i * 37 + 11));
  for (int i = 0; i < 32; ++i) qh.push_back(static_cast<char>(i * 53 + 5));
  for (int i = 0; i < 128; ++i) qs.push_back(static_cast<char>(i * 29 + 1));
  const float d = 0.125f, dmin = 0.0625f;
  std::vector<float> want4(256), want5(256);
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 32, l = e % 32;  // sub-block; chunk sub / 2 uses qs[32 * (sub / 2) + l]
    const int byte = static_cast<uint8_t>(qs[32 * (sub / 2) + l]);
    const int nib = sub % 2 == 0 ? byte & 15 : byte >> 4;
    const int high = (static_cast<uint8_t>(qh[l]) >> sub) & 1;
    const float sc = d * static_cast<float>(ScaleK4(scales, sub, false));
    const float mn = dmin * static_cast<float>(ScaleK4(scales, sub, true));
    want4[e] = sc * static_cast<float>(nib) - mn;
    want5[e] = sc * static_cast<float>(nib + 16 * high) - mn;
  }
  Builder b;
  b.T("q4k", {256}, GgmlType::kQ4_K, F16(d) + F16(dmin) + scales + qs)
      .T("q5k", {256}, GgmlType::kQ5_K, F16(d) + F16(dmin) + scales + qh + qs);
  auto f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Dequantized(**f, "q4k"), want4);
  EXPECT_EQ(Dequantized(**f, "q5k"), want5);
}

TEST(Gguf, Q6_K) {
  std::string ql, qh, scales;
  for (int i = 0; i < 128; ++i) ql.push_back(static_cast<char>(i * 31 + 7));
  for (int i = 0; i < 64; ++i) qh.push_back(static_cast<char>(i * 43 + 2));
  for (int i = 0; i < 16; ++i) scales.push_back(static_cast<char>(i * 19 - 120));
  const float d = 0.03125f;
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, g = (e % 128) / 32, l = e % 32;
    const int low_byte = static_cast<uint8_t>(ql[64 * half + 32 * (g % 2) + l]);
    const int low = g < 2 ? low_byte & 15 : low_byte >> 4;
    const int high = (static_cast<uint8_t>(qh[32 * half + l]) >> (2 * g)) & 3;
    const float sc = d * static_cast<float>(static_cast<int8_t>(scales[e / 16]));
    want[e] = sc * static_cast<float>(low + 16 * high - 32);
  }
  Builder b;
  b.T("q6k", {256}, GgmlType::kQ6_K, ql + qh + scales + F16(d));
  auto f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Dequantized(**f, "q6k"), want);
}

TEST(Gguf, MultiRowQuantizedTensorAndCustomAlignment) {
  // Two rows of 64 Q8_0 elements (2 blocks per row), alignment 64, a 3-d and a 4-d tensor.
  std::string data;
  std::vector<float> want;
  for (int blk = 0; blk < 4; ++blk) {
    data += F16(static_cast<float>(blk + 1));
    for (int j = 0; j < 32; ++j) {
      data.push_back(static_cast<char>(j - 16));
      want.push_back(static_cast<float>((j - 16) * (blk + 1)));
    }
  }
  Builder b;
  b.alignment = 64;
  b.Kv("general.alignment", GgufType::kUint32, Le<uint32_t>(64))
      .T("q", {64, 2}, GgmlType::kQ8_0, data)
      .T("cube", {1, 2, 3}, GgmlType::kF32, F32s({1, 2, 3, 4, 5, 6}))
      .T("four", {2, 1, 1, 2}, GgmlType::kF32, F32s({1, 2, 3, 4}));
  auto f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  auto q = (*f)->Get("q");
  EXPECT_EQ(q->rows(), 2);
  EXPECT_EQ(q->row_bytes(), 68);
  EXPECT_EQ(Dequantized(**f, "q"), want);
  std::vector<float> second(64);
  ASSERT_TRUE(q->DequantizeRows(1, 1, second.data()).ok());
  EXPECT_EQ(second, std::vector<float>(want.begin() + 64, want.end()));
  EXPECT_THAT((*f)->Get("cube")->shape(), ElementsAre(3, 2, 1));
  EXPECT_EQ((*f)->Get("cube")->rows(), 6);
  EXPECT_THAT((*f)->Get("four")->shape(), ElementsAre(2, 1, 1, 2));
  EXPECT_EQ((*f)->Get("cube")->offset, 192u);  // q's 136 bytes padded to 64
  EXPECT_EQ((*f)->Get("four")->offset, 256u);
}

TEST(Gguf, OpenMapsAFile) {
  coretest::TempDir dir;
  Builder b;
  b.Kv("k", GgufType::kInt8, Le<int8_t>(-5)).T("w", {2}, GgmlType::kF32, F32s({1, 2}));
  const std::string path = dir.File("m.gguf");
  {
    std::ofstream out(path, std::ios::binary);
    const std::string bytes = b.Build();
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ(*(*f)->GetInt("k"), -5);
  EXPECT_THAT(Dequantized(**f, "w"), ElementsAre(1, 2));
  EXPECT_EQ(GgufFile::Open(dir.File("missing.gguf")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GgufFile::Open(dir.path()).status().code(), absl::StatusCode::kFailedPrecondition);
  { std::ofstream empty(dir.File("empty.gguf")); }
  EXPECT_EQ(GgufFile::Open(dir.File("empty.gguf")).status().code(), absl::StatusCode::kDataLoss);
}

// --- Metadata values and getters ------------------------------------------------------------------

std::unique_ptr<GgufFile> EveryType() {
  Builder b;
  b.Kv("u8", GgufType::kUint8, Le<uint8_t>(200))
      .Kv("i8", GgufType::kInt8, Le<int8_t>(-100))
      .Kv("u16", GgufType::kUint16, Le<uint16_t>(60000))
      .Kv("i16", GgufType::kInt16, Le<int16_t>(-30000))
      .Kv("u32", GgufType::kUint32, Le<uint32_t>(4000000000u))
      .Kv("i32", GgufType::kInt32, Le<int32_t>(-2000000000))
      .Kv("i32pos", GgufType::kInt32, Le<int32_t>(7))
      .Kv("f32", GgufType::kFloat32, Le<float>(0.1f))
      .Kv("bool", GgufType::kBool, Le<uint8_t>(1))
      .Kv("str", GgufType::kString, Str("h\xC3\xA9llo"))
      .Kv("u64", GgufType::kUint64, Le<uint64_t>(18446744073709551615ull))
      .Kv("i64", GgufType::kInt64, Le<int64_t>(-9223372036854775807ll - 1))
      .Kv("f64", GgufType::kFloat64, Le<double>(1e300))
      .Kv("strs", GgufType::kArray, Arr(GgufType::kString, 3, Str("a") + Str("") + Str("merge s")))
      .Kv("ints", GgufType::kArray,
          Arr(GgufType::kInt32, 3, Le<int32_t>(1) + Le<int32_t>(-2) + Le<int32_t>(3)))
      .Kv("u8s", GgufType::kArray, Arr(GgufType::kUint8, 2, "\xFF\x01"))
      .Kv("u64s", GgufType::kArray, Arr(GgufType::kUint64, 1, Le<uint64_t>(~0ull)))
      .Kv("floats", GgufType::kArray,
          Arr(GgufType::kFloat32, 2, Le<float>(0.5f) + Le<float>(-1e-3f)))
      .Kv("doubles", GgufType::kArray, Arr(GgufType::kFloat64, 1, Le<double>(0.1)))
      .Kv("bools", GgufType::kArray, Arr(GgufType::kBool, 2, std::string("\x01\x00", 2)))
      .Kv("empty", GgufType::kArray, Arr(GgufType::kInt16, 0, ""))
      .Kv("nested", GgufType::kArray,
          Arr(GgufType::kArray, 2,
              Arr(GgufType::kInt8, 2, "\x01\xFF") + Arr(GgufType::kString, 1, Str("deep"))));
  auto f = Parse(b.Build());
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(*f) : nullptr;
}

TEST(GgufMetadata, ScalarGetters) {
  auto f = EveryType();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(*f->GetUint("u8"), 200u);
  EXPECT_EQ(*f->GetUint("u16"), 60000u);
  EXPECT_EQ(*f->GetUint("u32"), 4000000000u);
  EXPECT_EQ(*f->GetUint("u64"), 18446744073709551615ull);
  EXPECT_EQ(*f->GetUint("i32pos"), 7u);  // a non-negative signed value is fine
  EXPECT_EQ(*f->GetInt("i8"), -100);
  EXPECT_EQ(*f->GetInt("i16"), -30000);
  EXPECT_EQ(*f->GetInt("i32"), -2000000000);
  EXPECT_EQ(*f->GetInt("i64"), INT64_MIN);
  EXPECT_EQ(*f->GetInt("u32"), 4000000000);
  EXPECT_EQ(*f->GetFloat("f32"), static_cast<double>(0.1f));
  EXPECT_EQ(*f->GetFloat("f64"), 1e300);
  EXPECT_TRUE(*f->GetBool("bool"));
  EXPECT_EQ(*f->GetString("str"), "h\xC3\xA9llo");
  EXPECT_TRUE(f->Has("u8"));
  EXPECT_FALSE(f->Has("u9"));
  EXPECT_EQ(f->keys().size(), 22u);
  EXPECT_EQ((*f->Find("nested"))->Describe(), "ARRAY[ARRAY] of 2 elements");
}

void ExpectError(const absl::Status& s, absl::StatusCode code, std::vector<std::string> fragments) {
  EXPECT_EQ(s.code(), code) << s;
  for (const auto& frag : fragments) EXPECT_THAT(std::string(s.message()), HasSubstr(frag)) << s;
}

TEST(GgufMetadata, WrongTypeGettersNameKeyAndTypes) {
  auto f = EveryType();
  ASSERT_NE(f, nullptr);
  using C = absl::StatusCode;
  ExpectError(f->GetString("u32").status(), C::kInvalidArgument,
              {"test.gguf", "key 'u32'", "expected STRING, found UINT32"});
  ExpectError(f->GetUint("i32").status(), C::kInvalidArgument,
              {"key 'i32'", "non-negative", "-2000000000"});
  ExpectError(f->GetUint("f32").status(), C::kInvalidArgument,
              {"expected an unsigned integer, found FLOAT32"});
  ExpectError(f->GetUint("bool").status(), C::kInvalidArgument, {"found BOOL"});
  ExpectError(f->GetInt("u64").status(), C::kOutOfRange, {"key 'u64'", "does not fit in int64"});
  ExpectError(f->GetInt("str").status(), C::kInvalidArgument,
              {"expected an integer, found STRING"});
  ExpectError(f->GetFloat("i32").status(), C::kInvalidArgument,
              {"expected FLOAT32 or FLOAT64, found INT32"});
  ExpectError(f->GetBool("u8").status(), C::kInvalidArgument, {"expected BOOL, found UINT8"});
  ExpectError(f->GetStringArray("ints").status(), C::kInvalidArgument,
              {"key 'ints'", "expected ARRAY[STRING], found ARRAY[INT32] of 3 elements"});
  ExpectError(f->GetStringArray("str").status(), C::kInvalidArgument, {"found STRING"});
  ExpectError(f->GetIntArray("floats").status(), C::kInvalidArgument, {"found ARRAY[FLOAT32]"});
  ExpectError(f->GetIntArray("bools").status(), C::kInvalidArgument, {"found ARRAY[BOOL]"});
  ExpectError(f->GetIntArray("u64s").status(), C::kOutOfRange,
              {"element 0", "does not fit in int64"});
  ExpectError(f->GetFloatArray("ints").status(), C::kInvalidArgument, {"found ARRAY[INT32]"});
  ExpectError(f->GetString("absent").status(), C::kNotFound,
              {"test.gguf", "no metadata key 'absent'"});
  ExpectError(f->GetUint("absent").status(), C::kNotFound, {"'absent'"});
}

TEST(GgufMetadata, Arrays) {
  auto f = EveryType();
  ASSERT_NE(f, nullptr);
  auto strs = f->GetStringArray("strs");
  ASSERT_TRUE(strs.ok());
  EXPECT_THAT(*strs, ElementsAre("a", "", "merge s"));
  EXPECT_THAT(*f->GetIntArray("ints"), ElementsAre(1, -2, 3));
  EXPECT_THAT(*f->GetIntArray("u8s"), ElementsAre(255, 1));
  EXPECT_THAT(*f->GetIntArray("empty"), ElementsAre());
  EXPECT_THAT(*f->GetFloatArray("floats"), ElementsAre(0.5, static_cast<double>(-1e-3f)));
  EXPECT_THAT(*f->GetFloatArray("doubles"), ElementsAre(0.1));
  const GgufValue* bools = *f->Find("bools");
  EXPECT_EQ(bools->array_type(), GgufType::kBool);
  EXPECT_EQ(bools->array_size(), 2u);
  EXPECT_TRUE(*bools->Element(0)->AsBool());
  EXPECT_FALSE(*bools->Element(1)->AsBool());
  EXPECT_EQ(bools->Element(2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*(*f->Find("u64s"))->Element(0)->AsUint(), ~0ull);
  EXPECT_EQ(*(*f->Find("strs"))->Element(2)->AsString(), "merge s");
  EXPECT_EQ((*f->Find("u8"))->Element(0).status().code(), absl::StatusCode::kInvalidArgument);
  auto nested = (*f->Find("nested"))->AsArrayArray();
  ASSERT_TRUE(nested.ok());
  ASSERT_EQ(nested->size(), 2u);
  EXPECT_THAT(*(*nested)[0].AsIntArray(), ElementsAre(1, -1));
  EXPECT_THAT(*(*nested)[1].AsStringArray(), ElementsAre("deep"));
  EXPECT_EQ((*(*f->Find("nested"))->Element(1)).Describe(), "ARRAY[STRING] of 1 elements");
}

// --- Hostile headers -------------------------------------------------------------------------------

using C = absl::StatusCode;

TEST(GgufHostile, MagicAndVersion) {
  Builder b;
  b.magic = "GGML";
  ExpectRejected(b.Build(), C::kInvalidArgument, {"not a GGUF file", "GGML"});
  b.magic = "GGUF";
  b.version = 1;
  ExpectRejected(b.Build(), C::kInvalidArgument, {"version 1 is not supported"});
  b.version = 4;
  ExpectRejected(b.Build(), C::kInvalidArgument, {"unsupported GGUF version 4"});
  b.version = 0x03000000;
  ExpectRejected(b.Build(), C::kInvalidArgument, {"big-endian"});
  ExpectRejected("GG", C::kDataLoss, {"2 bytes"});
  ExpectRejected("GGUF\x03\x00\x00\x00", C::kDataLoss, {"24-byte GGUF header"});
  ExpectRejected("", C::kDataLoss, {"0 bytes"});
}

TEST(GgufHostile, CountsThatCannotFit) {
  Builder b;
  b.Kv("a", GgufType::kUint8, Le<uint8_t>(1));
  b.kv_count = int64_t{1} << 62;
  ExpectRejected(b.Build(), C::kInvalidArgument, {"kv_count 4611686018427387904 cannot fit"});
  // One pair (14 bytes) and the header's padding to 32: 40 bytes follow the header, room for two.
  b.kv_count = 3;
  ExpectRejected(b.Build(), C::kInvalidArgument, {"kv_count 3 cannot fit"});
  b.kv_count = 2;  // fits the count bound; the second pair's key is the zero padding
  ExpectRejected(b.Build(), C::kInvalidArgument, {"kv pair 1", "empty key"});
  b.kv_count = -1;
  b.tensor_count = int64_t{1} << 60;
  ExpectRejected(b.Build(), C::kInvalidArgument, {"tensor_count 1152921504606846976 cannot fit"});
  b.tensor_count = 1;  // passes the first bound (there are padding bytes) but not the second
  b.Kv("pad", GgufType::kString, Str(std::string(40, 'x')));
  ExpectRejected(b.Build(), C::kInvalidArgument,
                 {"tensor_count 1 cannot fit", "after the metadata"});
}

TEST(GgufHostile, StringsPastTheEnd) {
  Builder b;
  b.Kv("s", GgufType::kString, Le<uint64_t>(1000) + "short");
  ExpectRejected(b.Build(), C::kDataLoss, {"key 's'", "string of 1000 bytes", "truncated"});
  Builder huge;
  huge.Kv("s", GgufType::kString, Le<uint64_t>(~0ull) + "x");
  ExpectRejected(huge.Build(), C::kDataLoss, {"key 's'", "18446744073709551615"});
  // A key whose length runs past the end.
  std::string img = "GGUF" + Le<uint32_t>(3) + Le<uint64_t>(0) + Le<uint64_t>(1) +
                    Le<uint64_t>(500) + std::string(20, 'k');
  ExpectRejected(img, C::kDataLoss, {"kv pair 0", "key of 500 bytes"});
  // Over the name limit: refused before the bytes are read.
  Builder long_key;
  long_key.Kv(std::string(kGgufMaxNameBytes + 1, 'k'), GgufType::kUint8, Le<uint8_t>(0));
  ExpectRejected(long_key.Build(), C::kInvalidArgument,
                 {"key length 4097 exceeds the limit of 4096"});
  Builder long_name;
  long_name.T(std::string(kGgufMaxNameBytes + 1, 'n'), {1}, GgmlType::kF32, F32s({1}));
  ExpectRejected(long_name.Build(), C::kInvalidArgument,
                 {"tensor info 0", "tensor name length 4097"});
}

TEST(GgufHostile, ArrayCountLiesAndNesting) {
  Builder b;
  b.Kv("a", GgufType::kArray, Arr(GgufType::kUint32, 1000, Le<uint32_t>(1)));
  ExpectRejected(b.Build(), C::kInvalidArgument,
                 {"key 'a'", "array count 1000 of UINT32 cannot fit"});
  Builder s;
  s.Kv("a", GgufType::kArray, Arr(GgufType::kString, ~0ull >> 1, Str("x")));
  ExpectRejected(s.Build(), C::kInvalidArgument, {"key 'a'", "of STRING cannot fit"});
  Builder lie;  // count fits the bytes but the strings do not
  lie.Kv("a", GgufType::kArray, Arr(GgufType::kString, 3, Str("x") + Le<uint64_t>(900)));
  lie.Kv("pad", GgufType::kString, Str(std::string(32, 'p')));
  ExpectRejected(lie.Build(), C::kDataLoss, {"key 'a'", "string of 900 bytes"});
  // kGgufMaxArrayDepth levels are fine, one more is refused.
  std::string v = Arr(GgufType::kUint8, 1, "\x07");
  for (int i = 1; i < kGgufMaxArrayDepth; ++i) v = Arr(GgufType::kArray, 1, v);
  Builder ok;
  ok.Kv("deep", GgufType::kArray, v);
  EXPECT_TRUE(Parse(ok.Build()).ok());
  Builder deep;
  deep.Kv("deep", GgufType::kArray, Arr(GgufType::kArray, 1, v));
  ExpectRejected(deep.Build(), C::kInvalidArgument, {"key 'deep'", "nested more than 4 deep"});
  Builder many;  // more arrays inside arrays than the file-wide budget
  std::string inner;
  for (uint64_t i = 0; i <= kGgufMaxNestedArrays; ++i) inner += Arr(GgufType::kUint8, 0, "");
  many.Kv("many", GgufType::kArray, Arr(GgufType::kArray, kGgufMaxNestedArrays + 1, inner));
  ExpectRejected(many.Build(), C::kInvalidArgument, {"arrays inside arrays"});
}

TEST(GgufHostile, BadValueTypesAndBools) {
  Builder b;
  b.Kv("t", static_cast<GgufType>(13), Le<uint64_t>(0));
  ExpectRejected(b.Build(), C::kInvalidArgument, {"key 't'", "unknown value type 13"});
  Builder a;
  a.Kv("t", GgufType::kArray, Arr(static_cast<GgufType>(99), 1, Le<uint64_t>(0)));
  ExpectRejected(a.Build(), C::kInvalidArgument, {"unknown array element type 99"});
  Builder bo;
  bo.Kv("flag", GgufType::kBool, Le<uint8_t>(2));
  ExpectRejected(bo.Build(), C::kInvalidArgument, {"key 'flag'", "BOOL value is 2"});
  Builder ba;
  ba.Kv("flags", GgufType::kArray, Arr(GgufType::kBool, 3, std::string("\x00\x01\x05", 3)));
  ExpectRejected(ba.Build(), C::kInvalidArgument, {"BOOL element 2 is 5"});
}

TEST(GgufHostile, DuplicatesAndEmptyNames) {
  Builder b;
  b.Kv("k", GgufType::kUint8, Le<uint8_t>(1)).Kv("k", GgufType::kUint8, Le<uint8_t>(2));
  ExpectRejected(b.Build(), C::kInvalidArgument, {"key 'k'", "duplicate key"});
  Builder t;
  t.T("w", {1}, GgmlType::kF32, F32s({1})).T("w", {1}, GgmlType::kF32, F32s({2}));
  ExpectRejected(t.Build(), C::kInvalidArgument, {"tensor 'w'", "duplicate tensor name"});
  Builder ek;
  ek.Kv("", GgufType::kUint8, Le<uint8_t>(1));
  ExpectRejected(ek.Build(), C::kInvalidArgument, {"kv pair 0", "empty key"});
  Builder et;
  et.T("", {1}, GgmlType::kF32, F32s({1}));
  ExpectRejected(et.Build(), C::kInvalidArgument, {"tensor info 0", "empty tensor name"});
}

TEST(GgufHostile, Dimensions) {
  Builder b;
  b.T("w", {}, GgmlType::kF32, F32s({1}));
  ExpectRejected(b.Build(), C::kInvalidArgument, {"tensor 'w'", "n_dims is 0"});
  Builder five;
  five.T("w", {1, 1, 1, 1, 1}, GgmlType::kF32, F32s({1}));
  ExpectRejected(five.Build(), C::kInvalidArgument, {"n_dims is 5, must be 1 to 4"});
  Builder zero;
  zero.T("w", {4, 0}, GgmlType::kF32, "");
  ExpectRejected(zero.Build(), C::kInvalidArgument, {"tensor 'w'", "ne[1] is 0"});
  Builder big;
  big.T("w", {1ull << 32, 1ull << 32}, GgmlType::kF32, "");
  ExpectRejected(big.Build(), C::kInvalidArgument, {"element count overflows int64 at ne[1]"});
  Builder huge;
  huge.T("w", {~0ull}, GgmlType::kF32, "");
  ExpectRejected(huge.Build(), C::kInvalidArgument, {"overflows int64 at ne[0]"});
  Builder bytes;  // numel fits int64, bytes do not
  bytes.T("w", {1ull << 31, 1ull << 31}, GgmlType::kF32, "");
  ExpectRejected(bytes.Build(), C::kInvalidArgument, {"byte size", "overflows int64"});
  Builder block;
  block.T("q", {48}, GgmlType::kQ4_0, std::string(36, '\0'));
  ExpectRejected(block.Build(), C::kInvalidArgument,
                 {"tensor 'q'", "ne[0] = 48 is not a multiple", "32"});
}

TEST(GgufHostile, TypesRefusedNamingTheTensor) {
  Builder b;
  b.T("blk.0.attn_q.weight", {256}, GgmlType::kIQ2_XXS, std::string(66, '\0'));
  ExpectRejected(b.Build(), C::kUnimplemented,
                 {"tensor 'blk.0.attn_q.weight'", "IQ2_XXS (16)", "not supported", "Q4_1", "Q6_K"});
  Builder q2;
  q2.T("w", {256}, GgmlType::kQ2_K, std::string(84, '\0'));
  ExpectRejected(q2.Build(), C::kUnimplemented, {"Q2_K (10)"});
  Builder i32;
  i32.T("w", {1}, GgmlType::kI32, Le<int32_t>(1));
  ExpectRejected(i32.Build(), C::kUnimplemented, {"I32 (26)"});
  Builder unknown;
  unknown.T("w", {1}, static_cast<GgmlType>(4), F32s({1}));
  ExpectRejected(unknown.Build(), C::kInvalidArgument,
                 {"tensor 'w'", "unknown ggml type 4", "supported types"});
}

TEST(GgufHostile, Alignment) {
  for (uint32_t bad : {0u, 3u, 48u, kGgufMaxAlignment * 2}) {
    Builder b;
    b.Kv("general.alignment", GgufType::kUint32, Le<uint32_t>(bad));
    ExpectRejected(b.Build(), C::kInvalidArgument, {"general.alignment", "must be a power of two"});
  }
  Builder t;
  t.Kv("general.alignment", GgufType::kUint64, Le<uint64_t>(32));
  ExpectRejected(t.Build(), C::kInvalidArgument,
                 {"general.alignment", "must be UINT32, found UINT64"});
  Builder one;  // alignment 1: nothing is padded, every offset is aligned
  one.alignment = 1;
  one.Kv("general.alignment", GgufType::kUint32, Le<uint32_t>(1))
      .T("a", {1}, GgmlType::kF16, F16(1.0f))
      .T("b", {2}, GgmlType::kF16, F16(2.0f) + F16(3.0f));
  auto f = Parse(one.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Get("b")->offset, 2u);
  EXPECT_THAT(Dequantized(**f, "b"), ElementsAre(2.0f, 3.0f));
}

TEST(GgufHostile, OffsetsAndBounds) {
  Builder mis;
  mis.T("w", {1}, GgmlType::kF32, F32s({1}), 4);
  ExpectRejected(mis.Build(), C::kInvalidArgument,
                 {"tensor 'w'", "offset 4 is not a multiple of the alignment 32"});
  Builder oob;
  oob.T("w", {8}, GgmlType::kF32, F32s({1, 2}));  // 32 bytes claimed, 8 present
  ExpectRejected(oob.Build(), C::kDataLoss, {"tensor 'w'", "runs past the end", "truncated"});
  Builder far;
  far.T("a", {1}, GgmlType::kF32, F32s({1})).T("w", {1}, GgmlType::kF32, "", int64_t{1} << 40);
  ExpectRejected(far.Build(), C::kDataLoss, {"tensor 'w'", "1099511627776"});
  Builder wrap;  // offset + size would wrap around uint64
  wrap.T("w", {4}, GgmlType::kF32, "", static_cast<int64_t>(~0ull - 31));
  ExpectRejected(wrap.Build(), C::kDataLoss, {"tensor 'w'"});
  Builder overlap;
  overlap.T("a", {16}, GgmlType::kF32, std::string(64, '\0'), 0)
      .T("b", {1}, GgmlType::kF32, F32s({1}), 32);
  ExpectRejected(overlap.Build(), C::kInvalidArgument, {"tensor 'b'", "overlaps tensor 'a'"});
  Builder same;  // two tensors on the same bytes, listed in either order
  same.T("x", {1}, GgmlType::kF32, F32s({1}), 0).T("y", {1}, GgmlType::kF32, F32s({1}), 0);
  ExpectRejected(same.Build(), C::kInvalidArgument, {"overlaps"});
  Builder ordered;  // not in data order, no overlap: fine
  ordered.T("late", {1}, GgmlType::kF32, F32s({2}), 32)
      .T("early", {1}, GgmlType::kF32, F32s({1}), 0);
  auto f = Parse(ordered.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT((*f)->names(), ElementsAre("late", "early"));
  EXPECT_THAT(Dequantized(**f, "late"), ElementsAre(2));
}

TEST(GgufHostile, EveryTruncationAndByteFlipIsAStatus) {
  Builder b;
  b.Kv("general.alignment", GgufType::kUint32, Le<uint32_t>(32))
      .Kv("strs", GgufType::kArray, Arr(GgufType::kString, 2, Str("ab") + Str("c")))
      .Kv("nested", GgufType::kArray,
          Arr(GgufType::kArray, 1, Arr(GgufType::kInt16, 1, Le<int16_t>(-1))))
      .T("q", {32}, GgmlType::kQ4_1, F16(1) + F16(0) + std::string(16, '\x21'))
      .T("f", {2}, GgmlType::kF32, F32s({1, 2}));
  const std::string img = b.Build();
  ASSERT_TRUE(Parse(img).ok());
  const size_t data_end = img.size();
  for (size_t n = 0; n < data_end; ++n) {
    const absl::Status s = Parse(img.substr(0, n)).status();
    EXPECT_FALSE(s.ok()) << "prefix of " << n << " bytes";
    EXPECT_TRUE(s.code() == C::kDataLoss || s.code() == C::kInvalidArgument) << n << ": " << s;
  }
  for (size_t i = 0; i < img.size(); ++i) {
    for (int bit : {0, 3, 7}) {
      std::string bad = img;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      auto f = Parse(bad);
      if (!f.ok()) continue;
      for (const GgufTensor& t : (*f)->tensors()) {
        std::vector<float> out(t.numel());
        EXPECT_TRUE(t.DequantizeRows(0, t.rows(), out.data()).ok());
      }
    }
  }
}

// --- ggml_quant.h ----------------------------------------------------------------------------------

TEST(GgmlQuant, TypeTable) {
  EXPECT_EQ(GgmlTypeName(GgmlType::kQ4_K), "Q4_K");
  EXPECT_EQ(GgmlTypeName(GgmlType::kBF16), "BF16");
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(5)), "");
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kBF16), 30u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ6_K), 14u);
  EXPECT_TRUE(GgmlTypeSupported(GgmlType::kQ5_1));
  EXPECT_FALSE(GgmlTypeSupported(GgmlType::kQ8_1));
  EXPECT_FALSE(GgmlTypeSupported(static_cast<GgmlType>(1000)));
  EXPECT_EQ(GgmlBlockSize(GgmlType::kQ4_0), 32);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ4_0), 18);
  EXPECT_EQ(GgmlBlockSize(GgmlType::kQ6_K), 256);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ6_K), 210);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kBF16), 2);
  EXPECT_EQ(GgmlBlockSize(GgmlType::kQ3_K), 0);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ4_1, 576), 360);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ8_0, 576), 612);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kF16, 7), 14);
  ExpectError(GgmlRowBytes(GgmlType::kQ4_1, 33).status(), C::kInvalidArgument,
              {"Q4_1", "33", "block size 32"});
  ExpectError(GgmlRowBytes(GgmlType::kQ4_1, -32).status(), C::kInvalidArgument, {"-32"});
  ExpectError(GgmlRowBytes(GgmlType::kIQ4_XS, 256).status(), C::kUnimplemented,
              {"IQ4_XS (23)", "F32, F16"});
  ExpectError(GgmlRowBytes(GgmlType::kF32, INT64_MAX).status(), C::kInvalidArgument, {"overflows"});
}

TEST(GgmlQuant, QuantizeRowsQ8_0AsGgmlsReference) {
  // Block 0: -16 .. 15 (max 16: d = 16/127, q = round-half-away(x * 127 / 16)); block 1: zeros;
  // block 2 (row 1): 0.5 at element 3, -0.25 at element 4 (q = 127, -63.5 -> -64).
  std::vector<float> x(128, 0.0f);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16);
  x[64 + 3] = 0.5f;
  x[64 + 4] = -0.25f;
  std::vector<uint8_t> q(2 * *GgmlRowBytes(GgmlType::kQ8_0, 64));
  ASSERT_TRUE(QuantizeRowsQ8_0(x.data(), 2, 64, q.data()).ok());
  BlockQ8_0 b[3];
  std::memcpy(b, q.data(), sizeof(b));
  EXPECT_EQ(b[0].d, F32ToF16(16.0f / 127.0f));
  EXPECT_EQ(b[0].qs[0], -127);  // -16
  EXPECT_EQ(b[0].qs[17], 8);    // 1 * 7.9375
  EXPECT_EQ(b[0].qs[31], 119);  // 15 * 7.9375 = 119.06
  EXPECT_EQ(b[0].qs[24], 64);   // 8 * 7.9375 = 63.5, away from zero
  EXPECT_EQ(b[1].d, F32ToF16(0.0f));
  for (int8_t v : b[1].qs) EXPECT_EQ(v, 0);
  EXPECT_EQ(b[2].qs[3], 127);
  EXPECT_EQ(b[2].qs[4], -64);
  // Dequantized, every value is within half a step (plus the fp16 rounding of d) of the input.
  std::vector<float> back(128);
  ASSERT_TRUE(DequantizeRows(GgmlType::kQ8_0, q.data(), 2, 64, back.data(), 64).ok());
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(back[i], x[i], 0.5f * 16.0f / 127.0f + 1e-2f) << i;
  ExpectError(QuantizeRowsQ8_0(x.data(), 1, 40, q.data()), C::kInvalidArgument,
              {"40", "multiple of 32"});
  ExpectError(QuantizeRowsQ8_0(x.data(), -1, 32, q.data()), C::kInvalidArgument, {"negative"});
}

TEST(GgmlQuant, DequantizeRowsWithStrideAndUnalignedSource) {
  // Two Q4_0 rows of 32 at an odd address, into rows 40 floats apart.
  std::string buf = "x";
  for (int r = 0; r < 2; ++r) {
    buf += F16(r == 0 ? 1.0f : -1.0f);
    for (int j = 0; j < 16; ++j) buf.push_back(static_cast<char>(0x9F));  // low 15, high 9
  }
  const uint8_t* src = reinterpret_cast<const uint8_t*>(buf.data()) + 1;
  std::vector<float> dst(80, 42.0f);
  ASSERT_TRUE(DequantizeRows(GgmlType::kQ4_0, src, 2, 32, dst.data(), 40).ok());
  EXPECT_EQ(dst[0], 7.0f);
  EXPECT_EQ(dst[16], 1.0f);
  EXPECT_EQ(dst[32], 42.0f);  // the gap is untouched
  EXPECT_EQ(dst[40], -7.0f);
  EXPECT_EQ(dst[56], -1.0f);
  EXPECT_EQ(DequantizeRows(GgmlType::kQ4_0, src, 2, 32, dst.data(), 31).code(),
            C::kInvalidArgument);
  EXPECT_EQ(DequantizeRows(GgmlType::kQ4_0, src, -1, 32, dst.data(), 32).code(),
            C::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ8_1, src, 32, dst.data()).code(), C::kUnimplemented);
  // F16 at an odd address, longer than the conversion chunk.
  std::string halves = "y";
  for (int i = 0; i < 300; ++i) halves += F16(static_cast<float>(i));
  std::vector<float> h(300);
  ASSERT_TRUE(DequantizeRow(GgmlType::kF16, reinterpret_cast<const uint8_t*>(halves.data()) + 1,
                            300, h.data())
                  .ok());
  for (int i = 0; i < 300; ++i) EXPECT_EQ(h[i], static_cast<float>(i));
}

}  // namespace
}  // namespace fedlora
