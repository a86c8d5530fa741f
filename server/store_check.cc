#include "server/store_check.h"

#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compression/downlink.h"
#include "compression/update_io.h"
#include "core/sha256.h"
#include "core/status.h"

namespace fedlora {

std::string_view BlobHealthName(BlobHealth h) {
  switch (h) {
    case BlobHealth::kIntact:
      return "intact";
    case BlobHealth::kCorrupt:
      return "corrupt";
    case BlobHealth::kMissing:
      return "missing";
  }
  return "?";
}

bool RunCheck::intact() const {
  for (const BlobCheck& b : blobs) {
    if (b.health != BlobHealth::kIntact) return false;
  }
  return true;
}

namespace {

absl::StatusOr<std::string> InitialAdapterHash(Store& store, const std::string& run_id) {
  FEDLORA_ASSIGN_OR_RETURN(RunRecord run, store.GetRun(run_id));
  const nlohmann::json meta =
      nlohmann::json::parse(run.config_json, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || !meta.contains("initial_adapter_sha256") ||
      !meta["initial_adapter_sha256"].is_string()) {
    return absl::DataLossError(
        absl::StrCat("run '", run_id, "' in the store has no initial adapter hash"));
  }
  return meta["initial_adapter_sha256"].get<std::string>();
}

// Re-hashes blobs once each (one blob may be referenced from several rows).
class Hasher {
 public:
  explicit Hasher(const BlobStore& blobs) : blobs_(blobs) {}
  absl::StatusOr<std::pair<BlobHealth, std::string>> Check(const std::string& hash) {
    if (auto it = seen_.find(hash); it != seen_.end()) return it->second;
    absl::StatusOr<std::string> got = blobs_.Get(hash);
    std::pair<BlobHealth, std::string> out{BlobHealth::kIntact, ""};
    if (absl::IsNotFound(got.status())) {
      out = {BlobHealth::kMissing, std::string(got.status().message())};
    } else if (!got.ok()) {  // DataLoss, or a file that cannot be read: unusable either way
      out = {BlobHealth::kCorrupt, std::string(got.status().message())};
    }
    seen_[hash] = out;
    return out;
  }

 private:
  const BlobStore& blobs_;
  std::map<std::string, std::pair<BlobHealth, std::string>> seen_;
};

std::string CostOf(const BlobCheck& b, bool latest, bool has_open_round) {
  const bool missing = b.health == BlobHealth::kMissing;
  const std::string no_start = "the server will not start (it needs this blob to resume the run)";
  if (b.kind == "accepted update") {
    return "the update is left out of the open round's aggregate, although its client was told "
           "ACCEPTED";
  }
  if (b.kind == "audit copy") {
    return "the audit trail loses this update (server.audit_public_key_file); the run itself is "
           "unaffected";
  }
  if (b.kind == "optimizer state") {
    return latest ? no_start : "nothing now (only the latest committed round's state is read)";
  }
  if (latest || missing) return no_start;
  if (b.kind == "initial adapter") return "downloads of the initial adapter fail";
  if (b.kind == "broadcast delta")
    return "clients that catch up by deltas through this round get a download error";
  if (b.kind == "result adapter") {
    return "downloads of this round's adapter fail, and aggregation.average_last_rounds fails at "
           "the run's last "
           "round if it reaches back to this one";
  }
  (void)has_open_round;
  return "downloads of this round's broadcast adapter fail";
}

}  // namespace

absl::StatusOr<RunCheck> CheckRun(Store& store, const BlobStore& blobs, const std::string& run_id) {
  RunCheck out;
  out.run_id = run_id;
  FEDLORA_ASSIGN_OR_RETURN(std::string initial, InitialAdapterHash(store, run_id));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store.ListRounds(run_id));
  FEDLORA_ASSIGN_OR_RETURN(RecoveredState st, store.LoadLatestState(run_id));
  out.latest_committed = st.last_committed.has_value() ? st.last_committed->round : 0;
  Hasher hasher(blobs);
  auto add = [&](int64_t round, std::string kind, std::string hash, std::string upload_id = "",
                 std::string client_id = "") -> absl::Status {
    BlobCheck b;
    b.round = round;
    b.kind = std::move(kind);
    b.hash = std::move(hash);
    b.upload_id = std::move(upload_id);
    b.client_id = std::move(client_id);
    FEDLORA_ASSIGN_OR_RETURN(auto health, hasher.Check(b.hash));
    b.health = health.first;
    b.detail = health.second;
    if (b.health != BlobHealth::kIntact) {
      const bool latest =
          b.kind != "accepted update" && b.kind != "audit copy" && b.round == out.latest_committed;
      b.cost = CostOf(b, latest, st.open_round.has_value());
    }
    out.blobs.push_back(std::move(b));
    return absl::OkStatus();
  };
  FEDLORA_RETURN_IF_ERROR(add(0, "initial adapter", initial));
  for (const RoundRecord& r : rounds) {
    // A round older than server.retain_rounds has had its blobs deleted on purpose: nothing to check.
    if (r.state != RoundState::kCommitted || r.result_adapter_hash.empty()) continue;
    FEDLORA_RETURN_IF_ERROR(add(r.round, "result adapter", r.result_adapter_hash));
    if (!r.broadcast_hash.empty()) {
      FEDLORA_RETURN_IF_ERROR(add(r.round, "broadcast adapter", r.broadcast_hash));
      FEDLORA_RETURN_IF_ERROR(add(r.round, "broadcast delta", r.broadcast_delta_hash));
    }
    if (!r.server_state_hash.empty()) {
      FEDLORA_RETURN_IF_ERROR(add(r.round, "optimizer state", r.server_state_hash));
    }
  }
  for (const UploadRecord& u : st.accepted_uploads) {
    FEDLORA_RETURN_IF_ERROR(add(u.round, "accepted update", u.blob_hash, u.upload_id, u.client_id));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<AuditCopyRecord> audit, store.ListAuditCopies(run_id, 0));
  for (const AuditCopyRecord& c : audit) {
    FEDLORA_RETURN_IF_ERROR(add(c.round, "audit copy", c.blob_hash, c.upload_id, c.client_id));
  }
  return out;
}

namespace {

// Rewrites blob `hash` from `bytes` if they hash to it (a corrupt file is removed first: Put keeps
// an existing file). False when they do not.
absl::StatusOr<bool> Replace(BlobStore& blobs, const std::string& hash, const std::string& bytes) {
  if (Sha256Hex(bytes) != hash) return false;
  FEDLORA_RETURN_IF_ERROR(blobs.Delete(hash));
  FEDLORA_ASSIGN_OR_RETURN(std::string put, blobs.Put(bytes));
  return put == hash;
}

bool Intact(const BlobStore& blobs, const std::string& hash) { return blobs.Get(hash).ok(); }

}  // namespace

absl::StatusOr<RepairOutcome> RepairRun(Store& store, BlobStore& blobs, const std::string& run_id,
                                        bool rewind) {
  RepairOutcome out;
  FEDLORA_ASSIGN_OR_RETURN(std::string initial, InitialAdapterHash(store, run_id));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store.ListRounds(run_id));
  // The downlink chain: each broadcast adapter is its predecessor plus its delta
  // (compression/downlink.h), so a damaged one comes back bit for bit from the two.
  std::string previous = initial;
  for (const RoundRecord& r : rounds) {
    if (r.state != RoundState::kCommitted) continue;
    if (!r.broadcast_hash.empty() && !Intact(blobs, r.broadcast_hash) && Intact(blobs, previous) &&
        Intact(blobs, r.broadcast_delta_hash)) {
      FEDLORA_ASSIGN_OR_RETURN(std::string base_bytes, blobs.Get(previous));
      FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> adapter,
                               AdapterFromSafetensors(base_bytes));
      FEDLORA_ASSIGN_OR_RETURN(std::string delta, blobs.Get(r.broadcast_delta_hash));
      FEDLORA_RETURN_IF_ERROR_CTX(ApplyDownlinkDelta(adapter, delta, DecodeLimits{}),
                                  absl::StrCat("round ", r.round, "'s broadcast delta"));
      FEDLORA_ASSIGN_OR_RETURN(std::string rebuilt, AdapterToSafetensors(adapter));
      FEDLORA_ASSIGN_OR_RETURN(bool ok, Replace(blobs, r.broadcast_hash, rebuilt));
      if (ok) {
        out.rebuilt.push_back(absl::StrCat(
            "round ", r.round, " broadcast adapter ", r.broadcast_hash,
            ": rebuilt from the previous broadcast adapter and round ", r.round, "'s delta"));
      }
    }
    previous = r.broadcast_hash.empty() ? r.result_adapter_hash : r.broadcast_hash;
  }
  // What the server needs to resume from round r: its adapter, its broadcast, its optimizer state.
  auto resumable = [&](const RoundRecord& r) {
    return Intact(blobs, r.result_adapter_hash) &&
           (r.broadcast_hash.empty() || Intact(blobs, r.broadcast_hash)) &&
           (r.server_state_hash.empty() || Intact(blobs, r.server_state_hash));
  };
  const RoundRecord* latest = nullptr;
  for (const RoundRecord& r : rounds) {
    if (r.state == RoundState::kCommitted) latest = &r;
  }
  if (latest == nullptr || resumable(*latest)) return out;
  int64_t target = 0;
  for (auto it = rounds.rbegin(); it != rounds.rend(); ++it) {
    if (it->state == RoundState::kCommitted && it->round < latest->round && resumable(*it)) {
      target = it->round;
      break;
    }
  }
  if (target == 0 && !Intact(blobs, initial)) {
    return absl::DataLossError(
        absl::StrCat("run '", run_id, "': no committed round can be resumed, and the initial ",
                     "adapter ", initial, " is damaged too: nothing to rewind to"));
  }
  if (!rewind) {
    out.rewind_needed_to = target;
    return out;
  }
  FEDLORA_ASSIGN_OR_RETURN(
      out.rounds_lost,
      store.RewindRun(run_id, target,
                      absl::StrCat("fedlora store repair --rewind: round ", latest->round,
                                   "'s adapter or optimizer state was lost")));
  out.rewound_to = target;
  return out;
}

}  // namespace fedlora
