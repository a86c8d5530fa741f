// The round state machine, the client registry and the rules for accepting updates: everything the
// gRPC services decide, without gRPC. The services (server/services.cc) translate RPCs into calls
// on a Coordinator; a driver thread (Server) calls Tick() to enforce deadlines and aggregates when
// a round closes. Its implementation is split by concern over coordinator_*.cc (listed in
// coordinator_internal.h); client sampling is server/selection.h, the checks of an upload header
// server/upload_admission.h.
//
// Blocking work never runs under the coordinator's lock: store writes made under it are committed
// without waiting for their fsync (DurabilityTicket), and whoever answers a client from that state
// waits for the fsync first, on the coordinator's delivery pool, never on a gRPC callback thread.
// Aggregation and evaluation run on an aggregation thread of their own, so the round clock (Tick)
// keeps closing windows, expiring long polls and counting heartbeats while they work.
//
// A run's life, as the coordinator drives it:
//   Restore()             loads the run from the store (or creates it), resumes an open round
//   round r selecting     clients that ask for work become candidates; the selection closes when
//                         the quota ceil(clients_per_round * over_selection) is waiting, or every
//                         live client is waiting and there are at least clients_per_round, or the
//                         selection window passed with at least min_clients; the quota is then
//                         sampled from the candidates with a seeded shuffle
//   round r training      selected clients get a TrainTask; uploads are accepted until
//                         clients_per_round are in, or the deadline passes with >= min_clients
//                         (else the round is abandoned and round r+1 starts from the same adapter)
//   round r aggregating   a RoundAggregator (server/round_aggregator.h) over the accepted
//                         uploads in canonical (upload_id) order; new adapter blob written;
//                         evaluator called; CommitRound. A failure is retried up to
//                         max_aggregation_attempts times, then the round is abandoned (or the
//                         run stopped: stop_on_aggregation_failure)
//   finished              after `rounds` committed rounds; WaitForTask answers RunFinished
//
// Thread-safety: every public method is thread-safe. Store writes that decide a client-visible
// outcome (selection, acceptance) are committed under the coordinator's lock, and made durable
// before the client hears of them, so what a client is told always matches what is durable.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "aggregation/fedavg.h"
#include "aggregation/server_optimizer.h"
#include "compression/codec.h"
#include "config/config_io.h"
#include "config/resolved.h"
#include "core/thread_pool.h"
#include "crypto/sealed_update.h"
#include "fedlora/v1/admin.pb.h"
#include "fedlora/v1/config.pb.h"
#include "fedlora/v1/federation.pb.h"
#include "server/aggregation_key.h"
#include "server/blob_store.h"
#include "server/client_registry.h"
#include "server/differential_privacy.h"
#include "server/evaluator.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/round_aggregator.h"
#include "server/secagg_round.h"
#include "server/store.h"
#include "server/upload_admission.h"

namespace fedlora {

// Milliseconds since the Unix epoch; injectable so that tests can drive deadlines.
using Clock = std::function<int64_t()>;
int64_t SystemClockMs();

// What BeginUpload tells the upload stream to do.
struct UploadPlan {
  // Set when the upload_id was already accepted: send this ack back and store nothing.
  std::optional<v1::UploadAck> duplicate_ack;
  // Otherwise: the durable prefix the stream continues after (the header's start_chunk may be at or
  // below it; the partial blob is cut back to start_chunk).
  int64_t chunks_durable = 0;
  int64_t bytes_durable = 0;
};

class Coordinator {
 public:
  // `store` and `blobs` must outlive the coordinator; `evaluator` may be null (no evaluation).
  // `initial_adapter` is used only when the run does not exist in the store yet. `run` is the run's
  // config with its codecs derived (Server::Create resolves it once).
  Coordinator(ServerOptions options, ResolvedRunConfig run,
              std::vector<UpdateTensor> initial_adapter, Store* store, BlobStore* blobs,
              Evaluator* evaluator, ServerMetrics* metrics, Clock clock);
  ~Coordinator();

  // Loads (or creates) the run and resumes it. Until it returns OK every RPC answers Unavailable.
  absl::Status Restore();
  bool restored() const;

  // --- Federation -------------------------------------------------------------------------------
  // Registers `client_id` (durably, with the fingerprint of the certificate it presented; empty
  // without TLS) and starts a new session; returns the JoinResponse.
  absl::StatusOr<v1::JoinResponse> Join(const std::string& client_id, const std::string& peer,
                                        const std::string& cert_fingerprint,
                                        const v1::JoinRequest& request);
  // Checks that `session_token` is the live session of `client_id` and marks the client seen.
  // Unauthenticated otherwise (the client must Join again).
  absl::Status Authenticate(const std::string& client_id, const std::string& session_token);
  // A download chunk of `bytes` of blob `sha256` went out to `client_id` (`last`: the blob's final
  // chunk). Marks the client seen (a client busy streaming is alive) and counts the bytes to the open round; a completed download
  // also counts what it stands for as a full adapter (download_full_bytes).
  void NoteDownloadChunk(const std::string& client_id, const std::string& sha256, int64_t bytes,
                         bool last);

  // Answers at once through `done`, or (when max_wait_ms > 0 and the answer would be "retry
  // later") holds the request until the client is selected, the round changes, or max_wait_ms
  // passes. `done` is called exactly once, possibly on another thread, never under a lock.
  using WaitCallback = std::function<void(absl::StatusOr<v1::WaitForTaskResponse>)>;
  // `held_adapter_sha256` is the adapter the client holds (WaitForTaskRequest), empty for none: a
  // task offers a delta chain from it when there is one (TrainTask.global_delta).
  void WaitForTask(const std::string& client_id, int64_t max_wait_ms, WaitCallback done,
                   const std::string& held_adapter_sha256 = "");

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& client_id,
                                                  const v1::HeartbeatRequest& request);
  // A step of the caller's secure-aggregation round (coordinator_secagg.cc): takes its message, if
  // any, and answers with the next step's input or "ask again".
  absl::StatusOr<v1::SecureAggregationResponse> SecureAggregation(
      const std::string& client_id, const v1::SecureAggregationRequest& request);
  absl::Status ReportMetrics(const std::string& client_id, const v1::MetricsReport& report);
  absl::Status Leave(const std::string& client_id, const v1::LeaveRequest& request);

  // The manifest of a downloadable adapter (a global adapter of this run). NotFound for any other
  // hash, including clients' update blobs.
  absl::StatusOr<v1::AdapterManifest> AdapterManifestFor(const std::string& sha256);

  // Validates an upload header against the caller, its task and the round; on success the upload_id
  // is locked to this stream until EndUpload. The new "receiving" row is committed but not waited
  // on: it becomes durable with the next WAL sync (a progress checkpoint, the acceptance, a status
  // query). Before that nothing about the upload has been acknowledged, so losing the row to a
  // power failure only makes the client start the upload again.
  absl::StatusOr<UploadPlan> BeginUpload(const std::string& client_id,
                                         const v1::UploadHeader& header);
  // Counts `bytes` more of an upload stream against the client's per-round quota
  // (ServerOptions::max_client_bytes_per_round); ResourceExhausted past it.
  absl::Status ChargeUploadBytes(const std::string& client_id, int64_t bytes);
  // Records that the first `chunks` chunks (`bytes` bytes) of the upload are durable (after Sync).
  absl::Status RecordUploadProgress(const std::string& upload_id, int64_t chunks, int64_t bytes);
  // Checks a complete, hash-verified upload before it may enter blobs/: opens the sealed blob for
  // this client, round and upload with the run's aggregation key (PermissionDenied when it does not
  // authenticate: replayed under another upload id, moved to another round or client, tampered),
  // then checks the codec against the header and the run, and every tensor against the adapter
  // (InvalidArgument). The plaintext stays in memory. `blob` is a read-only file mapping
  // (BlobWriter::Verify), whose pages are dropped from this process once read.
  absl::Status ValidateUpload(const std::string& client_id, const v1::UploadHeader& header,
                              std::string_view blob) const;
  // Records a validated upload, committed to blobs/ under `blob_hash`, as accepted. Returns the
  // ACCEPTED ack only after the store made it durable.
  absl::StatusOr<v1::UploadAck> CompleteUpload(const std::string& client_id,
                                               const v1::UploadHeader& header,
                                               const std::string& blob_hash, int64_t blob_size);
  // Notes a refused upload (for GetUploadStatus and the metrics).
  void RejectUpload(const std::string& client_id, const std::string& upload_id,
                    const absl::Status& why);
  // Unlocks upload_id (always call after a successful BeginUpload).
  void EndUpload(const std::string& upload_id);
  absl::StatusOr<v1::UploadStatusResponse> GetUploadStatus(const std::string& client_id,
                                                           const std::string& upload_id);

  // --- Admin --------------------------------------------------------------------------------------
  absl::StatusOr<v1::GetStatusResponse> GetStatus(const v1::GetStatusRequest& request);
  absl::StatusOr<v1::ListClientsResponse> ListClients(const v1::ListClientsRequest& request);
  // Blocks a client or lifts its block (durably first), for `operator_id`'s request.
  absl::StatusOr<v1::BlockClientResponse> BlockClient(const v1::BlockClientRequest& request,
                                                      const std::string& operator_id);

  // --- Driver -------------------------------------------------------------------------------------
  // Enforces the selection window, deadlines and long-poll expiries, and starts the aggregation of
  // a closed round on the aggregation thread (or its next try, once its pause has passed). Never
  // waits for an aggregation. Called by the server's driver thread every options.tick_ms, and by
  // tests. Returns the errors of the round bookkeeping (store writes).
  absl::Status Tick();
  // Server shutdown: wakes every held WaitForTask with "retry later", from now on answers new ones
  // at once (Unavailable), so that no call is left holding the gRPC server open, and asks a running
  // aggregation to stop at its next step (a restarted server redoes it).
  void ReleaseAllWaiters();
  // Blocks until no aggregation runs (tests; the destructor).
  void WaitForAggregation();

  // Whether the server can carry out the config's privacy settings: they validate
  // (ValidatePrivacySettings), the secure-aggregation encoding cannot overflow, and a DP budget
  // affords a round (under secure aggregation with the fixed point's rounding of an adapter of
  // `adapter_elements` values in the sensitivity). Server::Create asks before it opens the store.
  static absl::Status CheckPrivacy(const v1::RunConfig& config, int64_t adapter_elements);

  // --- Introspection (tests, tools) ---------------------------------------------------------------
  bool finished() const;
  // Why the run stopped short of its rounds (stop_on_aggregation_failure); OK while it has not.
  absl::Status stopped() const;
  int64_t rounds_committed() const;
  // Retention (ServerOptions::retain_rounds): rounds below this have had their blobs deleted.
  int64_t retained_from_round() const { return retained_from_.load(); }
  // With differential privacy: epsilon spent by the committed rounds; nullopt without it.
  std::optional<double> dp_epsilon() const;
  // The current global adapter (sorted by name) and its blob hash.
  std::vector<UpdateTensor> global_adapter() const;
  // Round `round`'s selected clients (sorted) and its deadline (unix ms), while it is the open
  // round and its selection has closed; nullopt otherwise. The simulator's attacks that read the
  // round's honest updates wait for these clients (sim/simulator.cc).
  struct Cohort {
    std::vector<std::string> clients;
    int64_t deadline_ms = 0;
  };
  std::optional<Cohort> SelectedCohort(int64_t round) const;
  std::string global_adapter_sha256() const;
  const ServerOptions& options() const { return options_; }
  // The run's config (immutable) and the coordinator's clock (unix ms), for the live view.
  const v1::RunConfig& config() const { return config_; }
  int64_t NowMs() const { return clock_(); }

 private:
  struct RoundInfo;
  struct Waiter;
  // An answer for a held or new WaitForTask, delivered by Deliver.
  struct Delivery {
    WaitCallback done;
    absl::StatusOr<v1::WaitForTaskResponse> answer;
  };

  int64_t Now() const { return clock_(); }
  int64_t Quota() const { return QuotaFor(config_); }
  int64_t Target() const { return TargetFor(config_); }
  int64_t MinClients() const { return MinClientsFor(config_); }
  static int64_t QuotaFor(const v1::RunConfig& config);
  static int64_t TargetFor(const v1::RunConfig& config);
  static int64_t MinClientsFor(const v1::RunConfig& config);
  // What Admin shows of a client: ListClients' entry, BlockClient's answer.
  v1::ClientInfo ClientInfoLocked(const ClientEntry& c, int64_t now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string TaskIdFor(int64_t round, const std::string& client_id) const;
  uint64_t TaskSeedFor(int64_t round, const std::string& client_id) const;
  // Seeds the downlink codec's random choices for the delta `round` commits (the same on a rerun).
  uint64_t DownlinkSeedFor(int64_t round) const;
  v1::AdapterManifest ManifestLocked(const std::string& hash, int64_t round,
                                     int64_t total_bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // WaitForTask's answer once the run is over.
  v1::WaitForTaskResponse RunFinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The TrainTask of selected client `client_id` in training round `r`.
  v1::WaitForTaskResponse TaskLocked(const RoundInfo& r, const std::string& client_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer to WaitForTask right now, or nullopt when the client should keep waiting.
  std::optional<v1::WaitForTaskResponse> AnswerLocked(const std::string& client_id, bool may_hold)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::WaitForTaskResponse RetryLaterLocked(const std::string& reason) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restore's steps (coordinator_restore.cc), in order: the round keys and signing and audit keys;
  // the run (created when new, with its initial adapter's hash); the blobs no row names; the
  // committed rounds' adapters and downlink steps; the global and broadcast adapters and the spec;
  // the privacy settings; the server optimizer's state; the clients.
  struct CommittedHeads {
    std::string global, broadcast;  // hashes of the adapters the last committed round left
    int64_t round = 0, broadcast_round = 0;
  };
  absl::Status LoadSecretsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> CreateRunIfNewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CollectGarbageLocked(const std::string& initial_hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<CommittedHeads> RestoreCommittedLocked(const std::vector<RoundRecord>& rounds,
                                                        const std::string& initial_hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LoadAdaptersLocked(const CommittedHeads& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RestorePrivacyLocked(const std::vector<RoundRecord>& rounds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RestoreOptimizerLocked(const std::vector<RoundRecord>& rounds, int64_t current_round)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RestoreClientsLocked(const std::vector<RoundRecord>& rounds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OpenNextRoundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MaybeCloseSelectionLocked(bool force_window) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks the accepted count and deadline; moves the round to aggregating or abandons it.
  absl::Status MaybeCloseRoundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the waiters that can be answered (or have expired); returns their callbacks to run
  // outside the lock.
  std::vector<Delivery> ResolveWaitersLocked(bool expire_all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the deliveries once every store write made so far under mu_ (`ticket`) is durable: at
  // once when it already is, else on the delivery pool (the caller may be a gRPC callback thread).
  // Should the fsync fail, the clients are told Unavailable instead.
  void Deliver(std::vector<Delivery> deliveries, DurabilityTicket ticket);
  // Notes a write committed under mu_ whose durability the next Deliver waits for.
  void DeferLocked(DurabilityTicket ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    pending_.seq = std::max(pending_.seq, ticket.seq);
  }
  // Starts aggregating the closed round on the aggregation pool when none runs and its pause has
  // passed.
  void MaybeStartAggregationLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The end of one aggregation try: counts a failure, schedules the next try or gives the round up.
  void AggregationDoneLocked(int64_t round, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One aggregation try of `round` (coordinator_aggregation.cc): snapshot, RoundAggregator, commit.
  struct RoundOutcome;
  absl::Status AggregateAndCommit(int64_t round);
  // What the aggregation of `round` starts from: the adapters and the committed count read under
  // mu_, the run's policies, and on the last round the tail adapters (TailFor).
  absl::StatusOr<RoundSnapshot> SnapshotRound(int64_t round, int64_t* committed_before);
  // aggregation.average_last_rounds: the latest committed rounds before `round` whose adapters the
  // final one is averaged with, oldest first; FailedPrecondition when one was deleted (retention).
  absl::StatusOr<std::vector<TailAdapter>> TailFor(int64_t round) const;
  // Feeds the round's accepted updates (canonical order) to `aggregator`: each read from blobs/,
  // opened with the round's key and, with an audit key, copied first. A lost one is counted and
  // skipped; when too few are left the round is abandoned (out.abandoned).
  absl::Status AggregatePlain(int64_t round, const AggregationKey& key,
                              const std::vector<UploadRecord>& uploads, RoundAggregator& aggregator,
                              RoundOutcome& out);
  // Opens accepted update `u`'s sealed blob; PermissionDenied (annotated) when it does not open.
  absl::StatusOr<std::string> OpenAccepted(const UploadRecord& u, const AggregationKey& key,
                                           std::string sealed) const;
  // Puts the result's blobs (optimizer state, adapter, downlink delta and broadcast adapter).
  absl::Status StoreResult(RoundOutcome& out);
  // The evaluator's metrics for the round's adapter, when the round is one to evaluate.
  std::map<std::string, double> EvaluateRound(int64_t round, int64_t committed_before,
                                              const std::vector<UpdateTensor>& adapter);
  // Evaluates, commits the round to the store, and installs it in memory.
  absl::Status CommitOutcome(int64_t round, RoundOutcome& out);
  // The committed round's in-memory part (the global and broadcast adapters, the counters); opens
  // the next round or finishes the run.
  absl::Status InstallCommittedLocked(int64_t round, RoundOutcome& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the open round abandoned (durably), counts it and opens the next one.
  absl::Status AbandonRoundLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Secure aggregation (coordinator_secagg.cc, server/secagg_round.h). The encoding every round of
  // the run uses, fixed at Restore from the config; unset without privacy.secure_aggregation.
  std::optional<SecAggEncoding> secagg_;
  // Logs and counts the cohort members (`index`: client id -> cohort index) whose revealed shares
  // were wrong, and keeps them out of the next round's selection.
  void ExcludeMisbehaving(int64_t round, const std::vector<uint32_t>& misbehaving,
                          const std::map<std::string, uint32_t>& index) ABSL_LOCKS_EXCLUDED(mu_);
  // At selection: the round's SecAgg+ parameters over the selected clients.
  absl::Status StartSecAggLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the key steps once every client answered or their time ran out; abandons the round when
  // too few are left.
  absl::Status AdvanceSecAggLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The aggregation thread's part: the masked inputs of `uploads`, the unmasking step, and the
  // mean of the survivors' updates. FailedPrecondition when the round cannot be unmasked.
  absl::StatusOr<std::vector<UpdateTensor>> AggregateSecAgg(
      int64_t round, const std::vector<UploadRecord>& uploads, int64_t* survivors);
  // Step 3 on the aggregation thread: publishes `request` and waits for the `expected` survivors'
  // answers, or for step_ms. Aborted when the round closed, Cancelled at shutdown.
  absl::StatusOr<std::map<uint32_t, v1::SecAggUnmaskingResponse>> CollectUnmasking(
      int64_t round, const v1::SecAggUnmaskingRequest& request, size_t expected, int64_t step_ms);
  // Cancelled once shutdown began: a running aggregation checks it between its steps.
  absl::Status CheckNotShuttingDown() const;
  // BeginUpload's admission under mu_ (server/upload_admission.h): `snapshot` holds what was read
  // before mu_ was taken (the free disk, the upload's row). A new upload is locked to the stream
  // and `*record` filled with the row to write.
  absl::StatusOr<UploadPlan> AdmitUpload(const std::string& client_id,
                                         const v1::UploadHeader& header, UploadSnapshot snapshot,
                                         UploadRecord* record) ABSL_LOCKS_EXCLUDED(mu_);
  // Fills in the rest of `*s` for `client_id`'s upload `upload_id`: the coordinator's state, the
  // open round, the client's quotas and the disk reserved.
  void SnapshotUploadLocked(const std::string& client_id, const std::string& upload_id,
                            UploadSnapshot* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CompleteUpload's bookkeeping under mu_: records the acceptance with a deferred ticket.
  absl::StatusOr<v1::UploadAck> CompleteUploadLocked(const std::string& client_id,
                                                     const v1::UploadHeader& header,
                                                     const std::string& blob_hash, size_t blob_size,
                                                     DurabilityTicket* ticket);
  void UpdateClientGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ResourceExhausted with `message`, counted in the metrics' quota refusals.
  absl::Status QuotaRefused(std::string message) const;
  // Housekeeping, on housekeeping_pool_ outside mu_: deletes the partial uploads that can no longer
  // complete (not of the round in training, and not streaming), and measures the store's size.
  void SweepPartials();
  void MeasureStore();
  std::pair<int64_t, int> swept_for_ ABSL_GUARDED_BY(mu_) = {-1, -1};  // (round, state) last swept
  int64_t store_measured_ms_ = 0;  // when Tick last handed the measurement over; driver thread only
  std::atomic<bool> housekeeping_{false};   // a pass is queued or running
  std::atomic<bool> sweep_pending_{false};  // the round moved on since the last sweep

  const ServerOptions options_;
  // The run's config and its codecs. The heartbeat's timings are options_' (set from the resolved
  // value by ServerOptionsFromRunConfig; tests shrink them below the config's whole seconds).
  const ResolvedRunConfig run_;
  const v1::RunConfig& config_ = run_.config;  // run_'s config, not a copy
  const std::string run_id_;
  const UploadAdmission upload_admission_;  // the limits of options_ and config_
  std::vector<UpdateTensor> initial_adapter_;
  Store* const store_;
  BlobStore* const blobs_;
  Evaluator* const evaluator_;
  ServerMetrics* const metrics_;
  const Clock clock_;
  const int64_t start_ms_;

  mutable absl::Mutex mu_;
  bool restored_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t rounds_committed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_committed_round_ ABSL_GUARDED_BY(mu_) = 0;
  // Global adapter: tensors sorted by name, the blob hash and size, the round that produced it.
  // The tensors are an immutable snapshot, replaced whole at each commit, so that whoever needs a
  // copy takes the pointer under mu_ and copies outside it: copying a 1 GB adapter takes about
  // half a second, which every RPC would otherwise wait out on mu_ as each aggregation starts.
  std::shared_ptr<const std::vector<UpdateTensor>> global_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const std::vector<UpdateTensor>>();
  std::string global_hash_ ABSL_GUARDED_BY(mu_);
  int64_t global_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t global_round_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t global_elements_ ABSL_GUARDED_BY(mu_) = 0;
  // Names and shapes of the adapter's federated tensors (config/federated_tensors.h: all but the
  // lora_A under lora.freeze_a), sorted by name, and their element count: what every update and
  // aggregate covers. Fixed for the whole run, written once by Restore before restored_ is set, read without the lock afterwards
  // (every reader first passed a locked check of restored_).
  std::vector<TensorSpec> spec_;
  int64_t spec_elements_ = 0;
  // Where the rounds' aggregation keys live; set once by Restore like spec_. The open round's key
  // is its RoundInfo::key.
  std::optional<RoundKeys> keys_;
  // With TLS: the server's certificate key and chain (PEM), which sign each round's key; set once
  // by Restore like spec_. Empty without TLS.
  std::string signing_key_pem_, signing_chain_pem_;
  std::string audit_public_key_;  // raw X25519 key of the offline audit key; empty: no audit trail
  // Signs `key` for `round` when the server has TLS.
  absl::Status SignRoundKey(int64_t round, AggregationKey& key) const;
  // The key of `round` while that round is open; FailedPrecondition once it has closed.
  absl::StatusOr<std::shared_ptr<const AggregationKey>> KeyFor(int64_t round) const;
  // Outside mu_: destroys round `round`'s key and its sealed updates (`uploads`), once it has closed.
  void ForgetRound(int64_t round, const std::vector<UploadRecord>& uploads);
  // Outside mu_: destroys every key file but the open round's, and the sealed updates of every
  // closed round after forgotten_through_ (the driver's sweep, and Restore).
  void ForgetClosedRounds();
  // Retention (coordinator_retention.cc): the lowest round number whose blobs are kept, given the
  // run's rounds (0 when every round is kept).
  int64_t RetentionKeepFrom(const std::vector<RoundRecord>& rounds) const;
  // Housekeeping: clears the hashes of the rounds below RetentionKeepFrom in the store, forgets
  // their downloads and delta steps, deletes the blobs no row names any more, and truncates the WAL.
  void ApplyRetention();
  // Deletes retention_pending_ blobs that no row names, unless a round is being aggregated (its
  // blobs may be Put and not yet recorded: a content-addressed hash may recur); else next pass.
  void DeletePrunedBlobs();
  int64_t pruned_from_ = 0;  // rows below this are pruned; housekeeping and Restore only
  std::vector<std::string>
      retention_pending_;  // blobs of pruned rows, not yet deleted; housekeeping only
  std::atomic<int64_t> retained_from_{0};  // pruned_from_ once its blobs are deleted
  // Restore: the open round `r`'s key into round_. A missing key with `accepted` updates (or an
  // aggregating round), or a key other than the one the round recorded, refuses start; a missing
  // key with nothing accepted abandons the round.
  absl::Status RestoreRoundKeyLocked(const RoundRecord& r, int64_t accepted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t forgotten_through_ =
      0;  // rounds up to this have no key and no sealed update; housekeeping only
  crypto::UpdatePlace PlaceOf(const std::string& client_id, const v1::UploadHeader& header) const;
  // The server optimizer with its state after the last committed round (set by Restore; used by
  // the driver thread's AggregateAndCommit only).
  std::optional<ServerOptimizer> server_opt_;
  // config.rounds (or its default), or fewer when the privacy budget affords fewer (set by Restore).
  int64_t TotalRounds() const {
    return std::min<int64_t>(ConfiguredRounds(config_), affordable_rounds_);
  }
  int64_t affordable_rounds_ = std::numeric_limits<int64_t>::max();
  // Differential privacy (config.privacy.dp); unset without it. Written by Restore and, under mu_,
  // by the aggregation thread as it commits a round; that thread reads it without the lock (no one
  // else writes it), every other reader holds mu_.
  std::optional<ServerDp> dp_;
  // training.learning_rate scaled by training.round_schedule at the current round.
  double RoundLearningRateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The adapter clients train from. Without a downlink codec it is the global adapter; with one, the
  // broadcast adapter (compression/downlink.h): the initial adapter plus every round's decoded
  // delta. Same names and shapes as global_.
  std::shared_ptr<const std::vector<UpdateTensor>> broadcast_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const std::vector<UpdateTensor>>();
  std::string broadcast_hash_ ABSL_GUARDED_BY(mu_);
  int64_t broadcast_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t broadcast_round_ ABSL_GUARDED_BY(mu_) = 0;
  // Each round's downlink delta: from broadcast `base` to broadcast `result`, by round.
  struct DownlinkStep {
    int64_t round = 0;
    std::string base, delta, result;
    int64_t delta_bytes = 0;
  };
  std::vector<DownlinkStep> downlink_steps_ ABSL_GUARDED_BY(mu_);
  // The delta chain from `held` to the broadcast adapter, when it is shorter than the adapter.
  std::optional<v1::AdapterDeltaChain> DeltaChainLocked(const std::string& held) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every blob a client may download: this run's global and broadcast adapters and downlink deltas.
  struct Downloadable {
    int64_t round = 0;
    int64_t bytes = 0;
    bool delta = false;
  };
  std::map<std::string, Downloadable> downloadable_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<RoundInfo> round_ ABSL_GUARDED_BY(mu_);  // the open round, if any
  ClientRegistry clients_ ABSL_GUARDED_BY(mu_){options_.heartbeat_timeout_ms};
  std::vector<std::unique_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
  // Upload streams admitted and not yet ended, by upload_id: whose, and the disk bytes reserved.
  struct ActiveUpload {
    std::string client_id;
    int64_t reserved_bytes = 0;
  };
  std::map<std::string, ActiveUpload> active_uploads_ ABSL_GUARDED_BY(mu_);
  int64_t disk_reserved_ ABSL_GUARDED_BY(mu_) = 0;  // the sum of their reserved_bytes
  // Refused upload ids and why (in memory only: a refused update is never counted, so losing this on
  // a restart only downgrades GetUploadStatus from REJECTED to what the store knows).
  struct Rejection {
    std::string client_id;
    std::string reason;
    int64_t round = 0;  // the round open when it was refused; forgotten two rounds later
  };
  std::map<std::string, Rejection> rejected_ ABSL_GUARDED_BY(mu_);
  uint64_t session_counter_ ABSL_GUARDED_BY(mu_) = 0;
  // The latest store write committed under mu_ (see DeferLocked).
  DurabilityTicket pending_ ABSL_GUARDED_BY(mu_);
  // Aggregation tries: one runs at a time; after a failure the next may start at retry_at_ms.
  bool aggregating_ ABSL_GUARDED_BY(mu_) = false;
  int aggregation_failures_ ABSL_GUARDED_BY(mu_) = 0;  // of the round now aggregating
  int64_t aggregation_retry_at_ms_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status stopped_ ABSL_GUARDED_BY(mu_);
  // Last members: destroyed first, so their threads finish before anything they use goes.
  // One worker: WaitForTask answers whose store writes still wait for their fsync.
  ThreadPool delivery_pool_{2};
  // One worker: the aggregation and evaluation of a closed round (ThreadPool(n) keeps n - 1
  // workers), at options_.bulk_work_nice.
  ThreadPool aggregation_pool_{2, options_.bulk_work_nice};
  // One worker: housekeeping (Tick hands it the sweeps and the store's size).
  ThreadPool housekeeping_pool_{2, options_.bulk_work_nice};
};

}  // namespace fedlora
