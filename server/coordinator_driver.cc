// The round driver: Tick (the round clock) and aggregation on the aggregation thread, with its
// bounded tries.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "aggregation/fedavg.h"
#include "compression/downlink.h"
#include "config/config_io.h"
#include "core/logging.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/strings.h"
#include "crypto/random.h"
#include "crypto/sealed_update.h"
#include "model/param.h"
#include "proto/wire.h"
#include "server/adapter_io.h"
#include "server/audit_trail.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/crash_point.h"

namespace fedlora {

void Coordinator::WaitForAggregation() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* running) { return !*running; }, &aggregating_));
}

// ------------------------------------------------------------------------------------------------
// Driver

absl::Status Coordinator::Tick() {
  std::vector<Delivery> deliveries;
  DurabilityTicket ticket;
  bool sweep = false;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (!restored_) return absl::OkStatus();
    UpdateClientGaugesLocked();
    status.Update(MaybeCloseSelectionLocked(/*force_window=*/false));
    status.Update(AdvanceSecAggLocked());
    status.Update(MaybeCloseRoundLocked());
    MaybeStartAggregationLocked();
    deliveries = ResolveWaitersLocked(/*expire_all=*/false);
    ticket = pending_;
    const std::pair<int64_t, int> now_for = {round_ ? round_->round : last_committed_round_,
                                             round_ ? static_cast<int>(round_->state) : -1};
    sweep = now_for != swept_for_;
    swept_for_ = now_for;
  }
  Deliver(std::move(deliveries), ticket);
  // Housekeeping walks directories and reads the store: it runs beside the round clock, on its own
  // thread, one pass at a time. At start and whenever the round moves on, nothing of a closed
  // round can complete any more; the store's size is measured then and every 10 s.
  const int64_t now = Now();
  const bool measure = now - store_measured_ms_ >= 10'000;
  if ((sweep || measure) && !housekeeping_.exchange(true)) {
    if (sweep) sweep_pending_.store(true);
    store_measured_ms_ = now;  // the housekeeping thread never reads the (injectable) clock
    housekeeping_pool_.Submit([this] {
      if (sweep_pending_.exchange(false)) {
        SweepPartials();
        ForgetClosedRounds();
        ApplyRetention();
      }
      MeasureStore();
      housekeeping_.store(false);
    });
  } else if (sweep) {
    sweep_pending_.store(true);  // the pass under way missed it: the next one does it
  }
  return status;
}

void Coordinator::MaybeStartAggregationLocked() {
  if (round_ == nullptr || round_->state != RoundState::kAggregating || aggregating_ ||
      shutting_down_ || Now() < aggregation_retry_at_ms_) {
    return;
  }
  aggregating_ = true;
  const int64_t round = round_->round;
  aggregation_pool_.Submit([this, round] {
    const absl::Status s = AggregateAndCommit(round);
    // Aggregation freed a few model-sized buffers (the accumulator, decoded updates, the serialized
    // adapter); hand them back to the OS, outside the lock, so that they do not count toward the
    // next round's RSS.
    malloc_trim(0);
    std::vector<Delivery> deliveries;
    DurabilityTicket ticket;
    {
      absl::MutexLock lock(&mu_);
      AggregationDoneLocked(round, s);
      deliveries = ResolveWaitersLocked(/*expire_all=*/false);
      ticket = pending_;
      aggregating_ = false;
    }
    Deliver(std::move(deliveries), ticket);
  });
}

void Coordinator::AggregationDoneLocked(int64_t round, const absl::Status& status) {
  if (status.ok() || round_ == nullptr || round_->round != round) return;
  if (absl::IsCancelled(status) && shutting_down_) {
    FEDLORA_LOG(INFO) << "round " << round
                      << ": aggregation stopped for shutdown; a restart redoes it";
    return;
  }
  metrics_->aggregation_failures.fetch_add(1);
  ++aggregation_failures_;
  // A secure-aggregation round has one try: its clients answer the unmasking step once.
  const int attempts =
      round_->secagg != nullptr ? 1 : std::max(1, options_.max_aggregation_attempts);
  if (aggregation_failures_ < attempts) {
    const int64_t pause_ms =
        std::min<int64_t>(int64_t{1000} << (aggregation_failures_ - 1), 30'000);
    aggregation_retry_at_ms_ = Now() + pause_ms;
    FEDLORA_LOG(ERROR) << "aggregating round " << round << " failed (try " << aggregation_failures_
                       << " of " << attempts << "): " << status << "; trying again in " << pause_ms
                       << " ms";
    return;
  }
  if (options_.stop_on_aggregation_failure) {
    stopped_ = Annotate(
        status, absl::StrCat("round ", round, " could not be aggregated in ", attempts, " tries"));
    finished_ = true;
    FEDLORA_LOG(ERROR)
        << "run " << run_id_ << " stopped: " << stopped_
        << "; the round stays aggregating in the store, and a restarted server tries it again";
    return;
  }
  DurabilityTicket ticket;
  const absl::Status abandoned =
      store_->SetRoundState(run_id_, round, RoundState::kAbandoned, &ticket);
  if (!abandoned.ok()) {
    // The store refuses the write too: try the whole round again after the longest pause.
    aggregation_retry_at_ms_ = Now() + 30'000;
    FEDLORA_LOG(ERROR) << "round " << round << ": cannot abandon it (" << abandoned
                       << "); trying again in 30 s";
    return;
  }
  DeferLocked(ticket);
  metrics_->rounds_abandoned.fetch_add(1);
  FEDLORA_LOG(ERROR) << "round " << round << " abandoned after " << attempts
                     << " failed aggregation tries (last: " << status
                     << "); the next round trains from the same adapter";
  round_.reset();
  const absl::Status opened = OpenNextRoundLocked();
  if (!opened.ok()) {
    FEDLORA_LOG(ERROR) << "opening the round after " << round << ": " << opened;
  }
}

absl::Status Coordinator::CheckNotShuttingDown() const {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::CancelledError("the server is shutting down");
  return absl::OkStatus();
}

void Coordinator::MeasureStore() {
  absl::StatusOr<int64_t> blobs = blobs_->DiskUsageBytes();
  if (!blobs.ok()) return;
  int64_t total = *blobs;
  for (const char* f : {"/fedlora.db", "/fedlora.db-wal", "/fedlora.db-shm"}) {
    std::error_code ec;
    const uintmax_t n = std::filesystem::file_size(options_.data_dir + f, ec);
    if (!ec) total += static_cast<int64_t>(n);
  }
  metrics_->store_bytes.store(total);
}

absl::Status Coordinator::AggregateAndCommit(int64_t round) {
  // Only the driver thread aggregates, and the round is in state aggregating, so no RPC changes the
  // accepted set or the global adapter meanwhile: reading them without the lock held throughout is
  // safe. The heavy work runs unlocked so RPCs keep being answered.
  std::shared_ptr<const std::vector<UpdateTensor>> snapshot, broadcast;
  int64_t committed_before = 0;
  {
    absl::MutexLock lock(&mu_);
    snapshot = global_;
    broadcast = broadcast_;
    committed_before = rounds_committed_;
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UploadRecord> uploads,
                           store_->ListAcceptedUploads(run_id_, round));
  std::vector<UploadRecord> all_uploads;  // set when some were left out as corrupt
  nlohmann::json metrics_json_extra = nlohmann::json::object();
  // A client's weight is its claimed example count, capped at the configured bound (the count is
  // sealed with the update, so no one on the way can change it, but the client itself may lie).
  const int64_t max_examples =
      static_cast<int64_t>(config_.aggregation().max_examples_per_client());
  const bool by_examples = config_.aggregation().weight_by_examples() && max_examples > 0;
  const double max_norm = config_.aggregation().max_update_norm();
  int64_t added = 0, unclipped = 0;
  std::vector<UpdateTensor> mean;
  std::optional<DpRound> dp_round;
  FEDLORA_ASSIGN_OR_RETURN(const std::shared_ptr<const AggregationKey> key, KeyFor(round));
  if (secagg_.has_value()) {
    // The server learns only the sum of the survivors' clipped (and, with DISTRIBUTED DP, noised)
    // updates: the clients clipped them, and an unclipped count does not exist.
    int64_t cohort = 0;
    {
      absl::MutexLock lock(&mu_);
      if (round_ != nullptr && round_->round == round && round_->secagg != nullptr) {
        cohort = static_cast<int64_t>(round_->secagg->cohort.size());
      }
    }
    FEDLORA_ASSIGN_OR_RETURN(mean, AggregateSecAgg(round, uploads, &added));
    if (dp_.has_value()) {
      FEDLORA_ASSIGN_OR_RETURN(dp_round, dp_->Release(mean, added, /*unclipped=*/0, cohort));
    }
  } else {
    FEDLORA_ASSIGN_OR_RETURN(StreamingFedAvg avg,
                             StreamingFedAvg::Create(spec_, options_.aggregation_device));
    std::vector<UploadRecord> intact;
    // With an audit key: the updates that already have a copy (an aggregation redone after a crash
    // or a failure), and the copies made now, recorded below before the round commits.
    absl::flat_hash_set<std::string> audited;
    std::vector<AuditCopyRecord> audit_copies;
    if (!audit_public_key_.empty()) {
      FEDLORA_ASSIGN_OR_RETURN(std::vector<AuditCopyRecord> existing,
                               store_->ListAuditCopies(run_id_, round));
      for (const AuditCopyRecord& c : existing) audited.insert(c.upload_id);
    }
    for (const UploadRecord& u :
         uploads) {  // canonical order (by upload_id); the sum is exact anyway
      std::string plain;
      {
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
        FEDLORA_ASSIGN_OR_RETURN(std::string sealed, std::move(read));
        const crypto::UpdatePlace place{run_id_, static_cast<uint64_t>(u.round), u.client_id,
                                        u.upload_id, static_cast<uint64_t>(u.num_examples)};
        absl::StatusOr<std::string> opened =
            crypto::OpenUpdateBlob(key->private_key, place, sealed);
        if (!opened.ok())
          return Annotate(opened.status(), absl::StrCat("opening update ", u.upload_id));
        plain = *std::move(opened);
        if (!audit_public_key_.empty() && !audited.contains(u.upload_id)) {
          FEDLORA_ASSIGN_OR_RETURN(AuditCopyRecord copy,
                                   SealAuditCopy(audit_public_key_, place, plain, *blobs_));
          audit_copies.push_back(std::move(copy));
        }
      }  // the sealed copy is freed before decoding
      // A sparsified update stays sparse: its kept entries are clipped and added where they go.
      FEDLORA_ASSIGN_OR_RETURN(std::vector<KeptTensor> update, DecodeAndValidate(plain));
      std::string().swap(plain);
      if (dp_.has_value()) {
        unclipped += dp_->Clip(update) ? 1 : 0;
      } else if (max_norm > 0) {
        ClipUpdateNorm(update, max_norm);
      }
      FEDLORA_RETURN_IF_ERROR_CTX(
          avg.Add(update, by_examples ? std::min(u.num_examples, max_examples) : 1),
          absl::StrCat("update ", u.upload_id));
      intact.push_back(u);
      if (++added == 1) MaybeCrashAt("during_aggregation");
      FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
    }
    if (const int64_t lost = static_cast<int64_t>(uploads.size()) - added; lost > 0) {
      metrics_json_extra["updates_corrupt"] = lost;
      if (added < MinClients()) {
        FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
        absl::MutexLock lock(&mu_);  // housekeeping (ForgetClosedRounds) deletes its key and blobs
        if (round_ == nullptr || round_->round != round) return absl::OkStatus();
        aggregation_failures_ = 0;
        return AbandonRoundLocked(
            absl::StrCat(lost, " of its ", uploads.size(),
                         " accepted updates are corrupt or missing in the blob store, and the ",
                         added, " intact ones are fewer than min_clients (", MinClients(), ")"));
      }
    }
    // Durable before CommitRound: a round that counted an update always has its audit copy.
    FEDLORA_RETURN_IF_ERROR_CTX(store_->RecordAuditCopies(audit_copies),
                                "recording the audit copies");
    // Corrupt ones counted nowhere below (bytes, participation); ForgetRound still deletes them.
    all_uploads = uploads;
    uploads = std::move(intact);
    FEDLORA_ASSIGN_OR_RETURN(mean, avg.Finish());
    if (dp_.has_value()) {
      FEDLORA_ASSIGN_OR_RETURN(dp_round, dp_->Release(mean, added, unclipped));
    }
  }  // the exact accumulator (16 bytes per element) is freed before the adapter is copied below
  // Step a copy of the optimizer: its state becomes the server's only once the round commits.
  ServerOptimizer opt = *server_opt_;
  std::vector<UpdateTensor> next = *snapshot;  // the copy the optimizer steps, made unlocked
  snapshot.reset();
  FEDLORA_RETURN_IF_ERROR(opt.Step(mean, next));
  std::vector<UpdateTensor>().swap(mean);  // not needed past the step: one adapter less held below
  if (committed_before + 1 >= TotalRounds())
    FEDLORA_RETURN_IF_ERROR(AverageWithEarlierRounds(round, next));
  std::string state_hash;
  if (opt.stateful()) {
    FEDLORA_ASSIGN_OR_RETURN(std::string state, opt.SaveState());
    FEDLORA_ASSIGN_OR_RETURN(state_hash, blobs_->Put(state));
  }
  std::string hash;
  int64_t adapter_bytes = 0;
  {
    FEDLORA_ASSIGN_OR_RETURN(std::string bytes, AdapterToSafetensors(next));
    FEDLORA_ASSIGN_OR_RETURN(hash, blobs_->Put(bytes));
    adapter_bytes = static_cast<int64_t>(bytes.size());
  }  // the serialized copy is freed before evaluation
  // The downlink: the next broadcast adapter and the delta that leads to it (compression/downlink.h).
  BroadcastHashes downlink;
  std::shared_ptr<const std::vector<UpdateTensor>> next_broadcast;
  int64_t broadcast_bytes = 0, delta_bytes = 0;
  if (downlink_.has_value()) {
    CodecOptions o = *downlink_;
    o.seed = DownlinkSeedFor(round);
    FEDLORA_ASSIGN_OR_RETURN(DownlinkDelta d, EncodeDownlinkDelta(*broadcast, next, o));
    FEDLORA_ASSIGN_OR_RETURN(downlink.delta_hash, blobs_->Put(d.blob));
    delta_bytes = static_cast<int64_t>(d.blob.size());
    std::string().swap(d.blob);
    FEDLORA_ASSIGN_OR_RETURN(std::string bytes, AdapterToSafetensors(d.rebuilt));
    FEDLORA_ASSIGN_OR_RETURN(downlink.adapter_hash, blobs_->Put(bytes));
    broadcast_bytes = static_cast<int64_t>(bytes.size());
    next_broadcast = std::make_shared<const std::vector<UpdateTensor>>(std::move(d.rebuilt));
  }
  broadcast.reset();
  MaybeCrashAt("during_checkpoint");

  // Evaluate every data.eval_every_rounds committed rounds, and always the last one.
  const int64_t eval_every = std::max<int64_t>(1, config_.data().eval_every_rounds());
  const bool evaluate =
      (committed_before + 1) % eval_every == 0 || committed_before + 1 >= TotalRounds();
  std::map<std::string, double> eval;
  FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
  if (evaluator_ != nullptr && evaluate) {
    absl::StatusOr<std::map<std::string, double>> result =
        evaluator_->Evaluate(static_cast<uint64_t>(round), next);
    if (result.ok()) {
      eval = *std::move(result);
    } else {
      FEDLORA_LOG(WARNING) << "round " << round << ": evaluation failed (" << result.status()
                           << "); committing without metrics";
    }
  } else if (evaluator_ != nullptr) {
    evaluator_->Skipped(static_cast<uint64_t>(round));
  }
  nlohmann::json metrics_json = nlohmann::json::object();
  std::vector<MetricRecord> records;
  for (const auto& [k, v] : eval) {
    if (!std::isfinite(v)) continue;
    metrics_json[k] = v;
    records.push_back({run_id_, round, "", k, v});
  }
  metrics_json["updates"] = added;
  metrics_json.update(metrics_json_extra);
  int64_t wire_bytes = 0;
  for (const UploadRecord& u : uploads) wire_bytes += u.bytes;
  metrics_json["upload_bytes"] = wire_bytes;
  metrics_json["update_fp32_bytes"] = added * spec_elements_ * static_cast<int64_t>(sizeof(float));
  if (dp_round.has_value()) dp_round->AddTo(metrics_json);
  {
    absl::MutexLock lock(&mu_);
    if (round_ != nullptr && round_->round == round) {
      metrics_json["updates_rejected"] = round_->rejected;
      metrics_json["download_bytes"] = round_->download_bytes;
      metrics_json["download_full_bytes"] = round_->download_full_bytes;
    }
  }
  FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
  FEDLORA_RETURN_IF_ERROR(store_->CommitRound(run_id_, round, hash, metrics_json.dump(), records,
                                              state_hash, downlink));
  server_opt_.emplace(std::move(opt));
  ForgetRound(round, all_uploads.empty() ? uploads : all_uploads);

  auto committed = std::make_shared<const std::vector<UpdateTensor>>(std::move(next));
  std::shared_ptr<const std::vector<UpdateTensor>> previous;  // freed after the lock is released
  absl::MutexLock lock(&mu_);
  aggregation_failures_ = 0;
  if (dp_round.has_value()) {
    // The accountant's durable state is the round's metrics, committed above; this only mirrors it.
    const absl::Status dp_committed = dp_->Commit(*dp_round);
    if (!dp_committed.ok()) {
      FEDLORA_LOG(ERROR) << "round " << round << ": DP accountant: " << dp_committed;
    }
    metrics_->dp_epsilon_micro.store(static_cast<int64_t>(std::llround(dp_->epsilon() * 1e6)));
  }
  for (const UploadRecord& u : uploads) {
    if (ClientEntry* c = FindClientLocked(u.client_id)) ++c->rounds_participated;
  }
  previous = std::exchange(global_, std::move(committed));
  global_hash_ = hash;
  global_bytes_ = adapter_bytes;
  global_round_ = round;
  downloadable_[hash] = {round, global_bytes_, false};
  broadcast_round_ = round;
  if (next_broadcast != nullptr) {
    downlink_steps_.push_back(
        {round, broadcast_hash_, downlink.delta_hash, downlink.adapter_hash, delta_bytes});
    downloadable_[downlink.delta_hash] = {round, delta_bytes, true};
    downloadable_[downlink.adapter_hash] = {round, broadcast_bytes, false};
    broadcast_ = std::move(next_broadcast);
    broadcast_hash_ = downlink.adapter_hash;
    broadcast_bytes_ = broadcast_bytes;
  } else {
    broadcast_ = global_;
    broadcast_hash_ = hash;
    broadcast_bytes_ = adapter_bytes;
  }
  last_committed_round_ = round;
  ++rounds_committed_;
  metrics_->rounds_committed.store(rounds_committed_);
  round_.reset();
  FEDLORA_LOG(INFO) << "round " << round << " committed: " << added << " updates, adapter " << hash;
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

absl::Status Coordinator::AverageWithEarlierRounds(int64_t round,
                                                   std::vector<UpdateTensor>& adapter) const {
  const int64_t k = config_.aggregation().average_last_rounds();
  if (k <= 1) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store_->ListRounds(run_id_));
  std::vector<const RoundRecord*> earlier;  // committed before `round`, oldest first
  for (const RoundRecord& r : rounds) {
    if (r.state == RoundState::kCommitted && r.round < round) earlier.push_back(&r);
  }
  if (static_cast<int64_t>(earlier.size()) > k - 1)
    earlier.erase(earlier.begin(), earlier.end() - (k - 1));
  if (earlier.empty()) return absl::OkStatus();
  // The unweighted mean, with FedAvg's exact accumulator: the same adapters give the same bits in
  // any order, and Add checks each against the spec.
  FEDLORA_ASSIGN_OR_RETURN(StreamingFedAvg mean, StreamingFedAvg::Create(spec_));
  for (const RoundRecord* r : earlier) {
    if (r->result_adapter_hash.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", r->round,
          "'s adapter, which aggregation.average_last_rounds averages, was deleted by an "
          "earlier server.retain_rounds below average_last_rounds - 1"));
    }
    FEDLORA_ASSIGN_OR_RETURN(std::string bytes, blobs_->Get(r->result_adapter_hash));
    FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> a, AdapterFromSafetensors(bytes));
    FEDLORA_RETURN_IF_ERROR_CTX(mean.Add(a, 1),
                                absl::StrCat("round ", r->round, "'s committed adapter"));
  }
  FEDLORA_RETURN_IF_ERROR(mean.Add(adapter, 1));
  FEDLORA_ASSIGN_OR_RETURN(adapter, mean.Finish());
  FEDLORA_LOG(INFO) << "round " << round << ": the final adapter is the mean of rounds "
                    << earlier.front()->round << " to " << round << " (" << earlier.size() + 1
                    << " adapters)";
  return absl::OkStatus();
}

}  // namespace fedlora
