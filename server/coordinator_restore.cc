// Restore: the run loaded from the store (or created), in steps: the secrets, the run's row, the
// garbage collection, the committed rounds and their adapters, privacy, the server optimizer, the
// clients, then the open round resumed (its key: RestoreRoundKeyLocked) or the next one opened.
#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/config_io.h"
#include "config/federated_tensors.h"
#include "core/file.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/strings.h"
#include "server/adapter_io.h"
#include "server/audit_trail.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/round_aggregator.h"

namespace fedlora {

namespace {

// A blob the run needs to resume is damaged: an error naming the round, the blob and the commands
// that diagnose and repair it (tools/cmd_store.cc), with the blob store's own code and text.
absl::Status ResumeBlobError(const absl::Status& s, int64_t round, absl::string_view what,
                             const std::string& hash, const std::string& data_dir,
                             const std::string& run_id) {
  const std::string where =
      round == 0 ? std::string("the run's") : absl::StrCat("round ", round, "'s");
  const std::string args = absl::StrCat("--store ", data_dir, " --run-id ", run_id);
  return absl::Status(
      s.code(),
      absl::StrCat(where, " ", what, " (blob ", hash, ") cannot be read: ", s.message(),
                   ". The server cannot resume run '", run_id, "' without it: run `fedlora ",
                   "store verify ", args, "` to see what is damaged, then `fedlora store ",
                   "repair ", args, "` (add --rewind to roll the run back to its newest ",
                   "intact round)"));
}

}  // namespace

absl::Status Coordinator::LoadSecretsLocked() {
  FEDLORA_ASSIGN_OR_RETURN(
      keys_,
      RoundKeys::Open(options_.key_dir.empty() ? options_.data_dir + "/keys" : options_.key_dir,
                      run_id_));
  if (options_.tls.enabled()) {
    FEDLORA_ASSIGN_OR_RETURN(signing_key_pem_, ReadFileToString(options_.tls.key_file));
    FEDLORA_ASSIGN_OR_RETURN(signing_chain_pem_, ReadFileToString(options_.tls.cert_file));
  }
  if (!options_.audit_public_key_file.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(audit_public_key_, LoadAuditPublicKey(options_.audit_public_key_file));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::CreateRunIfNewLocked() {
  std::string initial_hash;
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RunRecord> runs, store_->ListRuns());
  const bool exists = std::any_of(runs.begin(), runs.end(),
                                  [&](const RunRecord& r) { return r.run_id == run_id_; });
  if (!exists) {
    FEDLORA_RETURN_IF_ERROR(CanonicalizeAdapter(initial_adapter_));
    if (initial_adapter_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("run '", run_id_, "' is new but no initial adapter was given"));
    }
    FEDLORA_ASSIGN_OR_RETURN(std::string bytes, AdapterToSafetensors(initial_adapter_));
    FEDLORA_ASSIGN_OR_RETURN(initial_hash, blobs_->Put(bytes));
    nlohmann::json meta;
    meta["initial_adapter_sha256"] = initial_hash;
    meta["run_config"] = RunConfigToJson(config_);
    FEDLORA_RETURN_IF_ERROR(store_->CreateRun(run_id_, meta.dump()));
    FEDLORA_LOG(INFO) << "run " << run_id_ << " created; initial adapter " << initial_hash;
  }
  return initial_hash;
}

absl::Status Coordinator::CollectGarbageLocked(const std::string& initial_hash) {
  // Nothing writes blobs yet, so this is the moment to drop what no row points to: blobs of refused
  // updates, and of updates committed to disk by a crashed server before it recorded them (their
  // clients upload them again). Partial uploads are kept for resumption.
  {
    // Retention first (a round may have closed after the last pass): the collection below then
    // deletes the pruned rounds' blobs too.
    FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> before, store_->ListRounds(run_id_));
    if (const int64_t keep_from = RetentionKeepFrom(before); keep_from > 0) {
      FEDLORA_RETURN_IF_ERROR(store_->PruneRoundBlobs(run_id_, keep_from).status());
      pruned_from_ = keep_from;
      retained_from_.store(keep_from);  // the collection below deletes the blobs
    }
    FEDLORA_ASSIGN_OR_RETURN(absl::flat_hash_set<std::string> referenced,
                             store_->ReferencedBlobHashes());
    referenced.insert(initial_hash);
    FEDLORA_ASSIGN_OR_RETURN(BlobGcStats gc, blobs_->CollectGarbage(referenced));
    if (gc.blobs_deleted > 0) {
      FEDLORA_LOG(INFO) << "removed " << gc.blobs_deleted << " unreferenced blobs ("
                        << gc.bytes_deleted << " bytes)";
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Coordinator::CommittedHeads> Coordinator::RestoreCommittedLocked(
    const std::vector<RoundRecord>& rounds, const std::string& initial_hash) {
  absl::StatusOr<int64_t> initial_size = blobs_->Size(initial_hash);
  if (!initial_size.ok()) {
    return ResumeBlobError(initial_size.status(), 0, "initial adapter", initial_hash,
                           options_.data_dir, run_id_);
  }
  downloadable_[initial_hash] = {0, *initial_size, false};
  downlink_steps_.clear();
  rounds_committed_ = 0;
  CommittedHeads h{initial_hash, initial_hash, 0, 0};
  std::string& current_hash = h.global;
  std::string& current_broadcast = h.broadcast;
  int64_t& current_round = h.round;
  int64_t& broadcast_round = h.broadcast_round;
  auto ResumeSize = [&](int64_t round, absl::string_view what,
                        const std::string& hash) -> absl::StatusOr<int64_t> {
    absl::StatusOr<int64_t> size = blobs_->Size(hash);
    if (!size.ok())
      return ResumeBlobError(size.status(), round, what, hash, options_.data_dir, run_id_);
    return size;
  };
  for (const RoundRecord& r : rounds) {
    if (r.state != RoundState::kCommitted) continue;
    ++rounds_committed_;
    if (r.result_adapter_hash.empty()) {  // pruned by retention: counted, nothing to serve
      current_broadcast.clear();
      continue;
    }
    FEDLORA_ASSIGN_OR_RETURN(int64_t size,
                             ResumeSize(r.round, "result adapter", r.result_adapter_hash));
    downloadable_[r.result_adapter_hash] = {r.round, size, false};
    current_hash = r.result_adapter_hash;
    current_round = r.round;
    if (r.broadcast_hash.empty()) {
      current_broadcast = r.result_adapter_hash;
    } else {
      FEDLORA_ASSIGN_OR_RETURN(int64_t broadcast_size,
                               ResumeSize(r.round, "broadcast adapter", r.broadcast_hash));
      FEDLORA_ASSIGN_OR_RETURN(int64_t delta_size,
                               ResumeSize(r.round, "broadcast delta", r.broadcast_delta_hash));
      downloadable_[r.broadcast_hash] = {r.round, broadcast_size, false};
      downloadable_[r.broadcast_delta_hash] = {r.round, delta_size, true};
      downlink_steps_.push_back(
          {r.round, current_broadcast, r.broadcast_delta_hash, r.broadcast_hash, delta_size});
      current_broadcast = r.broadcast_hash;
    }
    broadcast_round = r.round;
  }
  return h;
}

absl::Status Coordinator::LoadAdaptersLocked(const CommittedHeads& h) {
  const std::string& current_hash = h.global;
  const std::string& current_broadcast = h.broadcast;
  const int64_t current_round = h.round, broadcast_round = h.broadcast_round;
  last_committed_round_ = current_round;
  absl::StatusOr<std::string> bytes_or = blobs_->Get(current_hash);
  if (!bytes_or.ok()) {
    return ResumeBlobError(
        bytes_or.status(), current_round,
        current_round == 0 ? "initial adapter" : "result adapter (the current global adapter)",
        current_hash, options_.data_dir, run_id_);
  }
  std::string bytes = *std::move(bytes_or);
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> restored, AdapterFromSafetensors(bytes));
  global_ = std::make_shared<const std::vector<UpdateTensor>>(std::move(restored));
  global_hash_ = current_hash;
  global_bytes_ = static_cast<int64_t>(bytes.size());
  global_round_ = current_round;
  broadcast_ = global_;
  broadcast_hash_ = global_hash_;
  broadcast_bytes_ = global_bytes_;
  broadcast_round_ = broadcast_round;
  if (current_broadcast != current_hash) {
    absl::StatusOr<std::string> b_or = blobs_->Get(current_broadcast);
    if (!b_or.ok()) {
      return ResumeBlobError(b_or.status(), broadcast_round,
                             "broadcast adapter (what clients train from next)", current_broadcast,
                             options_.data_dir, run_id_);
    }
    std::string b = *std::move(b_or);
    FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> adapter, AdapterFromSafetensors(b));
    broadcast_ = std::make_shared<const std::vector<UpdateTensor>>(std::move(adapter));
    broadcast_hash_ = current_broadcast;
    broadcast_bytes_ = static_cast<int64_t>(b.size());
  }
  global_elements_ = 0;
  spec_elements_ = 0;
  spec_.clear();
  for (const UpdateTensor& t : *global_) {
    global_elements_ += static_cast<int64_t>(t.values.size());
    if (!IsFederated(t.name, config_)) continue;  // lora.freeze_a's lora_A: never in an update
    spec_.push_back({t.name, t.shape});
    spec_elements_ += static_cast<int64_t>(t.values.size());
  }
  if (spec_.empty()) {
    return absl::FailedPreconditionError(
        "the adapter has no tensor this run federates (lora.freeze_a leaves out every lora_A)");
  }
  return absl::OkStatus();
}

absl::Status Coordinator::RestorePrivacyLocked(const std::vector<RoundRecord>& rounds) {
  if (config_.privacy().secure_aggregation()) {
    FEDLORA_ASSIGN_OR_RETURN(secagg_, SecAggEncoding::For(config_, MinClients(), Quota()));
  } else {
    secagg_.reset();
  }
  // Under secure aggregation a client's contribution is its clipped update rounded to the fixed
  // point: up to this much more than the clip norm, which the accountant must assume.
  const double encoding_bound =
      secagg_.has_value() ? FixedPointRoundingBound(secagg_->frac_bits, spec_elements_) : 0;
  FEDLORA_ASSIGN_OR_RETURN(
      dp_, ServerDp::Create(config_, rounds, MinClients(), Quota(), encoding_bound));
  if (dp_.has_value() && encoding_bound > 0) {
    FEDLORA_LOG(INFO) << "differential privacy with secure aggregation: the fixed point ("
                      << secagg_->frac_bits << " fraction bits, " << spec_elements_
                      << " values) adds up to " << encoding_bound
                      << " to an update's norm; the accountant takes the sensitivity "
                      << dp_->clip_norm() << " + " << encoding_bound;
  }
  const int64_t configured = ConfiguredRounds(config_);
  affordable_rounds_ =
      dp_.has_value() ? dp_->AffordableRounds(rounds_committed_, configured) : configured;
  if (dp_.has_value()) {
    metrics_->dp_epsilon_micro.store(static_cast<int64_t>(std::llround(dp_->epsilon() * 1e6)));
    FEDLORA_LOG(INFO) << "differential privacy: epsilon " << dp_->epsilon() << " at delta "
                      << dp_->target_delta() << " after " << rounds_committed_
                      << " rounds; clip norm " << dp_->clip_norm()
                      << (affordable_rounds_ < configured
                              ? absl::StrCat("; the budget affords ", affordable_rounds_,
                                             " of the ", configured, " configured rounds")
                              : std::string());
  }
  return absl::OkStatus();
}

absl::Status Coordinator::RestoreOptimizerLocked(const std::vector<RoundRecord>& rounds,
                                                 int64_t current_round) {
  FEDLORA_ASSIGN_OR_RETURN(ServerOptimizerOptions opt_options,
                           ServerOptimizerOptionsFromConfig(config_.aggregation()));
  FEDLORA_ASSIGN_OR_RETURN(ServerOptimizer opt, ServerOptimizer::Create(opt_options, spec_));
  if (opt.stateful() && current_round > 0) {
    // The state saved with the last committed round: momentum or moments continue exactly.
    const auto last = std::find_if(rounds.rbegin(), rounds.rend(), [&](const RoundRecord& r) {
      return r.state == RoundState::kCommitted && r.round == current_round;
    });
    if (last == rounds.rend() || last->server_state_hash.empty()) {
      return absl::DataLossError(absl::StrCat(
          "round ", current_round, " was committed without a server optimizer state, ",
          "but this run's aggregation (", ToAbsl(ServerOptimizerName(opt_options.kind)),
          ") keeps one; was the run's config changed?"));
    }
    absl::StatusOr<std::string> state = blobs_->Get(last->server_state_hash);
    if (!state.ok()) {
      return ResumeBlobError(state.status(), current_round, "server optimizer state",
                             last->server_state_hash, options_.data_dir, run_id_);
    }
    FEDLORA_RETURN_IF_ERROR_CTX(opt.LoadState(*state), absl::StrCat("round ", current_round));
  }
  server_opt_.emplace(std::move(opt));

  return absl::OkStatus();
}

absl::Status Coordinator::RestoreClientsLocked(const std::vector<RoundRecord>& rounds) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<ClientRecord> known, store_->ListClients());
  for (const ClientRecord& c : known) {
    ClientEntry& entry = clients_.FindOrAdd(c.client_id);
    entry.cert_fingerprint = c.cert_fingerprint;
    entry.joined_ms = c.first_seen_unix_ms;
    entry.last_seen_ms = c.last_seen_unix_ms;
    entry.reported = v1::CLIENT_STATE_DISCONNECTED;
    entry.blocked = c.state == ClientState::kBlocked;
  }
  for (const RoundRecord& r : rounds) {
    if (r.state != RoundState::kCommitted) continue;
    FEDLORA_ASSIGN_OR_RETURN(std::vector<UploadRecord> ups,
                             store_->ListAcceptedUploads(run_id_, r.round));
    for (const UploadRecord& u : ups) {
      if (ClientEntry* c = clients_.Find(u.client_id)) ++c->rounds_participated;
    }
  }

  return absl::OkStatus();
}

absl::Status Coordinator::Restore() {
  absl::MutexLock lock(&mu_);
  FEDLORA_RETURN_IF_ERROR(LoadSecretsLocked());
  FEDLORA_ASSIGN_OR_RETURN(std::string initial_hash, CreateRunIfNewLocked());
  // The initial adapter now lives in the blob store (and, below, in global_): holding it too would
  // keep a second copy of the model for the life of the process.
  std::vector<UpdateTensor>().swap(initial_adapter_);
  FEDLORA_ASSIGN_OR_RETURN(RecoveredState st, store_->LoadLatestState(run_id_));
  if (initial_hash.empty()) {
    const nlohmann::json meta =
        nlohmann::json::parse(st.run.config_json, nullptr, /*allow_exceptions=*/false);
    if (!meta.is_object() || !meta.contains("initial_adapter_sha256") ||
        !meta["initial_adapter_sha256"].is_string()) {
      return absl::DataLossError(
          absl::StrCat("run '", run_id_, "' in the store has no initial adapter hash"));
    }
    initial_hash = meta["initial_adapter_sha256"].get<std::string>();
  }

  FEDLORA_RETURN_IF_ERROR(CollectGarbageLocked(initial_hash));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store_->ListRounds(run_id_));
  FEDLORA_ASSIGN_OR_RETURN(const CommittedHeads heads,
                           RestoreCommittedLocked(rounds, initial_hash));
  FEDLORA_RETURN_IF_ERROR(LoadAdaptersLocked(heads));
  FEDLORA_RETURN_IF_ERROR(RestorePrivacyLocked(rounds));
  FEDLORA_RETURN_IF_ERROR(RestoreOptimizerLocked(rounds, heads.round));
  FEDLORA_RETURN_IF_ERROR(RestoreClientsLocked(rounds));

  const int64_t total_rounds = TotalRounds();
  if (st.open_round.has_value()) {
    const RoundRecord& r = *st.open_round;
    round_ = std::make_unique<RoundInfo>();
    round_->round = r.round;
    round_->state = r.state;
    round_->started_ms = r.created_unix_ms;
    round_->deadline_ms = r.deadline_unix_ms;
    round_->selected.insert(r.selected_clients.begin(), r.selected_clients.end());
    for (const UploadRecord& u : st.accepted_uploads) round_->accepted[u.client_id] = u.upload_id;
    if (r.global_adapter_hash != broadcast_hash_) {
      return absl::DataLossError(
          absl::StrCat("open round ", r.round, " trains from adapter ", r.global_adapter_hash,
                       " but the last committed round's clients train from ", broadcast_hash_));
    }
    FEDLORA_RETURN_IF_ERROR(
        RestoreRoundKeyLocked(r, static_cast<int64_t>(st.accepted_uploads.size())));
    if (round_ != nullptr && round_->round == r.round) {
      FEDLORA_LOG(INFO) << "resuming round " << r.round << " (" << RoundStateName(r.state) << ", "
                        << round_->accepted.size() << " updates accepted, "
                        << st.receiving_uploads.size() << " uploads resumable)";
    }
  } else if (rounds_committed_ >= total_rounds) {
    finished_ = true;
  }
  if (round_ != nullptr && secagg_.has_value() && round_->state != RoundState::kSelecting) {
    // Its keys and shares were in the previous process's memory only: start the round afresh.
    FEDLORA_RETURN_IF_ERROR(
        AbandonRoundLocked("its secure aggregation cannot resume after a restart"));
  }
  // Keys of rounds that closed before a crash let them be destroyed; their sealed updates went with
  // the garbage collection above.
  for (const RoundRecord& r : rounds) {
    if (r.state == RoundState::kCommitted || r.state == RoundState::kAbandoned)
      forgotten_through_ = r.round;
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<int64_t> keyed, keys_->List());
  for (int64_t k : keyed) {
    if (round_ == nullptr || k != round_->round) FEDLORA_RETURN_IF_ERROR(keys_->Destroy(k));
  }
  // Protocol version 1's one key for the whole run: nothing sealed to it can be counted any more,
  // and kept it would let a copy of the disk open that version's uploads.
  FEDLORA_RETURN_IF_ERROR(keys_->DestroyRunKey());
  metrics_->rounds_committed.store(rounds_committed_);
  restored_ = true;
  if (!finished_ && round_ == nullptr) FEDLORA_RETURN_IF_ERROR(OpenNextRoundLocked());
  metrics_->current_round.store(round_ ? round_->round : last_committed_round_);
  UpdateClientGaugesLocked();
  return absl::OkStatus();
}

absl::Status Coordinator::RestoreRoundKeyLocked(const RoundRecord& r, int64_t accepted) {
  absl::StatusOr<AggregationKey> key = keys_->Load(r.round);
  if (key.ok() && !r.key_id.empty() && key->key_id != r.key_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", r.round, "'s aggregation key ", keys_->PathOf(r.round), " is ",
                     key->key_id, ", but the round's ", "updates are sealed to ", r.key_id,
                     ": restore the file that holds ", r.key_id, " (mode 0600)"));
  }
  if (absl::IsNotFound(key.status())) {
    if (accepted > 0 || r.state == RoundState::kAggregating) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", r.round, "'s aggregation key ", keys_->PathOf(r.round),
          " is missing, and the round's ", accepted, " accepted updates are sealed to it (",
          r.key_id.empty() ? "key id not recorded" : r.key_id,
          "): restore that file (mode 0600) from wherever the key directory (server.key_dir) is "
          "kept, and start "
          "the server again. The server will not start without it: it would count the round's "
          "updates as "
          "accepted yet never open them"));
    }
    // Nothing was accepted under the lost key: the round starts again under a new one.
    FEDLORA_LOG(WARNING) << "round " << r.round << "'s aggregation key " << keys_->PathOf(r.round)
                         << " is missing; no update was accepted under it";
    return AbandonRoundLocked("its aggregation key is missing");
  }
  FEDLORA_RETURN_IF_ERROR(key.status());
  FEDLORA_RETURN_IF_ERROR(SignRoundKey(r.round, *key));
  round_->key = std::make_shared<const AggregationKey>(*std::move(key));
  return absl::OkStatus();
}

}  // namespace fedlora
