// The admission of an upload stream: every check BeginUpload makes of an upload header before the
// stream may write a byte, over a snapshot of what the coordinator knows, with no store, no
// coordinator and no lock. The coordinator reads the free disk and the upload's row first, takes
// its lock, fills in the rest of the snapshot, decides, and records the decision:
//
//   UploadSnapshot s;                  // free_disk_bytes, existing: read before the lock
//   ...                                // under the lock: the round, the client, its quotas
//   UploadDecision d = admission.Decide(client_id, header, s);
//   // d.status not OK: refused. d.duplicate_ack: a replay of an accepted upload, answered with its
//   // original ack. Else admitted: d.record is the "receiving" row, d.reserved_bytes the disk it
//   // reserves until the stream ends.
//
// The checks, in this order (the first that fails decides): the server has restored; a replay of
// the upload_id (another client's; accepted, for the same or another blob); an upload_id refused
// before; the round binding (run finished, stale round, round no longer training, client not
// selected, another task, deadline passed, an update already accepted, another base adapter);
// num_examples; the seal (scheme, the round's key, the ephemeral key); the manifest against the
// adapter and the server's chunking; the codec; the stream (already streaming, unknown client);
// the per-client quotas (uploads in flight, uploads per round, bytes per round); the free-disk
// watermark.
//
// Thread-safety: UploadAdmission is immutable; Decide may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregation/fedavg.h"
#include "fedlora/v1/config.pb.h"
#include "fedlora/v1/federation.pb.h"
#include "server/options.h"
#include "server/store.h"

namespace fedlora {

// The limits admission applies: the server's (ServerOptions) and the run config's.
struct UploadLimits {
  int64_t max_upload_bytes = 0;  // one update, sealed
  int64_t chunk_bytes = 0;       // the chunking every manifest must use
  int max_client_uploads_in_flight = 0;
  int max_client_uploads_per_round = 0;
  int64_t max_client_bytes_per_round = 0;
  int64_t min_free_disk_bytes = 0;  // the free-disk watermark
  // Secure aggregation or differential privacy: every update claims 1 example
  // (HidesPerClientStatistics).
  bool one_example_each = false;
  // aggregation.weight_by_examples and max_examples_per_client: a larger claim is logged.
  bool weight_by_examples = false;
  uint64_t max_examples_per_client = 0;
};
UploadLimits UploadLimitsFor(const ServerOptions& options, const v1::RunConfig& config);

// A client's per-round upload quotas (ServerOptions::max_client_*), as the coordinator counts them.
struct UploadQuota {
  int64_t round = 0;  // the round the per-round counters count; another round's start at 0
  int64_t bytes_this_round = 0;
  int uploads_this_round = 0;  // new upload ids begun
  int uploads_in_flight = 0;
};

// The open round as one client stands in it (UploadSnapshot::round). A type of its own, not nested:
// clang cannot default-construct a nested struct with member initializers in std::optional before
// the enclosing struct is complete.
struct UploadRound {
  int64_t round = 0;
  RoundState state = RoundState::kSelecting;
  int64_t deadline_ms = 0;
  bool selected = false;                       // the client was selected
  std::string task_id;                         // the client's task (when selected)
  std::optional<std::string> accepted_upload;  // the client's update already accepted
  std::string trains_from;                     // the adapter its clients train from (SHA-256)
  std::string key_id;                          // the aggregation key its updates are sealed to
};

// What the coordinator knows that bears on one upload header.
struct UploadSnapshot {
  // Read before the coordinator's lock: the bytes free on the store's disk, and this upload_id's
  // row (NotFound: a new upload).
  int64_t free_disk_bytes = 0;
  absl::StatusOr<UploadRecord> existing = absl::NotFoundError("no such upload");
  // The coordinator, under its lock.
  bool restored = false;
  bool finished = false;
  std::string run_id;
  int64_t now_ms = 0;
  // This upload_id refused earlier (Coordinator::RejectUpload): whose, and why.
  struct Rejection {
    std::string client_id;
    std::string reason;
  };
  std::optional<Rejection> rejected;
  // The open round, as this client stands in it; unset when none is open.
  using Round = UploadRound;
  std::optional<Round> round;
  int64_t last_committed_round = 0;  // names the current round when none is open
  // The adapter's tensors, sorted by name: fixed for the run; not owned.
  const std::vector<TensorSpec>* spec = nullptr;
  bool streaming = false;             // this upload_id streams on another call
  std::optional<UploadQuota> client;  // the client's quotas; unset for an unknown client
  int64_t disk_reserved = 0;          // disk bytes reserved for the uploads streaming
};

// What Decide says.
struct UploadDecision {
  // OK: admitted, or a replay (duplicate_ack). Otherwise the refusal.
  absl::Status status;
  // The refusal is a quota's (per-client, or the free-disk watermark): counted in the metrics.
  bool quota_refused = false;
  // Set once the checks reached the per-round quotas, admitted or not: the round the client's
  // quotas count from now on (ClientEntry::StartQuotaRound, server/client_registry.h).
  std::optional<int64_t> quota_round;
  // A replay of an upload already accepted: its original ack (duplicate), and nothing to store.
  std::optional<v1::UploadAck> duplicate_ack;
  // Admitted: the "receiving" row to write, the disk it reserves, and whether it is a new
  // upload_id (counted in uploads_this_round; a resume continues a row already counted).
  UploadRecord record;
  int64_t reserved_bytes = 0;
  bool new_upload = false;
};

class UploadAdmission {
 public:
  explicit UploadAdmission(UploadLimits limits) : limits_(limits) {}

  // The decision on `header`, sent by `client_id`, given `s`.
  UploadDecision Decide(const std::string& client_id, const v1::UploadHeader& header,
                        const UploadSnapshot& s) const;

  const UploadLimits& limits() const { return limits_; }

 private:
  UploadLimits limits_;
};

}  // namespace fedlora
