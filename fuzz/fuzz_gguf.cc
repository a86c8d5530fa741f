// Fuzzes the GGUF reader (core/gguf.h) and the ggml dequantizers (core/ggml_quant.h) on arbitrary
// file images: model files come from disk and from downloads.
//
// Checks beyond "no crash, no sanitizer report": a refusal is InvalidArgument, DataLoss or
// Unimplemented; every metadata value answers every getter, and exactly the getters of its type
// succeed; every array element can be read and the one past the end is OutOfRange; every tensor
// lies inside the image, has rows() * row_bytes() bytes and its rows dequantize (every byte read).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/ggml_quant.h"
#include "core/gguf.h"
#include "fuzz/fuzz_util.h"

namespace {

using fedlora::GgufType;
using fedlora::GgufValue;

bool IsInteger(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

uint64_t Touch(const char* p, size_t n) {
  uint64_t h = 0;
  for (size_t i = 0; i < n; ++i) h = h * 31 + static_cast<uint8_t>(p[i]);  // ASan sees any overrun
  return h;
}

volatile uint64_t sink = 0;

// Reads v every way there is; `budget` bounds the elements visited per input.
void Walk(const GgufValue& v, int depth, int64_t* budget) {
  FUZZ_CHECK(depth <= fedlora::kGgufMaxArrayDepth, v.Describe());
  const GgufType t = v.type();
  FUZZ_CHECK(v.AsString().ok() == (t == GgufType::kString), v.Describe());
  FUZZ_CHECK(v.AsBool().ok() == (t == GgufType::kBool), v.Describe());
  FUZZ_CHECK(v.AsFloat().ok() == (t == GgufType::kFloat32 || t == GgufType::kFloat64),
             v.Describe());
  auto u = v.AsUint();
  auto i = v.AsInt();
  if (!IsInteger(t)) FUZZ_CHECK(!u.ok() && !i.ok(), v.Describe());
  if (u.ok() && i.ok()) FUZZ_CHECK(*u == static_cast<uint64_t>(*i), v.Describe());
  if (auto s = v.AsString(); s.ok()) sink = sink + Touch(s->data(), s->size());
  if (t != GgufType::kArray) {
    FUZZ_CHECK(!v.Element(0).ok(), v.Describe());
    return;
  }
  const GgufType et = v.array_type();
  auto strings = v.AsStringArray();
  FUZZ_CHECK(strings.ok() == (et == GgufType::kString), v.Describe());
  if (strings.ok()) FUZZ_CHECK(strings->size() == v.array_size(), v.Describe());
  auto ints = v.AsIntArray();
  if (ints.ok()) FUZZ_CHECK(IsInteger(et) && ints->size() == v.array_size(), v.Describe());
  if (!IsInteger(et)) FUZZ_CHECK(!ints.ok(), v.Describe());
  auto floats = v.AsFloatArray();
  FUZZ_CHECK(floats.ok() == (et == GgufType::kFloat32 || et == GgufType::kFloat64), v.Describe());
  auto arrays = v.AsArrayArray();
  FUZZ_CHECK(arrays.ok() == (et == GgufType::kArray), v.Describe());
  FUZZ_CHECK(v.Element(v.array_size()).status().code() == absl::StatusCode::kOutOfRange,
             v.Describe());
  for (uint64_t k = 0; k < v.array_size() && *budget > 0; ++k, --*budget) {
    auto e = v.Element(k);
    FUZZ_CHECK(e.ok(), e.status());
    FUZZ_CHECK(e->type() == et, v.Describe());
    if (ints.ok()) FUZZ_CHECK(*e->AsInt() == (*ints)[k], v.Describe());
    if (strings.ok()) FUZZ_CHECK(*e->AsString() == (*strings)[k], v.Describe());
    Walk(*e, depth + 1, budget);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlora;
  auto file =
      GgufFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz input");
  FUZZ_TRACE("%zu bytes: %s\n", size, file.status().ToString().c_str());
  if (!file.ok()) {
    const absl::StatusCode c = file.status().code();
    FUZZ_CHECK(c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kDataLoss ||
                   c == absl::StatusCode::kUnimplemented,
               file.status());
    return 0;
  }
  const GgufFile& f = **file;
  FUZZ_CHECK(f.version() == 2 || f.version() == 3, "");
  FUZZ_CHECK(f.alignment() >= 1 && (f.alignment() & (f.alignment() - 1)) == 0, "");
  FUZZ_CHECK(f.data_offset() <= size, "");

  int64_t budget = 1 << 16;
  for (std::string_view key : f.keys()) {
    FUZZ_CHECK(f.Has(key), std::string(key));
    auto v = f.Find(key);
    FUZZ_CHECK(v.ok(), v.status());
    // The file-level getters agree with the value's.
    FUZZ_CHECK(f.GetString(key).ok() == (*v)->AsString().ok(), std::string(key));
    FUZZ_CHECK(f.GetUint(key).ok() == (*v)->AsUint().ok(), std::string(key));
    FUZZ_CHECK(f.GetInt(key).ok() == (*v)->AsInt().ok(), std::string(key));
    FUZZ_CHECK(f.GetFloat(key).ok() == (*v)->AsFloat().ok(), std::string(key));
    FUZZ_CHECK(f.GetBool(key).ok() == (*v)->AsBool().ok(), std::string(key));
    FUZZ_CHECK(f.GetStringArray(key).ok() == (*v)->AsStringArray().ok(), std::string(key));
    FUZZ_CHECK(f.GetIntArray(key).ok() == (*v)->AsIntArray().ok(), std::string(key));
    FUZZ_CHECK(f.GetFloatArray(key).ok() == (*v)->AsFloatArray().ok(), std::string(key));
    Walk(**v, 0, &budget);
  }
  FUZZ_CHECK(!f.Find("\x01not a key").ok(), "");

  FUZZ_CHECK(f.names().size() == f.tensors().size(), "");
  const uint8_t* base = nullptr;  // the image's first byte, as every tensor sees it
  std::vector<float> out;
  for (size_t k = 0; k < f.tensors().size(); ++k) {
    const GgufTensor& t = f.tensors()[k];
    FUZZ_CHECK(t.name == f.names()[k] && f.Contains(t.name), std::string(t.name));
    auto got = f.Get(t.name);
    FUZZ_CHECK(got.ok() && got->offset == t.offset && got->data == t.data, std::string(t.name));
    FUZZ_CHECK(GgmlTypeSupported(t.type), std::string(t.name));
    FUZZ_CHECK(!t.ne.empty() && t.ne.size() <= static_cast<size_t>(kGgufMaxDims),
               std::string(t.name));
    int64_t numel = 1;
    for (int64_t d : t.ne) {
      FUZZ_CHECK(d >= 1, std::string(t.name));
      numel *= d;
    }
    FUZZ_CHECK(numel == t.numel() && t.rows() * t.ne[0] == numel, std::string(t.name));
    auto row_bytes = GgmlRowBytes(t.type, t.ne[0]);
    FUZZ_CHECK(row_bytes.ok() && *row_bytes == t.row_bytes(), std::string(t.name));
    FUZZ_CHECK(static_cast<uint64_t>(t.rows()) * static_cast<uint64_t>(t.row_bytes()) == t.size,
               std::string(t.name));
    FUZZ_CHECK(t.offset % f.alignment() == 0, std::string(t.name));
    FUZZ_CHECK(f.data_offset() + t.offset + t.size <= size, std::string(t.name));
    const uint8_t* b = t.data - f.data_offset() - t.offset;
    FUZZ_CHECK(base == nullptr || base == b, std::string(t.name));
    base = b;
    std::vector<int64_t> shape = t.shape();
    FUZZ_CHECK(std::vector<int64_t>(shape.rbegin(), shape.rend()) == t.ne, std::string(t.name));
    // Tensors are bounded by the input, so dequantizing all of them is a few floats per byte.
    out.assign(static_cast<size_t>(numel), 0.0f);
    const absl::Status s = t.DequantizeRows(0, t.rows(), out.data());
    FUZZ_CHECK(s.ok(), s);
    FUZZ_CHECK(t.DequantizeRows(t.rows(), 1, out.data()).code() == absl::StatusCode::kOutOfRange,
               std::string(t.name));
    sink = sink + Touch(reinterpret_cast<const char*>(t.data), t.size);
  }
  FUZZ_CHECK(!f.Get("\x01not a tensor").ok(), "");
  return 0;
}
