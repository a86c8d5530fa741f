// The server's durable state: runs, rounds, clients, uploads and metrics in SQLite, beside the
// content-addressed blob files of server/blob_store.h (which hold the bytes the rows point to).
//
//   FEDLORA_ASSIGN_OR_RETURN(auto store, Store::Open(dir + "/fedlora.db"));
//   FEDLORA_RETURN_IF_ERROR(store->CreateRun("run-1", config_json));
//   FEDLORA_ASSIGN_OR_RETURN(RoundRecord r, store->BeginRound("run-1", 1, initial_hash, deadline_ms));
//   ...  // selection, SetRoundState(kTraining), uploads:
//   absl::Status s = store->RecordAccepted(upload);   // OK or AlreadyExists: both mean "acknowledge"
//   ...
//   FEDLORA_RETURN_IF_ERROR(store->SetRoundState("run-1", 1, RoundState::kAggregating));
//   FEDLORA_RETURN_IF_ERROR(store->CommitRound("run-1", 1, new_hash, metrics_json, metrics));
//   // after a restart:
//   FEDLORA_ASSIGN_OR_RETURN(RecoveredState st, store->LoadLatestState("run-1"));
//
// Durability: the database is in WAL mode with synchronous=NORMAL, and every write transaction is
// made durable by a group fsync of the WAL (DurabilityTicket, below): a method that writes returns
// OK only after its transaction is committed and fsynced, unless it was handed a ticket to wait on
// later, so a row acknowledged to a client survives a process kill or power loss. The fsync is
// never waited for under the store's lock. Each write method is one transaction (all or nothing).
// Schema: versioned through PRAGMA user_version; Open applies the missing migrations in order (each
// in a transaction) and refuses a database newer than this binary (FailedPrecondition).
//
// Round life cycle (SetRoundState enforces it; re-setting the current state is a no-op):
//   selecting -> training -> aggregating -> committed (only through CommitRound)
//   any of the first three -> abandoned;  committed and abandoned are final.
// At most one round per run is open (not committed/abandoned), and round numbers only grow.
//
// Upload life cycle: BeginUpload (receiving) -> RecordUploadProgress* -> RecordAccepted (accepted).
// RecordAccepted also works without BeginUpload (a one-shot upload). An upload is accepted only
// while its round is selecting or training; at most one accepted upload per (run, round, client,
// task), so a retried upload under a new upload_id is not counted twice.
//
// Errors: NotFound (unknown run/round/upload/client), AlreadyExists (duplicate keys; see each
// method), FailedPrecondition (wrong round state, illegal transition, schema too new),
// InvalidArgument (bad field values), Unavailable (the database stayed locked past the busy
// timeout), Internal / DataLoss (other SQLite errors; DataLoss for SQLITE_CORRUPT/NOTADB). Every
// SQLite error message carries SQLite's own text.
//
// Thread-safety: all methods are thread-safe (one connection guarded by a mutex, held for the
// SQL only: concurrent writers wait for one shared fsync outside it). Several
// processes may open the same file (SQLite's locking plus the busy timeout arbitrate).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace fedlora {

enum class RoundState { kSelecting, kTraining, kAggregating, kCommitted, kAbandoned };
enum class UploadState { kReceiving, kAccepted };
enum class ClientState { kActive, kBlocked };

// Lowercase names as stored in the database: "selecting", ..., "receiving", "accepted",
// "active", "blocked".
std::string_view RoundStateName(RoundState state);
std::string_view UploadStateName(UploadState state);
std::string_view ClientStateName(ClientState state);
// True for committed and abandoned.
bool IsTerminal(RoundState state);

struct RunRecord {
  std::string run_id;
  std::string config_json;  // opaque to the store (the run's config, as the server serialises it)
  int64_t created_unix_ms = 0;
};

// The downlink's blobs of a committed round (RoundRecord::broadcast_hash, broadcast_delta_hash).
struct BroadcastHashes {
  std::string adapter_hash;
  std::string delta_hash;
};

struct RoundRecord {
  std::string run_id;
  int64_t round = 0;
  RoundState state = RoundState::kSelecting;
  std::vector<std::string> selected_clients;  // sorted by client_id
  int64_t deadline_unix_ms = 0;
  std::string global_adapter_hash;  // blob the round's clients train from
  std::string result_adapter_hash;  // blob CommitRound stored; empty until committed
  std::string metrics_json;         // as given to CommitRound; empty until committed
  std::string
      server_state_hash;  // blob of the server optimizer state after this round; may be empty
  // With a downlink codec: the adapter clients train from next (the previous one plus the decoded
  // delta) and the delta's blob. Empty without one.
  std::string broadcast_hash;
  std::string broadcast_delta_hash;
  // The aggregation key the round's updates are sealed to (crypto::AggregationKeyId); empty for a
  // round begun without one.
  std::string key_id;
  int64_t created_unix_ms = 0;
  int64_t updated_unix_ms = 0;
};

// A committed round that Store::RewindRun later marked lost: abandoned, with its result adapter
// and metrics (its DP record) kept. Its adapter was released, so privacy accounting still counts it.
bool IsRewound(const RoundRecord& r);
// Committed, or committed and then rewound: the round released an adapter.
bool ReleasedAnAdapter(const RoundRecord& r);

struct ClientRecord {
  std::string client_id;
  // SHA-256 hex of the DER of the certificate the client last joined with; empty without TLS and
  // for a client an operator blocked before it ever joined.
  std::string cert_fingerprint;
  ClientState state = ClientState::kActive;
  int64_t first_seen_unix_ms = 0;
  int64_t last_seen_unix_ms = 0;
};

struct UploadRecord {
  std::string upload_id;  // chosen by the client; the idempotency key
  std::string run_id;
  int64_t round = 0;
  std::string client_id;
  std::string task_id;
  int64_t num_examples = 0;  // aggregation weight, >= 1 once accepted
  std::string blob_hash;     // SHA-256 hex of the stored update; set once accepted
  int64_t bytes = 0;         // bytes received so far (receiving) or blob size (accepted)
  UploadState state = UploadState::kReceiving;
  int64_t chunks_received = 0;
  int64_t created_unix_ms = 0;
  int64_t accepted_unix_ms = 0;  // 0 while receiving
};

struct MetricRecord {
  std::string run_id;
  int64_t round = 0;
  std::string client_id;  // empty for a server-side (global) metric
  std::string key;        // e.g. "eval/accuracy", "train/loss"
  double value = 0.0;
};

// An accepted update re-sealed to the offline audit key (server/audit_trail.h); kept past every
// retention setting.
struct AuditCopyRecord {
  std::string upload_id;
  std::string run_id;
  int64_t round = 0;
  std::string client_id;
  int64_t num_examples = 0;
  std::string blob_hash;  // the audit blob (crypto/sealed_update.h's form, sealed to the audit key)
};

// What a restarting server needs to resume a run.
struct RecoveredState {
  RunRecord run;
  // The latest committed round: its result_adapter_hash is the current global adapter.
  std::optional<RoundRecord> last_committed;
  // The round that was in progress (selecting, training or aggregating), if any.
  std::optional<RoundRecord> open_round;
  std::vector<UploadRecord> accepted_uploads;   // of open_round, in canonical order
  std::vector<UploadRecord> receiving_uploads;  // of open_round, by upload_id: resumable uploads
  int64_t next_round = 1;                       // 1 + the highest round number of any state
};

struct StoreOptions {
  // How long a statement waits for another connection's lock before failing with Unavailable
  // (ms). 5 s covers a checkpoint of a large WAL on a slow disk.
  int busy_timeout_ms = 5000;
  // Source of timestamps (unix ms). Default: the system clock. Tests pin it.
  std::function<int64_t()> clock;
  // Test-only fault injection: called inside write transactions at the named steps
  // "CommitRound:after_round_update", "CommitRound:before_commit" and
  // "RecordAccepted:before_commit"; a non-OK status aborts and rolls back the transaction as a real
  // failure would (a test may also kill the process there). Also after each WAL fsync
  // ("WalSyncer:fsync"), where a non-OK status stands for a failed fsync. Null in production.
  std::function<absl::Status(std::string_view step)> fault_hook;
};

// Names a committed write transaction for Store::WaitDurable. 0 means "nothing to wait for".
struct DurabilityTicket {
  uint64_t seq = 0;
};

class WalSyncer;  // group fsync of the WAL (store_internal.h, store_durability.cc)

class Store {
 public:
  static constexpr int kSchemaVersion = 5;

  // Opens or creates the database at `path`, sets WAL / synchronous=NORMAL / foreign keys / busy
  // timeout, and migrates the schema to kSchemaVersion. Durability does not rest on SQLite's own
  // fsync: every write transaction is made durable by a group fsync of the WAL (see
  // DurabilityTicket); a method that returns OK has made its transaction durable unless it was
  // handed a ticket to wait on later.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path,
                                                     StoreOptions options = {});
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // The schema version found in the file after migration (== kSchemaVersion).
  absl::StatusOr<int> SchemaVersion();

  // --- runs ---
  // AlreadyExists when run_id exists. InvalidArgument on an empty run_id.
  absl::Status CreateRun(const std::string& run_id, const std::string& config_json);
  absl::StatusOr<RunRecord> GetRun(const std::string& run_id);
  absl::StatusOr<std::vector<RunRecord>> ListRuns();  // by created time, then run_id

  // --- rounds ---
  // Opens round `round` (>= 1) in state selecting. NotFound for an unknown run; AlreadyExists when
  // the round exists; FailedPrecondition when another round of the run is still open or `round`
  // is not above every existing round number. `key_id` names the round's aggregation key.
  absl::StatusOr<RoundRecord> BeginRound(const std::string& run_id, int64_t round,
                                         const std::string& global_adapter_hash,
                                         int64_t deadline_unix_ms,
                                         DurabilityTicket* deferred = nullptr,
                                         const std::string& key_id = "");
  absl::StatusOr<RoundRecord> GetRound(const std::string& run_id, int64_t round);
  absl::StatusOr<std::vector<RoundRecord>> ListRounds(const std::string& run_id);  // by round
  // Moves a round along its life cycle (see top). InvalidArgument for kCommitted (use
  // CommitRound); FailedPrecondition for an illegal transition.
  absl::Status SetRoundState(const std::string& run_id, int64_t round, RoundState state,
                             DurabilityTicket* deferred = nullptr);
  // Adds clients to the round's selection (already selected ones are ignored) and sets its
  // deadline. FailedPrecondition unless the round is selecting or training.
  absl::Status RecordSelection(const std::string& run_id, int64_t round,
                               const std::vector<std::string>& client_ids, int64_t deadline_unix_ms,
                               DurabilityTicket* deferred = nullptr);
  absl::StatusOr<bool> IsSelected(const std::string& run_id, int64_t round,
                                  const std::string& client_id);
  // Atomically: round -> committed with result_adapter_hash, metrics_json and server_state_hash
  // (empty for a stateless server optimizer), plus every row of `metrics` (each must name this run
  // and round). FailedPrecondition unless the round is aggregating; AlreadyExists for a metric that
  // exists. On any error nothing changes.
  // `broadcast` (both hashes or neither) is stored with it: see RoundRecord.
  absl::Status CommitRound(const std::string& run_id, int64_t round,
                           const std::string& result_adapter_hash, const std::string& metrics_json,
                           const std::vector<MetricRecord>& metrics,
                           const std::string& server_state_hash = "",
                           const BroadcastHashes& broadcast = {});

  // --- clients ---
  // Registers a client or refreshes it (fingerprint and last_seen updated; state kept).
  absl::StatusOr<ClientRecord> UpsertClient(const std::string& client_id,
                                            const std::string& cert_fingerprint);
  absl::StatusOr<ClientRecord> GetClient(const std::string& client_id);
  absl::Status SetClientState(const std::string& client_id, ClientState state);
  absl::StatusOr<std::vector<ClientRecord>> ListClients();  // by client_id

  // --- uploads ---
  // Starts (state receiving) or resumes an upload. Uses upload_id, run_id, round, client_id,
  // task_id, num_examples of `upload` (the rest is ignored). If upload_id exists with the same
  // run/round/client/task, returns the stored record unchanged (receiving: resume from its
  // `bytes`; accepted: already done). FailedPrecondition when upload_id is bound to a different
  // run/round/client/task, or the round is not selecting/training; NotFound for an unknown round.
  //
  // `deferred`, here and on every method that takes one: null means return only once the
  // transaction is durable; non-null means return as soon as it is committed (visible to readers,
  // lost on power failure until synced) and store the ticket to pass to WaitDurable. Deferring lets
  // a caller release its own locks first, so that concurrent commits share one fsync.
  absl::StatusOr<UploadRecord> BeginUpload(const UploadRecord& upload,
                                           DurabilityTicket* deferred = nullptr);
  // Records durable progress of a receiving upload (call after BlobWriter::Sync). NotFound for an
  // unknown upload; FailedPrecondition once accepted; InvalidArgument for negative values.
  absl::Status RecordUploadProgress(const std::string& upload_id, int64_t chunks_received,
                                    int64_t bytes, DurabilityTicket* deferred = nullptr);
  // Marks the upload accepted with its blob_hash, bytes, num_examples (>= 1), chunks_received,
  // creating the row if BeginUpload was skipped. Returns OK only after the transaction is durable.
  // AlreadyExists when this upload_id is already accepted (an idempotent replay), or another
  // upload of the same (run, round, client, task) is; both mean "acknowledge, do not count again".
  // FailedPrecondition when upload_id is bound to other run/round/client/task or the round is not
  // selecting/training; NotFound for an unknown round; InvalidArgument for empty ids or hash.
  absl::Status RecordAccepted(const UploadRecord& upload, DurabilityTicket* deferred = nullptr);

  // Returns once the transaction behind `ticket` (and every one committed before it) is durable.
  // One caller fsyncs the WAL for all waiters (group commit). Internal when the fsync fails.
  absl::Status WaitDurable(DurabilityTicket ticket);
  // True when WaitDurable(ticket) would return at once.
  bool IsDurable(DurabilityTicket ticket);
  // Makes every transaction committed so far durable (no-op when nothing is pending). Call before
  // reporting state that another thread may have committed with a deferred ticket.
  absl::Status SyncCommitted();
  absl::StatusOr<UploadRecord> GetUpload(const std::string& upload_id);
  // Accepted uploads of a round in the canonical order: by upload_id, bytewise (memcmp).
  absl::StatusOr<std::vector<UploadRecord>> ListAcceptedUploads(const std::string& run_id,
                                                                int64_t round);
  absl::StatusOr<std::vector<UploadRecord>> ListReceivingUploads(const std::string& run_id,
                                                                 int64_t round);
  absl::StatusOr<int64_t> CountAccepted(const std::string& run_id, int64_t round);

  // --- metrics ---
  // AlreadyExists when (run, round, client, key) exists. NotFound for an unknown run.
  absl::Status RecordMetric(const MetricRecord& metric);
  // All of `metrics` in one transaction (one fsync); entries whose key already exists keep their
  // first value (a re-sent report). NotFound for an unknown run.
  absl::Status RecordMetrics(const std::vector<MetricRecord>& metrics);
  // By client_id ("" first), then key.
  absl::StatusOr<std::vector<MetricRecord>> ListMetrics(const std::string& run_id, int64_t round);

  // --- audit trail (server/audit_trail.h) ---
  // Records the copies in one durable transaction; an upload that already has one keeps it (a
  // redone aggregation). InvalidArgument for an empty upload_id or blob_hash.
  absl::Status RecordAuditCopies(const std::vector<AuditCopyRecord>& copies);
  // The copies of run `run_id` ("" for every run) and round `round` (0 for every round), by run,
  // round and upload_id.
  absl::StatusOr<std::vector<AuditCopyRecord>> ListAuditCopies(const std::string& run_id,
                                                               int64_t round);

  // --- recovery and GC ---
  absl::StatusOr<RecoveredState> LoadLatestState(const std::string& run_id);
  // Rolls run `run_id` back to round `keep_through` (0: to the initial adapter), for a store whose
  // later adapters are lost (fedlora store repair --rewind; the server must not be running). In one
  // transaction every later round becomes abandoned: a committed one keeps its hashes and metrics
  // (IsRewound) and its metrics JSON gains "rewound": `reason`; an open one is abandoned as usual.
  // Returns how many committed rounds were marked lost. FailedPrecondition unless `keep_through` is
  // 0 or a committed round; NotFound for an unknown run. The one exception to "committed is final".
  absl::StatusOr<int64_t> RewindRun(const std::string& run_id, int64_t keep_through,
                                    const std::string& reason);
  // Every blob hash a row still needs (the uploads of rounds not yet committed or abandoned, the
  // rounds' adapters and optimizer states, the audit copies): keep these when collecting blob garbage.
  absl::StatusOr<absl::flat_hash_set<std::string>> ReferencedBlobHashes();

  // --- retention (server/coordinator_retention.cc) ---
  // Clears the blob hashes (result, global, optimizer state, broadcast adapter and delta) of every
  // closed round of the run numbered below `before_round`, so that ReferencedBlobHashes no longer
  // names them; the rows, their state and metrics_json stay (DP accounting counts them). A round
  // still open is never touched. Returns how many rounds changed.
  absl::StatusOr<int64_t> PruneRoundBlobs(const std::string& run_id, int64_t before_round);
  // Checkpoints the WAL into the database and truncates it (PRAGMA wal_checkpoint(TRUNCATE)), so
  // that the WAL does not sit at its high-water mark. Best effort under concurrent readers.
  absl::Status CheckpointWal();

 private:
  struct Impl;  // the connection, its prepared-statement cache, shared queries (store_internal.h)
  explicit Store(std::unique_ptr<Impl> impl);
  // impl_->Transaction(body) under mu_, with the fsync left to the caller: *ticket receives the
  // commit's ticket (0 when nothing was committed). Defined in store_internal.h, beside Impl.
  template <class F>
  auto DeferredTransaction(DurabilityTicket* ticket, F&& body);
  // Every write method: DeferredTransaction, then FinishDurability, so that the fsync is waited for
  // (or its ticket handed out) after mu_ is released and concurrent writers share it.
  template <class F>
  auto WriteTransaction(DurabilityTicket* deferred, F&& body) -> decltype(body());
  // Commits the current transaction's durability: waits now, or hands the ticket out.
  absl::Status FinishDurability(DurabilityTicket ticket, DurabilityTicket* deferred);

  absl::Mutex mu_;
  std::unique_ptr<Impl> impl_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<WalSyncer> syncer_;  // thread-safe on its own; also referenced by impl_
};

}  // namespace fedlora
