// An update matched to the run's adapter: the decoding limits the adapter implies, the name and
// shape check, and both together for an opened update body. Shared by upload validation
// (coordinator_uploads.cc) and aggregation (round_aggregator.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "aggregation/fedavg.h"
#include "compression/codec.h"
#include "config/federated_tensors.h"
#include "core/status.h"

namespace fedlora {

inline std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i ? "," : "", shape[i]);
  return out + "]";
}

// Decoding limits from the adapter itself: a valid update has exactly the adapter's elements, so
// anything that declares more is refused before a byte is allocated (decompression bombs).
inline DecodeLimits LimitsForSpec(const std::vector<TensorSpec>& spec, int64_t elements) {
  DecodeLimits limits;
  // The body's u32 tensor count, then per tensor: u16 name length, name, u8 rank, dims.
  int64_t table_bytes = 4;
  for (const TensorSpec& t : spec) {
    table_bytes +=
        2 + static_cast<int64_t>(t.name.size()) + 1 + 8 * static_cast<int64_t>(t.shape.size());
  }
  limits.max_tensors = static_cast<int64_t>(spec.size());
  limits.max_elements = elements;
  limits.max_decoded_bytes = table_bytes + elements * 4;
  return limits;
}

// Whether `spec` (sorted by name) has a tensor `name`.
inline bool InSpec(const std::vector<TensorSpec>& spec, std::string_view name) {
  const auto it =
      std::lower_bound(spec.begin(), spec.end(), name,
                       [](const TensorSpec& t, std::string_view n) { return t.name < n; });
  return it != spec.end() && it->name == name;
}

// InvalidArgument for `what` (e.g. "update tensor") `name`, which the spec lacks.
inline absl::Status NotInSpec(std::string_view what, std::string_view name) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(what), " '", std::string(name.substr(0, 200)),
                   "' is not one of the tensors this run aggregates",
                   IsLoraA(name) ? " (with lora.freeze_a no lora_A is uploaded: each stays at the "
                                   "initial adapter's values)"
                                 : ""));
}

// Same names and shapes as the adapter's federated tensors, whose spec is sorted by name (the
// update's order is free; `tensors` is sorted here). T is KeptTensor, UpdateTensor or
// UpdateTensorInfo.
template <class T>
absl::Status MatchSpec(std::vector<T>& tensors, const std::vector<TensorSpec>& spec) {
  for (const T& t : tensors) {
    if (!InSpec(spec, t.name)) return NotInSpec("update tensor", t.name);
  }
  if (tensors.size() != spec.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("update has ", tensors.size(), " tensors; the adapter has ", spec.size()));
  }
  std::sort(tensors.begin(), tensors.end(), [](const T& a, const T& b) { return a.name < b.name; });
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name != spec[i].name) {
      return absl::InvalidArgumentError(absl::StrCat("update tensor '", tensors[i].name,
                                                     "' is not in the adapter (expected '",
                                                     spec[i].name, "')"));
    }
    if (tensors[i].shape != spec[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "update tensor '", tensors[i].name, "' has shape ", ShapeText(tensors[i].shape),
          "; the adapter's is ", ShapeText(spec[i].shape)));
    }
  }
  return absl::OkStatus();
}

// An opened update body, decoded (a sparsified one as its kept entries) and matched to the adapter
// (`spec` sorted by name, `elements` its element count).
inline absl::StatusOr<std::vector<KeptTensor>> DecodeAndValidate(
    std::string_view bytes, const std::vector<TensorSpec>& spec, int64_t elements) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<KeptTensor> update,
                           DecodeUpdateKept(bytes, LimitsForSpec(spec, elements)));
  FEDLORA_RETURN_IF_ERROR(MatchSpec(update, spec));  // DecodeUpdateKept already refused NaN/Inf
  return update;
}

}  // namespace fedlora
