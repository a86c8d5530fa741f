// The SQLite store (schema, migrations, WAL group fsync) and its queries. Over 600 lines, not split
// yet: the schema/migrations, the durability machinery (WalSyncer) and the per-table queries are
// the three files it becomes, with Stmt and Store::Impl in an internal header between them.
#include "server/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "core/strings.h"
#include "server/blob_store.h"

namespace fedlora {
namespace {

// Schema migrations: kMigrations[i] takes the schema from version i to i + 1. Append only; never
// edit a migration that has shipped. STRICT tables make SQLite enforce the column types.
constexpr const char* kMigrations[] = {
    // v1: the initial schema.
    R"sql(
CREATE TABLE runs(
  run_id      TEXT PRIMARY KEY NOT NULL,
  config_json TEXT NOT NULL,
  created_ms  INTEGER NOT NULL
) STRICT;

CREATE TABLE rounds(
  run_id              TEXT NOT NULL REFERENCES runs(run_id),
  round               INTEGER NOT NULL CHECK(round >= 1),
  state               TEXT NOT NULL
                      CHECK(state IN ('selecting','training','aggregating','committed','abandoned')),
  deadline_ms         INTEGER NOT NULL,
  global_adapter_hash TEXT NOT NULL,
  result_adapter_hash TEXT NOT NULL DEFAULT '',
  metrics_json        TEXT NOT NULL DEFAULT '',
  created_ms          INTEGER NOT NULL,
  updated_ms          INTEGER NOT NULL,
  PRIMARY KEY(run_id, round)
) STRICT;

CREATE TABLE round_selections(
  run_id    TEXT NOT NULL,
  round     INTEGER NOT NULL,
  client_id TEXT NOT NULL,
  PRIMARY KEY(run_id, round, client_id),
  FOREIGN KEY(run_id, round) REFERENCES rounds(run_id, round)
) STRICT;

CREATE TABLE clients(
  client_id        TEXT PRIMARY KEY NOT NULL,
  cert_fingerprint TEXT NOT NULL,
  state            TEXT NOT NULL CHECK(state IN ('active','blocked')),
  first_seen_ms    INTEGER NOT NULL,
  last_seen_ms     INTEGER NOT NULL
) STRICT;

-- One row per upload_id. A receiving row is the partial-blob record of a resumable upload: its
-- bytes are in the blob store's partial/<upload_id>, of which `bytes` are known durable.
CREATE TABLE uploads(
  upload_id       TEXT PRIMARY KEY NOT NULL,
  run_id          TEXT NOT NULL,
  round           INTEGER NOT NULL,
  client_id       TEXT NOT NULL,
  task_id         TEXT NOT NULL,
  num_examples    INTEGER NOT NULL CHECK(num_examples >= 0),
  blob_hash       TEXT NOT NULL DEFAULT '',
  bytes           INTEGER NOT NULL DEFAULT 0 CHECK(bytes >= 0),
  state           TEXT NOT NULL CHECK(state IN ('receiving','accepted')),
  chunks_received INTEGER NOT NULL DEFAULT 0 CHECK(chunks_received >= 0),
  created_ms      INTEGER NOT NULL,
  accepted_ms     INTEGER NOT NULL DEFAULT 0,
  FOREIGN KEY(run_id, round) REFERENCES rounds(run_id, round)
) STRICT;
-- Never count one task twice, whatever upload_id a retry uses.
CREATE UNIQUE INDEX uploads_one_accepted_per_task ON uploads(run_id, round, client_id, task_id)
  WHERE state = 'accepted';
CREATE INDEX uploads_by_round ON uploads(run_id, round, state, upload_id);

CREATE TABLE metrics(
  run_id      TEXT NOT NULL REFERENCES runs(run_id),
  round       INTEGER NOT NULL,
  client_id   TEXT NOT NULL DEFAULT '',
  key         TEXT NOT NULL,
  value       REAL NOT NULL,
  recorded_ms INTEGER NOT NULL,
  PRIMARY KEY(run_id, round, client_id, key)
) STRICT;
)sql",
    // v2: the server optimizer's state (momentum / Adam moments) saved with each committed round.
    R"sql(
ALTER TABLE rounds ADD COLUMN server_state_hash TEXT NOT NULL DEFAULT '';
)sql",
    // v3: the downlink's broadcast adapter and the delta that leads to it, with each committed round.
    R"sql(
ALTER TABLE rounds ADD COLUMN broadcast_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE rounds ADD COLUMN broadcast_delta_hash TEXT NOT NULL DEFAULT '';
)sql",
    // v4: the id of the aggregation key each round's updates are sealed to.
    R"sql(
ALTER TABLE rounds ADD COLUMN key_id TEXT NOT NULL DEFAULT '';
)sql",
    // v5: the audit trail (server/audit_trail.h): each counted update sealed to an offline key.
    R"sql(
CREATE TABLE audit_copies(
  upload_id    TEXT PRIMARY KEY NOT NULL,
  run_id       TEXT NOT NULL,
  round        INTEGER NOT NULL,
  client_id    TEXT NOT NULL,
  num_examples INTEGER NOT NULL,
  blob_hash    TEXT NOT NULL,
  created_ms   INTEGER NOT NULL
) STRICT;
CREATE INDEX audit_copies_by_round ON audit_copies(run_id, round);
)sql",
};
constexpr int kNumMigrations = static_cast<int>(sizeof(kMigrations) / sizeof(kMigrations[0]));
static_assert(kNumMigrations == Store::kSchemaVersion,
              "add a migration when bumping kSchemaVersion");

constexpr const char* kRoundColumns =
    "run_id, round, state, deadline_ms, global_adapter_hash, result_adapter_hash, metrics_json, "
    "created_ms, "
    "updated_ms, server_state_hash, broadcast_hash, broadcast_delta_hash, key_id";
constexpr const char* kUploadColumns =
    "upload_id, run_id, round, client_id, task_id, num_examples, blob_hash, bytes, state, "
    "chunks_received, "
    "created_ms, accepted_ms";
constexpr const char* kClientColumns =
    "client_id, cert_fingerprint, state, first_seen_ms, last_seen_ms";

// Maps a SQLite result code to the most specific status code; the message carries SQLite's text.
absl::Status SqlError(sqlite3* db, int rc, std::string_view context) {
  const int ext = db != nullptr ? sqlite3_extended_errcode(db) : rc;
  const std::string msg =
      absl::StrCat(ToAbsl(context), ": ", db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc),
                   " (", sqlite3_errstr(rc), ", code ", ext, ")");
  switch (rc & 0xFF) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(msg);
    case SQLITE_CONSTRAINT:
      if (ext == SQLITE_CONSTRAINT_PRIMARYKEY || ext == SQLITE_CONSTRAINT_UNIQUE)
        return absl::AlreadyExistsError(msg);
      if (ext == SQLITE_CONSTRAINT_FOREIGNKEY) return absl::FailedPreconditionError(msg);
      return absl::InvalidArgumentError(msg);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(msg);
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(msg);
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_AUTH:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<RoundState> ParseRoundState(std::string_view s) {
  for (RoundState st : {RoundState::kSelecting, RoundState::kTraining, RoundState::kAggregating,
                        RoundState::kCommitted, RoundState::kAbandoned}) {
    if (RoundStateName(st) == s) return st;
  }
  return absl::DataLossError(
      absl::StrCat("store: unknown round state '", ToAbsl(s), "' in the database"));
}
absl::StatusOr<UploadState> ParseUploadState(std::string_view s) {
  if (s == "receiving") return UploadState::kReceiving;
  if (s == "accepted") return UploadState::kAccepted;
  return absl::DataLossError(
      absl::StrCat("store: unknown upload state '", ToAbsl(s), "' in the database"));
}
absl::StatusOr<ClientState> ParseClientState(std::string_view s) {
  if (s == "active") return ClientState::kActive;
  if (s == "blocked") return ClientState::kBlocked;
  return absl::DataLossError(
      absl::StrCat("store: unknown client state '", ToAbsl(s), "' in the database"));
}

bool AcceptsUploads(RoundState s) {
  return s == RoundState::kSelecting || s == RoundState::kTraining;
}

bool IsLegalTransition(RoundState from, RoundState to) {
  if (IsTerminal(from)) return false;
  if (to == RoundState::kAbandoned) return true;
  return (from == RoundState::kSelecting && to == RoundState::kTraining) ||
         (from == RoundState::kTraining && to == RoundState::kAggregating);
}

std::string RoundName(const std::string& run_id, int64_t round) {
  return absl::StrCat("round ", round, " of run '", run_id, "'");
}

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

RoundRecord ReadRound(const Stmt& s) {
  RoundRecord r;
  r.run_id = s.Text(0);
  r.round = s.Int(1);
  r.state = ParseRoundState(s.Text(2)).value_or(RoundState::kAbandoned);  // CHECK constraint guards
  r.deadline_unix_ms = s.Int(3);
  r.global_adapter_hash = s.Text(4);
  r.result_adapter_hash = s.Text(5);
  r.metrics_json = s.Text(6);
  r.created_unix_ms = s.Int(7);
  r.updated_unix_ms = s.Int(8);
  r.server_state_hash = s.Text(9);
  r.broadcast_hash = s.Text(10);
  r.broadcast_delta_hash = s.Text(11);
  r.key_id = s.Text(12);
  return r;
}

UploadRecord ReadUpload(const Stmt& s) {
  UploadRecord u;
  u.upload_id = s.Text(0);
  u.run_id = s.Text(1);
  u.round = s.Int(2);
  u.client_id = s.Text(3);
  u.task_id = s.Text(4);
  u.num_examples = s.Int(5);
  u.blob_hash = s.Text(6);
  u.bytes = s.Int(7);
  u.state = ParseUploadState(s.Text(8)).value_or(UploadState::kReceiving);
  u.chunks_received = s.Int(9);
  u.created_unix_ms = s.Int(10);
  u.accepted_unix_ms = s.Int(11);
  return u;
}

ClientRecord ReadClient(const Stmt& s) {
  ClientRecord c;
  c.client_id = s.Text(0);
  c.cert_fingerprint = s.Text(1);
  c.state = ParseClientState(s.Text(2)).value_or(ClientState::kBlocked);
  c.first_seen_unix_ms = s.Int(3);
  c.last_seen_unix_ms = s.Int(4);
  return c;
}

bool SameBinding(const UploadRecord& a, const UploadRecord& b) {
  return a.run_id == b.run_id && a.round == b.round && a.client_id == b.client_id &&
         a.task_id == b.task_id;
}

}  // namespace

std::string_view RoundStateName(RoundState state) {
  switch (state) {
    case RoundState::kSelecting:
      return "selecting";
    case RoundState::kTraining:
      return "training";
    case RoundState::kAggregating:
      return "aggregating";
    case RoundState::kCommitted:
      return "committed";
    case RoundState::kAbandoned:
      return "abandoned";
  }
  return "unknown";
}

std::string_view UploadStateName(UploadState state) {
  return state == UploadState::kAccepted ? "accepted" : "receiving";
}

std::string_view ClientStateName(ClientState state) {
  return state == ClientState::kBlocked ? "blocked" : "active";
}

bool IsRewound(const RoundRecord& r) {
  return r.state == RoundState::kAbandoned && !r.result_adapter_hash.empty();
}
bool ReleasedAnAdapter(const RoundRecord& r) {
  return r.state == RoundState::kCommitted || IsRewound(r);
}

bool IsTerminal(RoundState state) {
  return state == RoundState::kCommitted || state == RoundState::kAbandoned;
}

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
  DurabilityTicket Committed() {
    std::lock_guard<std::mutex> lock(mu_);
    return DurabilityTicket{++committed_};
  }

  absl::Status WaitDurable(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    while (synced_ < seq) {
      if (!failed_.ok()) return failed_;
      if (syncing_) {
        cv_.wait(lock);
        continue;
      }
      syncing_ = true;
      const uint64_t target = committed_;  // every commit up to here has written its frames
      lock.unlock();
      absl::Status s = FsyncWal();
      lock.lock();
      syncing_ = false;
      cv_.notify_all();
      if (!s.ok()) {
        failed_ =
            absl::DataLossError(absl::StrCat(s.message(),
                                             "; the store is no longer durable and refuses "
                                             "every later write's durability: restart the server"));
        return failed_;
      }
      synced_ = std::max(synced_, target);
    }
    return absl::OkStatus();
  }

  bool IsDurable(uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    return synced_ >= seq;
  }

  absl::Status SyncAll() {
    uint64_t target;
    {
      std::lock_guard<std::mutex> lock(mu_);
      target = committed_;
    }
    return WaitDurable(target);
  }

 private:
  // fsync through a descriptor of our own: Linux flushes the inode whichever descriptor asks.
  // Opened per call because SQLite may recreate the file (then the frames we need were
  // checkpointed into the database, which SQLite synced).
  absl::Status FsyncWal() {
    const int fd = ::open(wal_path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return absl::OkStatus();
      return absl::InternalError(
          absl::StrCat("opening ", wal_path_, " to fsync it: ", std::strerror(errno)));
    }
    int rc = ::fsync(fd);
    int err = errno;
    if (rc == 0 && fault_hook_ != nullptr) {
      if (absl::Status injected = fault_hook_("WalSyncer:fsync"); !injected.ok()) {
        rc = -1;
        err = EIO;
      }
    }
    ::close(fd);
    if (rc != 0)
      return absl::InternalError(absl::StrCat("fsync ", wal_path_, ": ", std::strerror(err)));
    if (!dir_synced_) {
      // The WAL's directory entry, once: a new file is durable only with its entry.
      const std::string dir = wal_path_.substr(0, wal_path_.find_last_of('/') + 1);
      const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd < 0)
        return absl::InternalError(absl::StrCat("opening ", dir, ": ", std::strerror(errno)));
      const int drc = ::fsync(dfd);
      const int derr = errno;
      ::close(dfd);
      if (drc != 0)
        return absl::InternalError(absl::StrCat("fsync ", dir, ": ", std::strerror(derr)));
      dir_synced_ = true;  // only the syncing thread (syncing_ set) touches it
    }
    return absl::OkStatus();
  }

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

// --- Impl: the connection and every query. Callers hold Store::mu_. ------------------------------

struct Store::Impl {
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

  int64_t Now() const { return options.clock ? options.clock() : SystemNowMs(); }

  absl::Status Fault(std::string_view step) const {
    if (!options.fault_hook) return absl::OkStatus();
    return options.fault_hook(step);
  }

  // The cached statement for `sql`, prepared on first use.
  absl::StatusOr<sqlite3_stmt*> Prepare(const std::string& sql) {
    if (auto it = cache.find(sql); it != cache.end()) return it->second;
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v3(db, sql.c_str(), static_cast<int>(sql.size()),
                                      SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) {
      sqlite3_finalize(stmt);
      return SqlError(db, rc, absl::StrCat("preparing `", sql.substr(0, 120), "`"));
    }
    cache.emplace(sql, stmt);
    return stmt;
  }

  // Runs a statement with no rows and no parameters.
  absl::Status Exec(const std::string& sql) {
    FEDLORA_ASSIGN_OR_RETURN(sqlite3_stmt * raw, Prepare(sql));
    Stmt s(db, raw);
    return s.Run();
  }

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

  absl::StatusOr<int> UserVersion() {
    FEDLORA_ASSIGN_OR_RETURN(sqlite3_stmt * raw, Prepare("PRAGMA user_version"));
    Stmt s(db, raw);
    FEDLORA_ASSIGN_OR_RETURN(bool row, s.Step());
    return row ? static_cast<int>(s.Int(0)) : 0;
  }

  absl::Status Migrate() {
    FEDLORA_ASSIGN_OR_RETURN(int version, UserVersion());
    if (version > kNumMigrations) {
      return absl::FailedPreconditionError(absl::StrCat("store schema version ", version,
                                                        " is newer than this binary supports (",
                                                        kNumMigrations, "); upgrade the server"));
    }
    for (int v = version; v < kNumMigrations; ++v) {
      absl::Status s = Transaction([&]() -> absl::Status {
        // Re-read inside the write lock: another process may have migrated meanwhile.
        FEDLORA_ASSIGN_OR_RETURN(int now, UserVersion());
        if (now > v) return absl::OkStatus();
        char* err = nullptr;
        const int rc = sqlite3_exec(db, kMigrations[v], nullptr, nullptr, &err);
        if (rc != SQLITE_OK) {
          absl::Status st = SqlError(db, rc, absl::StrCat("schema migration ", v, " -> ", v + 1));
          sqlite3_free(err);
          return st;
        }
        return Exec(absl::StrCat("PRAGMA user_version = ", v + 1));
      });
      FEDLORA_RETURN_IF_ERROR(s);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Stmt*> Query(const std::string& sql, std::unique_ptr<Stmt>& holder) {
    FEDLORA_ASSIGN_OR_RETURN(sqlite3_stmt * raw, Prepare(sql));
    holder = std::make_unique<Stmt>(db, raw);
    return holder.get();
  }

  absl::Status RequireRun(const std::string& run_id) {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(Stmt * s, Query("SELECT 1 FROM runs WHERE run_id = ?", h));
    s->Bind(run_id);
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) return absl::NotFoundError(absl::StrCat("run '", run_id, "' not found"));
    return absl::OkStatus();
  }

  absl::StatusOr<RunRecord> GetRun(const std::string& run_id) {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s, Query("SELECT run_id, config_json, created_ms FROM runs WHERE run_id = ?", h));
    s->Bind(run_id);
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) return absl::NotFoundError(absl::StrCat("run '", run_id, "' not found"));
    return RunRecord{s->Text(0), s->Text(1), s->Int(2)};
  }

  absl::StatusOr<std::vector<std::string>> Selection(const std::string& run_id, int64_t round) {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(Stmt * s, Query("SELECT client_id FROM round_selections WHERE run_id "
                                             "= ? AND round = ? ORDER BY client_id",
                                             h));
    s->Bind(run_id).Bind(round);
    std::vector<std::string> out;
    for (;;) {
      FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
      if (!row) break;
      out.push_back(s->Text(0));
    }
    return out;
  }

  // Rounds matching `where` (a SQL condition on run_id = ?1 and optional round = ?2).
  absl::StatusOr<std::vector<RoundRecord>> Rounds(const std::string& where_and_order,
                                                  const std::string& run_id,
                                                  std::optional<int64_t> round) {
    std::vector<RoundRecord> out;
    {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s,
          Query(absl::StrCat("SELECT ", kRoundColumns, " FROM rounds WHERE ", where_and_order), h));
      s->Bind(run_id);
      if (round.has_value()) s->Bind(*round);
      for (;;) {
        FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
        if (!row) break;
        out.push_back(ReadRound(*s));
      }
    }
    for (RoundRecord& r : out) {
      FEDLORA_ASSIGN_OR_RETURN(r.selected_clients, Selection(r.run_id, r.round));
    }
    return out;
  }

  absl::StatusOr<RoundRecord> GetRound(const std::string& run_id, int64_t round) {
    FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rs,
                             Rounds("run_id = ? AND round = ?", run_id, round));
    if (rs.empty())
      return absl::NotFoundError(absl::StrCat(RoundName(run_id, round), " not found"));
    return std::move(rs[0]);
  }

  absl::StatusOr<RoundState> RoundStateOf(const std::string& run_id, int64_t round) {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                             Query("SELECT state FROM rounds WHERE run_id = ? AND round = ?", h));
    s->Bind(run_id).Bind(round);
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) return absl::NotFoundError(absl::StrCat(RoundName(run_id, round), " not found"));
    return ParseRoundState(s->Text(0));
  }

  absl::StatusOr<std::optional<UploadRecord>> FindUpload(const std::string& upload_id) {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        Query(absl::StrCat("SELECT ", kUploadColumns, " FROM uploads WHERE upload_id = ?"), h));
    s->Bind(upload_id);
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) return std::optional<UploadRecord>();
    return std::optional<UploadRecord>(ReadUpload(*s));
  }

  absl::StatusOr<std::vector<UploadRecord>> UploadsIn(const std::string& run_id, int64_t round,
                                                      UploadState state) {
    std::unique_ptr<Stmt> h;
    // ORDER BY upload_id uses SQLite's BINARY collation, i.e. memcmp: the canonical order.
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        Query(absl::StrCat(
                  "SELECT ", kUploadColumns,
                  " FROM uploads WHERE run_id = ? AND round = ? AND state = ? ORDER BY upload_id"),
              h));
    s->Bind(run_id).Bind(round).Bind(UploadStateName(state));
    std::vector<UploadRecord> out;
    for (;;) {
      FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
      if (!row) break;
      out.push_back(ReadUpload(*s));
    }
    return out;
  }

  absl::StatusOr<ClientRecord> GetClient(const std::string& client_id) {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        Query(absl::StrCat("SELECT ", kClientColumns, " FROM clients WHERE client_id = ?"), h));
    s->Bind(client_id);
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) return absl::NotFoundError(absl::StrCat("client '", client_id, "' not found"));
    return ReadClient(*s);
  }

  absl::Status InsertMetric(const MetricRecord& m) {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(Stmt * s, Query("INSERT INTO metrics(run_id, round, client_id, key, "
                                             "value, recorded_ms) VALUES(?, ?, ?, ?, ?, ?)",
                                             h));
    s->Bind(m.run_id).Bind(m.round).Bind(m.client_id).Bind(m.key).Bind(m.value).Bind(Now());
    return Annotate(
        s->Run(),
        absl::StrCat("metric '", m.key, "' of ", RoundName(m.run_id, m.round),
                     m.client_id.empty() ? "" : absl::StrCat(", client '", m.client_id, "'")));
  }
};

// --- Store -----------------------------------------------------------------------------------------

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path, StoreOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  const int rc =
      sqlite3_open_v2(path.c_str(), &impl->db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqlError(impl->db, rc, absl::StrCat("opening store '", path, "'"));
    return s;
  }
  sqlite3_extended_result_codes(impl->db, 1);
  if (int brc = sqlite3_busy_timeout(impl->db, impl->options.busy_timeout_ms); brc != SQLITE_OK) {
    return SqlError(impl->db, brc, "setting the busy timeout");
  }
  // journal_mode returns a row with the resulting mode: "wal" unless the file system cannot do it.
  {
    FEDLORA_ASSIGN_OR_RETURN(sqlite3_stmt * raw, impl->Prepare("PRAGMA journal_mode = WAL"));
    Stmt s(impl->db, raw);
    FEDLORA_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row || s.Text(0) != "wal") {
      return absl::FailedPreconditionError(absl::StrCat(
          "store '", path, "': cannot enable WAL journal mode (got '", row ? s.Text(0) : "", "')"));
    }
  }
  // NORMAL: COMMIT does not fsync; WalSyncer does, once per batch of concurrent commits, before
  // any write method returns (or before its deferred ticket is waited on), so acknowledged rows
  // still survive power loss.
  FEDLORA_RETURN_IF_ERROR(impl->Exec("PRAGMA synchronous = NORMAL"));
  FEDLORA_RETURN_IF_ERROR(impl->Exec("PRAGMA foreign_keys = ON"));
  const char* db_file = sqlite3_db_filename(impl->db, "main");
  auto syncer = std::make_shared<WalSyncer>(
      absl::StrCat(db_file != nullptr ? db_file : path.c_str(), "-wal"), impl->options.fault_hook);
  impl->syncer = syncer.get();
  FEDLORA_RETURN_IF_ERROR_CTX(impl->Migrate(), absl::StrCat("store '", path, "'"));
  auto store = std::unique_ptr<Store>(new Store(std::move(impl)));
  store->syncer_ = std::move(syncer);
  return store;
}

template <class F>
auto Store::DeferredTransaction(DurabilityTicket* ticket, F&& body) {
  absl::MutexLock lock(&mu_);
  impl_->defer_to = ticket;
  auto result = impl_->Transaction(std::forward<F>(body));
  impl_->defer_to = nullptr;
  return result;
}

absl::Status Store::FinishDurability(DurabilityTicket ticket, DurabilityTicket* deferred) {
  if (deferred != nullptr) {
    *deferred = ticket;
    return absl::OkStatus();
  }
  return syncer_->WaitDurable(ticket.seq);
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

absl::Status Store::WaitDurable(DurabilityTicket ticket) {
  return syncer_->WaitDurable(ticket.seq);
}

bool Store::IsDurable(DurabilityTicket ticket) { return syncer_->IsDurable(ticket.seq); }

absl::Status Store::SyncCommitted() { return syncer_->SyncAll(); }

absl::StatusOr<int> Store::SchemaVersion() {
  absl::MutexLock lock(&mu_);
  return impl_->UserVersion();
}

absl::Status Store::CreateRun(const std::string& run_id, const std::string& config_json) {
  DurabilityTicket* const deferred = nullptr;
  if (run_id.empty()) return absl::InvalidArgumentError("CreateRun: empty run_id");
  return WriteTransaction(deferred, [&]() -> absl::Status {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        impl_->Query("INSERT INTO runs(run_id, config_json, created_ms) VALUES(?, ?, ?)", h));
    s->Bind(run_id).Bind(config_json).Bind(impl_->Now());
    return Annotate(s->Run(), absl::StrCat("CreateRun('", run_id, "')"));
  });
}

absl::StatusOr<RunRecord> Store::GetRun(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  return impl_->GetRun(run_id);
}

absl::StatusOr<std::vector<RunRecord>> Store::ListRuns() {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s,
      impl_->Query("SELECT run_id, config_json, created_ms FROM runs ORDER BY created_ms, run_id",
                   h));
  std::vector<RunRecord> out;
  for (;;) {
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back(RunRecord{s->Text(0), s->Text(1), s->Int(2)});
  }
  return out;
}

absl::StatusOr<RoundRecord> Store::BeginRound(const std::string& run_id, int64_t round,
                                              const std::string& global_adapter_hash,
                                              int64_t deadline_unix_ms, DurabilityTicket* deferred,
                                              const std::string& key_id) {
  if (round < 1)
    return absl::InvalidArgumentError(absl::StrCat("BeginRound: round ", round, " must be >= 1"));
  return WriteTransaction(deferred, [&]() -> absl::StatusOr<RoundRecord> {
    FEDLORA_RETURN_IF_ERROR(impl_->RequireRun(run_id));
    {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s,
          impl_->Query("SELECT round, state FROM rounds WHERE run_id = ? ORDER BY round DESC", h));
      s->Bind(run_id);
      int64_t max_round = 0;
      for (;;) {
        FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
        if (!row) break;
        const int64_t r = s->Int(0);
        FEDLORA_ASSIGN_OR_RETURN(RoundState st, ParseRoundState(s->Text(1)));
        max_round = std::max(max_round, r);
        if (r == round)
          return absl::AlreadyExistsError(
              absl::StrCat(RoundName(run_id, round), " already exists"));
        if (!IsTerminal(st)) {
          return absl::FailedPreconditionError(
              absl::StrCat("BeginRound(", round, "): ", RoundName(run_id, r), " is still ",
                           ToAbsl(RoundStateName(st))));
        }
      }
      if (round <= max_round) {
        return absl::FailedPreconditionError(absl::StrCat("BeginRound(", round, "): run '", run_id,
                                                          "' already reached round ", max_round));
      }
    }
    {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                               impl_->Query("INSERT INTO rounds(run_id, round, state, deadline_ms, "
                                            "global_adapter_hash, created_ms, updated_ms, key_id) "
                                            "VALUES(?, ?, 'selecting', ?, ?, ?, ?, ?)",
                                            h));
      const int64_t now = impl_->Now();
      s->Bind(run_id)
          .Bind(round)
          .Bind(deadline_unix_ms)
          .Bind(global_adapter_hash)
          .Bind(now)
          .Bind(now)
          .Bind(key_id);
      FEDLORA_RETURN_IF_ERROR_CTX(s->Run(), absl::StrCat("BeginRound: ", RoundName(run_id, round)));
    }
    return impl_->GetRound(run_id, round);
  });
}

absl::StatusOr<RoundRecord> Store::GetRound(const std::string& run_id, int64_t round) {
  absl::MutexLock lock(&mu_);
  return impl_->ReadTransaction([&] { return impl_->GetRound(run_id, round); });
}

absl::StatusOr<std::vector<RoundRecord>> Store::ListRounds(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  return impl_->ReadTransaction(
      [&] { return impl_->Rounds("run_id = ? ORDER BY round", run_id, std::nullopt); });
}

absl::Status Store::SetRoundState(const std::string& run_id, int64_t round, RoundState state,
                                  DurabilityTicket* deferred) {
  if (state == RoundState::kCommitted) {
    return absl::InvalidArgumentError(
        "SetRoundState: a round becomes committed only through CommitRound");
  }
  return WriteTransaction(deferred, [&]() -> absl::Status {
    FEDLORA_ASSIGN_OR_RETURN(RoundState from, impl_->RoundStateOf(run_id, round));
    if (from == state) return absl::OkStatus();
    if (!IsLegalTransition(from, state)) {
      return absl::FailedPreconditionError(
          absl::StrCat(RoundName(run_id, round), ": cannot go from ", ToAbsl(RoundStateName(from)),
                       " to ", ToAbsl(RoundStateName(state))));
    }
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        impl_->Query("UPDATE rounds SET state = ?, updated_ms = ? WHERE run_id = ? AND round = ?",
                     h));
    s->Bind(RoundStateName(state)).Bind(impl_->Now()).Bind(run_id).Bind(round);
    return s->Run();
  });
}

absl::Status Store::RecordSelection(const std::string& run_id, int64_t round,
                                    const std::vector<std::string>& client_ids,
                                    int64_t deadline_unix_ms, DurabilityTicket* deferred) {
  return WriteTransaction(deferred, [&]() -> absl::Status {
    FEDLORA_ASSIGN_OR_RETURN(RoundState st, impl_->RoundStateOf(run_id, round));
    if (!AcceptsUploads(st)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RecordSelection: ", RoundName(run_id, round), " is ", ToAbsl(RoundStateName(st))));
    }
    for (const std::string& c : client_ids) {
      if (c.empty()) return absl::InvalidArgumentError("RecordSelection: empty client_id");
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s,
          impl_->Query(
              "INSERT OR IGNORE INTO round_selections(run_id, round, client_id) VALUES(?, ?, ?)",
              h));
      s->Bind(run_id).Bind(round).Bind(c);
      FEDLORA_RETURN_IF_ERROR(s->Run());
    }
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        impl_->Query(
            "UPDATE rounds SET deadline_ms = ?, updated_ms = ? WHERE run_id = ? AND round = ?", h));
    s->Bind(deadline_unix_ms).Bind(impl_->Now()).Bind(run_id).Bind(round);
    return s->Run();
  });
}

absl::StatusOr<bool> Store::IsSelected(const std::string& run_id, int64_t round,
                                       const std::string& client_id) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s,
      impl_->Query(
          "SELECT 1 FROM round_selections WHERE run_id = ? AND round = ? AND client_id = ?", h));
  s->Bind(run_id).Bind(round).Bind(client_id);
  return s->Step();
}

absl::Status Store::CommitRound(const std::string& run_id, int64_t round,
                                const std::string& result_adapter_hash,
                                const std::string& metrics_json,
                                const std::vector<MetricRecord>& metrics,
                                const std::string& server_state_hash,
                                const BroadcastHashes& broadcast) {
  DurabilityTicket* const deferred = nullptr;
  if (broadcast.adapter_hash.empty() != broadcast.delta_hash.empty()) {
    return absl::InvalidArgumentError(
        "CommitRound: a broadcast adapter and its delta come together");
  }
  for (const MetricRecord& m : metrics) {
    if (m.run_id != run_id || m.round != round) {
      return absl::InvalidArgumentError(absl::StrCat("CommitRound(", RoundName(run_id, round),
                                                     "): metric '", m.key, "' names ",
                                                     RoundName(m.run_id, m.round)));
    }
    if (m.key.empty()) return absl::InvalidArgumentError("CommitRound: metric with an empty key");
  }
  return WriteTransaction(deferred, [&]() -> absl::Status {
    FEDLORA_ASSIGN_OR_RETURN(RoundState st, impl_->RoundStateOf(run_id, round));
    if (st != RoundState::kAggregating) {
      return absl::FailedPreconditionError(absl::StrCat("CommitRound: ", RoundName(run_id, round),
                                                        " is ", ToAbsl(RoundStateName(st)),
                                                        ", not aggregating"));
    }
    {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s, impl_->Query("UPDATE rounds SET state = 'committed', result_adapter_hash = ?, "
                                 "metrics_json = ?, server_state_hash = ?, broadcast_hash = ?, "
                                 "broadcast_delta_hash = ?, updated_ms = ? "
                                 "WHERE run_id = ? AND round = ?",
                                 h));
      s->Bind(result_adapter_hash)
          .Bind(metrics_json)
          .Bind(server_state_hash)
          .Bind(broadcast.adapter_hash)
          .Bind(broadcast.delta_hash)
          .Bind(impl_->Now())
          .Bind(run_id)
          .Bind(round);
      FEDLORA_RETURN_IF_ERROR(s->Run());
    }
    FEDLORA_RETURN_IF_ERROR(impl_->Fault("CommitRound:after_round_update"));
    for (const MetricRecord& m : metrics) FEDLORA_RETURN_IF_ERROR(impl_->InsertMetric(m));
    return impl_->Fault("CommitRound:before_commit");
  });
}

absl::StatusOr<ClientRecord> Store::UpsertClient(const std::string& client_id,
                                                 const std::string& cert_fingerprint) {
  DurabilityTicket* const deferred = nullptr;
  if (client_id.empty()) return absl::InvalidArgumentError("UpsertClient: empty client_id");
  return WriteTransaction(deferred, [&]() -> absl::StatusOr<ClientRecord> {
    {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s,
          impl_->Query(
              "INSERT INTO clients(client_id, cert_fingerprint, state, first_seen_ms, "
              "last_seen_ms) "
              "VALUES(?, ?, 'active', ?, ?) ON CONFLICT(client_id) DO UPDATE SET "
              "cert_fingerprint = excluded.cert_fingerprint, last_seen_ms = excluded.last_seen_ms",
              h));
      const int64_t now = impl_->Now();
      s->Bind(client_id).Bind(cert_fingerprint).Bind(now).Bind(now);
      FEDLORA_RETURN_IF_ERROR(s->Run());
    }
    return impl_->GetClient(client_id);
  });
}

absl::StatusOr<ClientRecord> Store::GetClient(const std::string& client_id) {
  absl::MutexLock lock(&mu_);
  return impl_->GetClient(client_id);
}

absl::Status Store::SetClientState(const std::string& client_id, ClientState state) {
  DurabilityTicket* const deferred = nullptr;
  return WriteTransaction(deferred, [&]() -> absl::Status {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                             impl_->Query("UPDATE clients SET state = ? WHERE client_id = ?", h));
    s->Bind(ClientStateName(state)).Bind(client_id);
    FEDLORA_RETURN_IF_ERROR(s->Run());
    if (sqlite3_changes(impl_->db) == 0) {
      return absl::NotFoundError(absl::StrCat("client '", client_id, "' not found"));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<ClientRecord>> Store::ListClients() {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s,
      impl_->Query(absl::StrCat("SELECT ", kClientColumns, " FROM clients ORDER BY client_id"), h));
  std::vector<ClientRecord> out;
  for (;;) {
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back(ReadClient(*s));
  }
  return out;
}

namespace {

absl::Status ValidateUploadIds(const UploadRecord& u, std::string_view op) {
  if (u.upload_id.empty() || u.run_id.empty() || u.client_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(op), ": upload_id, run_id and client_id must be non-empty (upload_id '",
                     u.upload_id, "', run_id '", u.run_id, "', client_id '", u.client_id, "')"));
  }
  if (u.round < 1)
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(op), ": round ", u.round, " must be >= 1"));
  return absl::OkStatus();
}

absl::Status BindingMismatch(const UploadRecord& stored, const UploadRecord& u,
                             std::string_view op) {
  return absl::FailedPreconditionError(
      absl::StrCat(ToAbsl(op), ": upload_id '", u.upload_id, "' is bound to client '",
                   stored.client_id, "', task '", stored.task_id, "', ",
                   RoundName(stored.run_id, stored.round), "; refused for client '", u.client_id,
                   "', task '", u.task_id, "', ", RoundName(u.run_id, u.round)));
}

}  // namespace

absl::StatusOr<UploadRecord> Store::BeginUpload(const UploadRecord& upload,
                                                DurabilityTicket* deferred) {
  FEDLORA_RETURN_IF_ERROR(ValidateUploadIds(upload, "BeginUpload"));
  if (upload.num_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BeginUpload: num_examples ", upload.num_examples, " < 0"));
  }
  DurabilityTicket ticket;
  auto result = DeferredTransaction(&ticket, [&]() -> absl::StatusOr<UploadRecord> {
    FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> existing,
                             impl_->FindUpload(upload.upload_id));
    if (existing.has_value()) {
      if (!SameBinding(*existing, upload)) return BindingMismatch(*existing, upload, "BeginUpload");
      return *std::move(existing);
    }
    FEDLORA_ASSIGN_OR_RETURN(RoundState st, impl_->RoundStateOf(upload.run_id, upload.round));
    if (!AcceptsUploads(st)) {
      return absl::FailedPreconditionError(
          absl::StrCat("BeginUpload: ", RoundName(upload.run_id, upload.round), " is ",
                       ToAbsl(RoundStateName(st)), " and no longer accepts uploads"));
    }
    {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s, impl_->Query("INSERT INTO uploads(upload_id, run_id, round, client_id, "
                                 "task_id, num_examples, state, created_ms) "
                                 "VALUES(?, ?, ?, ?, ?, ?, 'receiving', ?)",
                                 h));
      s->Bind(upload.upload_id)
          .Bind(upload.run_id)
          .Bind(upload.round)
          .Bind(upload.client_id)
          .Bind(upload.task_id);
      s->Bind(upload.num_examples).Bind(impl_->Now());
      FEDLORA_RETURN_IF_ERROR(s->Run());
    }
    FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> stored,
                             impl_->FindUpload(upload.upload_id));
    return *std::move(stored);
  });
  FEDLORA_RETURN_IF_ERROR(result.status());
  FEDLORA_RETURN_IF_ERROR(FinishDurability(ticket, deferred));
  return result;
}

absl::Status Store::RecordUploadProgress(const std::string& upload_id, int64_t chunks_received,
                                         int64_t bytes, DurabilityTicket* deferred) {
  if (chunks_received < 0 || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("RecordUploadProgress('", upload_id,
                                                   "'): chunks_received ", chunks_received,
                                                   " and bytes ", bytes, " must be >= 0"));
  }
  DurabilityTicket ticket;
  auto result = DeferredTransaction(&ticket, [&]() -> absl::Status {
    FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> existing, impl_->FindUpload(upload_id));
    if (!existing.has_value())
      return absl::NotFoundError(absl::StrCat("upload '", upload_id, "' not found"));
    if (existing->state != UploadState::kReceiving) {
      return absl::FailedPreconditionError(
          absl::StrCat("RecordUploadProgress: upload '", upload_id, "' is already accepted"));
    }
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        impl_->Query("UPDATE uploads SET chunks_received = ?, bytes = ? WHERE upload_id = ?", h));
    s->Bind(chunks_received).Bind(bytes).Bind(upload_id);
    return s->Run();
  });
  FEDLORA_RETURN_IF_ERROR(result);
  return FinishDurability(ticket, deferred);
}

absl::Status Store::RecordAccepted(const UploadRecord& upload, DurabilityTicket* deferred) {
  FEDLORA_RETURN_IF_ERROR(ValidateUploadIds(upload, "RecordAccepted"));
  if (!IsValidBlobHash(upload.blob_hash)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordAccepted('", upload.upload_id, "'): blob_hash '",
                     upload.blob_hash.substr(0, 80), "' is not a SHA-256 hex"));
  }
  if (upload.num_examples < 1 || upload.bytes < 0 || upload.chunks_received < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordAccepted('", upload.upload_id, "'): num_examples ", upload.num_examples,
                     " must be >= 1 and bytes ", upload.bytes, ", chunks_received ",
                     upload.chunks_received, " >= 0"));
  }
  DurabilityTicket ticket;
  auto result = DeferredTransaction(&ticket, [&]() -> absl::Status {
    FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> existing,
                             impl_->FindUpload(upload.upload_id));
    if (existing.has_value()) {
      if (!SameBinding(*existing, upload))
        return BindingMismatch(*existing, upload, "RecordAccepted");
      if (existing->state == UploadState::kAccepted) {
        return absl::AlreadyExistsError(absl::StrCat("upload '", upload.upload_id,
                                                     "' was already accepted (blob ",
                                                     existing->blob_hash, ")"));
      }
    }
    FEDLORA_ASSIGN_OR_RETURN(RoundState st, impl_->RoundStateOf(upload.run_id, upload.round));
    if (!AcceptsUploads(st)) {
      return absl::FailedPreconditionError(
          absl::StrCat("RecordAccepted: ", RoundName(upload.run_id, upload.round), " is ",
                       ToAbsl(RoundStateName(st)), " and no longer accepts uploads"));
    }
    {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s, impl_->Query("SELECT upload_id FROM uploads WHERE run_id = ? AND round = ? "
                                 "AND client_id = ? AND task_id = ? AND state = 'accepted'",
                                 h));
      s->Bind(upload.run_id).Bind(upload.round).Bind(upload.client_id).Bind(upload.task_id);
      FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
      if (row) {
        return absl::AlreadyExistsError(absl::StrCat(
            "client '", upload.client_id, "' already has accepted upload '", s->Text(0),
            "' for task '", upload.task_id, "' of ", RoundName(upload.run_id, upload.round)));
      }
    }
    const int64_t now = impl_->Now();
    std::unique_ptr<Stmt> h;
    if (existing.has_value()) {
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s, impl_->Query("UPDATE uploads SET state = 'accepted', num_examples = ?, "
                                 "blob_hash = ?, bytes = ?, chunks_received = ?, "
                                 "accepted_ms = ? WHERE upload_id = ?",
                                 h));
      s->Bind(upload.num_examples)
          .Bind(upload.blob_hash)
          .Bind(upload.bytes)
          .Bind(upload.chunks_received)
          .Bind(now);
      s->Bind(upload.upload_id);
      FEDLORA_RETURN_IF_ERROR(s->Run());
    } else {
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s, impl_->Query("INSERT INTO uploads(upload_id, run_id, round, client_id, "
                                 "task_id, num_examples, blob_hash, bytes, state, "
                                 "chunks_received, created_ms, accepted_ms) "
                                 "VALUES(?, ?, ?, ?, ?, ?, ?, ?, 'accepted', ?, ?, ?)",
                                 h));
      s->Bind(upload.upload_id)
          .Bind(upload.run_id)
          .Bind(upload.round)
          .Bind(upload.client_id)
          .Bind(upload.task_id);
      s->Bind(upload.num_examples)
          .Bind(upload.blob_hash)
          .Bind(upload.bytes)
          .Bind(upload.chunks_received);
      s->Bind(now).Bind(now);
      FEDLORA_RETURN_IF_ERROR(s->Run());
    }
    return impl_->Fault("RecordAccepted:before_commit");
  });
  FEDLORA_RETURN_IF_ERROR(result);
  return FinishDurability(ticket, deferred);
}

absl::StatusOr<UploadRecord> Store::GetUpload(const std::string& upload_id) {
  absl::MutexLock lock(&mu_);
  FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> u, impl_->FindUpload(upload_id));
  if (!u.has_value())
    return absl::NotFoundError(absl::StrCat("upload '", upload_id, "' not found"));
  return *std::move(u);
}

absl::StatusOr<std::vector<UploadRecord>> Store::ListAcceptedUploads(const std::string& run_id,
                                                                     int64_t round) {
  absl::MutexLock lock(&mu_);
  return impl_->UploadsIn(run_id, round, UploadState::kAccepted);
}

absl::StatusOr<std::vector<UploadRecord>> Store::ListReceivingUploads(const std::string& run_id,
                                                                      int64_t round) {
  absl::MutexLock lock(&mu_);
  return impl_->UploadsIn(run_id, round, UploadState::kReceiving);
}

absl::StatusOr<int64_t> Store::CountAccepted(const std::string& run_id, int64_t round) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s,
      impl_->Query(
          "SELECT COUNT(*) FROM uploads WHERE run_id = ? AND round = ? AND state = 'accepted'", h));
  s->Bind(run_id).Bind(round);
  FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
  return row ? s->Int(0) : 0;
}

absl::Status Store::RecordMetric(const MetricRecord& metric) {
  DurabilityTicket* const deferred = nullptr;
  if (metric.key.empty()) return absl::InvalidArgumentError("RecordMetric: empty key");
  return WriteTransaction(deferred, [&]() -> absl::Status {
    FEDLORA_RETURN_IF_ERROR(impl_->RequireRun(metric.run_id));
    return impl_->InsertMetric(metric);
  });
}

absl::Status Store::RecordMetrics(const std::vector<MetricRecord>& metrics) {
  DurabilityTicket* const deferred = nullptr;
  for (const MetricRecord& m : metrics) {
    if (m.key.empty()) return absl::InvalidArgumentError("RecordMetrics: empty key");
  }
  if (metrics.empty()) return absl::OkStatus();
  return WriteTransaction(deferred, [&]() -> absl::Status {
    std::set<std::string> runs;
    for (const MetricRecord& m : metrics) {
      if (runs.insert(m.run_id).second) FEDLORA_RETURN_IF_ERROR(impl_->RequireRun(m.run_id));
      absl::Status s = impl_->InsertMetric(m);
      if (!s.ok() && !absl::IsAlreadyExists(s)) return s;
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<MetricRecord>> Store::ListMetrics(const std::string& run_id,
                                                             int64_t round) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                           impl_->Query("SELECT run_id, round, client_id, key, value FROM metrics "
                                        "WHERE run_id = ? AND round = ? ORDER BY client_id, key",
                                        h));
  s->Bind(run_id).Bind(round);
  std::vector<MetricRecord> out;
  for (;;) {
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back(MetricRecord{s->Text(0), s->Int(1), s->Text(2), s->Text(3), s->Double(4)});
  }
  return out;
}

absl::Status Store::RecordAuditCopies(const std::vector<AuditCopyRecord>& copies) {
  for (const AuditCopyRecord& c : copies) {
    if (c.upload_id.empty() || c.blob_hash.empty()) {
      return absl::InvalidArgumentError("RecordAuditCopies: empty upload_id or blob_hash");
    }
  }
  if (copies.empty()) return absl::OkStatus();
  return WriteTransaction(nullptr, [&]() -> absl::Status {
    for (const AuditCopyRecord& c : copies) {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s, impl_->Query("INSERT OR IGNORE INTO audit_copies(upload_id, run_id, round, "
                                 "client_id, num_examples, blob_hash, created_ms) "
                                 "VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 h));
      s->Bind(c.upload_id)
          .Bind(c.run_id)
          .Bind(c.round)
          .Bind(c.client_id)
          .Bind(c.num_examples)
          .Bind(c.blob_hash);
      s->Bind(impl_->Now());
      FEDLORA_RETURN_IF_ERROR(s->Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<AuditCopyRecord>> Store::ListAuditCopies(const std::string& run_id,
                                                                    int64_t round) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s, impl_->Query("SELECT upload_id, run_id, round, client_id, num_examples, blob_hash "
                             "FROM audit_copies WHERE (? = '' OR run_id = ?) AND "
                             "(? = 0 OR round = ?) ORDER BY run_id, round, upload_id",
                             h));
  s->Bind(run_id).Bind(run_id).Bind(round).Bind(round);
  std::vector<AuditCopyRecord> out;
  for (;;) {
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back(
        AuditCopyRecord{s->Text(0), s->Text(1), s->Int(2), s->Text(3), s->Int(4), s->Text(5)});
  }
  return out;
}

absl::StatusOr<RecoveredState> Store::LoadLatestState(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  return impl_->ReadTransaction([&]() -> absl::StatusOr<RecoveredState> {
    RecoveredState st;
    FEDLORA_ASSIGN_OR_RETURN(st.run, impl_->GetRun(run_id));
    FEDLORA_ASSIGN_OR_RETURN(
        std::vector<RoundRecord> committed,
        impl_->Rounds("run_id = ? AND state = 'committed' ORDER BY round DESC LIMIT 1", run_id,
                      std::nullopt));
    if (!committed.empty()) st.last_committed = std::move(committed[0]);
    FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> open,
                             impl_->Rounds("run_id = ? AND state IN ('selecting', 'training', "
                                           "'aggregating') ORDER BY round DESC LIMIT 1",
                                           run_id, std::nullopt));
    if (!open.empty()) {
      st.open_round = std::move(open[0]);
      FEDLORA_ASSIGN_OR_RETURN(st.accepted_uploads, impl_->UploadsIn(run_id, st.open_round->round,
                                                                     UploadState::kAccepted));
      FEDLORA_ASSIGN_OR_RETURN(st.receiving_uploads, impl_->UploadsIn(run_id, st.open_round->round,
                                                                      UploadState::kReceiving));
    }
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s, impl_->Query("SELECT COALESCE(MAX(round), 0) FROM rounds WHERE run_id = ?", h));
    s->Bind(run_id);
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    st.next_round = (row ? s->Int(0) : 0) + 1;
    return st;
  });
}

absl::StatusOr<absl::flat_hash_set<std::string>> Store::ReferencedBlobHashes() {
  absl::MutexLock lock(&mu_);
  return impl_->ReadTransaction([&]() -> absl::StatusOr<absl::flat_hash_set<std::string>> {
    std::unique_ptr<Stmt> h;
    // A sealed update is referenced only while its round is open: once the round has committed or
    // been abandoned nothing needs it, and keeping it would keep what a copied disk could open.
    FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                             impl_->Query("SELECT u.blob_hash FROM uploads u JOIN rounds r "
                                          "ON r.run_id = u.run_id AND r.round = u.round "
                                          "WHERE r.state NOT IN ('committed', 'abandoned') UNION "
                                          "SELECT global_adapter_hash FROM rounds UNION "
                                          "SELECT result_adapter_hash FROM rounds UNION "
                                          "SELECT server_state_hash FROM rounds UNION "
                                          "SELECT broadcast_hash FROM rounds UNION "
                                          "SELECT broadcast_delta_hash FROM rounds UNION "
                                          "SELECT blob_hash FROM audit_copies",
                                          h));
    absl::flat_hash_set<std::string> out;
    for (;;) {
      FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
      if (!row) break;
      std::string hash = s->Text(0);
      if (!hash.empty()) out.insert(std::move(hash));
    }
    return out;
  });
}

absl::StatusOr<int64_t> Store::PruneRoundBlobs(const std::string& run_id, int64_t before_round) {
  return WriteTransaction(nullptr, [&]() -> absl::StatusOr<int64_t> {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        impl_->Query(
            "UPDATE rounds SET result_adapter_hash = '', global_adapter_hash = '', "
            "server_state_hash = '', broadcast_hash = '', broadcast_delta_hash = '' "
            "WHERE run_id = ? AND round < ? AND state IN ('committed', 'abandoned') AND "
            "(result_adapter_hash != '' OR global_adapter_hash != '' OR server_state_hash != '' "
            "OR broadcast_hash != '' OR broadcast_delta_hash != '')",
            h));
    s->Bind(run_id).Bind(before_round);
    FEDLORA_RETURN_IF_ERROR(s->Run());
    return static_cast<int64_t>(sqlite3_changes(impl_->db));
  });
}

absl::Status Store::CheckpointWal() {
  absl::MutexLock lock(&mu_);
  char* err = nullptr;
  const int rc = sqlite3_exec(impl_->db, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, &err);
  sqlite3_free(err);
  if (rc != SQLITE_OK) return SqlError(impl_->db, rc, "checkpointing the WAL");
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Store::RewindRun(const std::string& run_id, int64_t keep_through,
                                         const std::string& reason) {
  return WriteTransaction(nullptr, [&]() -> absl::StatusOr<int64_t> {
    FEDLORA_RETURN_IF_ERROR(impl_->RequireRun(run_id));
    if (keep_through < 0)
      return absl::InvalidArgumentError(absl::StrCat("RewindRun: round ", keep_through, " < 0"));
    if (keep_through > 0) {
      FEDLORA_ASSIGN_OR_RETURN(RoundState st, impl_->RoundStateOf(run_id, keep_through));
      if (st != RoundState::kCommitted) {
        return absl::FailedPreconditionError(
            absl::StrCat("RewindRun: ", RoundName(run_id, keep_through), " is ",
                         ToAbsl(RoundStateName(st)), ", not committed"));
      }
    }
    FEDLORA_ASSIGN_OR_RETURN(
        std::vector<RoundRecord> later,
        impl_->Rounds("run_id = ? AND round > ? ORDER BY round", run_id, keep_through));
    int64_t lost = 0;
    for (const RoundRecord& r : later) {
      if (r.state == RoundState::kAbandoned) continue;
      std::string metrics = r.metrics_json;
      if (r.state == RoundState::kCommitted) {
        ++lost;
        nlohmann::json m = nlohmann::json::parse(metrics, nullptr, /*allow_exceptions=*/false);
        if (m.is_object()) {
          m["rewound"] = reason;
          metrics = m.dump();
        }
      }
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s, impl_->Query("UPDATE rounds SET state = 'abandoned', metrics_json = ?, "
                                 "updated_ms = ? WHERE run_id = ? AND round = ?",
                                 h));
      s->Bind(metrics).Bind(impl_->Now()).Bind(run_id).Bind(r.round);
      FEDLORA_RETURN_IF_ERROR(s->Run());
    }
    return lost;
  });
}

}  // namespace fedlora
