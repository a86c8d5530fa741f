// Offline integrity check and repair of a run's durable state (`fedlora store verify|repair`):
// every blob the store's rows reference is re-hashed; what the data allows is rebuilt, and what
// cannot be rebuilt can be given up by rewinding the run to its newest intact round.
//
//   FEDLORA_ASSIGN_OR_RETURN(RunCheck check, CheckRun(*store, *blobs, "run-1"));
//   if (!check.intact()) { FEDLORA_ASSIGN_OR_RETURN(RepairOutcome o, RepairRun(*store, *blobs, "run-1", rewind)); }
//
// Only while no server uses the store (tools/cmd_store.cc holds the data directory's lock).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/blob_store.h"
#include "server/store.h"

namespace fedlora {

enum class BlobHealth { kIntact, kCorrupt, kMissing };
std::string_view BlobHealthName(BlobHealth h);  // "intact", "corrupt", "missing"

struct BlobCheck {
  int64_t round = 0;  // 0 for the initial adapter
  std::string kind;  // "initial adapter", "result adapter", "broadcast adapter", "broadcast delta",
                     // "optimizer state", "accepted update", "audit copy"
  std::string hash;
  BlobHealth health = BlobHealth::kIntact;
  std::string detail;     // the blob store's error, when not intact
  std::string upload_id;  // accepted updates and audit copies only
  std::string client_id;
  std::string cost;  // what the damage costs, when not intact
};

struct RunCheck {
  std::string run_id;
  std::vector<BlobCheck> blobs;  // by round, then the order above
  int64_t latest_committed = 0;  // 0 when none
  bool intact() const;
};

// Re-hashes every blob run `run_id` references: the initial adapter, each committed round's
// result adapter, broadcast adapter and delta and optimizer state, and the open round's accepted
// updates. NotFound for an unknown run; other errors only when the store cannot be read.
absl::StatusOr<RunCheck> CheckRun(Store& store, const BlobStore& blobs, const std::string& run_id);

struct RepairOutcome {
  std::vector<std::string> rebuilt;  // one line per blob rebuilt
  int64_t rewound_to = -1;           // the round the run was rolled back to; -1: no rewind
  int64_t rounds_lost = 0;           // committed rounds the rewind marked lost
  // Set when the run cannot resume and --rewind was not given: the round it would go back to.
  int64_t rewind_needed_to = -1;
};

// Rebuilds a damaged broadcast adapter from its predecessor plus its intact delta (the rebuilt
// bytes must hash to the recorded name). Then, if the latest committed round's result adapter,
// broadcast adapter or optimizer state is still not intact: with `rewind`, rolls the run back to
// the newest committed round whose three are intact (Store::RewindRun; 0 = the initial adapter);
// without, reports that round in rewind_needed_to. DataLoss when even the initial adapter is
// damaged and a rewind is needed.
absl::StatusOr<RepairOutcome> RepairRun(Store& store, BlobStore& blobs, const std::string& run_id,
                                        bool rewind);

}  // namespace fedlora
