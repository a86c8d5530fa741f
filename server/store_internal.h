// Shared by the store's own files and nobody else: the prepared-statement wrapper, the mapping of
// rows to records, the group-commit syncer and Store::Impl (the connection, its statement cache and
// the queries several methods share). store_schema.cc: the schema, its migrations and Open;
// store_durability.cc: WalSyncer and the durability methods; store.cc: runs, rounds and clients;
// store_uploads.cc: uploads, metrics, audit copies and blob references.
#pragma once

#include <sqlite3.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/store.h"

namespace fedlora {
namespace store_internal {

inline constexpr const char* kRoundColumns =
    "run_id, round, state, deadline_ms, global_adapter_hash, result_adapter_hash, metrics_json, "
    "created_ms, "
    "updated_ms, server_state_hash, broadcast_hash, broadcast_delta_hash, key_id";
inline constexpr const char* kUploadColumns =
    "upload_id, run_id, round, client_id, task_id, num_examples, blob_hash, bytes, state, "
    "chunks_received, "
    "created_ms, accepted_ms";
inline constexpr const char* kClientColumns =
    "client_id, cert_fingerprint, state, first_seen_ms, last_seen_ms";

// Maps a SQLite result code to the most specific status code; the message carries SQLite's text.
absl::Status SqlError(sqlite3* db, int rc, std::string_view context);
int64_t SystemNowMs();

absl::StatusOr<RoundState> ParseRoundState(std::string_view s);
absl::StatusOr<UploadState> ParseUploadState(std::string_view s);
absl::StatusOr<ClientState> ParseClientState(std::string_view s);
bool AcceptsUploads(RoundState s);
bool IsLegalTransition(RoundState from, RoundState to);
// "round 3 of run 'r'", for messages.
std::string RoundName(const std::string& run_id, int64_t round);

// A cached prepared statement in use: binds, steps and reads columns; resets itself when it goes
// out of scope so that the next user finds it clean.
class Stmt {
 public:
  Stmt(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~Stmt() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& Bind(std::string_view v) {
    Check(
        sqlite3_bind_text(stmt_, ++next_, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& Bind(const std::string& v) { return Bind(std::string_view(v)); }
  Stmt& Bind(const char* v) { return Bind(std::string_view(v)); }
  Stmt& Bind(int64_t v) {
    Check(sqlite3_bind_int64(stmt_, ++next_, v));
    return *this;
  }
  Stmt& Bind(double v) {
    Check(sqlite3_bind_double(stmt_, ++next_, v));
    return *this;
  }

  // True when a row is available, false when done.
  absl::StatusOr<bool> Step() {
    if (!bind_status_.ok()) return bind_status_;
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqlError(db_, rc, absl::StrCat("executing `", Abbrev(), "`"));
  }
  // Runs a statement that returns no rows.
  absl::Status Run() {
    FEDLORA_ASSIGN_OR_RETURN(bool row, Step());
    (void)row;
    return absl::OkStatus();
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Double(int col) const { return sqlite3_column_double(stmt_, col); }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    const int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
  }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && bind_status_.ok())
      bind_status_ = SqlError(db_, rc, absl::StrCat("binding `", Abbrev(), "`"));
  }
  std::string Abbrev() const {
    std::string sql = sqlite3_sql(stmt_);
    return sql.size() > 120 ? sql.substr(0, 117) + "..." : sql;
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int next_ = 0;
  absl::Status bind_status_;
};

// One row of SELECT kRoundColumns / kUploadColumns / kClientColumns, as its record.
RoundRecord ReadRound(const Stmt& s);
UploadRecord ReadUpload(const Stmt& s);
ClientRecord ReadClient(const Stmt& s);
// Same run, round, client and task.
bool SameBinding(const UploadRecord& a, const UploadRecord& b);

}  // namespace store_internal

// --- WalSyncer: group commit -------------------------------------------------------------------
//
// The connection runs with synchronous=NORMAL: COMMIT appends the transaction's frames to the WAL
// (write(), no fsync), and SQLite itself fsyncs the WAL before each checkpoint and the database
// after it, so the files stay consistent. What NORMAL alone would lose on power failure is the
// tail of the WAL since the last fsync; WaitDurable closes that gap by fsyncing the WAL file. The
// WAL is append-only between checkpoints and a checkpoint first syncs it, so one fsync after a
// transaction's COMMIT returned covers that transaction and every earlier one: waiters that arrive
// while an fsync is running are served by the next one (one fsync per batch, not per commit).
//
// A failed fsync is final: the kernel may have dropped the dirty pages it could not write and
// marked them clean, so a later fsync that succeeds proves nothing about them. Every wait after
// the first failure fails with it (as PostgreSQL has done since 2018): nothing written after it is
// acknowledged, and a restart recovers from what is really on disk.
class WalSyncer {
 public:
  WalSyncer(std::string wal_path, std::function<absl::Status(std::string_view)> fault_hook)
      : wal_path_(std::move(wal_path)), fault_hook_(std::move(fault_hook)) {}

  // Called right after a COMMIT succeeded, under Store::mu_, so tickets follow commit order.
  DurabilityTicket Committed();
  absl::Status WaitDurable(uint64_t seq);
  bool IsDurable(uint64_t seq);
  absl::Status SyncAll();

 private:
  absl::Status FsyncWal();

  const std::string wal_path_;
  const std::function<absl::Status(std::string_view)> fault_hook_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t committed_ = 0;  // tickets handed out
  uint64_t synced_ = 0;     // every ticket <= this is durable
  absl::Status failed_;     // the first fsync failure, for good
  bool syncing_ = false;    // one thread is inside FsyncWal
  bool dir_synced_ = false;
};

// --- Impl: the connection and the shared queries. Callers hold Store::mu_. --------------------

struct Store::Impl {
  using Stmt = store_internal::Stmt;

  sqlite3* db = nullptr;
  StoreOptions options;
  WalSyncer* syncer = nullptr;
  // Where Transaction puts its ticket instead of waiting for durability (null: wait).
  DurabilityTicket* defer_to = nullptr;
  absl::flat_hash_map<std::string, sqlite3_stmt*> cache;  // SQL text -> prepared statement

  ~Impl() {
    for (auto& [sql, stmt] : cache) sqlite3_finalize(stmt);
    // sqlite3_close_v2 with the statements finalized closes now; in WAL mode the last connection
    // to close checkpoints and removes the -wal file.
    if (db != nullptr) sqlite3_close_v2(db);
  }

  int64_t Now() const { return options.clock ? options.clock() : store_internal::SystemNowMs(); }

  absl::Status Fault(std::string_view step) const {
    if (!options.fault_hook) return absl::OkStatus();
    return options.fault_hook(step);
  }

  // The cached statement for `sql`, prepared on first use.
  absl::StatusOr<sqlite3_stmt*> Prepare(const std::string& sql);
  // Runs a statement with no rows and no parameters.
  absl::Status Exec(const std::string& sql);

  // Runs `body` in one write transaction: BEGIN IMMEDIATE takes the write lock up front (no
  // read-to-write upgrade deadlock between processes); any error rolls everything back. Returns
  // after the WAL is fsynced (WalSyncer), or, with defer_to set, right after COMMIT with the ticket.
  template <class F>
  auto Transaction(F&& body) -> decltype(body()) {
    FEDLORA_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    auto result = body();
    if (!result.ok()) {
      (void)Exec("ROLLBACK");
      return result;
    }
    if (absl::Status s = Exec("COMMIT"); !s.ok()) {
      (void)Exec("ROLLBACK");
      return s;
    }
    if (syncer != nullptr) {
      const DurabilityTicket ticket = syncer->Committed();
      if (defer_to != nullptr) {
        *defer_to = ticket;
      } else if (absl::Status s = syncer->WaitDurable(ticket.seq); !s.ok()) {
        return s;
      }
    }
    return result;
  }

  // A read-only snapshot: every SELECT inside sees the same committed state.
  template <class F>
  auto ReadTransaction(F&& body) -> decltype(body()) {
    FEDLORA_RETURN_IF_ERROR(Exec("BEGIN DEFERRED"));
    auto result = body();
    (void)Exec(result.ok() ? "COMMIT" : "ROLLBACK");
    return result;
  }

  absl::StatusOr<int> UserVersion();
  // Applies the missing schema migrations, each in its own transaction (store_schema.cc).
  absl::Status Migrate();

  absl::StatusOr<Stmt*> Query(const std::string& sql, std::unique_ptr<Stmt>& holder);
  absl::Status RequireRun(const std::string& run_id);
  absl::StatusOr<RunRecord> GetRun(const std::string& run_id);
  absl::StatusOr<std::vector<std::string>> Selection(const std::string& run_id, int64_t round);
  // Rounds matching `where` (a SQL condition on run_id = ?1 and optional round = ?2).
  absl::StatusOr<std::vector<RoundRecord>> Rounds(const std::string& where_and_order,
                                                  const std::string& run_id,
                                                  std::optional<int64_t> round);
  absl::StatusOr<RoundRecord> GetRound(const std::string& run_id, int64_t round);
  absl::StatusOr<RoundState> RoundStateOf(const std::string& run_id, int64_t round);
  absl::StatusOr<std::optional<UploadRecord>> FindUpload(const std::string& upload_id);
  absl::StatusOr<std::vector<UploadRecord>> UploadsIn(const std::string& run_id, int64_t round,
                                                      UploadState state);
  absl::StatusOr<ClientRecord> GetClient(const std::string& client_id);
  absl::Status InsertMetric(const MetricRecord& m);
  // RecordAccepted's steps inside its transaction (store_uploads.cc): AlreadyExists when the
  // client already has another accepted upload for the task; then the row marked accepted
  // (`exists`: it was begun) or inserted as accepted.
  absl::Status CheckNoOtherAccepted(const UploadRecord& upload);
  absl::Status WriteAccepted(const UploadRecord& upload, bool exists);
};

template <class F>
auto Store::DeferredTransaction(DurabilityTicket* ticket, F&& body) {
  absl::MutexLock lock(&mu_);
  impl_->defer_to = ticket;
  auto result = impl_->Transaction(std::forward<F>(body));
  impl_->defer_to = nullptr;
  return result;
}

template <class F>
auto Store::WriteTransaction(DurabilityTicket* deferred, F&& body) -> decltype(body()) {
  DurabilityTicket ticket;
  auto result =
      DeferredTransaction(&ticket, std::forward<F>(body));  // mu_ held for the transaction only
  if (!result.ok()) return result;
  if (absl::Status s = FinishDurability(ticket, deferred); !s.ok()) return s;
  return result;
}

}  // namespace fedlora
