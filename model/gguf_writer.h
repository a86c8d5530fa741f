// A small GGUF writer (version 3, little-endian, alignment 32): string, uint32 and float32
// metadata and F32 tensors, which is what a LoRA adapter for llama.cpp needs (model/gguf_lora.h).
// core/gguf.h reads what it writes; the layout is described there.
//
//   GgufWriter w;
//   w.AddString("general.architecture", "llama");
//   w.AddFloat32("adapter.lora.alpha", 16.0f);
//   FEDLORA_RETURN_IF_ERROR(w.AddTensorF32("blk.0.attn_q.weight.lora_a", {8, 576}, values));
//   FEDLORA_RETURN_IF_ERROR(w.WriteFile("adapter.gguf"));
//
// Metadata keys and tensors keep the order they were added in. Shapes are given outermost first,
// as PyTorch writes them, and stored in ggml's order (innermost first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora {

// ggml's GGML_MAX_NAME: a tensor name is at most 63 bytes there.
inline constexpr size_t kGgufMaxTensorName = 63;

class GgufWriter {
 public:
  // InvalidArgument for an empty or repeated key (checked when the image is built).
  void AddString(const std::string& key, const std::string& value);
  void AddUint32(const std::string& key, uint32_t value);
  void AddFloat32(const std::string& key, float value);

  // InvalidArgument, naming the tensor, for an empty, repeated or over-long name, 1 to 4
  // dimensions not all >= 1, or a value count other than the shape's.
  absl::Status AddTensorF32(const std::string& name, std::vector<int64_t> shape,
                            std::vector<float> values);

  // The whole file image.
  absl::StatusOr<std::string> Serialize() const;
  // Serialize + WriteFileAtomically (core/file.h).
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  std::vector<std::pair<std::string, std::string>> kvs_;  // key -> value type u32 + value bytes
  std::vector<Tensor> tensors_;
};

}  // namespace fedlora
