// Conversions shared by the server and the client SDK between the codec module's types and the
// formats they travel in: a CodecSpec (the wire's codec request) and a safetensors image of an fp32
// adapter. Thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "core/safetensors.h"
#include "fedlora/v1/common.pb.h"

namespace fedlora {

// The CodecOptions a CodecSpec stands for (seed unset: the client derives it from its task). Every
// stage is implemented; a misplaced ZSTD, quantization parameters or a rank out of range give
// InvalidArgument, an unknown stage id Unimplemented. Error feedback is on when any stage asks for
// it (config_io fills each stage's default) and always with LOWRANK.
absl::StatusOr<CodecOptions> CodecOptionsFromSpec(const v1::CodecSpec& spec);

// Parses a safetensors image whose tensors are all F32, in the file's (sorted) name order.
// InvalidArgument/DataLoss as SafetensorsFile; InvalidArgument for another dtype.
absl::StatusOr<std::vector<UpdateTensor>> AdapterFromSafetensors(const std::string& bytes);
// The same for an opened file; `what` names it in errors.
absl::StatusOr<std::vector<UpdateTensor>> AdapterFromSafetensors(const SafetensorsFile& file,
                                                                 std::string_view what);

// The safetensors image of `adapter` (all F32, in the given order). Deterministic: the same tensors
// give the same bytes, hence the same blob hash, on the server and on every client.
absl::StatusOr<std::string> AdapterToSafetensors(const std::vector<UpdateTensor>& adapter);

}  // namespace fedlora
