// The admin view: GetStatus, ListClients and BlockClient.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
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

namespace fedlora {

// ------------------------------------------------------------------------------------------------
// Admin

namespace {

// What GetStatus reads of a committed round from the store (before the coordinator's lock): the
// examples of its accepted updates, and their clients' reported train_loss_last weighted by those
// examples.
struct RoundFromStore {
  uint64_t examples = 0;
  double loss_sum = 0, loss_weight = 0;
};

absl::StatusOr<RoundFromStore> ReadRoundFromStore(Store& store, const std::string& run_id,
                                                  int64_t round) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UploadRecord> ups, store.ListAcceptedUploads(run_id, round));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<MetricRecord> metrics, store.ListMetrics(run_id, round));
  std::map<std::string, double> loss_last;
  for (const MetricRecord& m : metrics) {
    if (m.key == "train/loss_last") loss_last[m.client_id] = m.value;
  }
  RoundFromStore f;
  for (const UploadRecord& u : ups) {
    f.examples += static_cast<uint64_t>(u.num_examples);
    auto it = loss_last.find(u.client_id);
    if (it == loss_last.end()) continue;
    f.loss_sum += static_cast<double>(u.num_examples) * it->second;
    f.loss_weight += static_cast<double>(u.num_examples);
  }
  return f;
}

// One key of a committed round's metrics_json into its summary.
void SetSummaryMetric(const std::string& k, double d, v1::RoundSummary* s) {
  if (k == "updates") {
    s->set_updates_accepted(static_cast<uint32_t>(d));
  } else if (k == "updates_rejected") {
    s->set_updates_rejected(static_cast<uint32_t>(d));
  } else if (k == "upload_bytes") {
    s->set_upload_bytes(static_cast<uint64_t>(d));
  } else if (k == "update_fp32_bytes") {
    s->set_update_fp32_bytes(static_cast<uint64_t>(d));
  } else if (k == "download_bytes") {
    s->set_download_bytes(static_cast<uint64_t>(d));
  } else if (k == "download_full_bytes") {
    s->set_download_full_bytes(static_cast<uint64_t>(d));
  } else if (k == "eval_loss") {
    s->set_eval_loss(d);
  } else if (k == "eval_accuracy") {
    s->set_eval_accuracy(d);
  } else if (k == "dp_epsilon") {
    s->set_dp_epsilon(d);
  } else if (k.rfind("dp_", 0) == 0) {
    // The rest of the round's DP record (noise multiplier, rate, clip norms) is the accountant's.
  } else {
    (*s->mutable_eval_metrics())[k] = d;
  }
}

// The history entry of committed round `r`.
void SummarizeRound(const RoundRecord& r, const RoundFromStore& f, v1::RoundSummary* s) {
  s->set_round(static_cast<uint64_t>(r.round));
  s->set_clients_selected(static_cast<uint32_t>(r.selected_clients.size()));
  s->set_started_unix_ms(r.created_unix_ms);
  s->set_committed_unix_ms(r.updated_unix_ms);
  s->set_global_adapter_sha256(r.result_adapter_hash);
  const nlohmann::json m =
      nlohmann::json::parse(r.metrics_json, nullptr, /*allow_exceptions=*/false);
  if (m.is_object()) {
    for (const auto& [k, v] : m.items()) {
      if (v.is_number()) SetSummaryMetric(k, v.get<double>(), s);
    }
    // Updates that arrived complete: the accepted ones and those refused at validation.
    s->set_updates_received(s->updates_accepted() + s->updates_rejected());
  }
  s->set_clients_dropped(s->clients_selected() > s->updates_accepted()
                             ? s->clients_selected() - s->updates_accepted()
                             : 0);
  s->set_examples(f.examples);
  if (f.loss_weight > 0) s->set_mean_train_loss(f.loss_sum / f.loss_weight);
}

}  // namespace

absl::StatusOr<v1::GetStatusResponse> Coordinator::GetStatus(const v1::GetStatusRequest& request) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store_->ListRounds(run_id_));
  std::vector<const RoundRecord*> committed;
  for (const RoundRecord& r : rounds) {
    if (r.state == RoundState::kCommitted) committed.push_back(&r);
  }
  size_t first = 0;
  if (request.max_history() > 0 && committed.size() > request.max_history()) {
    first = committed.size() - request.max_history();
  }
  std::vector<RoundFromStore> from_store;  // per round of the history, read before mu_ is taken
  for (size_t i = first; i < committed.size(); ++i) {
    FEDLORA_ASSIGN_OR_RETURN(from_store.emplace_back(),
                             ReadRoundFromStore(*store_, run_id_, committed[i]->round));
  }
  absl::MutexLock lock(&mu_);
  v1::GetStatusResponse response;
  response.set_run_id(run_id_);
  response.set_total_rounds(static_cast<uint64_t>(TotalRounds()));
  response.set_server_start_unix_ms(start_ms_);
  if (!restored_) {
    response.set_phase(v1::ROUND_PHASE_RESTORING);
    return response;
  }
  const int64_t now = Now();
  const auto live = static_cast<uint32_t>(clients_.CountLive(now));
  response.set_connected_clients(live);
  if (finished_) {
    response.set_phase(v1::ROUND_PHASE_FINISHED);
    response.set_current_round(static_cast<uint64_t>(last_committed_round_));
  } else if (round_ != nullptr) {
    response.set_current_round(static_cast<uint64_t>(round_->round));
    response.set_round_start_unix_ms(round_->started_ms);
    response.set_updates_accepted_this_round(static_cast<uint32_t>(round_->accepted.size()));
    switch (round_->state) {
      case RoundState::kSelecting:
        response.set_phase(v1::ROUND_PHASE_WAITING_FOR_CLIENTS);
        break;
      case RoundState::kTraining:
        response.set_phase(v1::ROUND_PHASE_TRAINING);
        response.set_active_tasks(
            static_cast<uint32_t>(round_->selected.size() - round_->accepted.size()));
        break;
      default:
        response.set_phase(v1::ROUND_PHASE_AGGREGATING);
        break;
    }
  }
  *response.mutable_global_adapter() = ManifestLocked(global_hash_, global_round_, global_bytes_);
  if (dp_.has_value()) {
    response.set_dp_epsilon(dp_->epsilon());
    response.set_dp_target_delta(dp_->target_delta());
    if (dp_->max_epsilon().has_value()) response.set_dp_max_epsilon(*dp_->max_epsilon());
    response.set_dp_clip_norm(dp_->clip_norm());
    response.set_dp_sampling_rate(dp_->sampling_rate());
    response.set_dp_noise_multiplier(dp_->accounted_noise_multiplier());
    response.set_dp_sensitivity(dp_->sensitivity());
    response.set_dp_assumptions(dp_->Assumptions());
    response.set_privacy_budget_spent(finished_ && stopped_.ok() &&
                                      TotalRounds() < ConfiguredRounds(config_));
  }
  for (size_t i = first; i < committed.size(); ++i)
    SummarizeRound(*committed[i], from_store[i - first], response.add_history());
  return response;
}

v1::ClientInfo Coordinator::ClientInfoLocked(const ClientEntry& c, int64_t now) const {
  v1::ClientInfo info;
  info.set_client_id(c.id);
  if (c.left) {
    info.set_state(c.failure.empty() ? v1::CLIENT_STATE_LEFT : v1::CLIENT_STATE_FAILED);
    info.set_failure(c.failure);
  } else {
    info.set_state(clients_.IsLive(c, now) ? c.reported : v1::CLIENT_STATE_DISCONNECTED);
  }
  info.set_peer(c.peer);
  info.set_client_version(c.client_version);
  info.set_cert_fingerprint(c.cert_fingerprint);
  info.set_device_name(c.device_name);
  info.set_has_cuda(c.has_cuda);
  info.set_joined_unix_ms(c.joined_ms);
  info.set_last_seen_unix_ms(c.last_seen_ms);
  if (round_ != nullptr && round_->state == RoundState::kTraining &&
      round_->selected.count(c.id) != 0 && round_->accepted.count(c.id) == 0) {
    info.set_current_task_id(TaskIdFor(round_->round, c.id));
    if (c.progress_task == info.current_task_id()) {
      info.set_steps_done(c.steps_done);
      info.set_steps_total(c.steps_total);
    }
  }
  info.set_rounds_participated(static_cast<uint32_t>(c.rounds_participated));
  info.set_updates_rejected(static_cast<uint32_t>(c.updates_rejected));
  info.set_blocked(c.blocked);
  return info;
}

absl::StatusOr<v1::ListClientsResponse> Coordinator::ListClients(
    const v1::ListClientsRequest& request) {
  absl::MutexLock lock(&mu_);
  const int64_t now = Now();
  v1::ListClientsResponse response;
  for (const auto& [id, c] : clients_) {
    if (!clients_.IsLive(*c, now) && !request.include_inactive()) continue;
    *response.add_clients() = ClientInfoLocked(*c, now);
  }
  return response;
}

absl::StatusOr<v1::BlockClientResponse> Coordinator::BlockClient(
    const v1::BlockClientRequest& request, const std::string& operator_id) {
  const std::string& id = request.client_id();
  // Durable before it takes effect, so that a restart keeps it. A site not seen yet gets its row now.
  absl::StatusOr<ClientRecord> known = store_->GetClient(id);
  if (absl::IsNotFound(known.status())) known = store_->UpsertClient(id, /*cert_fingerprint=*/"");
  FEDLORA_RETURN_IF_ERROR(known.status());
  FEDLORA_RETURN_IF_ERROR(
      store_->SetClientState(id, request.blocked() ? ClientState::kBlocked : ClientState::kActive));
  std::vector<Delivery> deliveries;
  DurabilityTicket ticket;
  v1::BlockClientResponse response;
  {
    absl::MutexLock lock(&mu_);
    bool created = false;
    ClientEntry& c = clients_.FindOrAdd(id, &created);
    if (created) {
      c.joined_ms = known->first_seen_unix_ms;
      c.last_seen_ms = known->last_seen_unix_ms;
      c.reported = v1::CLIENT_STATE_DISCONNECTED;
    }
    c.blocked = request.blocked();
    if (c.blocked) {
      // Its session ends and its held polls are answered; not live, it cannot be selected, and a
      // task it holds goes to a replacement as a silent client's would.
      c.session.clear();
      if (round_ != nullptr) round_->candidates.erase(id);
      deliveries = ResolveWaitersLocked(/*expire_all=*/false);
      ticket = pending_;
    }
    UpdateClientGaugesLocked();
    FEDLORA_LOG(WARNING) << "client " << id << (c.blocked ? " blocked" : " unblocked")
                         << " by operator " << operator_id << (request.reason().empty() ? "" : ": ")
                         << request.reason();
    *response.mutable_client() = ClientInfoLocked(c, Now());
  }
  Deliver(std::move(deliveries), ticket);
  return response;
}

}  // namespace fedlora
