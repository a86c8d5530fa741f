// What `fedlora status` prints: a short view of a run for people (the default), and one JSON
// document for programs (--json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/status/statusor.h"
#include "fedlora/v1/admin.pb.h"

namespace fedlora::tools {

// The run in a few lines: round x of N and its phase, sites, the last evaluation, epsilon, the
// global adapter; then a table of the last kViewRounds committed rounds. `now_ms`: this machine's
// clock, for "12 s ago".
inline constexpr int kViewRounds = 10;
std::string StatusView(const v1::GetStatusResponse& status, int64_t now_ms);

// One line per client (state, rounds, rejected updates, last seen, task), and a failed client's
// error on the line below it.
std::string ClientsView(const std::vector<v1::ClientInfo>& clients, int64_t now_ms);

// `message` as JSON: proto field names, every field (zeros too; an unset optional field is left
// out), enums by name, and 64-bit integers as numbers (protobuf's own mapping writes them as
// strings).
absl::StatusOr<std::string> MessageJson(const google::protobuf::Message& message);

// The status as MessageJson, with `clients` (when not null) as a "clients" array beside its fields.
absl::StatusOr<std::string> StatusJson(const v1::GetStatusResponse& status, const v1::ListClientsResponse* clients);

}  // namespace fedlora::tools
