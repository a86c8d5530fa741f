#include "server/coordinator.h"
#include "server/coordinator_internal.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "aggregation/fedavg.h"
#include "core/logging.h"
#include "crypto/random.h"
#include "crypto/sealed_update.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/strings.h"
#include "model/param.h"
#include "proto/config_io.h"
#include "proto/wire.h"
#include "server/adapter_io.h"
#include "server/crash_point.h"
#include <nlohmann/json.hpp>

namespace fedlora {

int64_t SystemClockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

// The server optimizer a run's aggregation config asks for. Unimplemented for the robust
// strategies, which need every update in memory at once rather than the streaming mean.
absl::StatusOr<ServerOptimizerOptions> ServerOptimizerOptionsFromConfig(const v1::AggregationConfig& a) {
  ServerOptimizerOptions o;
  switch (a.strategy()) {
    case v1::AggregationConfig::STRATEGY_UNSPECIFIED:
    case v1::AggregationConfig::FEDAVG:
    case v1::AggregationConfig::FEDPROX:
      o.kind = ServerOptimizerKind::kSgd;
      break;
    case v1::AggregationConfig::FEDADAM:
      o.kind = ServerOptimizerKind::kAdam;
      break;
    case v1::AggregationConfig::FEDYOGI:
      o.kind = ServerOptimizerKind::kYogi;
      break;
    case v1::AggregationConfig::FEDADAGRAD:
      o.kind = ServerOptimizerKind::kAdagrad;
      break;
    default:
      return absl::UnimplementedError(absl::StrCat("aggregation.strategy ",
                                                   v1::AggregationConfig::Strategy_Name(a.strategy()),
                                                   " is not implemented by the server yet; use FEDAVG, FEDPROX, "
                                                   "FEDADAM, FEDYOGI or FEDADAGRAD"));
  }
  const bool adaptive = o.kind != ServerOptimizerKind::kSgd;
  o.learning_rate = a.has_server_learning_rate() ? a.server_learning_rate() : (adaptive ? 0.01 : 1.0);
  o.momentum = a.server_momentum();
  if (a.has_server_beta1()) o.beta1 = a.server_beta1();
  if (a.has_server_beta2()) o.beta2 = a.server_beta2();
  if (a.has_server_tau()) o.tau = a.server_tau();
  return o;
}

// splitmix64: a tiny, well-mixed PRNG step. Selection only needs a reproducible shuffle from a seed,
// not cryptographic strength.
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t DigestPrefix64(const std::string& text) {
  const Sha256DigestBytes d = Sha256Digest(text);
  uint64_t v = 0;
  std::memcpy(&v, d.data(), sizeof(v));
  return v;
}




}  // namespace

Coordinator::Coordinator(ServerOptions options, v1::RunConfig config, std::vector<UpdateTensor> initial_adapter,
                         Store* store, BlobStore* blobs, Evaluator* evaluator, ServerMetrics* metrics, Clock clock)
    : options_(std::move(options)),
      config_(std::move(config)),
      run_id_(config_.run_id().empty() ? "default" : config_.run_id()),
      initial_adapter_(std::move(initial_adapter)),
      store_(store),
      blobs_(blobs),
      evaluator_(evaluator),
      metrics_(metrics),
      clock_(clock ? std::move(clock) : Clock(SystemClockMs)),
      start_ms_(clock_()) {}

Coordinator::~Coordinator() { ReleaseAllWaiters(); }

int64_t Coordinator::Target() const {
  return std::max<int64_t>(1, config_.selection().has_clients_per_round() ? config_.selection().clients_per_round() : 10);
}
int64_t Coordinator::Quota() const {
  const double over = config_.selection().has_over_selection() ? config_.selection().over_selection() : 1.3;
  // The small epsilon keeps 10 * 1.3 = 13.000000000000002 from becoming 14.
  return std::max<int64_t>(Target(), static_cast<int64_t>(std::ceil(static_cast<double>(Target()) * over - 1e-9)));
}
int64_t Coordinator::MinClients() const {
  if (config_.selection().has_min_clients()) return std::max<int64_t>(1, config_.selection().min_clients());
  return CeilDiv(Target(), 2);
}

bool Coordinator::restored() const {
  absl::MutexLock lock(&mu_);
  return restored_;
}
bool Coordinator::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}
int64_t Coordinator::rounds_committed() const {
  absl::MutexLock lock(&mu_);
  return rounds_committed_;
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

bool Coordinator::IsLive(const ClientEntry& c, int64_t now) const {
  return !c.session.empty() && !c.left && now - c.last_seen_ms <= options_.heartbeat_timeout_ms;
}

std::string Coordinator::TaskIdFor(int64_t round, const std::string& client_id) const {
  // Deterministic, so a restarted server recognises the tasks it handed out before the crash, and
  // bound to (run, round, client): a client cannot use another client's task id.
  return absl::StrCat("r", round, "-", Sha256Hex(absl::StrCat(run_id_, "\n", round, "\n", client_id)).substr(0, 24));
}

uint64_t Coordinator::TaskSeedFor(int64_t round, const std::string& client_id) const {
  return DigestPrefix64(absl::StrCat("task-seed\n", config_.seed(), "\n", round, "\n", client_id));
}

Coordinator::ClientEntry* Coordinator::FindClientLocked(const std::string& client_id) {
  auto it = clients_.find(client_id);
  return it == clients_.end() ? nullptr : it->second.get();
}

void Coordinator::UpdateClientGaugesLocked() {
  const int64_t now = Now();
  int64_t live = 0;
  for (const auto& [id, c] : clients_) live += IsLive(*c, now) ? 1 : 0;
  metrics_->clients_registered.store(static_cast<int64_t>(clients_.size()));
  metrics_->clients_live.store(live);
}

// ------------------------------------------------------------------------------------------------
// Restore

absl::Status Coordinator::Restore() {
  absl::MutexLock lock(&mu_);
  FEDLORA_ASSIGN_OR_RETURN(aggregation_key_, LoadOrCreateAggregationKey(options_.data_dir, run_id_));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RunRecord> runs, store_->ListRuns());
  const bool exists =
      std::any_of(runs.begin(), runs.end(), [&](const RunRecord& r) { return r.run_id == run_id_; });
  std::string initial_hash;
  if (!exists) {
    FEDLORA_RETURN_IF_ERROR(CanonicalizeAdapter(initial_adapter_));
    if (initial_adapter_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("run '", run_id_, "' is new but no initial adapter was given"));
    }
    FEDLORA_ASSIGN_OR_RETURN(std::string bytes, AdapterToSafetensors(initial_adapter_));
    FEDLORA_ASSIGN_OR_RETURN(initial_hash, blobs_->Put(bytes));
    nlohmann::json meta;
    meta["initial_adapter_sha256"] = initial_hash;
    meta["run_config"] = RunConfigToJson(config_);
    FEDLORA_RETURN_IF_ERROR(store_->CreateRun(run_id_, meta.dump()));
    FEDLORA_LOG(INFO) << "run " << run_id_ << " created; initial adapter " << initial_hash;
  }
  // The initial adapter now lives in the blob store (and, below, in global_): holding it too would
  // keep a second copy of the model for the life of the process.
  std::vector<UpdateTensor>().swap(initial_adapter_);
  FEDLORA_ASSIGN_OR_RETURN(RecoveredState st, store_->LoadLatestState(run_id_));
  if (initial_hash.empty()) {
    const nlohmann::json meta = nlohmann::json::parse(st.run.config_json, nullptr, /*allow_exceptions=*/false);
    if (!meta.is_object() || !meta.contains("initial_adapter_sha256") || !meta["initial_adapter_sha256"].is_string()) {
      return absl::DataLossError(absl::StrCat("run '", run_id_, "' in the store has no initial adapter hash"));
    }
    initial_hash = meta["initial_adapter_sha256"].get<std::string>();
  }

  // Nothing writes blobs yet, so this is the moment to drop what no row points to: blobs of refused
  // updates, and of updates committed to disk by a crashed server before it recorded them (their
  // clients upload them again). Partial uploads are kept for resumption.
  {
    FEDLORA_ASSIGN_OR_RETURN(absl::flat_hash_set<std::string> referenced, store_->ReferencedBlobHashes());
    referenced.insert(initial_hash);
    FEDLORA_ASSIGN_OR_RETURN(BlobGcStats gc, blobs_->CollectGarbage(referenced));
    if (gc.blobs_deleted > 0) {
      FEDLORA_LOG(INFO) << "removed " << gc.blobs_deleted << " unreferenced blobs (" << gc.bytes_deleted << " bytes)";
    }
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store_->ListRounds(run_id_));
  FEDLORA_ASSIGN_OR_RETURN(int64_t initial_size, blobs_->Size(initial_hash));
  downloadable_[initial_hash] = {0, initial_size};
  rounds_committed_ = 0;
  std::string current_hash = initial_hash;
  int64_t current_round = 0;
  for (const RoundRecord& r : rounds) {
    if (r.state != RoundState::kCommitted) continue;
    ++rounds_committed_;
    FEDLORA_ASSIGN_OR_RETURN(int64_t size, blobs_->Size(r.result_adapter_hash));
    downloadable_[r.result_adapter_hash] = {r.round, size};
    current_hash = r.result_adapter_hash;
    current_round = r.round;
  }
  last_committed_round_ = current_round;
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, blobs_->Get(current_hash));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> restored, AdapterFromSafetensors(bytes));
  global_ = std::make_shared<const std::vector<UpdateTensor>>(std::move(restored));
  global_hash_ = current_hash;
  global_bytes_ = static_cast<int64_t>(bytes.size());
  global_round_ = current_round;
  global_elements_ = 0;
  spec_.clear();
  for (const UpdateTensor& t : *global_) {
    global_elements_ += static_cast<int64_t>(t.values.size());
    spec_.push_back({t.name, t.shape});
  }
  spec_elements_ = global_elements_;
  FEDLORA_ASSIGN_OR_RETURN(ServerOptimizerOptions opt_options, ServerOptimizerOptionsFromConfig(config_.aggregation()));
  FEDLORA_ASSIGN_OR_RETURN(ServerOptimizer opt, ServerOptimizer::Create(opt_options, spec_));
  if (opt.stateful() && current_round > 0) {
    // The state saved with the last committed round: momentum or moments continue exactly.
    const auto last = std::find_if(rounds.rbegin(), rounds.rend(), [&](const RoundRecord& r) {
      return r.state == RoundState::kCommitted && r.round == current_round;
    });
    if (last == rounds.rend() || last->server_state_hash.empty()) {
      return absl::DataLossError(absl::StrCat("round ", current_round, " was committed without a server optimizer state, ",
                                              "but this run's aggregation (", ToAbsl(ServerOptimizerName(opt_options.kind)),
                                              ") keeps one; was the run's config changed?"));
    }
    FEDLORA_ASSIGN_OR_RETURN(std::string state, blobs_->Get(last->server_state_hash));
    FEDLORA_RETURN_IF_ERROR_CTX(opt.LoadState(state), absl::StrCat("round ", current_round));
  }
  server_opt_.emplace(std::move(opt));

  FEDLORA_ASSIGN_OR_RETURN(std::vector<ClientRecord> known, store_->ListClients());
  for (const ClientRecord& c : known) {
    auto entry = std::make_unique<ClientEntry>();
    entry->id = c.client_id;
    entry->joined_ms = c.first_seen_unix_ms;
    entry->last_seen_ms = c.last_seen_unix_ms;
    entry->reported = v1::CLIENT_STATE_DISCONNECTED;
    clients_[c.client_id] = std::move(entry);
  }
  for (const RoundRecord& r : rounds) {
    if (r.state != RoundState::kCommitted) continue;
    FEDLORA_ASSIGN_OR_RETURN(std::vector<UploadRecord> ups, store_->ListAcceptedUploads(run_id_, r.round));
    for (const UploadRecord& u : ups) {
      if (ClientEntry* c = FindClientLocked(u.client_id)) ++c->rounds_participated;
    }
  }

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
    if (r.global_adapter_hash != global_hash_) {
      return absl::DataLossError(absl::StrCat("open round ", r.round, " trains from adapter ", r.global_adapter_hash,
                                              " but the last committed adapter is ", global_hash_));
    }
    FEDLORA_LOG(INFO) << "resuming round " << r.round << " (" << RoundStateName(r.state) << ", "
                      << round_->accepted.size() << " updates accepted, " << st.receiving_uploads.size()
                      << " uploads resumable)";
  } else if (rounds_committed_ >= total_rounds) {
    finished_ = true;
  }
  metrics_->rounds_committed.store(rounds_committed_);
  restored_ = true;
  if (!finished_ && round_ == nullptr) FEDLORA_RETURN_IF_ERROR(OpenNextRoundLocked());
  metrics_->current_round.store(round_ ? round_->round : last_committed_round_);
  UpdateClientGaugesLocked();
  return absl::OkStatus();
}

absl::Status Coordinator::OpenNextRoundLocked() {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store_->ListRounds(run_id_));
  const int64_t next = rounds.empty() ? 1 : rounds.back().round + 1;
  // Refusals of rounds before the last one can no longer be asked about by a resuming client.
  for (auto it = rejected_.begin(); it != rejected_.end();) {
    it = it->second.round + 2 <= next ? rejected_.erase(it) : std::next(it);
  }
  FEDLORA_ASSIGN_OR_RETURN(RoundRecord r, store_->BeginRound(run_id_, next, global_hash_, /*deadline_unix_ms=*/0));
  round_ = std::make_unique<RoundInfo>();
  round_->round = r.round;
  round_->state = RoundState::kSelecting;
  round_->started_ms = Now();
  metrics_->current_round.store(r.round);
  FEDLORA_LOG(INFO) << "round " << r.round << " opened (selecting " << Quota() << " of the waiting clients)";
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Join, sessions

absl::StatusOr<v1::JoinResponse> Coordinator::Join(const std::string& client_id, const std::string& peer,
                                                   const v1::JoinRequest& request) {
  if (request.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("client speaks protocol version ", request.protocol_version(),
                                                      ", this server speaks ", kProtocolVersion));
  }
  absl::MutexLock lock(&mu_);
  if (!restored_) return absl::UnavailableError("server is restoring its state; retry");
  FEDLORA_ASSIGN_OR_RETURN(ClientRecord record, store_->UpsertClient(client_id, /*cert_fingerprint=*/""));
  if (record.state == ClientState::kBlocked) {
    return absl::PermissionDeniedError(absl::StrCat("client '", client_id, "' is blocked by the operator"));
  }
  auto& slot = clients_[client_id];
  if (!slot) {
    slot = std::make_unique<ClientEntry>();
    slot->id = client_id;
  }
  ClientEntry& c = *slot;
  const int64_t now = Now();
  // 128 bits from OpenSSL's CSPRNG; no session is handed out when it cannot deliver (fails closed).
  FEDLORA_ASSIGN_OR_RETURN(c.session, crypto::RandomHex(16));
  c.peer = peer;
  c.client_version = request.client_version();
  c.joined_ms = now;
  c.last_seen_ms = now;
  c.left = false;
  c.reported = v1::CLIENT_STATE_IDLE;
  metrics_->joins.fetch_add(1);
  UpdateClientGaugesLocked();

  v1::JoinResponse response;
  response.set_protocol_version(kProtocolVersion);
  response.set_client_id(client_id);
  response.set_session_token(c.session);
  response.set_session_ttl_seconds(static_cast<uint32_t>(CeilDiv(options_.heartbeat_timeout_ms, 1000)));
  *response.mutable_run_config() = RedactRunConfigForClients(config_);
  v1::ServerLimits* limits = response.mutable_limits();
  limits->set_max_message_bytes(static_cast<uint32_t>(options_.max_message_bytes));
  limits->set_max_update_bytes(static_cast<uint64_t>(options_.max_upload_bytes));
  limits->set_chunk_size_bytes(static_cast<uint32_t>(options_.chunk_bytes));
  response.set_current_round(round_ ? round_->round : last_committed_round_);
  response.set_server_encryption_public_key(aggregation_key_.public_key);
  response.set_server_encryption_key_id(aggregation_key_.key_id);
  return response;
}

absl::Status Coordinator::Authenticate(const std::string& client_id, const std::string& session_token) {
  absl::MutexLock lock(&mu_);
  if (!restored_) return absl::UnavailableError("server is restoring its state; retry");
  ClientEntry* c = FindClientLocked(client_id);
  if (c == nullptr || c->session.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("client '", client_id, "' has no session; call Join"));
  }
  if (!crypto::ConstantTimeEquals(session_token, c->session)) {
    return absl::UnauthenticatedError(
        absl::StrCat("session token does not belong to client '", client_id, "' (expired or foreign); call Join"));
  }
  const int64_t now = Now();
  if (now - c->last_seen_ms > options_.heartbeat_timeout_ms) {
    // JoinResponse.session_ttl_seconds: a session silent for longer than the heartbeat timeout has
    // been treated as dead (its task may have gone to someone else), so the client starts afresh.
    c->session.clear();
    return absl::UnauthenticatedError(absl::StrCat("session of client '", client_id, "' expired after ",
                                                   now - c->last_seen_ms, " ms of silence; call Join"));
  }
  c->last_seen_ms = now;
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------------
// WaitForTask and selection

double Coordinator::RoundLearningRateLocked() const {
  const v1::TrainingConfig& t = config_.training();
  const double base = t.has_learning_rate() ? t.learning_rate() : 5e-4;
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

v1::AdapterManifest Coordinator::ManifestLocked(const std::string& hash, int64_t round, int64_t total_bytes) const {
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

std::optional<v1::WaitForTaskResponse> Coordinator::AnswerLocked(const std::string& client_id, bool may_hold) {
  if (finished_) {
    v1::WaitForTaskResponse response;
    v1::RunFinished* done = response.mutable_run_finished();
    done->set_reason(v1::RunFinished::COMPLETED);
    done->set_final_round(static_cast<uint64_t>(last_committed_round_));
    *done->mutable_final_adapter() = ManifestLocked(global_hash_, global_round_, global_bytes_);
    return response;
  }
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
    v1::WaitForTaskResponse response;
    v1::TrainTask* task = response.mutable_task();
    task->set_round(static_cast<uint64_t>(r.round));
    task->set_task_id(TaskIdFor(r.round, client_id));
    *task->mutable_global_adapter() = ManifestLocked(global_hash_, global_round_, global_bytes_);
    *task->mutable_training() = config_.training();
    task->mutable_training()->set_learning_rate(RoundLearningRateLocked());
    task->set_proximal_mu(config_.aggregation().has_proximal_mu() ? config_.aggregation().proximal_mu() : 0.0);
    task->set_deadline_seconds(static_cast<uint32_t>(std::max<int64_t>(0, CeilDiv(r.deadline_ms - Now(), 1000))));
    task->set_seed(TaskSeedFor(r.round, client_id));
    *task->mutable_codec() = config_.codec();
    task->set_encryption_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
    return response;
  }
  if (r.state == RoundState::kSelecting) {
    r.candidates.insert(client_id);
    if (r.first_candidate_ms == 0) r.first_candidate_ms = Now();
    if (may_hold) return std::nullopt;
    return RetryLaterLocked(absl::StrCat("waiting for clients to start round ", r.round));
  }
  if (r.state == RoundState::kTraining) {
    // A selected client that went silent (no RPC within heartbeat_timeout) will most likely never
    // deliver: its place goes to this live client, so that the round can still reach its target.
    // (Should the silent one come back and deliver first, both updates count: each is a valid
    // update of this round from a selected client.)
    const int64_t now = Now();
    int64_t working = static_cast<int64_t>(r.accepted.size());
    for (const std::string& id : r.selected) {
      const ClientEntry* c = FindClientLocked(id);
      if (r.accepted.count(id) == 0 && c != nullptr && IsLive(*c, now)) ++working;
    }
    const ClientEntry* me = FindClientLocked(client_id);
    if (working < Quota() && me != nullptr && IsLive(*me, now) && now < r.deadline_ms) {
      absl::Status s = store_->RecordSelection(run_id_, r.round, {client_id}, r.deadline_ms);
      if (s.ok()) {
        r.selected.insert(client_id);
        FEDLORA_LOG(INFO) << "round " << r.round << ": " << client_id << " replaces a silent client ("
                          << working << " of " << Quota() << " tasks alive)";
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

void Coordinator::WaitForTask(const std::string& client_id, int64_t max_wait_ms, WaitCallback done) {
  std::vector<std::function<void()>> to_run;  // callbacks run after the lock is released
  do {
    absl::MutexLock lock(&mu_);
    if (!restored_ || shutting_down_) {
      to_run.push_back([done, restoring = !restored_] {
        done(absl::UnavailableError(restoring ? "server is restoring its state; retry" : "server is shutting down"));
      });
      break;
    }
    if (ClientEntry* c = FindClientLocked(client_id)) c->reported = v1::CLIENT_STATE_IDLE;
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
    if (answer.has_value()) {
      to_run.push_back([done, a = *std::move(answer)] { done(a); });
    } else {
      auto w = std::make_unique<Waiter>();
      w->client_id = client_id;
      w->expires_ms = Now() + max_wait_ms;
      w->done = std::move(done);
      waiters_.push_back(std::move(w));
    }
    auto more = ResolveWaitersLocked(/*expire_all=*/false);
    for (auto& f : more) to_run.push_back(std::move(f));
  } while (false);
  for (auto& f : to_run) f();
}

std::vector<std::function<void()>> Coordinator::ResolveWaitersLocked(bool expire_all) {
  std::vector<std::function<void()>> out;
  const int64_t now = Now();
  std::vector<std::unique_ptr<Waiter>> keep;
  for (auto& w : waiters_) {
    std::optional<v1::WaitForTaskResponse> answer;
    if (expire_all || now >= w->expires_ms) {
      answer = AnswerLocked(w->client_id, /*may_hold=*/false);
    } else {
      answer = AnswerLocked(w->client_id, /*may_hold=*/true);
    }
    if (answer.has_value()) {
      out.push_back([done = std::move(w->done), a = *std::move(answer)] { done(a); });
    } else {
      // Holding a long poll counts as being alive.
      if (ClientEntry* c = FindClientLocked(w->client_id)) c->last_seen_ms = now;
      keep.push_back(std::move(w));
    }
  }
  waiters_ = std::move(keep);
  return out;
}

void Coordinator::ReleaseAllWaiters() {
  std::vector<std::function<void()>> to_run;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    to_run = ResolveWaitersLocked(/*expire_all=*/true);
  }
  for (auto& f : to_run) f();
}

absl::Status Coordinator::MaybeCloseSelectionLocked(bool force_window) {
  if (round_ == nullptr || round_->state != RoundState::kSelecting) return absl::OkStatus();
  RoundInfo& r = *round_;
  const int64_t now = Now();
  // Drop candidates that went silent or left: selecting them would waste a task.
  for (auto it = r.candidates.begin(); it != r.candidates.end();) {
    ClientEntry* c = FindClientLocked(*it);
    if (c == nullptr || !IsLive(*c, now)) {
      it = r.candidates.erase(it);
    } else {
      ++it;
    }
  }
  const int64_t n = static_cast<int64_t>(r.candidates.size());
  int64_t live = 0;
  for (const auto& [id, c] : clients_) live += IsLive(*c, now) ? 1 : 0;
  const bool quota_reached = options_.select_when_quota_reached && n >= Quota();
  const bool everyone_waiting = n >= Target() && n >= live && live >= options_.expected_clients;
  const bool window_passed = r.first_candidate_ms != 0 && now - r.first_candidate_ms >= options_.selection_window_ms;
  if (!(quota_reached || everyone_waiting || ((window_passed || force_window) && n >= MinClients()))) {
    return absl::OkStatus();
  }
  // Seeded shuffle of the sorted candidates: a pure function of (seed, round, candidates), so that
  // the choice is reproducible and independent of arrival order.
  std::vector<std::string> pool(r.candidates.begin(), r.candidates.end());
  uint64_t state = options_.selection_seed != 0 ? options_.selection_seed : config_.seed();
  state ^= DigestPrefix64(absl::StrCat("selection\n", r.round));
  for (size_t i = pool.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(SplitMix64(state) % i);
    std::swap(pool[i - 1], pool[j]);
  }
  pool.resize(static_cast<size_t>(std::min<int64_t>(Quota(), n)));
  std::sort(pool.begin(), pool.end());
  const int64_t deadline = now + options_.round_deadline_ms;
  FEDLORA_RETURN_IF_ERROR(store_->RecordSelection(run_id_, r.round, pool, deadline));
  FEDLORA_RETURN_IF_ERROR(store_->SetRoundState(run_id_, r.round, RoundState::kTraining));
  r.selected.insert(pool.begin(), pool.end());
  r.deadline_ms = deadline;
  r.state = RoundState::kTraining;
  r.candidates.clear();
  FEDLORA_LOG(INFO) << "round " << r.round << ": selected " << pool.size() << " of " << n << " waiting clients";
  return absl::OkStatus();
}

absl::Status Coordinator::MaybeCloseRoundLocked() {
  if (round_ == nullptr || round_->state != RoundState::kTraining) return absl::OkStatus();
  RoundInfo& r = *round_;
  const int64_t accepted = static_cast<int64_t>(r.accepted.size());
  const bool target_met = accepted >= Target();
  const bool deadline_passed = Now() >= r.deadline_ms;
  if (target_met || (deadline_passed && accepted >= MinClients())) {
    FEDLORA_RETURN_IF_ERROR(store_->SetRoundState(run_id_, r.round, RoundState::kAggregating));
    r.state = RoundState::kAggregating;
    FEDLORA_LOG(INFO) << "round " << r.round << " closed with " << accepted << " updates"
                      << (target_met ? "" : " at its deadline");
    return absl::OkStatus();
  }
  if (deadline_passed) {
    FEDLORA_RETURN_IF_ERROR(store_->SetRoundState(run_id_, r.round, RoundState::kAbandoned));
    FEDLORA_LOG(WARNING) << "round " << r.round << " abandoned: " << accepted << " updates by the deadline, "
                         << MinClients() << " needed; retrying as a new round";
    metrics_->rounds_abandoned.fetch_add(1);
    round_.reset();
    return OpenNextRoundLocked();
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Heartbeat, metrics, leave

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const std::string& client_id,
                                                            const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  ClientEntry* c = FindClientLocked(client_id);
  if (c == nullptr) return absl::UnauthenticatedError(absl::StrCat("unknown client '", client_id, "'"));
  c->last_seen_ms = Now();
  if (request.state() != v1::CLIENT_STATE_UNSPECIFIED && request.state() != v1::CLIENT_STATE_DISCONNECTED &&
      request.state() != v1::CLIENT_STATE_LEFT) {
    c->reported = request.state();
  }
  v1::HeartbeatResponse response;
  response.set_action(v1::HeartbeatResponse::CONTINUE);
  response.set_next_heartbeat_seconds(static_cast<uint32_t>(CeilDiv(options_.heartbeat_interval_ms, 1000)));
  if (!request.task_id().empty()) {
    const bool current = round_ != nullptr && round_->state == RoundState::kTraining &&
                         round_->selected.count(client_id) != 0 &&
                         request.task_id() == TaskIdFor(round_->round, client_id);
    if (!current) response.set_action(v1::HeartbeatResponse::CANCEL_TASK);
  }
  return response;
}

absl::Status Coordinator::ReportMetrics(const std::string& client_id, const v1::MetricsReport& report) {
  const int64_t round = static_cast<int64_t>(report.round());
  if (report.extra_size() > options_.max_metrics_per_report) {
    return QuotaRefused(absl::StrCat("metrics report has ", report.extra_size(),
                                                     " extra entries; the limit is ", options_.max_metrics_per_report));
  }
  {
    absl::MutexLock lock(&mu_);
    ClientEntry* c = FindClientLocked(client_id);
    if (c == nullptr) return absl::UnauthenticatedError(absl::StrCat("unknown client '", client_id, "'"));
    c->StartQuotaRound(round_ ? round_->round : last_committed_round_);
    if (c->reports_this_round >= options_.max_client_reports_per_round) {
      return QuotaRefused(absl::StrCat("client '", client_id, "' sent ", c->reports_this_round,
                                                       " metrics reports this round; the limit is ",
                                                       options_.max_client_reports_per_round));
    }
    ++c->reports_this_round;
  }
  // Bound to a task this client was really given: its selection for the round is in the store.
  FEDLORA_ASSIGN_OR_RETURN(const bool selected, store_->IsSelected(run_id_, round, client_id));
  if (!selected || report.task_id() != TaskIdFor(round, client_id)) {
    return absl::PermissionDeniedError(absl::StrCat("task '", report.task_id().substr(0, 80), "' of round ", round,
                                                    " was not assigned to client '", client_id, "'"));
  }
  std::vector<std::pair<std::string, double>> values = {
      {"train/loss_first", report.train_loss_first()}, {"train/loss_last", report.train_loss_last()},
      {"train/examples", static_cast<double>(report.examples_processed())},
      {"train/steps", static_cast<double>(report.steps())}, {"time/download_s", report.download_seconds()},
      {"time/train_s", report.train_seconds()},          {"time/encode_s", report.encode_seconds()},
      {"time/upload_s", report.upload_seconds()}};
  if (report.has_local_eval_loss()) values.push_back({"eval/local_loss", report.local_eval_loss()});
  if (report.has_local_eval_accuracy()) values.push_back({"eval/local_accuracy", report.local_eval_accuracy()});
  for (const auto& [k, v] : report.extra()) {
    if (k.empty() || k.size() > 128) {
      return absl::InvalidArgumentError(absl::StrCat("metric name of ", k.size(), " bytes; names are 1-128 bytes"));
    }
    values.push_back({absl::StrCat("extra/", k), v});
  }
  std::vector<MetricRecord> records;
  records.reserve(values.size());
  for (const auto& [key, value] : values) {
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat("metric '", key.substr(0, 140), "' is not finite"));
    }
    records.push_back({run_id_, round, client_id, key, value});
  }
  // One transaction for the whole report; a re-sent report (after a lost response) keeps the first.
  return store_->RecordMetrics(records);
}

absl::Status Coordinator::Leave(const std::string& client_id, const v1::LeaveRequest& request) {
  absl::MutexLock lock(&mu_);
  ClientEntry* c = FindClientLocked(client_id);
  if (c == nullptr) return absl::OkStatus();
  c->left = true;
  c->session.clear();
  c->reported = v1::CLIENT_STATE_LEFT;
  if (round_) round_->candidates.erase(client_id);
  UpdateClientGaugesLocked();
  FEDLORA_LOG(INFO) << "client " << client_id << " left: " << request.reason();
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Driver

absl::Status Coordinator::Tick() {
  std::vector<std::function<void()>> to_run;
  int64_t aggregate_round = 0;
  bool sweep = false;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (!restored_) return absl::OkStatus();
    UpdateClientGaugesLocked();
    status.Update(MaybeCloseSelectionLocked(/*force_window=*/false));
    status.Update(MaybeCloseRoundLocked());
    if (round_ != nullptr && round_->state == RoundState::kAggregating) aggregate_round = round_->round;
    to_run = ResolveWaitersLocked(/*expire_all=*/false);
    const std::pair<int64_t, int> now_for = {round_ ? round_->round : last_committed_round_,
                                             round_ ? static_cast<int>(round_->state) : -1};
    sweep = now_for != swept_for_;
    swept_for_ = now_for;
  }
  for (auto& f : to_run) f();
  // At start and whenever the round moves on, nothing of a closed round can complete any more.
  if (sweep) SweepPartials();
  if (sweep || Now() - store_measured_ms_ >= 1000) MeasureStore();
  if (aggregate_round != 0) {
    absl::Status s = AggregateAndCommit(aggregate_round);
    // Aggregation freed a few model-sized buffers (the accumulator, decoded updates, the serialized
    // adapter); hand them back to the OS, outside the lock, so that they do not count toward the
    // next round's RSS.
    malloc_trim(0);
    if (!s.ok()) {
      FEDLORA_LOG(ERROR) << "aggregating round " << aggregate_round << ": " << s;
    }
    status.Update(s);
    {
      absl::MutexLock lock(&mu_);
      to_run = ResolveWaitersLocked(/*expire_all=*/false);
    }
    for (auto& f : to_run) f();
  }
  return status;
}

void Coordinator::MeasureStore() {
  store_measured_ms_ = Now();
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
  std::shared_ptr<const std::vector<UpdateTensor>> snapshot;
  int64_t committed_before = 0;
  {
    absl::MutexLock lock(&mu_);
    snapshot = global_;
    committed_before = rounds_committed_;
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UploadRecord> uploads, store_->ListAcceptedUploads(run_id_, round));
  const bool by_examples = !config_.aggregation().has_weight_by_examples() || config_.aggregation().weight_by_examples();
  const double max_norm = config_.aggregation().max_update_norm();
  int64_t added = 0;
  std::vector<UpdateTensor> mean;
  {
    FEDLORA_ASSIGN_OR_RETURN(StreamingFedAvg avg, StreamingFedAvg::Create(spec_));
    for (const UploadRecord& u : uploads) {  // canonical order (by upload_id); the sum is exact anyway
      std::string plain;
      {
        FEDLORA_ASSIGN_OR_RETURN(std::string sealed, blobs_->Get(u.blob_hash));
        const crypto::UpdatePlace place{run_id_, static_cast<uint64_t>(u.round), u.client_id, u.upload_id};
        absl::StatusOr<std::string> opened = crypto::OpenUpdateBlob(aggregation_key_.private_key, place, sealed);
        if (!opened.ok()) return Annotate(opened.status(), absl::StrCat("opening update ", u.upload_id));
        plain = *std::move(opened);
      }  // the sealed copy is freed before decoding
      FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> update, DecodeAndValidate(plain));
      std::string().swap(plain);
      if (max_norm > 0) ClipUpdateNorm(update, max_norm);
      FEDLORA_RETURN_IF_ERROR_CTX(avg.Add(update, by_examples ? u.num_examples : 1),
                                  absl::StrCat("update ", u.upload_id));
      if (++added == 1) MaybeCrashAt("during_aggregation");
    }
    FEDLORA_ASSIGN_OR_RETURN(mean, avg.Finish());
  }  // the exact accumulator (16 bytes per element) is freed before the adapter is copied below
  // Step a copy of the optimizer: its state becomes the server's only once the round commits.
  ServerOptimizer opt = *server_opt_;
  std::vector<UpdateTensor> next = *snapshot;  // the copy the optimizer steps, made unlocked
  snapshot.reset();
  FEDLORA_RETURN_IF_ERROR(opt.Step(mean, next));
  std::vector<UpdateTensor>().swap(mean);  // not needed past the step: one adapter less held below
  if (committed_before + 1 >= TotalRounds()) FEDLORA_RETURN_IF_ERROR(AverageWithEarlierRounds(round, next));
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
  MaybeCrashAt("during_checkpoint");

  // Evaluate every data.eval_every_rounds committed rounds, and always the last one.
  const int64_t eval_every = std::max<int64_t>(1, config_.data().eval_every_rounds());
  const bool evaluate = (committed_before + 1) % eval_every == 0 || committed_before + 1 >= TotalRounds();
  std::map<std::string, double> eval;
  if (evaluator_ != nullptr && evaluate) {
    absl::StatusOr<std::map<std::string, double>> result = evaluator_->Evaluate(static_cast<uint64_t>(round), next);
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
  FEDLORA_RETURN_IF_ERROR(store_->CommitRound(run_id_, round, hash, metrics_json.dump(), records, state_hash));
  server_opt_.emplace(std::move(opt));

  auto committed = std::make_shared<const std::vector<UpdateTensor>>(std::move(next));
  std::shared_ptr<const std::vector<UpdateTensor>> previous;  // freed after the lock is released
  absl::MutexLock lock(&mu_);
  for (const UploadRecord& u : uploads) {
    if (ClientEntry* c = FindClientLocked(u.client_id)) ++c->rounds_participated;
  }
  previous = std::exchange(global_, std::move(committed));
  global_hash_ = hash;
  global_bytes_ = adapter_bytes;
  global_round_ = round;
  downloadable_[hash] = {round, global_bytes_};
  last_committed_round_ = round;
  ++rounds_committed_;
  metrics_->rounds_committed.store(rounds_committed_);
  round_.reset();
  FEDLORA_LOG(INFO) << "round " << round << " committed: " << added << " updates, adapter " << hash;
  const int64_t total_rounds = TotalRounds();
  if (rounds_committed_ >= total_rounds) {
    finished_ = true;
    FEDLORA_LOG(INFO) << "run " << run_id_ << " finished after " << rounds_committed_ << " rounds";
    return absl::OkStatus();
  }
  return OpenNextRoundLocked();
}

absl::Status Coordinator::AverageWithEarlierRounds(int64_t round, std::vector<UpdateTensor>& adapter) const {
  const int64_t k = config_.aggregation().average_last_rounds();
  if (k <= 1) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store_->ListRounds(run_id_));
  std::vector<const RoundRecord*> earlier;  // committed before `round`, oldest first
  for (const RoundRecord& r : rounds) {
    if (r.state == RoundState::kCommitted && r.round < round) earlier.push_back(&r);
  }
  if (static_cast<int64_t>(earlier.size()) > k - 1) earlier.erase(earlier.begin(), earlier.end() - (k - 1));
  if (earlier.empty()) return absl::OkStatus();
  // The unweighted mean, with FedAvg's exact accumulator: the same adapters give the same bits in
  // any order, and Add checks each against the spec.
  FEDLORA_ASSIGN_OR_RETURN(StreamingFedAvg mean, StreamingFedAvg::Create(spec_));
  for (const RoundRecord* r : earlier) {
    FEDLORA_ASSIGN_OR_RETURN(std::string bytes, blobs_->Get(r->result_adapter_hash));
    FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> a, AdapterFromSafetensors(bytes));
    FEDLORA_RETURN_IF_ERROR_CTX(mean.Add(a, 1), absl::StrCat("round ", r->round, "'s committed adapter"));
  }
  FEDLORA_RETURN_IF_ERROR(mean.Add(adapter, 1));
  FEDLORA_ASSIGN_OR_RETURN(adapter, mean.Finish());
  FEDLORA_LOG(INFO) << "round " << round << ": the final adapter is the mean of rounds " << earlier.front()->round
                    << " to " << round << " (" << earlier.size() + 1 << " adapters)";
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Admin

absl::StatusOr<v1::GetStatusResponse> Coordinator::GetStatus(const v1::GetStatusRequest& request) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store_->ListRounds(run_id_));
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
  uint32_t live = 0;
  for (const auto& [id, c] : clients_) live += IsLive(*c, now) ? 1 : 0;
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
        response.set_active_tasks(static_cast<uint32_t>(round_->selected.size() - round_->accepted.size()));
        break;
      default:
        response.set_phase(v1::ROUND_PHASE_AGGREGATING);
        break;
    }
  }
  *response.mutable_global_adapter() = ManifestLocked(global_hash_, global_round_, global_bytes_);
  std::vector<const RoundRecord*> committed;
  for (const RoundRecord& r : rounds) {
    if (r.state == RoundState::kCommitted) committed.push_back(&r);
  }
  size_t first = 0;
  if (request.max_history() > 0 && committed.size() > request.max_history()) {
    first = committed.size() - request.max_history();
  }
  for (size_t i = first; i < committed.size(); ++i) {
    const RoundRecord& r = *committed[i];
    v1::RoundSummary* s = response.add_history();
    s->set_round(static_cast<uint64_t>(r.round));
    s->set_clients_selected(static_cast<uint32_t>(r.selected_clients.size()));
    s->set_started_unix_ms(r.created_unix_ms);
    s->set_committed_unix_ms(r.updated_unix_ms);
    s->set_global_adapter_sha256(r.result_adapter_hash);
    const nlohmann::json m = nlohmann::json::parse(r.metrics_json, nullptr, /*allow_exceptions=*/false);
    if (m.is_object()) {
      for (const auto& [k, v] : m.items()) {
        if (!v.is_number()) continue;
        const double d = v.get<double>();
        if (k == "updates") {
          s->set_updates_accepted(static_cast<uint32_t>(d));
          s->set_updates_received(static_cast<uint32_t>(d));
        } else if (k == "eval_loss") {
          s->set_eval_loss(d);
        } else if (k == "eval_accuracy") {
          s->set_eval_accuracy(d);
        } else {
          (*s->mutable_eval_metrics())[k] = d;
        }
      }
    }
  }
  return response;
}

absl::StatusOr<v1::ListClientsResponse> Coordinator::ListClients(const v1::ListClientsRequest& request) {
  absl::MutexLock lock(&mu_);
  const int64_t now = Now();
  v1::ListClientsResponse response;
  for (const auto& [id, c] : clients_) {
    const bool live = IsLive(*c, now);
    v1::ClientState state = c->left ? v1::CLIENT_STATE_LEFT : (live ? c->reported : v1::CLIENT_STATE_DISCONNECTED);
    if (!live && !request.include_inactive()) continue;
    v1::ClientInfo* info = response.add_clients();
    info->set_client_id(id);
    info->set_state(state);
    info->set_peer(c->peer);
    info->set_client_version(c->client_version);
    info->set_joined_unix_ms(c->joined_ms);
    info->set_last_seen_unix_ms(c->last_seen_ms);
    if (round_ != nullptr && round_->state == RoundState::kTraining && round_->selected.count(id) != 0 &&
        round_->accepted.count(id) == 0) {
      info->set_current_task_id(TaskIdFor(round_->round, id));
    }
    info->set_rounds_participated(static_cast<uint32_t>(c->rounds_participated));
    info->set_updates_rejected(static_cast<uint32_t>(c->updates_rejected));
  }
  return response;
}

}  // namespace fedlora
