// The safetensors format (Hugging Face): read through mmap, validated as hostile input; write
// atomically.
//
//   Layout: 8-byte little-endian header length N | N bytes of JSON | data section.
//   The JSON maps each tensor name to {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}
//   (offsets in bytes, relative to the data section) plus an optional "__metadata__" object of
//   string -> string. The tensors must tile the data section exactly: no holes, no overlap.
//
//   FEDLORA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open("model.safetensors"));
//   FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, file->Get("encoder.layer.0.attention.self.query.weight"));
//   // t.data points into the mapping; it lives as long as `file`.
//
//   FEDLORA_RETURN_IF_ERROR(WriteSafetensors("adapter.safetensors",
//       {{"lora_A", DType::kF32, {8, 384}, a.data(), a.size() * sizeof(float)}}, {{"format", "pt"}}));
//
// Errors: I/O as core/file.h; DataLoss when the file is shorter than its header says (truncated
// download or write); InvalidArgument for every malformed header, naming the tensor and problem.
// A SafetensorsFile is immutable after Open and safe to share between threads. The file must not
// be truncated by another process while open (the mapping would fault, as with any mmap reader).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mapped_file.h"
#include "core/tensor.h"

namespace fedlora {

// Largest accepted JSON header, in bytes. The reference implementation (safetensors'
// MAX_HEADER_SIZE) uses 100,000,000; we use 100 MiB. Real headers are a few hundred bytes per
// tensor (a 7B LLaMA checkpoint: ~300 tensors, ~40 KB), so this only stops a hostile length field
// from making us copy and parse gigabytes.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Into the read-only mapping. Files written by WriteSafetensors align each tensor to its element
  // size; other writers may not, so use memcpy (or check alignment) before typed access.
  const uint8_t* data = nullptr;
  size_t size = 0;  // bytes; always numel * DTypeSize(dtype)

  int64_t numel() const;
  // A read-only CPU view of the tensor (the data is unaligned only if the writer made it so).
  absl::StatusOr<TensorView> view() const;
  // The values as fp32 into out[0, numel()): F32 copied, F16 and BF16 widened; InvalidArgument
  // naming the tensor for any other dtype.
  absl::Status CopyToF32(float* out) const;
  absl::StatusOr<std::vector<float>> ToF32() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Validates an in-memory image (same checks as Open). The bytes are copied.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes,
                                                                    std::string_view what);
  ~SafetensorsFile() = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Tensor names in byte order (sorted).
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(std::string_view name) const;
  // NotFound naming the tensor and the file when absent.
  absl::StatusOr<SafetensorsTensor> Get(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin;  // offset into the data section, bytes
    uint64_t end;
  };
  SafetensorsFile() = default;
  // Parses and validates the image at base_[0, size_).
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  MappedFile mapped_;  // base_ points into mapped_ (Open) or owned_ (FromBytes)
  std::string owned_;
  const uint8_t* data_section_ = nullptr;
  std::map<std::string, Entry, std::less<>> entries_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsTensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * DTypeSize(dtype) bytes; not owned
  size_t size = 0;             // bytes
};

// Builds the file image. InvalidArgument for an empty or duplicate name, the reserved name
// "__metadata__", a bad shape, or size != numel * dtype size. Tensors are laid out by element
// size (largest first), then name, so that each starts at a multiple of its element size (the
// header is padded with spaces to a multiple of 8, as the reference writer does).
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<SafetensorsTensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata);
// SerializeSafetensors + WriteFileAtomically. Holds the whole image in memory once.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace fedlora
