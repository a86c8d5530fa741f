#include "core/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/file.h"
#include "core/rng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// An 8-byte little-endian length, the header, then the data: the file layout, built by hand so
// the reader is tested against the spec rather than against our writer.
std::string Craft(const std::string& header, const std::string& data,
                  uint64_t length_override = UINT64_MAX) {
  const uint64_t n = length_override == UINT64_MAX ? header.size() : length_override;
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

absl::Status OpenStatus(const std::string& bytes) {
  return SafetensorsFile::FromBytes(bytes, "test.safetensors").status();
}

// Asserts that `bytes` is rejected with `code` and a message containing every fragment.
void ExpectRejected(const std::string& bytes, absl::StatusCode code,
                    std::vector<std::string> fragments) {
  const absl::Status s = OpenStatus(bytes);
  EXPECT_EQ(s.code(), code) << s;
  for (const auto& f : fragments) EXPECT_THAT(std::string(s.message()), HasSubstr(f));
}

std::string Entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

TEST(Safetensors, ReadsHandBuiltFileInReferenceLayout) {
  // What Python's safetensors.torch.save_file({"a": torch.tensor([1., 2.]),
  // "b": torch.tensor([[1, -1]], dtype=torch.int8)}, metadata={"format": "pt"}) writes:
  // compact JSON, larger dtypes first, padded with spaces to a multiple of 8.
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I8","shape":[1,2],"data_offsets":[8,10]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string data;
  const float a[2] = {1.0f, 2.0f};
  data.append(reinterpret_cast<const char*>(a), 8);
  data.push_back(1);
  data.push_back(static_cast<char>(-1));
  auto file = SafetensorsFile::FromBytes(Craft(header, data), "py.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->names(), ElementsAre("a", "b"));
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  auto ta = (*file)->Get("a");
  ASSERT_TRUE(ta.ok());
  EXPECT_EQ(ta->dtype, DType::kF32);
  EXPECT_EQ(ta->shape, std::vector<int64_t>{2});
  ASSERT_EQ(ta->size, 8u);
  float got[2];
  std::memcpy(got, ta->data, 8);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 2.0f);
  auto tb = (*file)->Get("b");
  ASSERT_TRUE(tb.ok());
  EXPECT_EQ(tb->dtype, DType::kI8);
  EXPECT_EQ(tb->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(static_cast<int8_t>(tb->data[1]), -1);
  auto view = tb->view();
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->numel(), 2);
  EXPECT_TRUE(view->read_only());
}

TEST(Safetensors, RoundTripEveryDTypeThroughDisk) {
  coretest::TempDir dir;
  const std::vector<DType> all = {DType::kF32, DType::kF16, DType::kBF16, DType::kI8,
                                  DType::kU8,  DType::kI16, DType::kI32,  DType::kI64,
                                  DType::kF64, DType::kBool};
  std::vector<std::string> buffers;
  std::vector<SafetensorsTensorToWrite> tensors;
  for (size_t k = 0; k < all.size(); ++k) {
    const DType dt = all[k];
    const std::vector<int64_t> shape = {static_cast<int64_t>(k % 3 + 1),
                                        3};  // odd sizes shake alignment
    std::string bytes(static_cast<size_t>(shape[0] * shape[1]) * DTypeSize(dt), '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + k);
    if (dt == DType::kBool) {
      for (auto& b : bytes) b &= 1;
    }
    buffers.push_back(std::move(bytes));
    tensors.push_back({"t_" + std::string(DTypeName(dt)), dt, shape, nullptr, 0});
  }
  for (size_t k = 0; k < tensors.size(); ++k) {
    tensors[k].data = buffers[k].data();
    tensors[k].size = buffers[k].size();
  }
  tensors.push_back({"scalar", DType::kF32, {}, buffers[0].data(), 4});
  tensors.push_back({"empty", DType::kF64, {0, 5}, nullptr, 0});
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"round", "7"}};
  const std::string path = dir.File("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, meta).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata(), meta);
  EXPECT_EQ((*file)->names().size(), tensors.size());
  EXPECT_TRUE(std::is_sorted((*file)->names().begin(), (*file)->names().end()));
  for (const auto& want : tensors) {
    auto got = (*file)->Get(want.name);
    ASSERT_TRUE(got.ok()) << want.name;
    EXPECT_EQ(got->dtype, want.dtype) << want.name;
    EXPECT_EQ(got->shape, want.shape) << want.name;
    ASSERT_EQ(got->size, want.size) << want.name;
    if (want.size > 0) {
      EXPECT_EQ(std::memcmp(got->data, want.data, want.size), 0) << want.name;
    }
    // Our writer aligns every tensor to its element size.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got->data) % DTypeSize(want.dtype), 0u) << want.name;
  }
  // Header padded with spaces to a multiple of 8, as the reference writer does.
  const std::string raw = *ReadFileToString(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  const size_t close = raw.rfind('}', 8 + n);
  for (size_t i = close + 1; i < 8 + n; ++i) EXPECT_EQ(raw[i], ' ');
  // The in-memory serializer produces the same bytes.
  EXPECT_EQ(*SerializeSafetensors(tensors, meta), raw);
}

TEST(Safetensors, ToF32WidensHalfPrecisionAndRefusesIntegers) {
  const uint16_t f16[2] = {0x3c00, 0xc000};   // 1, -2
  const uint16_t bf16[2] = {0x3fc0, 0x4040};  // 1.5, 3
  const int32_t i32[2] = {1, 2};
  auto bytes = SerializeSafetensors({{"h", DType::kF16, {2}, f16, sizeof(f16)},
                                     {"b", DType::kBF16, {2}, bf16, sizeof(bf16)},
                                     {"i", DType::kI32, {2}, i32, sizeof(i32)}},
                                    {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto file = SafetensorsFile::FromBytes(*bytes, "mixed.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(*(*file)->Get("h")->ToF32(), ::testing::ElementsAre(1.0f, -2.0f));
  EXPECT_THAT(*(*file)->Get("b")->ToF32(), ::testing::ElementsAre(1.5f, 3.0f));
  absl::StatusOr<std::vector<float>> ints = (*file)->Get("i")->ToF32();
  EXPECT_EQ(ints.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ints.status().message()),
              ::testing::HasSubstr("'i' has dtype I32, expected F32, F16 or BF16"));
}

TEST(Safetensors, NoTensorsIsValid) {
  auto bytes = SerializeSafetensors({}, {});
  ASSERT_TRUE(bytes.ok());
  auto file = SafetensorsFile::FromBytes(*bytes, "empty");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->names().empty());
}

TEST(Safetensors, OpenErrors) {
  coretest::TempDir dir;
  EXPECT_EQ(SafetensorsFile::Open(dir.File("missing.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(SafetensorsFile::Open(dir.path()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(WriteFileAtomically(dir.File("empty"), "").ok());
  EXPECT_EQ(SafetensorsFile::Open(dir.File("empty")).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Safetensors, NullMetadataMeansNone) {
  auto file = SafetensorsFile::FromBytes(Craft(R"({"__metadata__":null})", ""), "x");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST(Safetensors, GetUnknownNameIsNotFound) {
  auto file = SafetensorsFile::FromBytes(Craft("{}      ", ""), "x");
  ASSERT_TRUE(file.ok());
  auto t = (*file)->Get("w");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("'w'"));
  EXPECT_FALSE((*file)->Contains("w"));
}

// --- Hostile files: one test per way a header can lie. -------------------------------------------

TEST(SafetensorsMalformed, ShorterThanLengthPrefix) {
  ExpectRejected("", absl::StatusCode::kDataLoss, {"0 bytes"});
  ExpectRejected(std::string(7, '\0'), absl::StatusCode::kDataLoss, {"7 bytes", "8-byte"});
}

TEST(SafetensorsMalformed, HeaderLengthPastEndOfFile) {
  ExpectRejected(Craft("{}", "", 100), absl::StatusCode::kDataLoss,
                 {"header length 100", "truncated"});
}

TEST(SafetensorsMalformed, HeaderLengthOverCap) {
  // A length just past the cap is rejected before anything is read or allocated.
  ExpectRejected(Craft("{}", "", kSafetensorsMaxHeaderBytes + 1),
                 absl::StatusCode::kInvalidArgument, {"exceeds the limit"});
  ExpectRejected(Craft("{}", "", UINT64_MAX - 1), absl::StatusCode::kInvalidArgument,
                 {"exceeds the limit"});
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  ExpectRejected(Craft("{\"a\":", ""), absl::StatusCode::kInvalidArgument,
                 {"invalid JSON", "byte"});
  ExpectRejected(Craft("PK\x03\x04", ""), absl::StatusCode::kInvalidArgument,
                 {"does not start with '{'"});
  ExpectRejected(Craft("", ""), absl::StatusCode::kInvalidArgument, {"does not start with '{'"});
}

TEST(SafetensorsMalformed, HeaderNotAnObject) {
  // Starts with '{' but is followed by trailing garbage, or is an object of the wrong shape.
  ExpectRejected(Craft("{} []", ""), absl::StatusCode::kInvalidArgument, {"invalid JSON"});
  ExpectRejected(Craft(R"({"w": [1, 2]})", ""), absl::StatusCode::kInvalidArgument,
                 {"tensor 'w'", "must be an object"});
}

TEST(SafetensorsMalformed, DuplicateTensorName) {
  const std::string e = Entry("U8", "[1]", "[0,1]");
  ExpectRejected(Craft("{\"w\":" + e + ",\"w\":" + e + "}", "x"),
                 absl::StatusCode::kInvalidArgument, {"duplicate key 'w'"});
}

TEST(SafetensorsMalformed, MissingFields) {
  ExpectRejected(Craft(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "missing 'dtype'"});
  ExpectRejected(Craft(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "missing 'shape'"});
  ExpectRejected(Craft(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "missing 'data_offsets'"});
}

TEST(SafetensorsMalformed, WrongFieldTypes) {
  ExpectRejected(Craft("{\"w\":" + Entry("F32", "\"[1]\"", "[0,4]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "'shape' must be an array"});
  ExpectRejected(Craft("{\"w\":" + Entry("F32", "[1.5]", "[0,4]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument,
                 {"tensor 'w'", "'shape'[0] must be a non-negative integer"});
  ExpectRejected(Craft(R"({"w":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "'dtype' must be a string"});
  ExpectRejected(Craft("{\"w\":" + Entry("F32", "[1]", "[0,4,8]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "2 elements"});
}

TEST(SafetensorsMalformed, UnknownDType) {
  ExpectRejected(Craft("{\"w\":" + Entry("F8_E5M2", "[4]", "[0,4]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "unknown dtype 'F8_E5M2'"});
}

TEST(SafetensorsMalformed, NegativeDimension) {
  ExpectRejected(Craft("{\"w\":" + Entry("U8", "[2,-2]", "[0,4]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "'shape'[1] is negative"});
}

TEST(SafetensorsMalformed, ShapeProductOverflows) {
  // 2^32 * 2^32 elements: the product wraps to 0 in 64-bit arithmetic, which would match the
  // empty offsets [0,0] if it were not checked.
  ExpectRejected(Craft("{\"w\":" + Entry("U8", "[4294967296,4294967296]", "[0,0]") + "}", ""),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "overflows"});
  // Elements fit in int64 but bytes do not: 2^62 F32 values.
  ExpectRejected(Craft("{\"w\":" + Entry("F32", "[4611686018427387904]", "[0,0]") + "}", ""),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "overflows"});
  // Dimensions beyond int64.
  ExpectRejected(Craft("{\"w\":" + Entry("U8", "[18446744073709551615]", "[0,0]") + "}", ""),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "does not fit in int64"});
}

TEST(SafetensorsMalformed, ByteLengthDisagreesWithShape) {
  ExpectRejected(Craft("{\"w\":" + Entry("F32", "[2]", "[0,4]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "span 4 bytes", "needs 8"});
}

TEST(SafetensorsMalformed, OffsetsReversed) {
  ExpectRejected(Craft("{\"w\":" + Entry("U8", "[0]", "[4,0]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "begin 4 > end 0"});
}

TEST(SafetensorsMalformed, OffsetsPastDataSection) {
  // Indistinguishable from a file cut short after its header, hence DataLoss.
  ExpectRejected(Craft("{\"w\":" + Entry("U8", "[8]", "[0,8]") + "}", "abcd"),
                 absl::StatusCode::kDataLoss,
                 {"tensor 'w'", "past the end of the 4-byte data section"});
  ExpectRejected(Craft("{\"w\":" + Entry("U8", "[1]", "[18446744073709551615,0]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'w'", "does not fit in int64"});
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  ExpectRejected(
      Craft("{\"a\":" + Entry("U8", "[3]", "[0,3]") + ",\"b\":" + Entry("U8", "[3]", "[1,4]") + "}",
            "abcd"),
      absl::StatusCode::kInvalidArgument, {"tensor 'b'", "overlap tensor 'a'"});
  // Two names aliasing the same bytes are an overlap too.
  ExpectRejected(
      Craft("{\"a\":" + Entry("U8", "[4]", "[0,4]") + ",\"b\":" + Entry("U8", "[4]", "[0,4]") + "}",
            "abcd"),
      absl::StatusCode::kInvalidArgument, {"overlap"});
}

TEST(SafetensorsMalformed, HoleInDataSection) {
  // A gap between tensors.
  ExpectRejected(
      Craft("{\"a\":" + Entry("U8", "[1]", "[0,1]") + ",\"b\":" + Entry("U8", "[2]", "[2,4]") + "}",
            "abcd"),
      absl::StatusCode::kInvalidArgument, {"tensor 'b'", "hole"});
  // Unclaimed bytes at the start.
  ExpectRejected(Craft("{\"a\":" + Entry("U8", "[3]", "[1,4]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"tensor 'a'", "hole"});
  // Unclaimed bytes at the end.
  ExpectRejected(Craft("{\"a\":" + Entry("U8", "[3]", "[0,3]") + "}", "abcd"),
                 absl::StatusCode::kInvalidArgument, {"cover 3 bytes of the 4-byte data section"});
}

TEST(SafetensorsMalformed, MetadataMustBeStringToString) {
  ExpectRejected(Craft(R"({"__metadata__":{"epoch":3}})", ""), absl::StatusCode::kInvalidArgument,
                 {"'__metadata__' value of 'epoch' must be a string"});
  ExpectRejected(Craft(R"({"__metadata__":["pt"]})", ""), absl::StatusCode::kInvalidArgument,
                 {"'__metadata__' must be an object"});
  ExpectRejected(Craft(R"({"__metadata__":{"a":{"b":"c"}}})", ""),
                 absl::StatusCode::kInvalidArgument, {"value of 'a' must be a string"});
}

TEST(SafetensorsMalformed, DeeplyNestedHeaderIsRejectedNotACrash) {
  std::string deep = "{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  ExpectRejected(Craft(deep, ""), absl::StatusCode::kInvalidArgument, {"nesting"});
}

TEST(SafetensorsMalformed, EveryTruncationOfAValidFileIsRejected) {
  const float w[3] = {1, 2, 3};
  auto bytes = SerializeSafetensors({{"w", DType::kF32, {3}, w, sizeof(w)}}, {{"k", "v"}});
  ASSERT_TRUE(bytes.ok());
  for (size_t len = 0; len < bytes->size(); ++len) {
    const absl::Status s = OpenStatus(bytes->substr(0, len));
    // Wherever the cut falls (length prefix, header, data), the file is shorter than it says.
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "prefix of " << len << " bytes: " << s;
  }
  EXPECT_TRUE(OpenStatus(*bytes).ok());
}

TEST(SafetensorsMalformed, RandomCorruptionNeverCrashes) {
  // Flip, insert and delete bytes of a valid file: each variant must give a status (OK or not),
  // never a crash or an out-of-bounds read (the sanitizer build checks the latter).
  const float w[6] = {1, 2, 3, 4, 5, 6};
  const int8_t q[3] = {1, -1, 0};
  auto valid = SerializeSafetensors(
      {{"w", DType::kF32, {2, 3}, w, sizeof(w)}, {"q", DType::kI8, {3}, q, 3}}, {{"format", "pt"}});
  ASSERT_TRUE(valid.ok());
  Rng rng(20261129);
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = *valid;
    const int edits = 1 + static_cast<int>(rng.UniformInt(3));
    for (int k = 0; k < edits; ++k) {
      const size_t pos = rng.UniformInt(bytes.size());
      switch (rng.UniformInt(3)) {
        case 0:
          bytes[pos] = static_cast<char>(rng.NextU32());
          break;
        case 1:
          bytes.insert(pos, 1, static_cast<char>(rng.NextU32()));
          break;
        default:
          bytes.erase(pos, 1);
          break;
      }
    }
    auto file = SafetensorsFile::FromBytes(bytes, "fuzz");
    if (!file.ok()) continue;
    ++accepted;
    // Whatever was accepted must be self-consistent.
    for (const auto& name : (*file)->names()) {
      auto t = (*file)->Get(name);
      ASSERT_TRUE(t.ok());
      ASSERT_EQ(static_cast<int64_t>(t->size),
                t->numel() * static_cast<int64_t>(DTypeSize(t->dtype)));
      // Touch every byte: an out-of-bounds span would trip AddressSanitizer here.
      unsigned sum = 0;
      for (size_t i = 0; i < t->size; ++i) sum += t->data[i];
      (void)sum;
    }
  }
  EXPECT_LT(accepted, 3000);  // most corruptions are caught
}

// --- Writer validation ----------------------------------------------------------------------------

TEST(SafetensorsWriter, RejectsBadInput) {
  const float w[2] = {1, 2};
  auto code = [](std::vector<SafetensorsTensorToWrite> t) {
    return SerializeSafetensors(t, {}).status().code();
  };
  EXPECT_EQ(code({{"w", DType::kF32, {2}, w, 8}, {"w", DType::kF32, {2}, w, 8}}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"w", DType::kF32, {3}, w, 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"w", DType::kF32, {-2}, w, 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"", DType::kF32, {2}, w, 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"__metadata__", DType::kF32, {2}, w, 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"w", DType::kF32, {2}, nullptr, 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"bad\xff", DType::kF32, {2}, w, 8}}),
            absl::StatusCode::kInvalidArgument);  // not UTF-8
  const absl::Status s = SerializeSafetensors({{"lora_A", DType::kF32, {3}, w, 8}}, {}).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("'lora_A'"));
}

TEST(SafetensorsWriter, LaysOutLargestElementsFirstThenByName) {
  const uint8_t b[1] = {7};
  const double d[1] = {2.5};
  const uint16_t h[1] = {0x3c00};
  auto bytes = SerializeSafetensors({{"z_u8", DType::kU8, {1}, b, 1},
                                     {"a_f16", DType::kF16, {1}, h, 2},
                                     {"m_f64", DType::kF64, {1}, d, 8}},
                                    {});
  ASSERT_TRUE(bytes.ok());
  auto file = SafetensorsFile::FromBytes(*bytes, "layout");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Get("a_f16")->data - (*file)->Get("m_f64")->data, 8);
  EXPECT_EQ((*file)->Get("z_u8")->data - (*file)->Get("m_f64")->data, 10);
}

}  // namespace
}  // namespace fedlora
