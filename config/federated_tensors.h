// Which tensors of a run's adapter are federated: trained by the clients, uploaded, masked by
// secure aggregation, clipped and noised by DP, aggregated and stepped by the server. All of them,
// except under lora.freeze_a (FFA-LoRA), where every lora_A keeps the initial adapter's values on
// every site and on the server: it is downloaded with the adapter but never trained or uploaded.
// One rule for both ends: the server's update spec and the client's check of its trainer's delta.
//
//   spec_ = FederatedTensors(SpecFromUpdate(global), config);  // what each update must match
//   FEDLORA_RETURN_IF_ERROR(CheckFederated(delta, config));   // a client, before it uploads
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fedlora/v1/config.pb.h"

namespace fedlora {

// A LoRA A matrix: a name with the dot-separated component "lora_A" (PEFT's
// "base_model.model....query.lora_A.weight").
inline bool IsLoraA(std::string_view name) {
  constexpr std::string_view kPart = "lora_A";
  for (size_t at = name.find(kPart); at != std::string_view::npos; at = name.find(kPart, at + 1)) {
    const size_t end = at + kPart.size();
    if ((at == 0 || name[at - 1] == '.') && (end == name.size() || name[end] == '.')) return true;
  }
  return false;
}

// Whether the run federates adapter tensor `name`.
inline bool IsFederated(std::string_view name, const v1::RunConfig& config) {
  return !(config.lora().freeze_a() && IsLoraA(name));
}

// The tensors of `adapter` the run federates, in their order. T has a `name`: TensorSpec,
// UpdateTensor, NamedTensor.
template <class T>
std::vector<T> FederatedTensors(std::vector<T> adapter, const v1::RunConfig& config) {
  std::erase_if(adapter, [&config](const T& t) { return !IsFederated(t.name, config); });
  return adapter;
}

// Why tensor `name` is not federated, for error messages: empty when it is.
inline std::string NotFederatedReason(std::string_view name, const v1::RunConfig& config) {
  if (IsFederated(name, config)) return "";
  return "lora.freeze_a keeps every lora_A at the initial adapter's values: it is neither trained "
         "nor uploaded";
}

// InvalidArgument naming the first tensor of `update` the run does not federate; OK otherwise.
template <class T>
absl::Status CheckFederated(const std::vector<T>& update, const v1::RunConfig& config) {
  for (const T& t : update) {
    if (!IsFederated(t.name, config)) {
      return absl::InvalidArgumentError(absl::StrCat("update tensor '", t.name.substr(0, 200),
                                                     "' is not federated in this run (",
                                                     NotFederatedReason(t.name, config), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace fedlora
