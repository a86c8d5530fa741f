// What `fedlora status` prints: a short view of a run for people (the default), and one JSON
// document for programs (--json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fedlora/v1/admin.pb.h"
#include "server/status_json.h"

namespace fedlora::tools {

// The run in a few lines: round x of N and its phase, sites, the last evaluation, epsilon, the
// global adapter; then a table of the last kViewRounds committed rounds. `now_ms`: this machine's
// clock, for "12 s ago".
inline constexpr int kViewRounds = 10;
std::string StatusView(const v1::GetStatusResponse& status, int64_t now_ms);

// One line per client (state, rounds, rejected updates, last seen, task), and a failed client's
// error on the line below it.
std::string ClientsView(const std::vector<v1::ClientInfo>& clients, int64_t now_ms);

// The JSON of --json: MessageJson and StatusJson (server/status_json.h).

}  // namespace fedlora::tools
