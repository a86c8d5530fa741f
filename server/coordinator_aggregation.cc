// The coordinator's side of a round's aggregation, on the aggregation thread: it snapshots what
// the round starts from under mu_, feeds the accepted updates to a RoundAggregator
// (server/round_aggregator.h) with no lock held, stores the result's blobs, evaluates, and commits.
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "config/config_io.h"
#include "core/logging.h"
#include "core/status.h"
#include "crypto/sealed_update.h"
#include "server/adapter_io.h"
#include "server/audit_trail.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/crash_point.h"
#include "server/round_aggregator.h"

namespace fedlora {

// One aggregation try's state between its steps.
struct Coordinator::RoundOutcome {
  int64_t committed_before = 0;
  RoundResult result;
  std::vector<UploadRecord> counted;  // the updates the aggregate holds
  std::vector<UploadRecord> forget;   // every accepted update, deleted once the round commits
  int64_t corrupt = 0;                // accepted but lost in the blob store
  bool abandoned = false;             // too few intact updates: the round was given up
  // The blobs stored from the result.
  std::string adapter_hash, state_hash;
  int64_t adapter_bytes = 0;
  BroadcastHashes downlink;
  int64_t broadcast_bytes = 0, delta_bytes = 0;
  std::shared_ptr<const std::vector<UpdateTensor>> next_broadcast;
};

absl::Status Coordinator::AggregateAndCommit(int64_t round) {
  // Only the driver thread aggregates, and the round is in state aggregating, so no RPC changes the
  // accepted set or the global adapter meanwhile: reading them without the lock held throughout is
  // safe. The heavy work runs unlocked so RPCs keep being answered.
  RoundOutcome out;
  FEDLORA_ASSIGN_OR_RETURN(RoundSnapshot snapshot, SnapshotRound(round, &out.committed_before));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UploadRecord> uploads,
                           store_->ListAcceptedUploads(run_id_, round));
  FEDLORA_ASSIGN_OR_RETURN(const std::shared_ptr<const AggregationKey> key, KeyFor(round));
  FEDLORA_ASSIGN_OR_RETURN(RoundAggregator aggregator, RoundAggregator::Begin(std::move(snapshot)));
  if (secagg_.has_value()) {
    // The server learns only the sum of the survivors' clipped (and, with DISTRIBUTED DP, noised)
    // updates.
    int64_t cohort = 0;
    {
      absl::MutexLock lock(&mu_);
      if (round_ != nullptr && round_->round == round && round_->secagg != nullptr) {
        cohort = static_cast<int64_t>(round_->secagg->cohort_size());
      }
    }
    int64_t added = 0;
    FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> mean,
                             AggregateSecAgg(round, uploads, &added));
    FEDLORA_ASSIGN_OR_RETURN(out.result, aggregator.FinishUnmasked(std::move(mean), added, cohort));
    out.counted = std::move(uploads);
  } else {
    out.forget = uploads;
    FEDLORA_RETURN_IF_ERROR(AggregatePlain(round, *key, uploads, aggregator, out));
    if (out.abandoned) return absl::OkStatus();
    FEDLORA_ASSIGN_OR_RETURN(out.result, aggregator.Finish());
  }
  FEDLORA_RETURN_IF_ERROR(StoreResult(out));
  MaybeCrashAt("during_checkpoint");
  return CommitOutcome(round, out);
}

absl::StatusOr<RoundSnapshot> Coordinator::SnapshotRound(int64_t round, int64_t* committed_before) {
  RoundSnapshot s;
  {
    absl::MutexLock lock(&mu_);
    s.global = global_;
    s.broadcast = broadcast_;
    *committed_before = rounds_committed_;
  }
  s.round = round;
  s.spec = spec_;
  s.spec_elements = spec_elements_;
  s.optimizer = &*server_opt_;  // written only by this thread, once a round commits
  s.dp = dp_.has_value() ? &*dp_ : nullptr;
  const v1::AggregationConfig& a = config_.aggregation();
  s.aggregation = a;
  s.device = options_.aggregation_device;
  // A client's weight is its claimed example count, capped at the configured bound (the count is
  // sealed with the update, so no one on the way can change it, but the client itself may lie).
  const int64_t max_examples = static_cast<int64_t>(a.max_examples_per_client());
  s.weight_cap = a.weight_by_examples() && max_examples > 0 ? max_examples : 0;
  s.max_update_norm = a.max_update_norm();
  s.masked = secagg_.has_value();
  if (run_.codecs.downlink.has_value()) {
    s.downlink = run_.codecs.downlink;
    s.downlink->seed = DownlinkSeedFor(round);
  }
  if (*committed_before + 1 >= TotalRounds()) {
    FEDLORA_ASSIGN_OR_RETURN(s.tail, TailFor(round));
  }
  return s;
}

absl::StatusOr<std::vector<TailAdapter>> Coordinator::TailFor(int64_t round) const {
  const int64_t k = config_.aggregation().average_last_rounds();
  if (k <= 1) return std::vector<TailAdapter>();
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store_->ListRounds(run_id_));
  std::vector<const RoundRecord*> earlier;  // committed before `round`, oldest first
  for (const RoundRecord& r : rounds) {
    if (r.state == RoundState::kCommitted && r.round < round) earlier.push_back(&r);
  }
  if (static_cast<int64_t>(earlier.size()) > k - 1)
    earlier.erase(earlier.begin(), earlier.end() - (k - 1));
  std::vector<TailAdapter> tail;
  for (const RoundRecord* r : earlier) {
    if (r->result_adapter_hash.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", r->round,
          "'s adapter, which aggregation.average_last_rounds averages, was deleted by an "
          "earlier server.retain_rounds below average_last_rounds - 1"));
    }
    tail.push_back({r->round,
                    [blobs = blobs_,
                     hash = r->result_adapter_hash]() -> absl::StatusOr<std::vector<UpdateTensor>> {
                      FEDLORA_ASSIGN_OR_RETURN(std::string bytes, blobs->Get(hash));
                      return AdapterFromSafetensors(bytes);
                    }});
  }
  return tail;
}

absl::StatusOr<std::string> Coordinator::OpenAccepted(const UploadRecord& u,
                                                      const AggregationKey& key,
                                                      std::string sealed) const {
  const crypto::UpdatePlace place{run_id_, static_cast<uint64_t>(u.round), u.client_id, u.upload_id,
                                  static_cast<uint64_t>(u.num_examples)};
  absl::StatusOr<std::string> opened = crypto::OpenUpdateBlob(key.private_key, place, sealed);
  if (!opened.ok()) return Annotate(opened.status(), absl::StrCat("opening update ", u.upload_id));
  return opened;
}

absl::Status Coordinator::AggregatePlain(int64_t round, const AggregationKey& key,
                                         const std::vector<UploadRecord>& uploads,
                                         RoundAggregator& aggregator, RoundOutcome& out) {
  // With an audit key: the updates that already have a copy (an aggregation redone after a crash
  // or a failure), and the copies made now, recorded below before the round commits.
  absl::flat_hash_set<std::string> audited;
  std::vector<AuditCopyRecord> audit_copies;
  if (!audit_public_key_.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(std::vector<AuditCopyRecord> existing,
                             store_->ListAuditCopies(run_id_, round));
    for (const AuditCopyRecord& c : existing) audited.insert(c.upload_id);
  }
  for (const UploadRecord& u : uploads) {  // canonical order (by upload_id)
    absl::StatusOr<std::string> read = blobs_->Get(u.blob_hash);
    if (absl::IsDataLoss(read.status()) || absl::IsNotFound(read.status())) {
      // Its client was told ACCEPTED: say loudly that the update is lost, and go on without it.
      metrics_->updates_corrupt.fetch_add(1);
      FEDLORA_LOG(ERROR) << "round " << round << ": accepted update " << u.upload_id
                         << " of client " << u.client_id << " is "
                         << (absl::IsNotFound(read.status()) ? "missing" : "corrupt")
                         << " in the blob store (" << read.status().message()
                         << "); it is left out of the aggregate";
      continue;
    }
    FEDLORA_RETURN_IF_ERROR(read.status());
    // The sealed copy is freed before decoding.
    FEDLORA_ASSIGN_OR_RETURN(std::string plain, OpenAccepted(u, key, *std::move(read)));
    if (!audit_public_key_.empty() && !audited.contains(u.upload_id)) {
      const crypto::UpdatePlace place{run_id_, static_cast<uint64_t>(u.round), u.client_id,
                                      u.upload_id, static_cast<uint64_t>(u.num_examples)};
      FEDLORA_ASSIGN_OR_RETURN(AuditCopyRecord copy,
                               SealAuditCopy(audit_public_key_, place, plain, *blobs_));
      audit_copies.push_back(std::move(copy));
    }
    FEDLORA_RETURN_IF_ERROR(aggregator.Add(u.upload_id, u.num_examples, std::move(plain)));
    out.counted.push_back(u);
    if (aggregator.num_updates() == 1) MaybeCrashAt("during_aggregation");
    FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
  }
  const int64_t added = aggregator.num_updates();
  out.corrupt = static_cast<int64_t>(uploads.size()) - added;
  if (out.corrupt > 0 && added < MinClients()) {
    FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
    absl::MutexLock lock(&mu_);  // housekeeping (ForgetClosedRounds) deletes its key and blobs
    out.abandoned = true;
    if (round_ == nullptr || round_->round != round) return absl::OkStatus();
    aggregation_failures_ = 0;
    return AbandonRoundLocked(
        absl::StrCat(out.corrupt, " of its ", uploads.size(),
                     " accepted updates are corrupt or missing in the blob store, and the ", added,
                     " intact ones are fewer than min_clients (", MinClients(), ")"));
  }
  // Durable before CommitRound: a round that counted an update always has its audit copy.
  return Annotate(store_->RecordAuditCopies(audit_copies), "recording the audit copies");
}

absl::Status Coordinator::StoreResult(RoundOutcome& out) {
  RoundResult& r = out.result;
  if (r.optimizer->stateful()) {
    FEDLORA_ASSIGN_OR_RETURN(std::string state, r.optimizer->SaveState());
    FEDLORA_ASSIGN_OR_RETURN(out.state_hash, blobs_->Put(state));
  }
  {
    FEDLORA_ASSIGN_OR_RETURN(std::string bytes, AdapterToSafetensors(r.adapter));
    FEDLORA_ASSIGN_OR_RETURN(out.adapter_hash, blobs_->Put(bytes));
    out.adapter_bytes = static_cast<int64_t>(bytes.size());
  }  // the serialized copy is freed before evaluation
  if (r.downlink.has_value()) {
    // The downlink: the next broadcast adapter and the delta that leads to it
    // (compression/downlink.h).
    FEDLORA_ASSIGN_OR_RETURN(out.downlink.delta_hash, blobs_->Put(r.downlink->blob));
    out.delta_bytes = static_cast<int64_t>(r.downlink->blob.size());
    std::string().swap(r.downlink->blob);
    FEDLORA_ASSIGN_OR_RETURN(std::string bytes, AdapterToSafetensors(r.downlink->rebuilt));
    FEDLORA_ASSIGN_OR_RETURN(out.downlink.adapter_hash, blobs_->Put(bytes));
    out.broadcast_bytes = static_cast<int64_t>(bytes.size());
    out.next_broadcast =
        std::make_shared<const std::vector<UpdateTensor>>(std::move(r.downlink->rebuilt));
    r.downlink.reset();
  }
  return absl::OkStatus();
}

std::map<std::string, double> Coordinator::EvaluateRound(int64_t round, int64_t committed_before,
                                                         const std::vector<UpdateTensor>& adapter) {
  // Evaluate every data.eval_every_rounds committed rounds, and always the last one.
  const int64_t eval_every = std::max<int64_t>(1, config_.data().eval_every_rounds());
  const bool evaluate =
      (committed_before + 1) % eval_every == 0 || committed_before + 1 >= TotalRounds();
  std::map<std::string, double> eval;
  if (evaluator_ != nullptr && evaluate) {
    absl::StatusOr<std::map<std::string, double>> result =
        evaluator_->Evaluate(static_cast<uint64_t>(round), adapter);
    if (result.ok()) {
      eval = *std::move(result);
    } else {
      FEDLORA_LOG(WARNING) << "round " << round << ": evaluation failed (" << result.status()
                           << "); committing without metrics";
    }
  } else if (evaluator_ != nullptr) {
    evaluator_->Skipped(static_cast<uint64_t>(round));
  }
  return eval;
}

absl::Status Coordinator::CommitOutcome(int64_t round, RoundOutcome& out) {
  FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
  const std::map<std::string, double> eval =
      EvaluateRound(round, out.committed_before, out.result.adapter);
  nlohmann::json metrics_json = nlohmann::json::object();
  std::vector<MetricRecord> records;
  for (const auto& [k, v] : eval) {
    if (!std::isfinite(v)) continue;
    metrics_json[k] = v;
    records.push_back({run_id_, round, "", k, v});
  }
  const int64_t added = out.result.updates;
  metrics_json["updates"] = added;
  if (out.corrupt > 0) metrics_json["updates_corrupt"] = out.corrupt;
  int64_t wire_bytes = 0;
  for (const UploadRecord& u : out.counted) wire_bytes += u.bytes;
  metrics_json["upload_bytes"] = wire_bytes;
  metrics_json["update_fp32_bytes"] = added * spec_elements_ * static_cast<int64_t>(sizeof(float));
  if (out.result.dp.has_value()) out.result.dp->AddTo(metrics_json);
  {
    absl::MutexLock lock(&mu_);
    if (round_ != nullptr && round_->round == round) {
      metrics_json["updates_rejected"] = round_->rejected;
      metrics_json["download_bytes"] = round_->download_bytes;
      metrics_json["download_full_bytes"] = round_->download_full_bytes;
    }
  }
  FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
  FEDLORA_RETURN_IF_ERROR(store_->CommitRound(run_id_, round, out.adapter_hash, metrics_json.dump(),
                                              records, out.state_hash, out.downlink));
  server_opt_.emplace(*std::move(out.result.optimizer));
  ForgetRound(round, out.forget.empty() ? out.counted : out.forget);
  auto committed = std::make_shared<const std::vector<UpdateTensor>>(std::move(out.result.adapter));
  std::shared_ptr<const std::vector<UpdateTensor>> previous;  // freed after the lock is released
  absl::MutexLock lock(&mu_);
  previous = std::exchange(global_, std::move(committed));
  return InstallCommittedLocked(round, out);
}

absl::Status Coordinator::InstallCommittedLocked(int64_t round, RoundOutcome& out) {
  aggregation_failures_ = 0;
  if (out.result.dp.has_value()) {
    // The accountant's durable state is the round's metrics, committed above; this only mirrors it.
    const absl::Status dp_committed = dp_->Commit(*out.result.dp);
    if (!dp_committed.ok()) {
      FEDLORA_LOG(ERROR) << "round " << round << ": DP accountant: " << dp_committed;
    }
    metrics_->dp_epsilon_micro.store(static_cast<int64_t>(std::llround(dp_->epsilon() * 1e6)));
  }
  for (const UploadRecord& u : out.counted) {
    if (ClientEntry* c = clients_.Find(u.client_id)) ++c->rounds_participated;
  }
  const std::string& hash = out.adapter_hash;
  global_hash_ = hash;
  global_bytes_ = out.adapter_bytes;
  global_round_ = round;
  downloadable_[hash] = {round, global_bytes_, false};
  broadcast_round_ = round;
  if (out.next_broadcast != nullptr) {
    downlink_steps_.push_back({round, broadcast_hash_, out.downlink.delta_hash,
                               out.downlink.adapter_hash, out.delta_bytes});
    downloadable_[out.downlink.delta_hash] = {round, out.delta_bytes, true};
    downloadable_[out.downlink.adapter_hash] = {round, out.broadcast_bytes, false};
    broadcast_ = std::move(out.next_broadcast);
    broadcast_hash_ = out.downlink.adapter_hash;
    broadcast_bytes_ = out.broadcast_bytes;
  } else {
    broadcast_ = global_;
    broadcast_hash_ = hash;
    broadcast_bytes_ = out.adapter_bytes;
  }
  last_committed_round_ = round;
  ++rounds_committed_;
  metrics_->rounds_committed.store(rounds_committed_);
  round_.reset();
  FEDLORA_LOG(INFO) << "round " << round << " committed: " << out.result.updates
                    << " updates, adapter " << hash;
  const int64_t total_rounds = TotalRounds();
  if (rounds_committed_ >= total_rounds) {
    finished_ = true;
    FEDLORA_LOG(INFO) << "run " << run_id_ << " finished after " << rounds_committed_ << " rounds"
                      << (total_rounds < ConfiguredRounds(config_)
                              ? absl::StrCat(": the privacy budget (epsilon ",
                                             dp_->max_epsilon().value_or(0),
                                             ") affords no more; epsilon spent ", dp_->epsilon())
                              : std::string());
    return absl::OkStatus();
  }
  return OpenNextRoundLocked();
}

}  // namespace fedlora
