// Where each role of a run computes, from --device and the run config: one rule for the server,
// the client and the simulator, which each applied --device their own way before.
//
//   FEDLORA_ASSIGN_OR_RETURN(DevicePlan plan, PlanDevices(flags.device, RunRole::kServer, config));
//   model_options.device = plan.models;             // the held-out evaluator
//   server_options.aggregation_device = plan.updates;  // the sums
//
// --device is "cpu", "cuda" or "auto" (the GPU when one is usable, else the CPU), in any case.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "fedlora/v1/config.pb.h"

namespace fedlora {

enum class RunRole {
  kServer,     // fedlora server: a held-out evaluator, and the sums of the updates
  kClient,     // fedlora client: the local model, and the encoding of its update
  kSimulator,  // fedlora simulate: every virtual client's model and the server's sums, together
};

struct DevicePlan {
  // Where the role's models train and evaluate: --device's device, unless the run needs work that
  // runs on the CPU only (CpuOnlyWork), where "auto" takes the CPU and "cuda" is refused.
  Device models = Device::kCpu;
  // Where the server sums the updates (exact: the same bits on either device) and a client encodes
  // its update: --device's device for the server and the client, whatever the models need; the
  // models' device for the simulator, whose clients and server share one process and one GPU.
  Device updates = Device::kCpu;
};

// --device's text to a device. InvalidArgument naming the text (with the nearest valid value);
// FailedPrecondition with CUDA's reason for "cuda" without a usable GPU.
absl::StatusOr<Device> ResolveDevice(const std::string& text);

// What of a run computes on the CPU only so far: int8 math (a CPU kernel), named for a message;
// "" when it is not asked for. (bf16 math and exact-match evaluation run on CUDA too.)
std::string CpuOnlyWork(bool int8_math);
// The same for a federated run: its precision (INT8: int8 math).
std::string CpuOnlyWork(const v1::RunConfig& config);

// The device a run computes on, `resolved` from --device `flag` (ResolveDevice), when `cpu_only`
// (CpuOnlyWork) names work that needs the CPU: "auto" then takes the CPU, "cuda" is refused with
// Unimplemented naming that work. `resolved` itself otherwise.
absl::StatusOr<Device> DeviceForRun(const std::string& flag, Device resolved,
                                    const std::string& cpu_only);

// `role`'s plan for `config` under --device `flag`: ResolveDevice, then the rules above.
absl::StatusOr<DevicePlan> PlanDevices(const std::string& flag, RunRole role,
                                       const v1::RunConfig& config);
// The same with --device already resolved to `resolved` (for a caller that resolved it once).
absl::StatusOr<DevicePlan> PlanDevices(const std::string& flag, Device resolved, RunRole role,
                                       const v1::RunConfig& config);

}  // namespace fedlora
