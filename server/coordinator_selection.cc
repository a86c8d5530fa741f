// WaitForTask, long polls and their delivery, selection, and the close of a round's training.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregation/fedavg.h"
#include "config/config_io.h"
#include "core/logging.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/strings.h"
#include "crypto/random.h"
#include "crypto/sealed_update.h"
#include "proto/wire.h"
#include "server/adapter_io.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/crash_point.h"
#include "server/selection.h"

namespace fedlora {

// ------------------------------------------------------------------------------------------------
// WaitForTask and selection

double Coordinator::RoundLearningRateLocked() const {
  const v1::TrainingConfig& t = config_.training();
  const double base = t.has_learning_rate() ? t.learning_rate() : kDefaultLearningRate;
  const double total = static_cast<double>(TotalRounds());
  // The fraction of the run done before this round: committed rounds (abandoned ones do not count,
  // and a restarted server resumes the same value).
  const double done = std::min(1.0, static_cast<double>(rounds_committed_) / std::max(1.0, total));
  switch (t.round_schedule()) {
    case v1::TrainingConfig::LINEAR:
      return base * (1.0 - done);
    case v1::TrainingConfig::COSINE:
      return base * 0.5 * (1.0 + std::cos(M_PI * done));
    default:
      return base;
  }
}

v1::AdapterManifest Coordinator::ManifestLocked(const std::string& hash, int64_t round,
                                                int64_t total_bytes) const {
  v1::AdapterManifest m;
  FillTensorSpecs(*global_, &m);
  m.set_total_bytes(static_cast<uint64_t>(total_bytes));
  m.set_sha256(hash);
  m.set_chunk_size_bytes(static_cast<uint32_t>(options_.chunk_bytes));
  m.set_num_chunks(static_cast<uint32_t>(CeilDiv(total_bytes, options_.chunk_bytes)));
  m.set_round(static_cast<uint64_t>(round));
  return m;
}

v1::WaitForTaskResponse Coordinator::RetryLaterLocked(const std::string& reason) const {
  v1::WaitForTaskResponse response;
  v1::RetryLater* retry = response.mutable_retry_later();
  retry->set_retry_after_seconds(static_cast<uint32_t>(CeilDiv(options_.retry_after_ms, 1000)));
  retry->set_reason(reason);
  retry->set_current_round(static_cast<uint64_t>(round_ ? round_->round : last_committed_round_));
  return response;
}

v1::WaitForTaskResponse Coordinator::RunFinishedLocked() const {
  v1::WaitForTaskResponse response;
  v1::RunFinished* done = response.mutable_run_finished();
  done->set_reason(!stopped_.ok() ? v1::RunFinished::FAILED
                   : TotalRounds() < ConfiguredRounds(config_)
                       ? v1::RunFinished::PRIVACY_BUDGET_SPENT
                       : v1::RunFinished::COMPLETED);
  done->set_final_round(static_cast<uint64_t>(last_committed_round_));
  *done->mutable_final_adapter() = ManifestLocked(global_hash_, global_round_, global_bytes_);
  return response;
}

v1::WaitForTaskResponse Coordinator::TaskLocked(const RoundInfo& r, const std::string& client_id) {
  v1::WaitForTaskResponse response;
  v1::TrainTask* task = response.mutable_task();
  task->set_round(static_cast<uint64_t>(r.round));
  task->set_task_id(TaskIdFor(r.round, client_id));
  *task->mutable_global_adapter() =
      ManifestLocked(broadcast_hash_, broadcast_round_, broadcast_bytes_);
  if (const ClientEntry* c = clients_.Find(client_id)) {
    if (std::optional<v1::AdapterDeltaChain> chain = DeltaChainLocked(c->held_adapter)) {
      *task->mutable_global_delta() = *std::move(chain);
    }
  }
  *task->mutable_training() = config_.training();
  task->mutable_training()->set_learning_rate(RoundLearningRateLocked());
  task->set_proximal_mu(config_.aggregation().has_proximal_mu()
                            ? config_.aggregation().proximal_mu()
                            : kDefaultProximalMu);
  task->set_deadline_seconds(
      static_cast<uint32_t>(std::max<int64_t>(0, CeilDiv(r.deadline_ms - Now(), 1000))));
  task->set_seed(TaskSeedFor(r.round, client_id));
  *task->mutable_codec() = config_.codec();
  task->set_encryption_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
  task->mutable_aggregation_key()->set_public_key(r.key->public_key);
  task->mutable_aggregation_key()->set_key_id(r.key->key_id);
  if (!r.key->signature.empty()) {
    task->mutable_aggregation_key()->set_signature(r.key->signature);
    task->mutable_aggregation_key()->set_signer_certificate_pem(signing_chain_pem_);
  }
  if (r.secagg != nullptr) *task->mutable_secure_aggregation() = r.secagg->TaskFor(client_id);
  return response;
}

std::optional<v1::WaitForTaskResponse> Coordinator::AnswerLocked(const std::string& client_id,
                                                                 bool may_hold) {
  if (finished_) return RunFinishedLocked();
  if (round_ == nullptr) {
    if (may_hold) return std::nullopt;
    return RetryLaterLocked("no round is open");
  }
  RoundInfo& r = *round_;
  if (r.accepted.count(client_id) != 0) {
    if (may_hold) return std::nullopt;
    return RetryLaterLocked(absl::StrCat("update for round ", r.round, " already accepted"));
  }
  if (r.state == RoundState::kTraining && r.selected.count(client_id) != 0) {
    return TaskLocked(r, client_id);
  }
  if (r.state == RoundState::kSelecting) {
    if (const ClientEntry* c = clients_.Find(client_id);
        c != nullptr && c->excluded_through_round >= r.round) {
      return RetryLaterLocked(absl::StrCat("sitting out round ", r.round,
                                           ": wrong secure-aggregation shares in round ",
                                           c->excluded_through_round - 1));
    }
    r.candidates.insert(client_id);
    if (r.first_candidate_ms == 0) r.first_candidate_ms = Now();
    if (may_hold) return std::nullopt;
    return RetryLaterLocked(absl::StrCat("waiting for sites to start round ", r.round, " (",
                                         r.candidates.size(), " waiting, ", MinClients(),
                                         " needed)"));
  }
  if (r.state == RoundState::kTraining) {
    // A selected client that went silent (no RPC within heartbeat_timeout) will most likely never
    // deliver: its place goes to this live client, so that the round can still reach its target.
    // (Should the silent one come back and deliver first, both updates count: each is a valid
    // update of this round from a selected client.)
    const int64_t now = Now();
    int64_t working = static_cast<int64_t>(r.accepted.size());
    for (const std::string& id : r.selected) {
      const ClientEntry* c = clients_.Find(id);
      if (r.accepted.count(id) == 0 && c != nullptr && clients_.IsLive(*c, now)) ++working;
    }
    const ClientEntry* me = clients_.Find(client_id);
    // Not in a secure-aggregation round: its cohort is fixed when the selection closes.
    if (r.secagg == nullptr && working < Quota() && me != nullptr && clients_.IsLive(*me, now) &&
        now < r.deadline_ms) {
      DurabilityTicket ticket;
      absl::Status s =
          store_->RecordSelection(run_id_, r.round, {client_id}, r.deadline_ms, &ticket);
      if (s.ok()) {
        DeferLocked(ticket);
        r.selected.insert(client_id);
        FEDLORA_LOG(DEBUG) << "round " << r.round << ": " << client_id
                           << " replaces a silent client (" << working << " of " << Quota()
                           << " tasks alive)";
        return AnswerLocked(client_id, may_hold);
      }
      FEDLORA_LOG(ERROR) << "round " << r.round << ": replacement selection failed: " << s;
    }
    // Passed over by the sampling, or arrived after it: told at once when to come back, rather
    // than held through a round that has no work for it.
    return RetryLaterLocked(absl::StrCat("not selected for round ", r.round));
  }
  if (may_hold) return std::nullopt;
  return RetryLaterLocked(absl::StrCat("round ", r.round, " is aggregating"));
}

std::optional<v1::AdapterDeltaChain> Coordinator::DeltaChainLocked(const std::string& held) const {
  // A chain longer than this is not offered: its manifests alone would fill a message.
  constexpr size_t kMaxChain = 64;
  if (held.empty()) return std::nullopt;
  v1::AdapterDeltaChain chain;
  chain.set_base_sha256(held);
  if (held == broadcast_hash_) return chain;  // the client holds it already: nothing to download
  if (downlink_steps_.empty() || downlink_steps_.back().result != broadcast_hash_)
    return std::nullopt;
  size_t first = downlink_steps_.size();
  int64_t bytes = 0;
  while (first > 0 && downlink_steps_.size() - first < kMaxChain) {
    --first;
    bytes += downlink_steps_[first].delta_bytes;
    if (bytes >= broadcast_bytes_) return std::nullopt;  // the full adapter is no larger
    if (downlink_steps_[first].base == held) {
      for (size_t i = first; i < downlink_steps_.size(); ++i) {
        const DownlinkStep& step = downlink_steps_[i];
        *chain.add_deltas() = ManifestLocked(step.delta, step.round, step.delta_bytes);
      }
      return chain;
    }
    if (first > 0 && downlink_steps_[first - 1].result != downlink_steps_[first].base)
      return std::nullopt;
  }
  return std::nullopt;
}

void Coordinator::WaitForTask(const std::string& client_id, int64_t max_wait_ms, WaitCallback done,
                              const std::string& held_adapter_sha256) {
  std::vector<Delivery> deliveries;
  DurabilityTicket ticket;
  do {
    absl::MutexLock lock(&mu_);
    if (!restored_ || shutting_down_) {
      deliveries.push_back({std::move(done), absl::UnavailableError(
                                                 !restored_ ? "server is restoring its state; retry"
                                                            : "server is shutting down")});
      break;
    }
    ClientEntry* me = clients_.Find(client_id);
    if (me != nullptr && me->blocked) {
      deliveries.push_back({std::move(done), BlockedError(client_id)});
      break;
    }
    if (me != nullptr) {
      me->reported = v1::CLIENT_STATE_IDLE;
      me->held_adapter = held_adapter_sha256.substr(0, 64);
    }
    const bool may_hold = max_wait_ms > 0;
    std::optional<v1::WaitForTaskResponse> answer = AnswerLocked(client_id, may_hold);
    if (!answer.has_value()) {
      // A new candidate may complete the selection quota: close it now rather than at the next tick.
      absl::Status s = MaybeCloseSelectionLocked(/*force_window=*/false);
      if (!s.ok()) {
        FEDLORA_LOG(ERROR) << "selection: " << s;
      }
      answer = AnswerLocked(client_id, may_hold);
    }
    if (!answer.has_value()) {
      // A client holds one poll at a time, and briefly a retry beside one its transport dropped;
      // more are answered at once, so that a flood of polls holds no memory.
      if (me == nullptr || me->held_polls >= options_.max_client_held_polls) {
        answer = AnswerLocked(client_id, /*may_hold=*/false);
      }
    }
    if (answer.has_value()) {
      deliveries.push_back({std::move(done), *std::move(answer)});
    } else {
      auto w = std::make_unique<Waiter>();
      w->client_id = client_id;
      w->expires_ms = Now() + max_wait_ms;
      w->done = std::move(done);
      waiters_.push_back(std::move(w));
      ++me->held_polls;
    }
    for (Delivery& d : ResolveWaitersLocked(/*expire_all=*/false))
      deliveries.push_back(std::move(d));
    ticket = pending_;
  } while (false);
  Deliver(std::move(deliveries), ticket);
}

void Coordinator::Deliver(std::vector<Delivery> deliveries, DurabilityTicket ticket) {
  if (deliveries.empty()) return;
  auto run = [this, deliveries = std::move(deliveries), ticket]() mutable {
    const absl::Status durable = store_->WaitDurable(ticket);
    if (!durable.ok()) {
      FEDLORA_LOG(ERROR) << "store: " << durable << "; answering the held polls Unavailable";
    }
    for (Delivery& d : deliveries) {
      if (!durable.ok() && d.answer.ok()) {
        d.done(absl::UnavailableError(
            absl::StrCat("the server's store failed (", durable.message(), "); retry")));
      } else {
        d.done(std::move(d.answer));
      }
    }
  };
  if (store_->IsDurable(ticket)) {
    run();
  } else {
    delivery_pool_.Submit(std::move(run));
  }
}

std::vector<Coordinator::Delivery> Coordinator::ResolveWaitersLocked(bool expire_all) {
  std::vector<Delivery> out;
  const int64_t now = Now();
  std::vector<std::unique_ptr<Waiter>> keep;
  for (auto& w : waiters_) {
    ClientEntry* c = clients_.Find(w->client_id);
    if (c != nullptr && c->blocked) {
      --c->held_polls;
      out.push_back({std::move(w->done), BlockedError(w->client_id)});
      continue;
    }
    std::optional<v1::WaitForTaskResponse> answer;
    if (expire_all || now >= w->expires_ms) {
      answer = AnswerLocked(w->client_id, /*may_hold=*/false);
    } else {
      answer = AnswerLocked(w->client_id, /*may_hold=*/true);
    }
    if (answer.has_value()) {
      if (c != nullptr) --c->held_polls;
      out.push_back({std::move(w->done), *std::move(answer)});
    } else {
      // Holding a long poll counts as being alive.
      if (c != nullptr) c->last_seen_ms = now;
      keep.push_back(std::move(w));
    }
  }
  waiters_ = std::move(keep);
  return out;
}

void Coordinator::ReleaseAllWaiters() {
  std::vector<Delivery> deliveries;
  DurabilityTicket ticket;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    deliveries = ResolveWaitersLocked(/*expire_all=*/true);
    ticket = pending_;
  }
  Deliver(std::move(deliveries), ticket);
}

absl::Status Coordinator::MaybeCloseSelectionLocked(bool force_window) {
  if (round_ == nullptr || round_->state != RoundState::kSelecting) return absl::OkStatus();
  RoundInfo& r = *round_;
  const int64_t now = Now();
  // Drop candidates that went silent or left: selecting them would waste a task.
  for (auto it = r.candidates.begin(); it != r.candidates.end();) {
    ClientEntry* c = clients_.Find(*it);
    if (c == nullptr || !clients_.IsLive(*c, now)) {
      it = r.candidates.erase(it);
    } else {
      ++it;
    }
  }
  const int64_t n = static_cast<int64_t>(r.candidates.size());
  const int64_t live = clients_.CountLive(now);
  const bool quota_reached = options_.select_when_quota_reached && n >= Quota();
  const bool everyone_waiting = n >= Target() && n >= live && live >= options_.expected_clients;
  const bool window_passed =
      r.first_candidate_ms != 0 && now - r.first_candidate_ms >= options_.selection_window_ms;
  if (!(quota_reached || everyone_waiting ||
        ((window_passed || force_window) && n >= MinClients()))) {
    return absl::OkStatus();
  }
  const std::vector<std::string> pool =
      SampleClients(options_.selection_seed != 0 ? options_.selection_seed : config_.seed(),
                    r.round, r.candidates, Quota());
  const int64_t deadline = now + options_.round_deadline_ms;
  DurabilityTicket ticket;
  FEDLORA_RETURN_IF_ERROR(store_->RecordSelection(run_id_, r.round, pool, deadline, &ticket));
  DeferLocked(ticket);
  FEDLORA_RETURN_IF_ERROR(store_->SetRoundState(run_id_, r.round, RoundState::kTraining, &ticket));
  DeferLocked(ticket);
  r.selected.insert(pool.begin(), pool.end());
  r.deadline_ms = deadline;
  r.state = RoundState::kTraining;
  r.candidates.clear();
  if (secagg_.has_value()) FEDLORA_RETURN_IF_ERROR(StartSecAggLocked());
  FEDLORA_LOG(DEBUG) << "round " << r.round << ": selected " << pool.size() << " of " << n
                     << " waiting clients";
  return absl::OkStatus();
}

absl::Status Coordinator::MaybeCloseRoundLocked() {
  if (round_ == nullptr || round_->state != RoundState::kTraining) return absl::OkStatus();
  RoundInfo& r = *round_;
  const int64_t accepted = static_cast<int64_t>(r.accepted.size());
  int64_t target = Target();
  if (const std::optional<int64_t> cap = r.secagg ? r.secagg->UploadCap() : std::nullopt) {
    // Only the clients that shared their keys can upload.
    target = std::min<int64_t>(target, *cap);
  }
  const bool target_met = accepted >= target;
  // Sites that failed (left with an error) will not deliver: when they are all the round still
  // waits for, waiting for the deadline gains nothing. (A secure-aggregation round keeps its own
  // step clock: its dropouts are part of the protocol.)
  std::vector<std::string> failed;
  bool only_failed_remain = r.secagg == nullptr;
  for (const std::string& id : r.selected) {
    if (r.accepted.count(id) != 0) continue;
    const ClientEntry* c = clients_.Find(id);
    if (c != nullptr && c->left && !c->failure.empty()) {
      failed.push_back(id);
    } else {
      only_failed_remain = false;
    }
  }
  only_failed_remain = only_failed_remain && !failed.empty();
  const bool deadline_passed = Now() >= r.deadline_ms || only_failed_remain;
  DurabilityTicket ticket;
  if (target_met || (deadline_passed && accepted >= MinClients())) {
    FEDLORA_RETURN_IF_ERROR(
        store_->SetRoundState(run_id_, r.round, RoundState::kAggregating, &ticket));
    DeferLocked(ticket);
    r.state = RoundState::kAggregating;
    aggregation_failures_ = 0;
    aggregation_retry_at_ms_ = 0;
    FEDLORA_LOG(DEBUG) << "round " << r.round << " closed with " << accepted << " updates"
                       << (target_met           ? ""
                           : only_failed_remain ? " (the other selected sites failed)"
                                                : " at its deadline");
    return absl::OkStatus();
  }
  if (only_failed_remain) {
    return AbandonRoundLocked(absl::StrCat(
        accepted, " updates, ", MinClients(), " needed, and every selected site still due (",
        absl::StrJoin(failed, ", "), ") failed; retrying as a new round"));
  }
  if (deadline_passed) {
    return AbandonRoundLocked(absl::StrCat(accepted, " updates by the deadline, ", MinClients(),
                                           " needed; retrying as a new round"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::AbandonRoundLocked(const std::string& why) {
  DurabilityTicket ticket;
  const int64_t round = round_->round;
  FEDLORA_RETURN_IF_ERROR(store_->SetRoundState(run_id_, round, RoundState::kAbandoned, &ticket));
  DeferLocked(ticket);
  FEDLORA_LOG(WARNING) << "round " << round << " abandoned: " << why;
  metrics_->rounds_abandoned.fetch_add(1);
  round_.reset();
  return OpenNextRoundLocked();
}

}  // namespace fedlora
