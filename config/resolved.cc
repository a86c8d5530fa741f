#include "config/resolved.h"

#include <utility>

#include "compression/update_io.h"
#include "config/defaults.h"
#include "core/status.h"

namespace fedlora {

absl::StatusOr<RunCodecs> ResolveRunCodecs(const v1::RunConfig& config) {
  RunCodecs codecs;
  FEDLORA_ASSIGN_OR_RETURN(codecs.uplink, CodecOptionsFromSpec(config.codec()));
  if (config.downlink_codec().stages_size() > 0) {
    FEDLORA_ASSIGN_OR_RETURN(codecs.downlink, CodecOptionsFromSpec(config.downlink_codec()));
  }
  return codecs;
}

int64_t HeartbeatIntervalMs(const v1::RunConfig& config) {
  const v1::SelectionConfig& s = config.selection();
  return int64_t{1000} * (s.has_heartbeat_interval_seconds() ? s.heartbeat_interval_seconds()
                                                             : kDefaultHeartbeatIntervalSeconds);
}

int64_t HeartbeatTimeoutMs(const v1::RunConfig& config) {
  const v1::SelectionConfig& s = config.selection();
  return int64_t{1000} * (s.has_heartbeat_timeout_seconds() ? s.heartbeat_timeout_seconds()
                                                            : kDefaultHeartbeatTimeoutSeconds);
}

absl::StatusOr<ResolvedRunConfig> ResolveRunConfig(v1::RunConfig config) {
  ResolvedRunConfig resolved;
  FEDLORA_ASSIGN_OR_RETURN(resolved.codecs, ResolveRunCodecs(config));
  resolved.heartbeat_interval_ms = HeartbeatIntervalMs(config);
  resolved.heartbeat_timeout_ms = HeartbeatTimeoutMs(config);
  resolved.config = std::move(config);
  return resolved;
}

}  // namespace fedlora
