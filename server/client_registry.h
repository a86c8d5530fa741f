// The clients a coordinator knows, by id: each one's session, liveness, reported state, training
// progress, per-round quotas and standing (blocked by an operator, excluded from selection). Plain
// state with no lock of its own: the Coordinator holds its mutex around every use
// (server/coordinator.h). The rules that change it live with the coordinator's sessions
// (coordinator_sessions.cc), admission (upload_admission.h) and selection.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "fedlora/v1/common.pb.h"

namespace fedlora {

struct ClientEntry {
  std::string id;
  std::string session;  // empty: no live session (never joined since the server started, or left)
  std::string peer;
  std::string client_version;
  std::string
      cert_fingerprint;     // of the certificate it last joined with (mTLS), as the store has it
  std::string device_name;  // its last Join's capabilities
  bool has_cuda = false;
  int64_t joined_ms = 0;
  int64_t last_seen_ms = 0;
  v1::ClientState reported = v1::CLIENT_STATE_IDLE;
  bool left = false;
  std::string failure;   // the error it left with (LeaveRequest.error); cleared when it joins again
  bool blocked = false;  // by an operator (Admin.BlockClient): refused everywhere, never selected
  int held_polls = 0;    // WaitForTask polls held by the coordinator
  int64_t excluded_through_round = 0;  // not selected up to this round (wrong SecAgg shares)
  int64_t rounds_participated = 0;
  int64_t updates_rejected = 0;
  std::string held_adapter;  // as the client's last WaitForTask said
  // Training progress of task `progress_task` as its last heartbeat said (HeartbeatRequest).
  std::string progress_task;
  uint64_t steps_done = 0;
  uint64_t steps_total = 0;
  // Quotas (ServerOptions::max_client_*), counted for `quota_round`, reset as the round moves on.
  int64_t quota_round = 0;
  int64_t bytes_this_round = 0;
  int reports_this_round = 0;
  int uploads_this_round = 0;  // new upload ids begun
  int uploads_in_flight = 0;
  void StartQuotaRound(int64_t round) {
    if (quota_round == round) return;
    quota_round = round;
    bytes_this_round = 0;
    reports_this_round = 0;
    uploads_this_round = 0;
  }
};

class ClientRegistry {
 public:
  using Map = std::map<std::string, std::unique_ptr<ClientEntry>>;

  // A client is live for `heartbeat_timeout_ms` after it was last heard from.
  explicit ClientRegistry(int64_t heartbeat_timeout_ms)
      : heartbeat_timeout_ms_(heartbeat_timeout_ms) {}

  // The entry of `client_id`; null when it never joined, was never blocked and was not restored.
  ClientEntry* Find(const std::string& client_id);
  const ClientEntry* Find(const std::string& client_id) const;
  // The entry of `client_id`, made with its id when there is none (`*created` then true).
  ClientEntry& FindOrAdd(const std::string& client_id, bool* created = nullptr);

  // Holds a session it has not left, is not blocked, and was heard from within the timeout.
  bool IsLive(const ClientEntry& c, int64_t now) const;
  int64_t CountLive(int64_t now) const;
  size_t size() const { return clients_.size(); }

  // Every entry, by client id.
  Map::const_iterator begin() const { return clients_.begin(); }
  Map::const_iterator end() const { return clients_.end(); }

 private:
  const int64_t heartbeat_timeout_ms_;
  Map clients_;
};

}  // namespace fedlora
