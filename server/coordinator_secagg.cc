// Secure aggregation rounds (config.privacy.secure_aggregation): the SecAgg+ server of
// crypto/secagg.h driven by the round. When the selection closes, the selected clients become the
// round's cohort; they advertise keys and share their secrets through the SecureAggregation RPC
// (steps 0 and 1, each closed once every client answered or its time ran out), upload their masked
// fixed-point updates through UploadUpdate (step 2; the round closes as usual), and answer the
// unmasking request the aggregation thread publishes (step 3). The protocol's state lives in memory
// only: a restarted server abandons an open secure-aggregation round (Restore), and the clients,
// whose keys are drawn per task, start afresh in the next one.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "crypto/sealed_update.h"
#include "crypto/secagg_fixed_point.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

namespace fedlora {
namespace {

// How long a key step (and the unmasking step) waits for the clients that have not answered yet.
int64_t StepMs(int64_t round_deadline_ms) {
  return std::clamp<int64_t>(round_deadline_ms / 4, 1000, 60'000);
}

constexpr uint32_t kPollMs = 100;

v1::SecureAggregationResponse Retry() {
  v1::SecureAggregationResponse r;
  r.set_retry_after_ms(kPollMs);
  return r;
}

v1::SecureAggregationResponse Done(std::string why) {
  v1::SecureAggregationResponse r;
  r.set_done(std::move(why));
  return r;
}

}  // namespace

absl::StatusOr<Coordinator::SecAggEncoding> Coordinator::SecAggEncodingFor(
    const v1::RunConfig& config) {
  const v1::DifferentialPrivacyConfig& dp = config.privacy().dp();
  SecAggEncoding e;
  e.clip_norm = dp.enabled() ? dp.clip_norm() : config.aggregation().max_update_norm();
  // Every coordinate of a clipped update is within the clip norm; a client's share of distributed
  // noise (largest with the fewest clients) gets ten of its standard deviations on top.
  e.range = e.clip_norm;
  if (dp.enabled() && dp.mode() == v1::DifferentialPrivacyConfig::DISTRIBUTED) {
    e.range += 10.0 * dp.noise_multiplier() * e.clip_norm /
               std::sqrt(static_cast<double>(MinClientsFor(config)));
  }
  const double cohort = static_cast<double>(QuotaFor(config));
  if (config.codec().stages_size() == 1 && config.codec().stages(0).id() == v1::CodecStage::QUANT) {
    // QUANT b bits: each client's levels are b-bit signed integers (|level| <= 2^(b-1) - 1 at the
    // range), one power-of-two step for everyone, and the sum of the largest cohort needs
    // ceil(log2 cohort) bits more.
    const uint32_t b = config.codec().stages(0).quant().bits();
    const double levels = std::ldexp(1.0, static_cast<int>(b) - 1) - 1;
    if (levels / e.range < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("privacy.secure_aggregation with QUANT ", b, " bits: values up to ", e.range,
                       " need more than ", b, " bits at any step <= 1"));
    }
    e.frac_bits = static_cast<uint32_t>(std::min(40.0, std::floor(std::log2(levels / e.range))));
    e.modulus_bits = std::min<uint32_t>(
        64, b + static_cast<uint32_t>(std::ceil(std::log2(std::max(2.0, cohort)))));
    FEDLORA_RETURN_IF_ERROR_CTX(
        crypto::CheckSecAggFixedPoint(static_cast<uint64_t>(QuotaFor(config)), e.range, e.frac_bits,
                                      e.modulus_bits),
        "privacy.secure_aggregation's fixed-point encoding");
    return e;
  }
  // The fraction bits that keep a sum over the largest cohort within the signed range: 32-bit
  // elements when that leaves at least 16 of them, else 64-bit ones.
  for (uint32_t m : {32u, 64u}) {
    const double room = std::ldexp(1.0, static_cast<int>(m) - 1) / (cohort * e.range);
    const int f = room >= 4 ? std::min(40, static_cast<int>(std::floor(std::log2(room))) - 1) : -1;
    if (f >= (m == 32 ? 16 : 0)) {
      e.modulus_bits = m;
      e.frac_bits = static_cast<uint32_t>(f);
      break;
    }
  }
  if (e.modulus_bits == 0) {
    return absl::InvalidArgumentError(absl::StrCat("privacy.secure_aggregation: a sum of ",
                                                   QuotaFor(config), " updates within +-", e.range,
                                                   " does not fit 64-bit elements"));
  }
  FEDLORA_RETURN_IF_ERROR_CTX(crypto::CheckSecAggFixedPoint(static_cast<uint64_t>(QuotaFor(config)),
                                                            e.range, e.frac_bits, e.modulus_bits),
                              "privacy.secure_aggregation's fixed-point encoding");
  return e;
}

absl::Status Coordinator::StartSecAggLocked() {
  RoundInfo& r = *round_;
  auto s = std::make_unique<SecAggRound>();
  s->cohort.assign(r.selected.begin(), r.selected.end());  // sorted: index order is client id order
  for (uint32_t i = 0; i < s->cohort.size(); ++i) s->index[s->cohort[i]] = i;
  const uint32_t n = static_cast<uint32_t>(s->cohort.size());
  crypto::SecAggConfig c;
  c.round_id = static_cast<uint64_t>(r.round);
  c.num_clients = n;
  c.vector_length = static_cast<uint64_t>(spec_elements_);
  c.modulus_bits = secagg_->modulus_bits;
  c.degree = crypto::RecommendedSecAggDegree(n);
  c.threshold = crypto::RecommendedSecAggThreshold(c.degree);
  c.min_survivors =
      std::min<uint32_t>(n, std::max<uint32_t>(c.threshold, static_cast<uint32_t>(MinClients())));
  absl::StatusOr<v1::SecAggParams> params = crypto::NewSecAggParams(c);
  if (!params.ok())
    return AbandonRoundLocked(
        absl::StrCat("secure aggregation over ", n, " clients: ", params.status().message()));
  FEDLORA_ASSIGN_OR_RETURN(crypto::SecAggServer server, crypto::SecAggServer::Create(*params));
  s->server = std::make_unique<crypto::SecAggServer>(std::move(server));
  *s->task.mutable_params() = *params;
  s->task.set_clip_norm(secagg_->clip_norm);
  s->task.set_range(secagg_->range);
  s->task.set_frac_bits(secagg_->frac_bits);
  const v1::DifferentialPrivacyConfig& dp = config_.privacy().dp();
  if (dp.enabled() && dp.mode() == v1::DifferentialPrivacyConfig::DISTRIBUTED) {
    // n shares of variance (z C)^2 / n make the sum's (z C)^2 when nobody drops out.
    s->task.set_noise_stddev(dp.noise_multiplier() * secagg_->clip_norm /
                             std::sqrt(static_cast<double>(n)));
  }
  s->step_deadline_ms = Now() + StepMs(options_.round_deadline_ms);
  FEDLORA_LOG(DEBUG) << "round " << r.round << ": secure aggregation over " << n
                     << " clients (degree " << params->degree() << ", threshold "
                     << params->threshold() << ", " << params->modulus_bits() << "-bit elements, "
                     << secagg_->frac_bits << " fraction bits)";
  r.secagg = std::move(s);
  return absl::OkStatus();
}

absl::Status Coordinator::AdvanceSecAggLocked() {
  if (round_ == nullptr || round_->secagg == nullptr || round_->secagg->server == nullptr)
    return absl::OkStatus();
  SecAggRound& s = *round_->secagg;
  const int64_t now = Now();
  if (s.phase == SecAggRound::Phase::kAdvertise &&
      (s.advertised.size() == s.cohort.size() || now >= s.step_deadline_ms)) {
    if (absl::Status st = s.server->CloseAdvertiseKeys(); !st.ok()) {
      return AbandonRoundLocked(
          absl::StrCat("secure aggregation, key advertisement: ", st.message()));
    }
    s.u1 = s.server->advertised();
    s.phase = SecAggRound::Phase::kShareKeys;
    s.step_deadline_ms = now + StepMs(options_.round_deadline_ms);
  }
  if (s.phase == SecAggRound::Phase::kShareKeys &&
      (s.shared.size() == s.u1.size() || now >= s.step_deadline_ms)) {
    if (absl::Status st = s.server->CloseShareKeys(); !st.ok()) {
      return AbandonRoundLocked(absl::StrCat("secure aggregation, key sharing: ", st.message()));
    }
    s.u2 = s.server->shared_keys();
    s.phase = SecAggRound::Phase::kMaskedInput;
    FEDLORA_LOG(DEBUG) << "round " << round_->round << ": " << s.u2.size() << " of "
                       << s.cohort.size() << " clients shared their keys; masked uploads open";
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SecureAggregationResponse> Coordinator::SecureAggregation(
    const std::string& client_id, const v1::SecureAggregationRequest& request) {
  absl::MutexLock lock(&mu_);
  ClientEntry* c = FindClientLocked(client_id);
  if (c == nullptr)
    return absl::UnauthenticatedError(absl::StrCat("unknown client '", client_id, "'"));
  c->last_seen_ms = Now();
  const int64_t round = static_cast<int64_t>(request.round());
  if (round_ == nullptr || round_->round != round || round_->secagg == nullptr) {
    return Done(absl::StrCat("round ", round, " has no secure aggregation in progress"));
  }
  SecAggRound& s = *round_->secagg;
  auto it = s.index.find(client_id);
  if (it == s.index.end() || request.task_id() != TaskIdFor(round, client_id)) {
    return absl::PermissionDeniedError(absl::StrCat("client '", client_id, "' holds no task ",
                                                    request.task_id(), " in round ", round));
  }
  const uint32_t i = it->second;
  auto own = [i](uint32_t index, const char* what) -> absl::Status {
    if (index == i) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat(what, " names client index ", index, ", the caller's is ", i));
  };
  switch (request.message_case()) {
    case v1::SecureAggregationRequest::kAdvertiseKeys: {
      FEDLORA_RETURN_IF_ERROR(own(request.advertise_keys().client_index(), "AdvertiseKeys"));
      if (s.phase != SecAggRound::Phase::kAdvertise || s.server == nullptr) {
        if (s.advertised.count(i) == 0) return Done("the key advertisement is closed");
        break;  // a retry of an accepted message: answer as a poll
      }
      if (s.advertised.count(i) == 0) {
        FEDLORA_RETURN_IF_ERROR(s.server->ReceiveAdvertiseKeys(request.advertise_keys()));
        s.advertised.insert(i);
      }
      break;
    }
    case v1::SecureAggregationRequest::kShareKeys: {
      FEDLORA_RETURN_IF_ERROR(own(request.share_keys().client_index(), "ShareKeys"));
      if (s.phase != SecAggRound::Phase::kShareKeys || s.server == nullptr) {
        if (s.shared.count(i) == 0) return Done("the key sharing is closed");
        break;
      }
      if (s.shared.count(i) == 0) {
        FEDLORA_RETURN_IF_ERROR(s.server->ReceiveShareKeys(request.share_keys()));
        s.shared.insert(i);
      }
      break;
    }
    case v1::SecureAggregationRequest::kUnmasking: {
      FEDLORA_RETURN_IF_ERROR(own(request.unmasking().client_index(), "Unmasking"));
      if (s.phase != SecAggRound::Phase::kUnmasking || s.survivors.count(i) == 0) {
        return Done("the unmasking step is not open to this client");
      }
      s.unmasking_responses.emplace(i, request.unmasking());
      return Done("unmasking shares received");
    }
    case v1::SecureAggregationRequest::kPoll:
      break;
    default:
      return absl::InvalidArgumentError("SecureAggregationRequest carries no message");
  }
  FEDLORA_RETURN_IF_ERROR(AdvanceSecAggLocked());
  if (round_ == nullptr || round_->round != round || round_->secagg == nullptr) {
    return Done(absl::StrCat("round ", round, " was abandoned"));
  }
  v1::SecureAggregationResponse response;
  switch (s.phase) {
    case SecAggRound::Phase::kAdvertise:
      return Retry();
    case SecAggRound::Phase::kShareKeys: {
      if (!std::binary_search(s.u1.begin(), s.u1.end(), i))
        return Done("missed the key advertisement");
      if (s.shared.count(i) != 0) return Retry();
      FEDLORA_ASSIGN_OR_RETURN(*response.mutable_share_keys(), s.server->ShareKeysRequest(i));
      return response;
    }
    case SecAggRound::Phase::kMaskedInput: {
      if (!std::binary_search(s.u2.begin(), s.u2.end(), i)) return Done("missed the key sharing");
      if (round_->accepted.count(client_id) != 0) return Retry();  // uploaded: wait for step 3
      if (s.server == nullptr) return Done("the masked uploads are closed");
      FEDLORA_ASSIGN_OR_RETURN(*response.mutable_masked_input(), s.server->MaskedInputRequest(i));
      return response;
    }
    case SecAggRound::Phase::kUnmasking:
      if (s.survivors.count(i) == 0) return Done("the round goes on without this client's update");
      if (s.unmasking_responses.count(i) != 0) return Done("unmasking shares received");
      *response.mutable_unmasking() = s.unmasking;
      return response;
    case SecAggRound::Phase::kDone:
      return Done("the round's unmasking is over");
  }
  return Retry();
}

absl::Status Coordinator::ValidateMaskedUpload(std::string_view plain) const {
  const uint32_t m = secagg_->modulus_bits;
  const uint64_t want = static_cast<uint64_t>(spec_elements_) * ((m + 7) / 8);
  if (plain.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("a masked update is ", want, " bytes (",
                                                   spec_elements_, " elements of ", (m + 7) / 8,
                                                   "), got ", plain.size()));
  }
  return crypto::UnpackSecAggVector(plain, static_cast<uint64_t>(spec_elements_), m).status();
}

void Coordinator::ExcludeMisbehaving(int64_t round, const std::vector<uint32_t>& misbehaving,
                                     const std::map<std::string, uint32_t>& index) {
  if (misbehaving.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, i] : index) {
    if (!std::binary_search(misbehaving.begin(), misbehaving.end(), i)) continue;
    FEDLORA_LOG(WARNING) << "round " << round << ": " << id
                         << " revealed wrong secure-aggregation shares; the sum "
                         << "was rebuilt without them, and " << id << " sits out round "
                         << round + 1;
    metrics_->secagg_misbehaving_clients.fetch_add(1);
    if (ClientEntry* c = FindClientLocked(id)) c->excluded_through_round = round + 1;
  }
}

absl::Status Coordinator::CheckUnmaskedSum(int64_t round, const std::vector<double>& total,
                                           int64_t n) const {
  // n clipped updates, each at most its rounding bound above the clip norm, plus (DISTRIBUTED DP)
  // noise of total variance (z C)^2 per value at most, whose norm exceeds z C (sqrt(d) + 10) with
  // probability below e^-50. A wrong share or an out-of-range masked input from one client makes
  // the sum uniform over the modulus instead, orders of magnitude above this.
  const double d = static_cast<double>(total.size());
  const double rounding =
      FixedPointRoundingBound(secagg_->frac_bits, static_cast<int64_t>(total.size()));
  const v1::DifferentialPrivacyConfig& dp = config_.privacy().dp();
  const double noise = dp.enabled() && dp.mode() == v1::DifferentialPrivacyConfig::DISTRIBUTED
                           ? dp.noise_multiplier() * secagg_->clip_norm * (std::sqrt(d) + 10)
                           : 0;
  const double bound = static_cast<double>(n) * (secagg_->clip_norm + rounding) + noise;
  double sq = 0;
  for (double v : total) sq += v * v;
  const double norm = std::sqrt(sq);
  if (!(norm <= bound)) {
    metrics_->secagg_implausible_sums.fetch_add(1);
    return absl::DataLossError(absl::StrCat("round ", round, ": the unmasked sum of ", n,
                                            " updates has L2 norm ", norm, ", above the ", bound,
                                            " that many clipped updates can reach: a client sent a "
                                            "wrong share or masked input, so the sum is not "
                                            "committed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UpdateTensor>> Coordinator::AggregateSecAgg(
    int64_t round, const std::vector<UploadRecord>& uploads, int64_t* survivors) {
  std::unique_ptr<crypto::SecAggServer> server;
  std::map<std::string, uint32_t> index;
  FEDLORA_ASSIGN_OR_RETURN(const std::shared_ptr<const AggregationKey> key, KeyFor(round));
  {
    absl::MutexLock lock(&mu_);
    if (round_ == nullptr || round_->round != round || round_->secagg == nullptr ||
        round_->secagg->server == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", round, ": its secure aggregation cannot be tried twice (its keys are spent)"));
    }
    server = std::move(round_->secagg->server);
    index = round_->secagg->index;
  }
  for (const UploadRecord& u : uploads) {
    auto it = index.find(u.client_id);
    if (it == index.end()) continue;
    FEDLORA_ASSIGN_OR_RETURN(std::string sealed, blobs_->Get(u.blob_hash));
    const crypto::UpdatePlace place{run_id_, static_cast<uint64_t>(u.round), u.client_id,
                                    u.upload_id, static_cast<uint64_t>(u.num_examples)};
    absl::StatusOr<std::string> opened = crypto::OpenUpdateBlob(key->private_key, place, sealed);
    if (!opened.ok())
      return Annotate(opened.status(), absl::StrCat("opening update ", u.upload_id));
    v1::SecAggMaskedInputResponse masked;
    masked.set_client_index(it->second);
    masked.set_masked_input(*std::move(opened));
    if (absl::Status st = server->ReceiveMaskedInput(masked); !st.ok()) {
      FEDLORA_LOG(WARNING) << "round " << round << ": masked update of " << u.client_id
                           << " left out: " << st;
    }
    FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
  }
  FEDLORA_RETURN_IF_ERROR_CTX(server->CloseMaskedInput(), "secure aggregation");
  FEDLORA_ASSIGN_OR_RETURN(v1::SecAggUnmaskingRequest request, server->UnmaskingRequest());
  const size_t expected = static_cast<size_t>(request.survivors_size());
  {
    absl::MutexLock lock(&mu_);
    if (round_ == nullptr || round_->round != round || round_->secagg == nullptr) {
      return absl::AbortedError(absl::StrCat("round ", round, " is no longer open"));
    }
    SecAggRound& s = *round_->secagg;
    s.unmasking = request;
    s.survivors.insert(request.survivors().begin(), request.survivors().end());
    s.phase = SecAggRound::Phase::kUnmasking;
  }
  // Step 3: wait for every survivor's shares, or for the step's time.
  const int64_t until = Now() + StepMs(options_.round_deadline_ms);
  std::map<uint32_t, v1::SecAggUnmaskingResponse> responses;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return absl::CancelledError("the server is shutting down");
      if (round_ == nullptr || round_->secagg == nullptr)
        return absl::AbortedError("the round closed");
      SecAggRound& s = *round_->secagg;
      if (s.unmasking_responses.size() >= expected || Now() >= until) {
        responses = std::move(s.unmasking_responses);
        s.unmasking_responses.clear();
        s.phase = SecAggRound::Phase::kDone;
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const auto& [i, response] : responses) {
    if (absl::Status st = server->ReceiveUnmasking(response); !st.ok()) {
      FEDLORA_LOG(WARNING) << "round " << round << ": unmasking shares of client index " << i
                           << " left out: " << st;
    }
  }
  absl::StatusOr<std::vector<uint64_t>> finished = server->Finish();
  ExcludeMisbehaving(round, server->misbehaving(), index);
  FEDLORA_ASSIGN_OR_RETURN(std::vector<uint64_t> sum, std::move(finished));
  FEDLORA_ASSIGN_OR_RETURN(
      std::vector<double> total,
      crypto::DecodeSecAggFixedPointSum(sum, secagg_->frac_bits, secagg_->modulus_bits));
  const int64_t n = static_cast<int64_t>(server->survivors().size());
  FEDLORA_LOG(INFO) << "round " << round << ": secure aggregation unmasked the sum of " << n
                    << " updates (" << responses.size() << " of " << expected
                    << " survivors answered step 3)";
  FEDLORA_RETURN_IF_ERROR(CheckUnmaskedSum(round, total, n));
  std::vector<UpdateTensor> mean;
  size_t offset = 0;
  for (const TensorSpec& t : spec_) {
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    UpdateTensor u{t.name, t.shape, std::vector<float>(static_cast<size_t>(count))};
    for (int64_t k = 0; k < count; ++k) {
      u.values[static_cast<size_t>(k)] =
          static_cast<float>(total[offset + static_cast<size_t>(k)] / static_cast<double>(n));
    }
    offset += static_cast<size_t>(count);
    mean.push_back(std::move(u));
  }
  *survivors = n;
  return mean;
}

}  // namespace fedlora
