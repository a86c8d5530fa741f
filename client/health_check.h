// grpc.health.v1.Health/Check from the client side: what `fedlora health`, container health checks
// and Kubernetes exec probes ask a server. The request and response are encoded here with
// protobuf's wire primitives: Debian's gRPC ships the health service but not its .proto.
//
//   auto channel = grpc::CreateChannel("127.0.0.1:8081", grpc::InsecureChannelCredentials());
//   FEDLORA_ASSIGN_OR_RETURN(HealthStatus s, CheckHealth(channel, "", /*deadline_ms=*/5000));
#pragma once

#include <grpcpp/channel.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fedlora {

// grpc.health.v1.HealthCheckResponse.ServingStatus, same numbers.
enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

const char* HealthStatusName(HealthStatus status);

// The status of `service` ("" for the whole server). A name the server does not know comes back as
// NotFound, an unreachable server as Unavailable or DeadlineExceeded, a malformed answer as
// DataLoss.
absl::StatusOr<HealthStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                         const std::string& service, int64_t deadline_ms);

}  // namespace fedlora
