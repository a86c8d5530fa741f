// The store's schema: its migrations, the mapping of rows to records, the state names, and Open
// (WAL mode, the connection's pragmas, the migrations).
#include <sqlite3.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/strings.h"
#include "server/store.h"
#include "server/store_internal.h"

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

}  // namespace

namespace store_internal {

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

}  // namespace store_internal

using store_internal::SqlError;
using store_internal::Stmt;

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

absl::StatusOr<int> Store::Impl::UserVersion() {
  FEDLORA_ASSIGN_OR_RETURN(sqlite3_stmt * raw, Prepare("PRAGMA user_version"));
  Stmt s(db, raw);
  FEDLORA_ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? static_cast<int>(s.Int(0)) : 0;
}

absl::Status Store::Impl::Migrate() {
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

// --- Store -----------------------------------------------------------------------------------

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

absl::StatusOr<int> Store::SchemaVersion() {
  absl::MutexLock lock(&mu_);
  return impl_->UserVersion();
}

}  // namespace fedlora
