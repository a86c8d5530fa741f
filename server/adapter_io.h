// Conversions the server needs between its in-memory adapter (a list of fp32 UpdateTensors, sorted
// by name) and the safetensors blob it serves (AdapterManifest: "a safetensors file holding exactly
// these tensors"). Thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "compression/update_io.h"
#include "fedlora/v1/common.pb.h"

namespace fedlora {

// Sorts by name (the canonical order of the global adapter) and checks names are unique and every
// tensor's values match its shape. InvalidArgument naming the tensor otherwise.
absl::Status CanonicalizeAdapter(std::vector<UpdateTensor>& adapter);

// AdapterToSafetensors, AdapterFromSafetensors and CodecOptionsFromSpec, shared with the client,
// live in compression/update_io.h.

// The manifest's tensor list for an adapter (dtype "F32").
void FillTensorSpecs(const std::vector<UpdateTensor>& adapter, v1::AdapterManifest* manifest);

}  // namespace fedlora
