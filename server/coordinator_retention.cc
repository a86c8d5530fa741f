// Retention of old rounds (ServerOptions::retain_rounds): the blobs of committed rounds older than
// the kept ones are deleted, and their rows keep only what accounting needs.
//
// What is always kept: the latest committed round's adapter and optimizer state (Restore resumes
// from them), the adapter the open round trains from (the latest broadcast), the initial adapter
// (the run's row names it), the adapters aggregation.average_last_rounds averages at the last
// round, and the delta steps of the kept rounds (a client holding an older adapter downloads the
// full one). The rows of every round stay, with their state and metrics: DP accounting counts
// committed rounds from them, and upload rows keep counting exactly once.
#include <algorithm>

#include "core/logging.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

namespace fedlora {

int64_t Coordinator::RetentionKeepFrom(const std::vector<RoundRecord>& rounds) const {
  if (options_.retain_rounds <= 0) return 0;
  const int64_t keep = std::max<int64_t>(
      {options_.retain_rounds,
       static_cast<int64_t>(config_.aggregation().average_last_rounds()) - 1, int64_t{1}});
  std::vector<int64_t> committed;
  for (const RoundRecord& r : rounds) {
    if (r.state == RoundState::kCommitted) committed.push_back(r.round);
  }
  if (static_cast<int64_t>(committed.size()) <= keep) return 0;
  std::sort(committed.begin(), committed.end());
  return committed[committed.size() - static_cast<size_t>(keep)];
}

void Coordinator::ApplyRetention() {
  if (options_.retain_rounds <= 0) return;
  {
    absl::MutexLock lock(&mu_);
    if (!restored_) return;
  }
  absl::StatusOr<std::vector<RoundRecord>> rounds = store_->ListRounds(run_id_);
  if (!rounds.ok()) {
    FEDLORA_LOG(WARNING) << "retention: listing rounds: " << rounds.status();
    return;
  }
  const int64_t keep_from = RetentionKeepFrom(*rounds);
  if (keep_from > pruned_from_) {
    // The blobs the pruned rows name, deleted below once no row names them.
    for (const RoundRecord& r : *rounds) {
      if (r.round >= keep_from || !IsTerminal(r.state)) continue;
      for (const std::string* h :
           {&r.result_adapter_hash, &r.global_adapter_hash, &r.server_state_hash, &r.broadcast_hash,
            &r.broadcast_delta_hash}) {
        if (!h->empty()) retention_pending_.push_back(*h);
      }
    }
    // Rows first: a crash after this leaves blobs no row names, which Restore's collection deletes.
    if (absl::StatusOr<int64_t> pruned = store_->PruneRoundBlobs(run_id_, keep_from);
        !pruned.ok()) {
      FEDLORA_LOG(WARNING) << "retention: clearing the hashes of rounds below " << keep_from << ": "
                           << pruned.status();
      return;
    }
    pruned_from_ = keep_from;
    absl::MutexLock lock(&mu_);
    std::erase_if(downlink_steps_, [&](const DownlinkStep& s) { return s.round < keep_from; });
    std::erase_if(downloadable_, [&](const auto& entry) {
      return entry.second.round > 0 && entry.second.round < keep_from &&
             entry.first != global_hash_ && entry.first != broadcast_hash_;
    });
  }
  DeletePrunedBlobs();
}

void Coordinator::DeletePrunedBlobs() {
  if (retention_pending_.empty()) return;
  absl::StatusOr<RunRecord> run = store_->GetRun(run_id_);
  if (!run.ok()) {
    FEDLORA_LOG(WARNING) << "retention: reading the run: " << run.status();
    return;
  }
  int64_t deleted = 0;
  {
    // Under mu_ with no aggregation running, no blob can be Put and recorded behind our back.
    absl::MutexLock lock(&mu_);
    if (aggregating_) return;
    absl::StatusOr<absl::flat_hash_set<std::string>> referenced = store_->ReferencedBlobHashes();
    if (!referenced.ok()) {
      FEDLORA_LOG(WARNING) << "retention: reading what the store still names: "
                           << referenced.status();
      return;
    }
    absl::flat_hash_set<std::string> done;
    for (const std::string& h : retention_pending_) {
      // The run's row names the initial adapter in its config (Restore needs it).
      if (referenced->contains(h) || run->config_json.find(h) != std::string::npos ||
          !done.insert(h).second)
        continue;
      if (absl::Status s = blobs_->Delete(h); !s.ok()) {
        FEDLORA_LOG(WARNING) << "retention: deleting blob " << h << ": " << s
                             << " (a restart collects it)";
        continue;
      }
      ++deleted;
    }
  }
  retention_pending_.clear();
  if (absl::Status s = store_->CheckpointWal(); !s.ok()) {
    FEDLORA_LOG(WARNING) << "retention: " << s;
  }
  retained_from_.store(pruned_from_);
  FEDLORA_LOG(INFO) << "retention: rounds below " << pruned_from_ << " pruned; " << deleted
                    << " blobs deleted";
}

}  // namespace fedlora
