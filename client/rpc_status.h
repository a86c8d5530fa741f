// The one place where the client SDK turns a grpc::Status into an absl::Status. The canonical codes
// are the same numbers in both libraries, so the code carries over unchanged and the server's
// message (which names the problem) is kept.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace fedlora {

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace fedlora
