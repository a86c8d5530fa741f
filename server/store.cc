// The store's runs, rounds and clients, and the queries Store::Impl shares with store_uploads.cc.
// The schema and Open are in store_schema.cc, the group fsync in store_durability.cc.
#include "server/store.h"

#include <sqlite3.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/strings.h"
#include "server/store_internal.h"

namespace fedlora {

using store_internal::AcceptsUploads;
using store_internal::IsLegalTransition;
using store_internal::kClientColumns;
using store_internal::kRoundColumns;
using store_internal::kUploadColumns;
using store_internal::ParseRoundState;
using store_internal::ReadClient;
using store_internal::ReadRound;
using store_internal::ReadUpload;
using store_internal::RoundName;
using store_internal::SqlError;
using store_internal::Stmt;

// --- Impl: the queries several methods share ---------------------------------------------------

// The cached statement for `sql`, prepared on first use.
absl::StatusOr<sqlite3_stmt*> Store::Impl::Prepare(const std::string& sql) {
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
absl::Status Store::Impl::Exec(const std::string& sql) {
  FEDLORA_ASSIGN_OR_RETURN(sqlite3_stmt * raw, Prepare(sql));
  Stmt s(db, raw);
  return s.Run();
}

absl::StatusOr<Stmt*> Store::Impl::Query(const std::string& sql, std::unique_ptr<Stmt>& holder) {
  FEDLORA_ASSIGN_OR_RETURN(sqlite3_stmt * raw, Prepare(sql));
  holder = std::make_unique<Stmt>(db, raw);
  return holder.get();
}

absl::Status Store::Impl::RequireRun(const std::string& run_id) {
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(Stmt * s, Query("SELECT 1 FROM runs WHERE run_id = ?", h));
  s->Bind(run_id);
  FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
  if (!row) return absl::NotFoundError(absl::StrCat("run '", run_id, "' not found"));
  return absl::OkStatus();
}

absl::StatusOr<RunRecord> Store::Impl::GetRun(const std::string& run_id) {
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s, Query("SELECT run_id, config_json, created_ms FROM runs WHERE run_id = ?", h));
  s->Bind(run_id);
  FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
  if (!row) return absl::NotFoundError(absl::StrCat("run '", run_id, "' not found"));
  return RunRecord{s->Text(0), s->Text(1), s->Int(2)};
}

absl::StatusOr<std::vector<std::string>> Store::Impl::Selection(const std::string& run_id,
                                                                int64_t round) {
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
absl::StatusOr<std::vector<RoundRecord>> Store::Impl::Rounds(const std::string& where_and_order,
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

absl::StatusOr<RoundRecord> Store::Impl::GetRound(const std::string& run_id, int64_t round) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rs,
                           Rounds("run_id = ? AND round = ?", run_id, round));
  if (rs.empty()) return absl::NotFoundError(absl::StrCat(RoundName(run_id, round), " not found"));
  return std::move(rs[0]);
}

absl::StatusOr<RoundState> Store::Impl::RoundStateOf(const std::string& run_id, int64_t round) {
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                           Query("SELECT state FROM rounds WHERE run_id = ? AND round = ?", h));
  s->Bind(run_id).Bind(round);
  FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
  if (!row) return absl::NotFoundError(absl::StrCat(RoundName(run_id, round), " not found"));
  return ParseRoundState(s->Text(0));
}

absl::StatusOr<std::optional<UploadRecord>> Store::Impl::FindUpload(const std::string& upload_id) {
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s,
      Query(absl::StrCat("SELECT ", kUploadColumns, " FROM uploads WHERE upload_id = ?"), h));
  s->Bind(upload_id);
  FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
  if (!row) return std::optional<UploadRecord>();
  return std::optional<UploadRecord>(ReadUpload(*s));
}

absl::StatusOr<std::vector<UploadRecord>> Store::Impl::UploadsIn(const std::string& run_id,
                                                                 int64_t round, UploadState state) {
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

absl::StatusOr<ClientRecord> Store::Impl::GetClient(const std::string& client_id) {
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s,
      Query(absl::StrCat("SELECT ", kClientColumns, " FROM clients WHERE client_id = ?"), h));
  s->Bind(client_id);
  FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
  if (!row) return absl::NotFoundError(absl::StrCat("client '", client_id, "' not found"));
  return ReadClient(*s);
}

absl::Status Store::Impl::InsertMetric(const MetricRecord& m) {
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

// --- Runs, rounds, clients -----------------------------------------------------------------------

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
