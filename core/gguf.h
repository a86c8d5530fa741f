// GGUF files (llama.cpp's model format, versions 2 and 3): read through mmap, validated as
// hostile input.
//
//   Layout (little-endian): "GGUF" | version u32 | tensor_count u64 | kv_count u64 |
//   kv_count x (key: string, value type u32, value) | tensor_count x (name: string, n_dims u32,
//   ne u64 x n_dims innermost first, ggml type u32, offset u64) | padding to general.alignment |
//   data section. A string is a u64 length and that many bytes; an array is an element type u32,
//   a count u64 and the elements.
//
//   FEDLORA_ASSIGN_OR_RETURN(auto file, GgufFile::Open("SmolLM2-135M-Instruct.Q4_1.gguf"));
//   FEDLORA_ASSIGN_OR_RETURN(uint64_t layers, file->GetUint("llama.block_count"));
//   FEDLORA_ASSIGN_OR_RETURN(auto tokens, file->GetStringArray("tokenizer.ggml.tokens"));  // views
//   FEDLORA_ASSIGN_OR_RETURN(GgufTensor t, file->Get("blk.0.ffn_up.weight"));
//   // t.ne = {576, 1536}: 1536 rows of 576; t.shape() = {1536, 576}; t.data points into the file.
//   std::vector<float> rows(4 * t.ne[0]);
//   FEDLORA_RETURN_IF_ERROR(t.DequantizeRows(0, 4, rows.data()));
//
// Errors, each naming the file and the key or tensor: I/O as core/file.h; InvalidArgument for a
// malformed header (bad magic, a count or length that cannot fit in the bytes left, duplicates,
// bad dims, types, alignment or offsets, overlapping tensors); DataLoss when a field or a tensor's
// data runs past the end of the file (truncated download or copy); Unimplemented for a tensor of
// a ggml type fedlora cannot dequantize (core/ggml_quant.h lists the supported ones). The reader's
// bookkeeping is bounded by about 13 bytes per header byte. Strings are bytes as stored (GGUF
// says UTF-8; this reader does not check). Big-endian GGUF files are refused.
//
// A GgufFile is immutable after Open and safe to share between threads. Every string_view and
// pointer it hands out points into the file's bytes and lives as long as the GgufFile. The file
// must not be truncated by another process while open (the mapping would fault).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ggml_quant.h"
#include "core/mapped_file.h"

namespace fedlora {

// Limits on what a header may claim (beyond "fits in the file").
inline constexpr uint64_t kGgufMaxNameBytes = 4096;  // a key or a tensor name (ggml itself: 63)
inline constexpr int kGgufMaxArrayDepth = 4;         // an array nested in arrays, this deep at most
inline constexpr uint64_t kGgufMaxNestedArrays = 1u << 16;  // arrays inside arrays, whole file
inline constexpr uint32_t kGgufMaxAlignment = 1u << 20;     // general.alignment (the default is 32)
inline constexpr int kGgufMaxDims = 4;                      // ggml's GGML_MAX_DIMS

// The metadata value types; the numbers are the file's (gguf_type).
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
// "UINT32", "ARRAY", ... ("" for a number that is not a type).
std::string_view GgufTypeName(GgufType type);

// One metadata value. The As* accessors return InvalidArgument naming the expected and the actual
// type (GgufFile's getters add the key and the file).
class GgufValue {
 public:
  GgufType type() const { return type_; }
  // "UINT32", "STRING", "ARRAY[INT32] of 49152 elements".
  std::string Describe() const;

  // Any unsigned integer type, or a signed one holding a non-negative value (not BOOL).
  absl::StatusOr<uint64_t> AsUint() const;
  // Any integer type; OutOfRange for a UINT64 above INT64_MAX.
  absl::StatusOr<int64_t> AsInt() const;
  // FLOAT32 (exactly widened) or FLOAT64.
  absl::StatusOr<double> AsFloat() const;
  absl::StatusOr<bool> AsBool() const;
  absl::StatusOr<std::string_view> AsString() const;

  // Arrays: element type and count (both 0 for a non-array).
  GgufType array_type() const { return array_type_; }
  uint64_t array_size() const { return array_size_; }
  // ARRAY of STRING, without copying the strings.
  absl::StatusOr<std::span<const std::string_view>> AsStringArray() const;
  // ARRAY of any integer type (the AsInt rule per element).
  absl::StatusOr<std::vector<int64_t>> AsIntArray() const;
  // ARRAY of FLOAT32 or FLOAT64.
  absl::StatusOr<std::vector<double>> AsFloatArray() const;
  // ARRAY of ARRAY: the inner arrays.
  absl::StatusOr<std::span<const GgufValue>> AsArrayArray() const;
  // Element i of an array as a value of the element type. OutOfRange past the end.
  absl::StatusOr<GgufValue> Element(uint64_t i) const;

 private:
  friend class GgufParser;
  GgufType type_ = GgufType::kUint8;
  uint64_t bits_ = 0;       // a scalar's little-endian bytes, zero-extended
  std::string_view bytes_;  // STRING: the bytes; ARRAY of scalars: the packed elements
  GgufType array_type_ = GgufType::kUint8;
  uint64_t array_size_ = 0;
  std::vector<std::string_view> strings_;  // ARRAY of STRING
  std::vector<GgufValue> arrays_;          // ARRAY of ARRAY
};

struct GgufTensor {
  std::string_view name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;  // ggml's order: innermost (contiguous) dimension first, 1 to 4 of them
  uint64_t offset = 0;      // into the data section (a multiple of the alignment)
  const uint8_t* data = nullptr;  // into the file; no alignment beyond the file's is promised
  size_t size = 0;                // bytes: rows() * row_bytes()

  // Outermost first, as PyTorch and safetensors write shapes: ne reversed.
  std::vector<int64_t> shape() const;
  int64_t numel() const;
  int64_t row_elements() const { return ne.empty() ? 0 : ne[0]; }
  int64_t rows() const;       // numel() / ne[0]
  int64_t row_bytes() const;  // bytes of one row of ne[0] elements
  // Rows [first, first + count) as fp32 into dst (count * ne[0] floats). OutOfRange when the
  // range is not within [0, rows()).
  absl::Status DequantizeRows(int64_t first, int64_t count, float* dst) const;
};

class GgufFile {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Validates an in-memory image (same checks as Open). The bytes are kept by the GgufFile.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string bytes,
                                                             std::string_view what);
  ~GgufFile() = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section

  // Metadata keys in file order.
  const std::vector<std::string_view>& keys() const { return keys_; }
  bool Has(std::string_view key) const;
  // NotFound naming the key and the file.
  absl::StatusOr<const GgufValue*> Find(std::string_view key) const;
  // NotFound when absent; else GgufValue's As* with the key and the file in the message.
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::span<const std::string_view>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;

  // Tensors in file order (the tensor-info order, not necessarily the data order).
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const std::vector<std::string_view>& names() const { return names_; }
  bool Contains(std::string_view name) const;
  // NotFound naming the tensor and the file.
  absl::StatusOr<GgufTensor> Get(std::string_view name) const;

 private:
  friend class GgufParser;
  GgufFile() = default;
  absl::Status Parse();
  template <class T>
  absl::StatusOr<T> Typed(std::string_view key, absl::StatusOr<T> (GgufValue::*as)() const) const;

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  MappedFile mapped_;  // base_ points into mapped_ (Open) or owned_ (FromBytes)
  std::string owned_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::string_view> keys_;
  std::map<std::string_view, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensor> tensors_;
  std::vector<std::string_view> names_;
  std::map<std::string_view, size_t, std::less<>> tensor_index_;
};

}  // namespace fedlora
