#include "config/device_plan.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/did_you_mean.h"
#include "core/status.h"
#include "kernels/base/device.h"

namespace fedlora {

absl::StatusOr<Device> ResolveDevice(const std::string& typed) {
  const std::string text =
      absl::AsciiStrToLower(typed);  // any case, as the run config's enum values
  if (text == "cpu") return Device::kCpu;
  if (text == "auto") return kernels::CudaAvailable() ? Device::kCuda : Device::kCpu;
  if (text == "cuda") {
    FEDLORA_RETURN_IF_ERROR(kernels::CheckCudaAvailable());
    return Device::kCuda;
  }
  std::string message =
      absl::StrCat("--device: unknown value '", typed, "'; valid: cpu, cuda, auto (any case)");
  if (auto near = NearestName(text, {"cpu", "cuda", "auto"}))
    absl::StrAppend(&message, "; did you mean ", *near, "?");
  return absl::InvalidArgumentError(message);
}

std::string CpuOnlyWork(bool int8_math) { return int8_math ? "int8 math" : ""; }

std::string CpuOnlyWork(const v1::RunConfig& config) {
  return CpuOnlyWork(config.model().precision() == v1::ModelConfig::INT8);
}

absl::StatusOr<Device> DeviceForRun(const std::string& flag, Device resolved,
                                    const std::string& cpu_only) {
  if (resolved == Device::kCpu || cpu_only.empty()) return resolved;
  if (absl::EqualsIgnoreCase(flag, "auto")) return Device::kCpu;
  return absl::UnimplementedError(absl::StrCat(
      "--device cuda: ", cpu_only, " runs on the CPU only so far; use --device cpu or auto"));
}

absl::StatusOr<DevicePlan> PlanDevices(const std::string& flag, Device resolved, RunRole role,
                                       const v1::RunConfig& config) {
  DevicePlan plan;
  FEDLORA_ASSIGN_OR_RETURN(plan.models, DeviceForRun(flag, resolved, CpuOnlyWork(config)));
  plan.updates = role == RunRole::kSimulator ? plan.models : resolved;
  return plan;
}

absl::StatusOr<DevicePlan> PlanDevices(const std::string& flag, RunRole role,
                                       const v1::RunConfig& config) {
  FEDLORA_ASSIGN_OR_RETURN(const Device resolved, ResolveDevice(flag));
  return PlanDevices(flag, resolved, role, config);
}

}  // namespace fedlora
