#include "server/secagg_round.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "crypto/secagg_fixed_point.h"
#include "server/differential_privacy.h"

namespace fedlora {
namespace {

constexpr uint32_t kPollMs = 100;

bool Distributed(const v1::DifferentialPrivacyConfig& dp) {
  return dp.enabled() && dp.mode() == v1::DifferentialPrivacyConfig::DISTRIBUTED;
}

absl::Status CheckEncoding(int64_t max_cohort, const SecAggEncoding& e) {
  return Annotate(crypto::CheckSecAggFixedPoint(static_cast<uint64_t>(max_cohort), e.range,
                                                e.frac_bits, e.modulus_bits),
                  "privacy.secure_aggregation's fixed-point encoding");
}

}  // namespace

absl::StatusOr<SecAggEncoding> SecAggEncoding::For(const v1::RunConfig& config, int64_t min_clients,
                                                   int64_t max_cohort) {
  const v1::DifferentialPrivacyConfig& dp = config.privacy().dp();
  SecAggEncoding e;
  e.clip_norm = dp.enabled() ? dp.clip_norm() : config.aggregation().max_update_norm();
  // Every coordinate of a clipped update is within the clip norm; a client's share of distributed
  // noise (largest with the fewest clients) gets ten of its standard deviations on top.
  e.range = e.clip_norm;
  if (Distributed(dp)) {
    e.range +=
        10.0 * dp.noise_multiplier() * e.clip_norm / std::sqrt(static_cast<double>(min_clients));
  }
  const double cohort = static_cast<double>(max_cohort);
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
    FEDLORA_RETURN_IF_ERROR(CheckEncoding(max_cohort, e));
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
                                                   max_cohort, " updates within +-", e.range,
                                                   " does not fit 64-bit elements"));
  }
  FEDLORA_RETURN_IF_ERROR(CheckEncoding(max_cohort, e));
  return e;
}

absl::Status SecAggEncoding::ValidateMasked(std::string_view plain, int64_t elements) const {
  const uint32_t m = modulus_bits;
  const uint64_t want = static_cast<uint64_t>(elements) * ((m + 7) / 8);
  if (plain.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("a masked update is ", want, " bytes (",
                                                   elements, " elements of ", (m + 7) / 8,
                                                   "), got ", plain.size()));
  }
  return crypto::UnpackSecAggVector(plain, static_cast<uint64_t>(elements), m).status();
}

absl::Status SecAggEncoding::CheckUnmaskedSum(int64_t round, const std::vector<double>& total,
                                              int64_t n,
                                              const v1::DifferentialPrivacyConfig& dp) const {
  // n clipped updates, each at most its rounding bound above the clip norm, plus (DISTRIBUTED DP)
  // noise of total variance (z C)^2 per value at most, whose norm exceeds z C (sqrt(d) + 10) with
  // probability below e^-50. A wrong share or an out-of-range masked input from one client makes
  // the sum uniform over the modulus instead, orders of magnitude above this.
  const double d = static_cast<double>(total.size());
  const double rounding = FixedPointRoundingBound(frac_bits, static_cast<int64_t>(total.size()));
  const double noise =
      Distributed(dp) ? dp.noise_multiplier() * clip_norm * (std::sqrt(d) + 10) : 0;
  const double bound = static_cast<double>(n) * (clip_norm + rounding) + noise;
  double sq = 0;
  for (double v : total) sq += v * v;
  const double norm = std::sqrt(sq);
  if (!(norm <= bound)) {
    return absl::DataLossError(absl::StrCat("round ", round, ": the unmasked sum of ", n,
                                            " updates has L2 norm ", norm, ", above the ", bound,
                                            " that many clipped updates can reach: a client sent a "
                                            "wrong share or masked input, so the sum is not "
                                            "committed"));
  }
  return absl::OkStatus();
}

std::vector<UpdateTensor> UnmaskedMean(const std::vector<double>& total, int64_t n,
                                       const std::vector<TensorSpec>& spec) {
  std::vector<UpdateTensor> mean;
  size_t offset = 0;
  for (const TensorSpec& t : spec) {
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
  return mean;
}

// ------------------------------------------------------------------------------------------------
// SecAggRound

int64_t SecAggRound::StepMs(int64_t round_deadline_ms) {
  return std::clamp<int64_t>(round_deadline_ms / 4, 1000, 60'000);
}

v1::SecureAggregationResponse SecAggRound::Retry() {
  v1::SecureAggregationResponse r;
  r.set_retry_after_ms(kPollMs);
  return r;
}

v1::SecureAggregationResponse SecAggRound::Done(std::string why) {
  v1::SecureAggregationResponse r;
  r.set_done(std::move(why));
  return r;
}

absl::StatusOr<v1::SecAggParams> SecAggRound::Params(int64_t round, uint32_t n, int64_t elements,
                                                     const SecAggEncoding& e, int64_t min_clients) {
  crypto::SecAggConfig c;
  c.round_id = static_cast<uint64_t>(round);
  c.num_clients = n;
  c.vector_length = static_cast<uint64_t>(elements);
  c.modulus_bits = e.modulus_bits;
  c.degree = crypto::RecommendedSecAggDegree(n);
  c.threshold = crypto::RecommendedSecAggThreshold(c.degree);
  c.min_survivors =
      std::min<uint32_t>(n, std::max<uint32_t>(c.threshold, static_cast<uint32_t>(min_clients)));
  return crypto::NewSecAggParams(c);
}

absl::StatusOr<std::unique_ptr<SecAggRound>> SecAggRound::Start(
    int64_t round, const std::set<std::string>& cohort, const v1::SecAggParams& params,
    const SecAggEncoding& e, const v1::DifferentialPrivacyConfig& dp, int64_t step_ms,
    int64_t now) {
  FEDLORA_ASSIGN_OR_RETURN(crypto::SecAggServer server, crypto::SecAggServer::Create(params));
  std::unique_ptr<SecAggRound> s(new SecAggRound());
  s->round_ = round;
  s->step_ms_ = step_ms;
  s->cohort_.assign(cohort.begin(), cohort.end());  // sorted: index order is client id order
  for (uint32_t i = 0; i < s->cohort_.size(); ++i) s->index_[s->cohort_[i]] = i;
  const uint32_t n = static_cast<uint32_t>(s->cohort_.size());
  s->server_ = std::make_unique<crypto::SecAggServer>(std::move(server));
  *s->task_.mutable_params() = params;
  s->task_.set_clip_norm(e.clip_norm);
  s->task_.set_range(e.range);
  s->task_.set_frac_bits(e.frac_bits);
  if (Distributed(dp)) {
    // n shares of variance (z C)^2 / n make the sum's (z C)^2 when nobody drops out.
    s->task_.set_noise_stddev(dp.noise_multiplier() * e.clip_norm /
                              std::sqrt(static_cast<double>(n)));
  }
  s->step_deadline_ms_ = now + step_ms;
  FEDLORA_LOG(DEBUG) << "round " << round << ": secure aggregation over " << n
                     << " clients (degree " << params.degree() << ", threshold "
                     << params.threshold() << ", " << params.modulus_bits() << "-bit elements, "
                     << e.frac_bits << " fraction bits)";
  return s;
}

std::optional<uint32_t> SecAggRound::IndexOf(const std::string& client_id) const {
  auto it = index_.find(client_id);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

v1::SecureAggregationTask SecAggRound::TaskFor(const std::string& client_id) const {
  v1::SecureAggregationTask task = task_;
  task.set_client_index(index_.at(client_id));
  return task;
}

bool SecAggRound::MayUpload(const std::string& client_id) const {
  auto it = index_.find(client_id);
  return phase_ == Phase::kMaskedInput && it != index_.end() &&
         std::binary_search(u2_.begin(), u2_.end(), it->second);
}

std::optional<int64_t> SecAggRound::UploadCap() const {
  if (phase_ != Phase::kMaskedInput) return std::nullopt;
  return static_cast<int64_t>(u2_.size());
}

absl::Status SecAggRound::Advance(int64_t now) {
  if (server_ == nullptr) return absl::OkStatus();
  if (phase_ == Phase::kAdvertise &&
      (advertised_.size() == cohort_.size() || now >= step_deadline_ms_)) {
    FEDLORA_RETURN_IF_ERROR_CTX(server_->CloseAdvertiseKeys(),
                                "secure aggregation, key advertisement");
    u1_ = server_->advertised();
    phase_ = Phase::kShareKeys;
    step_deadline_ms_ = now + step_ms_;
  }
  if (phase_ == Phase::kShareKeys && (shared_.size() == u1_.size() || now >= step_deadline_ms_)) {
    FEDLORA_RETURN_IF_ERROR_CTX(server_->CloseShareKeys(), "secure aggregation, key sharing");
    u2_ = server_->shared_keys();
    phase_ = Phase::kMaskedInput;
    FEDLORA_LOG(DEBUG) << "round " << round_ << ": " << u2_.size() << " of " << cohort_.size()
                       << " clients shared their keys; masked uploads open";
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<v1::SecureAggregationResponse>> SecAggRound::Receive(
    uint32_t i, const v1::SecureAggregationRequest& request) {
  auto own = [i](uint32_t index, const char* what) -> absl::Status {
    if (index == i) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat(what, " names client index ", index, ", the caller's is ", i));
  };
  switch (request.message_case()) {
    case v1::SecureAggregationRequest::kAdvertiseKeys: {
      FEDLORA_RETURN_IF_ERROR(own(request.advertise_keys().client_index(), "AdvertiseKeys"));
      if (phase_ != Phase::kAdvertise || server_ == nullptr) {
        if (advertised_.count(i) == 0) return Done("the key advertisement is closed");
        return std::nullopt;  // a retry of an accepted message: answer as a poll
      }
      if (advertised_.count(i) == 0) {
        FEDLORA_RETURN_IF_ERROR(server_->ReceiveAdvertiseKeys(request.advertise_keys()));
        advertised_.insert(i);
      }
      return std::nullopt;
    }
    case v1::SecureAggregationRequest::kShareKeys: {
      FEDLORA_RETURN_IF_ERROR(own(request.share_keys().client_index(), "ShareKeys"));
      if (phase_ != Phase::kShareKeys || server_ == nullptr) {
        if (shared_.count(i) == 0) return Done("the key sharing is closed");
        return std::nullopt;
      }
      if (shared_.count(i) == 0) {
        FEDLORA_RETURN_IF_ERROR(server_->ReceiveShareKeys(request.share_keys()));
        shared_.insert(i);
      }
      return std::nullopt;
    }
    case v1::SecureAggregationRequest::kUnmasking: {
      FEDLORA_RETURN_IF_ERROR(own(request.unmasking().client_index(), "Unmasking"));
      if (phase_ != Phase::kUnmasking || survivors_.count(i) == 0) {
        return Done("the unmasking step is not open to this client");
      }
      unmasking_responses_.emplace(i, request.unmasking());
      return Done("unmasking shares received");
    }
    case v1::SecureAggregationRequest::kPoll:
      return std::nullopt;
    default:
      return absl::InvalidArgumentError("SecureAggregationRequest carries no message");
  }
}

absl::StatusOr<v1::SecureAggregationResponse> SecAggRound::Answer(uint32_t i, bool uploaded) const {
  v1::SecureAggregationResponse response;
  switch (phase_) {
    case Phase::kAdvertise:
      return Retry();
    case Phase::kShareKeys: {
      if (!std::binary_search(u1_.begin(), u1_.end(), i))
        return Done("missed the key advertisement");
      if (shared_.count(i) != 0) return Retry();
      FEDLORA_ASSIGN_OR_RETURN(*response.mutable_share_keys(), server_->ShareKeysRequest(i));
      return response;
    }
    case Phase::kMaskedInput: {
      if (!std::binary_search(u2_.begin(), u2_.end(), i)) return Done("missed the key sharing");
      if (uploaded) return Retry();  // wait for step 3
      if (server_ == nullptr) return Done("the masked uploads are closed");
      FEDLORA_ASSIGN_OR_RETURN(*response.mutable_masked_input(), server_->MaskedInputRequest(i));
      return response;
    }
    case Phase::kUnmasking:
      if (survivors_.count(i) == 0) return Done("the round goes on without this client's update");
      if (unmasking_responses_.count(i) != 0) return Done("unmasking shares received");
      *response.mutable_unmasking() = unmasking_;
      return response;
    case Phase::kDone:
      return Done("the round's unmasking is over");
  }
  return Retry();
}

void SecAggRound::OpenUnmasking(const v1::SecAggUnmaskingRequest& request) {
  unmasking_ = request;
  survivors_.insert(request.survivors().begin(), request.survivors().end());
  phase_ = Phase::kUnmasking;
}

std::optional<std::map<uint32_t, v1::SecAggUnmaskingResponse>> SecAggRound::CollectUnmasking(
    size_t expected, bool time_up) {
  if (unmasking_responses_.size() < expected && !time_up) return std::nullopt;
  std::map<uint32_t, v1::SecAggUnmaskingResponse> responses = std::move(unmasking_responses_);
  unmasking_responses_.clear();
  phase_ = Phase::kDone;
  return responses;
}

}  // namespace fedlora
