// Internal to the server module: the coordinator's per-client and per-round records, shared by the
// files that implement the Coordinator: coordinator.cc (construction, opening rounds, forgetting
// closed ones), coordinator_restore.cc (Restore), coordinator_sessions.cc (the client registry:
// Join, Authenticate, Heartbeat, metrics, Leave), coordinator_selection.cc (WaitForTask, long
// polls, selection), coordinator_uploads.cc (upload admission around an UploadAdmission,
// validation, acceptance), coordinator_driver.cc (the round clock and the aggregation tries),
// coordinator_aggregation.cc (a round's aggregation around a RoundAggregator),
// coordinator_secagg.cc (secure aggregation), coordinator_retention.cc (retention of old rounds)
// and coordinator_admin.cc (GetStatus, ListClients, BlockClient).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/coordinator.h"

namespace fedlora {

// Bytes kept of the error a failing client leaves with (LeaveRequest.error).
inline constexpr size_t kMaxFailureBytes = 1024;

struct Coordinator::RoundInfo {
  int64_t round = 0;
  RoundState state = RoundState::kSelecting;
  int64_t started_ms = 0;
  int64_t deadline_ms = 0;           // 0 while selecting
  std::set<std::string> candidates;  // clients waiting for this round's selection
  int64_t first_candidate_ms = 0;
  std::set<std::string> selected;
  std::map<std::string, std::string> accepted;  // client_id -> upload_id
  int64_t rejected = 0;
  // Download bytes sent while this round was open, and what the completed downloads stand for as
  // full adapters.
  int64_t download_bytes = 0;
  int64_t download_full_bytes = 0;
  // The round's secure aggregation, when the run has it (set when the selection closes).
  std::unique_ptr<SecAggRound> secagg;
  // The key the round's updates are sealed to (server/aggregation_key.h).
  std::shared_ptr<const AggregationKey> key;
};

struct Coordinator::Waiter {
  std::string client_id;
  int64_t expires_ms = 0;
  WaitCallback done;
};

// What a blocked client is told, wherever it calls.
inline absl::Status BlockedError(const std::string& client_id) {
  return absl::PermissionDeniedError(
      absl::StrCat("client '", client_id, "' is blocked by the operator"));
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace fedlora
