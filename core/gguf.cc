#include "core/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <iterator>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace {

constexpr size_t kHeaderBytes = 24;  // magic, version, tensor_count, kv_count
// The fewest bytes one kv pair or one tensor info can take: a key of one byte and a one-byte value
// (8 + 1 + 4 + 1); a one-byte name, one dim, a type and an offset (8 + 1 + 4 + 8 + 4 + 8).
constexpr uint64_t kMinKvBytes = 14;
constexpr uint64_t kMinTensorInfoBytes = 33;
constexpr uint64_t kMinArrayBytes = 12;  // element type + count
constexpr std::string_view kAlignmentKey = "general.alignment";

// A name or key for a message: quoted, C-escaped, cut at 200 bytes.
std::string Quote(std::string_view s) {
  const bool cut = s.size() > 200;
  return absl::StrCat("'", absl::CHexEscape(ToAbsl(s.substr(0, 200))), cut ? "...'" : "'");
}

// Bytes of a scalar type; 0 for STRING, ARRAY and unknown numbers.
size_t ScalarWidth(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

bool IsKnown(GgufType t) {
  return static_cast<uint32_t>(t) <= static_cast<uint32_t>(GgufType::kFloat64);
}
bool IsUnsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}
bool IsSigned(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}

std::string TypeString(GgufType t) {
  const std::string_view name = GgufTypeName(t);
  return name.empty() ? absl::StrCat("type ", static_cast<uint32_t>(t)) : std::string(name);
}

int64_t SignExtend(GgufType t, uint64_t bits) {
  switch (t) {
    case GgufType::kInt8:
      return static_cast<int8_t>(bits);
    case GgufType::kInt16:
      return static_cast<int16_t>(bits);
    case GgufType::kInt32:
      return static_cast<int32_t>(bits);
    default:
      return static_cast<int64_t>(bits);
  }
}

uint64_t LoadBits(const char* p, size_t width) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, width);  // little-endian host: the low bytes
  return bits;
}

absl::Status WrongType(std::string_view expected, const GgufValue& v) {
  return absl::InvalidArgumentError(
      absl::StrCat("expected ", ToAbsl(expected), ", found ", v.Describe()));
}

}  // namespace

std::string_view GgufTypeName(GgufType type) {
  static constexpr std::string_view kNames[] = {"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                                "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                                "UINT64", "INT64",   "FLOAT64"};
  const uint32_t i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : std::string_view();
}

// --- GgufValue ------------------------------------------------------------------------------------

std::string GgufValue::Describe() const {
  if (type_ != GgufType::kArray) return TypeString(type_);
  return absl::StrCat("ARRAY[", TypeString(array_type_), "] of ", array_size_, " elements");
}

absl::StatusOr<uint64_t> GgufValue::AsUint() const {
  if (IsUnsigned(type_)) return bits_;
  if (IsSigned(type_)) {
    const int64_t v = SignExtend(type_, bits_);
    if (v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected a non-negative integer, found ", Describe(), " ", v));
    }
    return static_cast<uint64_t>(v);
  }
  return WrongType("an unsigned integer", *this);
}

absl::StatusOr<int64_t> GgufValue::AsInt() const {
  if (IsSigned(type_)) return SignExtend(type_, bits_);
  if (IsUnsigned(type_)) {
    if (bits_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::OutOfRangeError(absl::StrCat("UINT64 value ", bits_, " does not fit in int64"));
    }
    return static_cast<int64_t>(bits_);
  }
  return WrongType("an integer", *this);
}

absl::StatusOr<double> GgufValue::AsFloat() const {
  if (type_ == GgufType::kFloat32)
    return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(bits_)));
  if (type_ == GgufType::kFloat64) return std::bit_cast<double>(bits_);
  return WrongType("FLOAT32 or FLOAT64", *this);
}

absl::StatusOr<bool> GgufValue::AsBool() const {
  if (type_ == GgufType::kBool) return bits_ != 0;
  return WrongType("BOOL", *this);
}

absl::StatusOr<std::string_view> GgufValue::AsString() const {
  if (type_ == GgufType::kString) return bytes_;
  return WrongType("STRING", *this);
}

absl::StatusOr<std::span<const std::string_view>> GgufValue::AsStringArray() const {
  if (type_ == GgufType::kArray && array_type_ == GgufType::kString) {
    return std::span<const std::string_view>(strings_);
  }
  return WrongType("ARRAY[STRING]", *this);
}

absl::StatusOr<std::vector<int64_t>> GgufValue::AsIntArray() const {
  if (type_ != GgufType::kArray || !(IsSigned(array_type_) || IsUnsigned(array_type_))) {
    return WrongType("an ARRAY of integers", *this);
  }
  const size_t w = ScalarWidth(array_type_);
  std::vector<int64_t> out(array_size_);
  for (uint64_t i = 0; i < array_size_; ++i) {
    const uint64_t bits = LoadBits(bytes_.data() + i * w, w);
    if (IsSigned(array_type_)) {
      out[i] = SignExtend(array_type_, bits);
    } else if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::OutOfRangeError(
          absl::StrCat("element ", i, ": UINT64 value ", bits, " does not fit in int64"));
    } else {
      out[i] = static_cast<int64_t>(bits);
    }
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufValue::AsFloatArray() const {
  if (type_ != GgufType::kArray ||
      (array_type_ != GgufType::kFloat32 && array_type_ != GgufType::kFloat64)) {
    return WrongType("an ARRAY of FLOAT32 or FLOAT64", *this);
  }
  const size_t w = ScalarWidth(array_type_);
  std::vector<double> out(array_size_);
  for (uint64_t i = 0; i < array_size_; ++i) {
    const uint64_t bits = LoadBits(bytes_.data() + i * w, w);
    out[i] = w == 4 ? static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(bits)))
                    : std::bit_cast<double>(bits);
  }
  return out;
}

absl::StatusOr<std::span<const GgufValue>> GgufValue::AsArrayArray() const {
  if (type_ == GgufType::kArray && array_type_ == GgufType::kArray)
    return std::span<const GgufValue>(arrays_);
  return WrongType("ARRAY[ARRAY]", *this);
}

absl::StatusOr<GgufValue> GgufValue::Element(uint64_t i) const {
  if (type_ != GgufType::kArray) return WrongType("an ARRAY", *this);
  if (i >= array_size_) {
    return absl::OutOfRangeError(absl::StrCat("element ", i, " of ", Describe()));
  }
  if (array_type_ == GgufType::kArray) return arrays_[i];
  GgufValue v;
  v.type_ = array_type_;
  if (array_type_ == GgufType::kString) {
    v.bytes_ = strings_[i];
  } else {
    const size_t w = ScalarWidth(array_type_);
    v.bits_ = LoadBits(bytes_.data() + i * w, w);
  }
  return v;
}

// --- Parsing --------------------------------------------------------------------------------------

// Reads the image front to back. Every read checks the bytes left first; every count is checked
// against the bytes left before anything is reserved for it.
class GgufParser {
 public:
  GgufParser(const uint8_t* base, size_t size, const std::string& where)
      : base_(reinterpret_cast<const char*>(base)), size_(size), where_(where) {}

  size_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  // DataLoss: the file ends inside `what`.
  absl::Status Need(uint64_t n, std::string_view item, std::string_view what) const {
    if (n <= left()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(
        where_, ": ", ToAbsl(item), ToAbsl(item.empty() ? "" : ": "), ToAbsl(what), " needs ", n,
        " bytes at offset ", pos_, " but only ", left(), " remain (truncated file?)"));
  }
  absl::Status Bad(std::string_view item, std::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(
        where_, ": ", ToAbsl(item), ToAbsl(item.empty() ? "" : ": "), ToAbsl(problem)));
  }

  absl::StatusOr<uint64_t> Scalar(size_t width, std::string_view item, std::string_view what) {
    FEDLORA_RETURN_IF_ERROR(Need(width, item, what));
    const uint64_t bits = LoadBits(base_ + pos_, width);
    pos_ += width;
    return bits;
  }
  absl::StatusOr<uint32_t> U32(std::string_view item, std::string_view what) {
    FEDLORA_ASSIGN_OR_RETURN(uint64_t v, Scalar(4, item, what));
    return static_cast<uint32_t>(v);
  }
  absl::StatusOr<uint64_t> U64(std::string_view item, std::string_view what) {
    return Scalar(8, item, what);
  }

  // A string; lengths above max_len are refused before the bytes are looked at.
  absl::StatusOr<std::string_view> String(std::string_view item, std::string_view what,
                                          uint64_t max_len) {
    FEDLORA_ASSIGN_OR_RETURN(uint64_t len, U64(item, absl::StrCat(ToAbsl(what), " length")));
    if (len > max_len) {
      return Bad(item, absl::StrCat(ToAbsl(what), " length ", len, " exceeds the limit of ",
                                    max_len, " bytes"));
    }
    FEDLORA_RETURN_IF_ERROR(Need(len, item, absl::StrCat(ToAbsl(what), " of ", len, " bytes")));
    std::string_view s(base_ + pos_, len);
    pos_ += len;
    return s;
  }

  // A value of type `type` (already read) into *v; `depth` arrays enclose it.
  absl::Status Value(GgufType type, int depth, std::string_view item, GgufValue* v) {
    v->type_ = type;
    if (const size_t w = ScalarWidth(type); w > 0) {
      FEDLORA_ASSIGN_OR_RETURN(v->bits_,
                               Scalar(w, item, absl::StrCat(ToAbsl(GgufTypeName(type)), " value")));
      if (type == GgufType::kBool && v->bits_ > 1) {
        return Bad(item, absl::StrCat("BOOL value is ", v->bits_, ", not 0 or 1"));
      }
      return absl::OkStatus();
    }
    if (type == GgufType::kString) {
      FEDLORA_ASSIGN_OR_RETURN(v->bytes_,
                               String(item, "string", std::numeric_limits<uint64_t>::max()));
      return absl::OkStatus();
    }
    if (type != GgufType::kArray)
      return Bad(item, absl::StrCat("unknown value type ", static_cast<uint32_t>(type)));
    if (depth + 1 > kGgufMaxArrayDepth) {
      return Bad(item, absl::StrCat("arrays nested more than ", kGgufMaxArrayDepth, " deep"));
    }
    FEDLORA_ASSIGN_OR_RETURN(uint32_t et, U32(item, "array element type"));
    const GgufType elem = static_cast<GgufType>(et);
    if (!IsKnown(elem)) return Bad(item, absl::StrCat("unknown array element type ", et));
    FEDLORA_ASSIGN_OR_RETURN(uint64_t count, U64(item, "array count"));
    const size_t w = ScalarWidth(elem);
    const uint64_t min_bytes = w > 0 ? w : elem == GgufType::kString ? 8 : kMinArrayBytes;
    if (count > left() / min_bytes) {
      return Bad(
          item, absl::StrCat("array count ", count, " of ", TypeString(elem), " cannot fit in the ",
                             left(), " bytes left (at least ", min_bytes, " bytes each)"));
    }
    v->array_type_ = elem;
    v->array_size_ = count;
    if (w > 0) {
      v->bytes_ = std::string_view(base_ + pos_, count * w);
      if (elem == GgufType::kBool) {
        for (uint64_t i = 0; i < count; ++i) {
          if (static_cast<uint8_t>(v->bytes_[i]) > 1) {
            return Bad(item, absl::StrCat("BOOL element ", i, " is ",
                                          static_cast<int>(static_cast<uint8_t>(v->bytes_[i])),
                                          ", not 0 or 1"));
          }
        }
      }
      pos_ += count * w;
      return absl::OkStatus();
    }
    if (elem == GgufType::kString) {
      v->strings_.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        FEDLORA_ASSIGN_OR_RETURN(std::string_view s,
                                 String(item, "string", std::numeric_limits<uint64_t>::max()));
        v->strings_.push_back(s);
      }
      return absl::OkStatus();
    }
    nested_arrays_ += count;  // count < file size, so this cannot wrap
    if (nested_arrays_ > kGgufMaxNestedArrays) {
      return Bad(item, absl::StrCat("more than ", kGgufMaxNestedArrays,
                                    " arrays inside arrays in the file"));
    }
    v->arrays_.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      FEDLORA_RETURN_IF_ERROR(Value(GgufType::kArray, depth + 1, item, &v->arrays_[i]));
    }
    return absl::OkStatus();
  }

  absl::Status ParseAll(GgufFile* f);

 private:
  absl::Status ParseTensorInfo(GgufFile* f, uint64_t index);

  const char* base_;
  size_t size_;
  const std::string& where_;
  size_t pos_ = 0;
  uint64_t nested_arrays_ = 0;
};

absl::Status GgufParser::ParseAll(GgufFile* f) {
  if (size_ < 4) {
    return absl::DataLossError(absl::StrCat(where_, ": file is ", size_,
                                            " bytes, shorter than the ", kHeaderBytes,
                                            "-byte GGUF header"));
  }
  if (std::memcmp(base_, "GGUF", 4) != 0) {
    return Bad(
        "", absl::StrCat("not a GGUF file: magic is \"",
                         absl::CHexEscape(absl::string_view(base_, 4)), "\", expected \"GGUF\""));
  }
  if (size_ < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(where_, ": file is ", size_,
                                            " bytes, shorter than the ", kHeaderBytes,
                                            "-byte GGUF header"));
  }
  pos_ = 4;
  FEDLORA_ASSIGN_OR_RETURN(f->version_, U32("", "version"));
  const uint32_t version = f->version_;
  if (version == 1) {
    return Bad(
        "",
        "GGUF version 1 is not supported (it has 32-bit counts and lengths); convert the model "
        "again with a current llama.cpp");
  }
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    if (swapped >= 1 && swapped <= 3) {
      return Bad("", absl::StrCat("big-endian GGUF (version ", swapped, ") is not supported"));
    }
    return Bad("", absl::StrCat("unsupported GGUF version ", version,
                                " (fedlora reads versions 2 and 3)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(uint64_t tensor_count, U64("", "tensor_count"));
  FEDLORA_ASSIGN_OR_RETURN(uint64_t kv_count, U64("", "kv_count"));
  if (kv_count > left() / kMinKvBytes) {
    return Bad("", absl::StrCat("kv_count ", kv_count, " cannot fit in the ", left(),
                                " bytes after the header (each kv pair takes at least ",
                                kMinKvBytes, ")"));
  }
  if (tensor_count > left() / kMinTensorInfoBytes) {
    return Bad("", absl::StrCat("tensor_count ", tensor_count, " cannot fit in the ", left(),
                                " bytes after the header (each tensor info takes at least ",
                                kMinTensorInfoBytes, ")"));
  }

  f->keys_.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string kv_item = absl::StrCat("kv pair ", i);
    FEDLORA_ASSIGN_OR_RETURN(std::string_view key, String(kv_item, "key", kGgufMaxNameBytes));
    if (key.empty()) return Bad(kv_item, "empty key");
    const std::string item = absl::StrCat("key ", Quote(key));
    if (f->metadata_.count(key) != 0) return Bad(item, "duplicate key");
    FEDLORA_ASSIGN_OR_RETURN(uint32_t type, U32(item, "value type"));
    GgufValue v;
    FEDLORA_RETURN_IF_ERROR(Value(static_cast<GgufType>(type), 0, item, &v));
    f->metadata_.emplace(key, std::move(v));
    f->keys_.push_back(key);
  }

  if (auto it = f->metadata_.find(kAlignmentKey); it != f->metadata_.end()) {
    const GgufValue& a = it->second;
    const std::string item = absl::StrCat("key ", Quote(kAlignmentKey));
    if (a.type() != GgufType::kUint32)
      return Bad(item, absl::StrCat("must be UINT32, found ", a.Describe()));
    const uint64_t v = *a.AsUint();
    if (v == 0 || !std::has_single_bit(v) || v > kGgufMaxAlignment) {
      return Bad(item, absl::StrCat("alignment ", v, " must be a power of two from 1 to ",
                                    kGgufMaxAlignment));
    }
    f->alignment_ = static_cast<uint32_t>(v);
  }

  if (tensor_count > left() / kMinTensorInfoBytes) {
    return Bad("", absl::StrCat("tensor_count ", tensor_count, " cannot fit in the ", left(),
                                " bytes after the metadata (each tensor info takes at least ",
                                kMinTensorInfoBytes, ")"));
  }
  f->tensors_.reserve(tensor_count);
  f->names_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) FEDLORA_RETURN_IF_ERROR(ParseTensorInfo(f, i));

  // The data section starts at the next multiple of the alignment.
  const uint64_t align = f->alignment_;
  const uint64_t data_offset = (static_cast<uint64_t>(pos_) + align - 1) / align * align;
  if (data_offset > size_ && !f->tensors_.empty()) {
    return absl::DataLossError(absl::StrCat(where_, ": the data section would start at offset ",
                                            data_offset, ", past the end of the ", size_,
                                            "-byte file (truncated file?)"));
  }
  f->data_offset_ = std::min<uint64_t>(data_offset, size_);
  const uint64_t data_size = size_ - f->data_offset_;
  const uint8_t* data = reinterpret_cast<const uint8_t*>(base_) + f->data_offset_;
  for (GgufTensor& t : f->tensors_) {
    if (t.offset > data_size || t.size > data_size - t.offset) {
      return absl::DataLossError(absl::StrCat(
          where_, ": tensor ", Quote(t.name), ": data [", t.offset, ", +", t.size,
          ") runs past the end of the ", data_size, "-byte data section (truncated file?)"));
    }
    t.data = data + t.offset;
  }
  // No two tensors may share bytes (holes, e.g. alignment padding, are fine).
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(f->tensors_.size());
  for (const GgufTensor& t : f->tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor* prev = by_offset[i - 1];
    const GgufTensor* cur = by_offset[i];
    if (cur->offset < prev->offset + prev->size) {
      return Bad(absl::StrCat("tensor ", Quote(cur->name)),
                 absl::StrCat("data [", cur->offset, ", +", cur->size, ") overlaps tensor ",
                              Quote(prev->name), " at [", prev->offset, ", +", prev->size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status GgufParser::ParseTensorInfo(GgufFile* f, uint64_t index) {
  const std::string ti_item = absl::StrCat("tensor info ", index);
  FEDLORA_ASSIGN_OR_RETURN(std::string_view name,
                           String(ti_item, "tensor name", kGgufMaxNameBytes));
  if (name.empty()) return Bad(ti_item, "empty tensor name");
  const std::string item = absl::StrCat("tensor ", Quote(name));
  if (f->tensor_index_.count(name) != 0) return Bad(item, "duplicate tensor name");
  FEDLORA_ASSIGN_OR_RETURN(uint32_t n_dims, U32(item, "n_dims"));
  if (n_dims < 1 || n_dims > static_cast<uint32_t>(kGgufMaxDims)) {
    return Bad(item, absl::StrCat("n_dims is ", n_dims, ", must be 1 to ", kGgufMaxDims));
  }
  GgufTensor t;
  t.name = name;
  t.ne.reserve(n_dims);
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    FEDLORA_ASSIGN_OR_RETURN(uint64_t ne, U64(item, "dimension"));
    if (ne == 0)
      return Bad(item, absl::StrCat("ne[", d, "] is 0 (every dimension must be at least 1)"));
    if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, static_cast<int64_t>(ne), &numel)) {
      return Bad(item, absl::StrCat("element count overflows int64 at ne[", d, "] = ", ne));
    }
    t.ne.push_back(static_cast<int64_t>(ne));
  }
  FEDLORA_ASSIGN_OR_RETURN(uint32_t type, U32(item, "ggml type"));
  FEDLORA_ASSIGN_OR_RETURN(t.offset, U64(item, "offset"));
  t.type = static_cast<GgmlType>(type);
  const std::string_view type_name = GgmlTypeName(t.type);
  if (type_name.empty()) {
    return Bad(item, absl::StrCat("unknown ggml type ", type,
                                  "; supported types: ", ToAbsl(SupportedGgmlTypeNames())));
  }
  if (!GgmlTypeSupported(t.type)) {
    return absl::UnimplementedError(
        absl::StrCat(where_, ": ", item, ": ggml type ", ToAbsl(type_name), " (", type,
                     ") is not supported; supported types: ", ToAbsl(SupportedGgmlTypeNames())));
  }
  const int64_t block = GgmlBlockSize(t.type);
  if (t.ne[0] % block != 0) {
    return Bad(item, absl::StrCat("ne[0] = ", t.ne[0], " is not a multiple of the ",
                                  ToAbsl(type_name), " block size ", block));
  }
  int64_t bytes;
  if (__builtin_mul_overflow(numel / block, GgmlBlockBytes(t.type), &bytes)) {
    return Bad(item, absl::StrCat("byte size of ", numel, " ", ToAbsl(type_name),
                                  " elements overflows int64"));
  }
  t.size = static_cast<size_t>(bytes);
  if (t.offset % f->alignment_ != 0) {
    return Bad(item, absl::StrCat("offset ", t.offset, " is not a multiple of the alignment ",
                                  f->alignment_));
  }
  f->tensor_index_.emplace(name, f->tensors_.size());
  f->names_.push_back(name);
  f->tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

// --- GgufTensor -----------------------------------------------------------------------------------

std::vector<int64_t> GgufTensor::shape() const {
  return std::vector<int64_t>(ne.rbegin(), ne.rend());
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // validated at Open: cannot overflow
  return n;
}

int64_t GgufTensor::rows() const { return ne.empty() ? 0 : numel() / ne[0]; }

int64_t GgufTensor::row_bytes() const {
  const int64_t block = GgmlBlockSize(type);
  return ne.empty() || block == 0 ? 0 : ne[0] / block * GgmlBlockBytes(type);
}

absl::Status GgufTensor::DequantizeRows(int64_t first, int64_t count, float* dst) const {
  const int64_t n_rows = rows();
  if (first < 0 || count < 0 || first > n_rows || count > n_rows - first) {
    return absl::OutOfRangeError(absl::StrCat("tensor ", Quote(name), ": rows [", first, ", +",
                                              count, ") are not within its ", n_rows, " rows"));
  }
  if (count == 0) return absl::OkStatus();
  if (data == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("tensor ", Quote(name), " has no data"));
  return fedlora::DequantizeRows(type, data + first * row_bytes(), count, row_elements(), dst,
                                 row_elements());
}

// --- GgufFile -------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  FEDLORA_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->mapped_ = std::move(mapped);
  file->base_ = file->mapped_.data();
  file->size_ = file->mapped_.size();
  FEDLORA_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string bytes,
                                                              std::string_view what) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = std::string(what);
  file->owned_ = std::move(bytes);
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  file->size_ = file->owned_.size();
  FEDLORA_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::Status GgufFile::Parse() {
  GgufParser parser(base_, size_, path_);
  return parser.ParseAll(this);
}

bool GgufFile::Has(std::string_view key) const { return metadata_.find(key) != metadata_.end(); }

absl::StatusOr<const GgufValue*> GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end())
    return absl::NotFoundError(absl::StrCat(path_, ": no metadata key ", Quote(key)));
  return &it->second;
}

template <class T>
absl::StatusOr<T> GgufFile::Typed(std::string_view key,
                                  absl::StatusOr<T> (GgufValue::*as)() const) const {
  FEDLORA_ASSIGN_OR_RETURN(const GgufValue* v, Find(key));
  absl::StatusOr<T> r = (v->*as)();
  if (!r.ok()) return Annotate(r.status(), absl::StrCat(path_, ": key ", Quote(key)));
  return r;
}

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  return Typed(key, &GgufValue::AsString);
}
absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  return Typed(key, &GgufValue::AsUint);
}
absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  return Typed(key, &GgufValue::AsInt);
}
absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  return Typed(key, &GgufValue::AsFloat);
}
absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  return Typed(key, &GgufValue::AsBool);
}
absl::StatusOr<std::span<const std::string_view>> GgufFile::GetStringArray(
    std::string_view key) const {
  return Typed(key, &GgufValue::AsStringArray);
}
absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  return Typed(key, &GgufValue::AsIntArray);
}
absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  return Typed(key, &GgufValue::AsFloatArray);
}

bool GgufFile::Contains(std::string_view name) const {
  return tensor_index_.find(name) != tensor_index_.end();
}

absl::StatusOr<GgufTensor> GgufFile::Get(std::string_view name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end())
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named ", Quote(name)));
  return tensors_[it->second];
}

}  // namespace fedlora
