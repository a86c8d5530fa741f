// The run config as its consumers take it: the config plus the values derived from it, built once
// by ResolveRunConfig instead of by each consumer on its own. `fedlora server` and `fedlora
// simulate` resolve the config they loaded and hand the value down: the simulator
// (sim::RunSimulation), the server's options (ServerOptionsFromRunConfig: the heartbeat) and the
// server (Server::Create), whose coordinator keeps it and reads the codecs from it. Where --device
// computes is a separate plan (config/device_plan.h), made by each command for its role.
//
//   FEDLORA_ASSIGN_OR_RETURN(v1::RunConfig config, LoadRunConfigFile(path));
//   FEDLORA_ASSIGN_OR_RETURN(ResolvedRunConfig run, ResolveRunConfig(std::move(config)));
//   if (!declared.SameWireFormat(run.codecs.uplink)) ...
//
// Thread-safe (no shared state); the result is a plain value, copied freely.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "fedlora/v1/config.pb.h"

namespace fedlora {

// The codec options a run's config gives (compression/update_io.h CodecOptionsFromSpec), derived
// once.
struct RunCodecs {
  CodecOptions uplink;                   // config.codec: what every client update is encoded as
  std::optional<CodecOptions> downlink;  // config.downlink_codec, when it has stages
};

// InvalidArgument or Unimplemented naming the stage where a codec spec cannot be carried out.
absl::StatusOr<RunCodecs> ResolveRunCodecs(const v1::RunConfig& config);

// selection.heartbeat_interval_seconds and heartbeat_timeout_seconds in milliseconds, or their
// defaults (config/defaults.h) where unset: the one source of the server's interval, which it
// sends clients in JoinResponse and HeartbeatResponse.
int64_t HeartbeatIntervalMs(const v1::RunConfig& config);
int64_t HeartbeatTimeoutMs(const v1::RunConfig& config);

struct ResolvedRunConfig {
  v1::RunConfig config;  // as given: through LoadRunConfigFile, defaults filled in and validated
  RunCodecs codecs;
  int64_t heartbeat_interval_ms = 0;
  int64_t heartbeat_timeout_ms = 0;
};

// Derives the values above from `config`; fails only where ResolveRunCodecs does (never for a
// config that ValidateRunConfig accepted).
absl::StatusOr<ResolvedRunConfig> ResolveRunConfig(v1::RunConfig config);

}  // namespace fedlora
