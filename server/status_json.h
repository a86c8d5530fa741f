// What the Admin service's answers look like as JSON, shared by `fedlora status --json`
// (tools/status_view.h) and the live view's /api/run.json (server/live_view.h).
#pragma once

#include <google/protobuf/message.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "fedlora/v1/admin.pb.h"

namespace fedlora {

// `message` as a JSON value: proto field names, every field (zeros too; an unset optional field is
// left out), enums by name, and 64-bit integers as numbers (protobuf's own mapping writes them as
// strings).
absl::StatusOr<nlohmann::json> MessageJsonValue(const google::protobuf::Message& message);

// The same, printed with an indent of 2.
absl::StatusOr<std::string> MessageJson(const google::protobuf::Message& message);

// The status as MessageJsonValue, with `clients` (when not null) as a "clients" array beside its fields.
absl::StatusOr<nlohmann::json> StatusJsonValue(const v1::GetStatusResponse& status,
                                               const v1::ListClientsResponse* clients);
absl::StatusOr<std::string> StatusJson(const v1::GetStatusResponse& status,
                                       const v1::ListClientsResponse* clients);

}  // namespace fedlora
