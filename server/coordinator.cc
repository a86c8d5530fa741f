// The coordinator's construction and accessors, and its rounds: opening the next one under a signed
// key, and forgetting closed ones (see coordinator.h for the whole; Restore is
// coordinator_restore.cc).
#include "server/coordinator.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "aggregation/fedavg.h"
#include "config/config_io.h"
#include "core/logging.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/strings.h"
#include "crypto/envelope.h"
#include "crypto/key_signature.h"
#include "crypto/random.h"
#include "crypto/sealed_update.h"
#include "proto/wire.h"
#include "server/coordinator_internal.h"
#include "server/crash_point.h"
#include "server/selection.h"

namespace fedlora {

int64_t SystemClockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Coordinator::Coordinator(ServerOptions options, ResolvedRunConfig run,
                         std::vector<UpdateTensor> initial_adapter, Store* store, BlobStore* blobs,
                         Evaluator* evaluator, ServerMetrics* metrics, Clock clock)
    : options_(std::move(options)),
      run_(std::move(run)),
      run_id_(config_.run_id().empty() ? kDefaultRunId : config_.run_id()),
      upload_admission_(UploadLimitsFor(options_, config_)),
      initial_adapter_(std::move(initial_adapter)),
      store_(store),
      blobs_(blobs),
      evaluator_(evaluator),
      metrics_(metrics),
      clock_(clock ? std::move(clock) : Clock(SystemClockMs)),
      start_ms_(clock_()) {}

Coordinator::~Coordinator() {
  ReleaseAllWaiters();
  WaitForAggregation();
}

int64_t Coordinator::TargetFor(const v1::RunConfig& config) {
  return std::max<int64_t>(1, config.selection().has_clients_per_round()
                                  ? config.selection().clients_per_round()
                                  : kDefaultClientsPerRound);
}
int64_t Coordinator::QuotaFor(const v1::RunConfig& config) {
  const double over = config.selection().has_over_selection() ? config.selection().over_selection()
                                                              : kDefaultOverSelection;
  const int64_t target = TargetFor(config);
  // The small epsilon keeps 10 * 1.3 = 13.000000000000002 from becoming 14.
  return std::max<int64_t>(
      target, static_cast<int64_t>(std::ceil(static_cast<double>(target) * over - 1e-9)));
}
int64_t Coordinator::MinClientsFor(const v1::RunConfig& config) {
  if (config.selection().has_min_clients())
    return std::max<int64_t>(1, config.selection().min_clients());
  return DefaultMinClients(static_cast<uint32_t>(TargetFor(config)));
}

absl::Status Coordinator::CheckPrivacy(const v1::RunConfig& config, int64_t adapter_elements) {
  FEDLORA_RETURN_IF_ERROR(ValidatePrivacySettings(config));
  double encoding_bound = 0;
  if (config.privacy().secure_aggregation()) {
    FEDLORA_ASSIGN_OR_RETURN(SecAggEncoding encoding,
                             SecAggEncoding::For(config, MinClientsFor(config), QuotaFor(config)));
    encoding_bound = FixedPointRoundingBound(encoding.frac_bits, adapter_elements);
  }
  // The budget check needs no real key; Restore checks it again with the run's adapter.
  return ServerDp::Create(config, {}, MinClientsFor(config), QuotaFor(config), encoding_bound)
      .status();
}

bool Coordinator::restored() const {
  absl::MutexLock lock(&mu_);
  return restored_;
}
bool Coordinator::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}
absl::Status Coordinator::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}
int64_t Coordinator::rounds_committed() const {
  absl::MutexLock lock(&mu_);
  return rounds_committed_;
}
std::optional<double> Coordinator::dp_epsilon() const {
  absl::MutexLock lock(&mu_);
  return dp_.has_value() ? std::optional<double>(dp_->epsilon()) : std::nullopt;
}
std::optional<Coordinator::Cohort> Coordinator::SelectedCohort(int64_t round) const {
  absl::MutexLock lock(&mu_);
  if (round_ == nullptr || round_->round != round || round_->state == RoundState::kSelecting)
    return std::nullopt;
  return Cohort{.clients = {round_->selected.begin(), round_->selected.end()},
                .deadline_ms = round_->deadline_ms};
}
std::vector<UpdateTensor> Coordinator::global_adapter() const {
  std::shared_ptr<const std::vector<UpdateTensor>> snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot = global_;
  }
  return *snapshot;
}
std::string Coordinator::global_adapter_sha256() const {
  absl::MutexLock lock(&mu_);
  return global_hash_;
}

std::string Coordinator::TaskIdFor(int64_t round, const std::string& client_id) const {
  // Deterministic, so a restarted server recognises the tasks it handed out before the crash, and
  // bound to (run, round, client): a client cannot use another client's task id.
  return absl::StrCat("r", round, "-",
                      Sha256Hex(absl::StrCat(run_id_, "\n", round, "\n", client_id)).substr(0, 24));
}

uint64_t Coordinator::TaskSeedFor(int64_t round, const std::string& client_id) const {
  return DigestPrefix64(absl::StrCat("task-seed\n", config_.seed(), "\n", round, "\n", client_id));
}

uint64_t Coordinator::DownlinkSeedFor(int64_t round) const {
  return DigestPrefix64(absl::StrCat("downlink-seed\n", config_.seed(), "\n", round));
}

void Coordinator::UpdateClientGaugesLocked() {
  const int64_t now = Now();
  metrics_->clients_registered.store(static_cast<int64_t>(clients_.size()));
  metrics_->clients_live.store(clients_.CountLive(now));
}

// ------------------------------------------------------------------------------------------------
// Rounds: opening the next one under a signed key, and forgetting closed ones

absl::Status Coordinator::OpenNextRoundLocked() {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store_->ListRounds(run_id_));
  const int64_t next = rounds.empty() ? 1 : rounds.back().round + 1;
  // Refusals of rounds before the last one can no longer be asked about by a resuming client.
  for (auto it = rejected_.begin(); it != rejected_.end();) {
    it = it->second.round + 2 <= next ? rejected_.erase(it) : std::next(it);
  }
  // The round's key exists durably before the round does: a task never names a key a crash can lose.
  absl::StatusOr<AggregationKey> key = keys_->Create(next);
  if (absl::IsAlreadyExists(
          key.status())) {  // left by a server that stopped before the round began
    FEDLORA_RETURN_IF_ERROR(keys_->Destroy(next));
    key = keys_->Create(next);
  }
  FEDLORA_RETURN_IF_ERROR(key.status());
  FEDLORA_RETURN_IF_ERROR(SignRoundKey(next, *key));
  DurabilityTicket ticket;
  FEDLORA_ASSIGN_OR_RETURN(
      RoundRecord r, store_->BeginRound(run_id_, next, broadcast_hash_, /*deadline_unix_ms=*/0,
                                        &ticket, key->key_id));
  DeferLocked(ticket);
  round_ = std::make_unique<RoundInfo>();
  round_->key = std::make_shared<const AggregationKey>(*std::move(key));
  round_->round = r.round;
  round_->state = RoundState::kSelecting;
  round_->started_ms = Now();
  metrics_->current_round.store(r.round);
  FEDLORA_LOG(DEBUG) << "round " << r.round << " opened (selecting " << Quota()
                     << " of the waiting clients)";
  return absl::OkStatus();
}

absl::Status Coordinator::SignRoundKey(int64_t round, AggregationKey& key) const {
  if (signing_key_pem_.empty()) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(
      key.signature, crypto::SignAggregationKey(signing_key_pem_, run_id_,
                                                static_cast<uint64_t>(round), key.public_key));
  return absl::OkStatus();
}

void Coordinator::ForgetRound(int64_t round, const std::vector<UploadRecord>& uploads) {
  if (absl::Status s = keys_->Destroy(round); !s.ok()) {
    FEDLORA_LOG(ERROR) << "round " << round << ": destroying its aggregation key: " << s;
  }
  for (const UploadRecord& u : uploads) {
    if (u.blob_hash.empty()) continue;
    if (absl::Status s = blobs_->Delete(u.blob_hash); !s.ok()) {
      FEDLORA_LOG(ERROR) << "round " << round << ": deleting sealed update " << u.upload_id << ": "
                         << s;
    }
  }
}

void Coordinator::ForgetClosedRounds() {
  int64_t open = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!restored_) return;
    open = round_ != nullptr ? round_->round : std::numeric_limits<int64_t>::max();
  }
  absl::StatusOr<std::vector<RoundRecord>> rounds = store_->ListRounds(run_id_);
  if (!rounds.ok()) {
    FEDLORA_LOG(WARNING) << "listing rounds to forget: " << rounds.status();
    return;
  }
  for (const RoundRecord& r : *rounds) {
    if (r.round <= forgotten_through_ || r.round >= open) continue;
    if (r.state != RoundState::kCommitted && r.state != RoundState::kAbandoned) break;
    absl::StatusOr<std::vector<UploadRecord>> uploads =
        store_->ListAcceptedUploads(run_id_, r.round);
    if (!uploads.ok()) {
      FEDLORA_LOG(WARNING) << "round " << r.round
                           << ": listing its updates to delete: " << uploads.status();
      return;
    }
    ForgetRound(r.round, *uploads);
    forgotten_through_ = r.round;
  }
}

// ------------------------------------------------------------------------------------------------

}  // namespace fedlora
