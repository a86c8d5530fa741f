// The round driver: Tick (the round clock) and the aggregation thread's bounded tries (each try is
// AggregateAndCommit, coordinator_aggregation.cc).
#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

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

}  // namespace fedlora
