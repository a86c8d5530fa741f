// The one place where an absl::Status becomes a grpc::Status for the server's handlers. The canonical
// codes map one to one (absl's StatusCode values are gRPC's), so only the message needs care: it is
// passed through unchanged, because it names the problem for the client (see federation.proto's error
// table).
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace fedlora {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace fedlora
