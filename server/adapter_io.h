// Conversions the server needs between its in-memory adapter (a list of fp32 UpdateTensors, sorted
// by name), the safetensors blob it serves (AdapterManifest: "a safetensors file holding exactly
// these tensors"), and the codec options a CodecSpec asks for. Thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "fedlora/v1/common.pb.h"

namespace fedlora {

// Sorts by name (the canonical order of the global adapter) and checks names are unique and every
// tensor's values match its shape. InvalidArgument naming the tensor otherwise.
absl::Status CanonicalizeAdapter(std::vector<UpdateTensor>& adapter);

// The safetensors image of `adapter` (all F32). Deterministic: the same tensors give the same bytes,
// hence the same blob hash.
absl::StatusOr<std::string> AdapterToSafetensors(const std::vector<UpdateTensor>& adapter);
// Parses a safetensors image whose tensors are all F32, sorted by name. InvalidArgument/DataLoss as
// SafetensorsFile; InvalidArgument for another dtype.
absl::StatusOr<std::vector<UpdateTensor>> AdapterFromSafetensors(const std::string& bytes);

// The element codec and zstd flag a CodecSpec stands for. The codec module implements NONE, FP16,
// BF16 and a final ZSTD; other stages give Unimplemented, a misplaced ZSTD InvalidArgument.
absl::StatusOr<CodecOptions> CodecOptionsFromSpec(const v1::CodecSpec& spec);

// The manifest's tensor list for an adapter (dtype "F32").
void FillTensorSpecs(const std::vector<UpdateTensor>& adapter, v1::AdapterManifest* manifest);

}  // namespace fedlora
