#include "server/differential_privacy.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "aggregation/fedavg.h"
#include "core/status.h"
#include "crypto/random.h"
#include "privacy/gaussian_noise.h"

namespace fedlora {

void DpRound::AddTo(nlohmann::json& metrics) const {
  metrics["dp_noise_multiplier"] = noise_multiplier;
  metrics["dp_sampling_rate"] = sampling_rate;
  metrics["dp_clip_norm"] = clip_norm;
  metrics["dp_next_clip_norm"] = next_clip_norm;
  if (unclipped_fraction.has_value()) metrics["dp_unclipped_fraction"] = *unclipped_fraction;
  metrics["dp_epsilon"] = epsilon;
}

absl::StatusOr<DpRound> DpRound::From(const nlohmann::json& metrics) {
  auto number = [&metrics](const char* key) -> std::optional<double> {
    auto it = metrics.find(key);
    if (it == metrics.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  DpRound r;
  const std::optional<double> z = number("dp_noise_multiplier"), q = number("dp_sampling_rate"),
                              c = number("dp_clip_norm"), next = number("dp_next_clip_norm"),
                              eps = number("dp_epsilon");
  if (!z || !q || !c || !next || !eps)
    return absl::NotFoundError("the round's metrics hold no DP record");
  r.noise_multiplier = *z;
  r.sampling_rate = *q;
  r.clip_norm = *c;
  r.next_clip_norm = *next;
  r.epsilon = *eps;
  r.unclipped_fraction = number("dp_unclipped_fraction");
  return r;
}

double FixedPointRoundingBound(uint32_t frac_bits, int64_t elements) {
  return std::ldexp(1.0, -static_cast<int>(frac_bits)) *
         std::sqrt(static_cast<double>(std::max<int64_t>(0, elements)));
}

ServerDp::ServerDp(const v1::RunConfig& config) : dp_(config.privacy().dp()) {
  clip_norm_ = dp_.clip_norm();
  planned_noise_multiplier_ = dp_.noise_multiplier();
}

absl::StatusOr<std::optional<ServerDp>> ServerDp::Create(const v1::RunConfig& config,
                                                         const std::vector<RoundRecord>& rounds,
                                                         int64_t min_clients, int64_t max_cohort,
                                                         double encoding_bound) {
  if (!config.privacy().dp().enabled()) {
    for (const RoundRecord& r : rounds) {
      if (!ReleasedAnAdapter(r)) continue;  // a rewound round's release still happened
      const nlohmann::json metrics =
          nlohmann::json::parse(r.metrics_json, nullptr, /*allow_exceptions=*/false);
      if (metrics.is_object() && DpRound::From(metrics).ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "round ", r.round,
            " was committed with differential privacy, and this config turns privacy.dp off: the "
            "rest of the run would release adapters without noise and stop counting epsilon. "
            "Restore the run's "
            "privacy.dp settings, or start a new run (a new run_id)"));
      }
    }
    return std::optional<ServerDp>();
  }
  const v1::DifferentialPrivacyConfig::Mode mode = config.privacy().dp().mode();
  if (mode != v1::DifferentialPrivacyConfig::CENTRAL &&
      !(mode == v1::DifferentialPrivacyConfig::DISTRIBUTED &&
        config.privacy().secure_aggregation())) {
    return absl::UnimplementedError(
        "privacy.dp.mode: CENTRAL, and DISTRIBUTED with secure aggregation, are implemented");
  }
  if (config.privacy().dp().has_population_size()) {
    return absl::InvalidArgumentError(
        "privacy.dp.population_size is refused: the server's cohorts are not uniform samples of a "
        "population");
  }
  if (!(std::isfinite(encoding_bound) && encoding_bound >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("encoding bound ", encoding_bound, " is not finite and >= 0"));
  }
  ServerDp dp(config);
  dp.sensitivity_scale_ = dp.clip_norm_ / (dp.clip_norm_ + encoding_bound);
  dp.planned_noise_multiplier_ *= dp.sensitivity_scale_;
  if (mode == v1::DifferentialPrivacyConfig::DISTRIBUTED && max_cohort > min_clients) {
    dp.planned_noise_multiplier_ *=
        std::sqrt(static_cast<double>(min_clients) / static_cast<double>(max_cohort));
  }
  // Every released adapter counts, including those of rounds a repair rewound (IsRewound): what was
  // released cannot be taken back, so rewinding never lowers the epsilon.
  for (const RoundRecord& r : rounds) {
    if (!ReleasedAnAdapter(r)) continue;
    const nlohmann::json metrics =
        nlohmann::json::parse(r.metrics_json, nullptr, /*allow_exceptions=*/false);
    absl::StatusOr<DpRound> record = metrics.is_object()
                                         ? DpRound::From(metrics)
                                         : absl::NotFoundError("the round's metrics are not JSON");
    if (!record.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("round ", r.round, " was committed without differential privacy (",
                       record.status().message(),
                       "): a run cannot turn privacy.dp on midway, since the earlier adapters "
                       "carry no guarantee"));
    }
    FEDLORA_RETURN_IF_ERROR_CTX(dp.Commit(*record),
                                absl::StrCat("round ", r.round, "'s DP record"));
  }
  int64_t committed = 0;
  for (const RoundRecord& r : rounds) committed += ReleasedAnAdapter(r) ? 1 : 0;
  if (committed == 0 && dp.AffordableRounds(0, 1) == 0) {
    privacy::RdpAccountant one;
    FEDLORA_RETURN_IF_ERROR(one.AddSteps(dp.planned_noise_multiplier_, dp.sampling_rate_, 1));
    FEDLORA_ASSIGN_OR_RETURN(privacy::PrivacySpent spent, one.GetEpsilon(dp.target_delta()));
    return absl::InvalidArgumentError(absl::StrCat("privacy.dp.max_epsilon (",
                                                   config.privacy().dp().max_epsilon(),
                                                   ") affords no round: one round costs epsilon ",
                                                   spent.epsilon, " at delta ", dp.target_delta()));
  }
  return std::optional<ServerDp>(std::move(dp));
}

std::string ServerDp::Assumptions() const {
  const bool distributed = dp_.mode() == v1::DifferentialPrivacyConfig::DISTRIBUTED;
  std::string out = absl::StrCat(
      "RDP accountant of the Gaussian mechanism, one step per committed round, at delta ",
      target_delta(), "; sampling rate ", sampling_rate_,
      " (no amplification: the server's cohorts are the first sites to ask, "
      "not a uniform sample); ",
      distributed ? "DISTRIBUTED: the sites' noise shares, accounted as if only the "
                    "fewest survivors a round allows had added theirs"
                  : "CENTRAL: the server adds the noise (it is trusted to)",
      "; sensitivity ", sensitivity(), " (clip norm ", clip_norm_);
  if (sensitivity_scale_ < 1)
    absl::StrAppend(&out, " plus the fixed point's rounding under secure aggregation");
  absl::StrAppend(&out, "); noise multiplier ", planned_noise_multiplier_, " on that sensitivity");
  if (dp_.adaptive_clipping().enabled()) {
    absl::StrAppend(&out,
                    "; adaptive clipping (its noisy count is part of the same Gaussian budget)");
  }
  return out;
}

double ServerDp::UpdateNoiseMultiplier() const {
  const double z = dp_.noise_multiplier();
  if (!dp_.adaptive_clipping().enabled()) return z;
  const double sigma_b = dp_.adaptive_clipping().count_noise_stddev();
  return std::pow(std::pow(z, -2.0) - std::pow(2.0 * sigma_b, -2.0), -0.5);
}

bool ServerDp::Clip(std::vector<KeptTensor>& update) const {
  return ClipUpdateNorm(update, clip_norm_) <= clip_norm_;
}

absl::StatusOr<DpRound> ServerDp::Release(std::vector<UpdateTensor>& mean, int64_t n,
                                          int64_t unclipped, int64_t cohort) const {
  if (n < 1) return absl::InvalidArgumentError("no update to release");
  DpRound r;
  r.noise_multiplier = dp_.noise_multiplier() * sensitivity_scale_;
  r.sampling_rate = sampling_rate_;
  r.clip_norm = clip_norm_;
  r.next_clip_norm = clip_norm_;
  if (dp_.mode() == v1::DifferentialPrivacyConfig::DISTRIBUTED) {
    if (cohort < n)
      return absl::InvalidArgumentError(
          absl::StrCat("a cohort of ", cohort, " cannot have ", n, " survivors"));
    r.noise_multiplier *= std::sqrt(static_cast<double>(n) / static_cast<double>(cohort));
  } else {
    FEDLORA_RETURN_IF_ERROR(AddServerNoise(mean, n, unclipped, r));
  }
  privacy::RdpAccountant after = accountant_;
  FEDLORA_RETURN_IF_ERROR(after.AddSteps(r.noise_multiplier, r.sampling_rate, 1));
  FEDLORA_ASSIGN_OR_RETURN(privacy::PrivacySpent spent, after.GetEpsilon(target_delta()));
  r.epsilon = spent.epsilon;
  return r;
}

absl::Status ServerDp::AddServerNoise(std::vector<UpdateTensor>& mean, int64_t n, int64_t unclipped,
                                      DpRound& r) const {
  // A fresh key from the CSPRNG for every release, held only here: nothing persisted regenerates the
  // noise. Two streams: the update's noise and the count's.
  FEDLORA_ASSIGN_OR_RETURN(const std::string key, crypto::RandomBytes(32));
  const double sigma =
      UpdateNoiseMultiplier() * clip_norm_ / static_cast<double>(n);  // on the mean
  FEDLORA_ASSIGN_OR_RETURN(privacy::GaussianSampler noise,
                           privacy::GaussianSampler::Create(key, 0));
  for (UpdateTensor& t : mean) {
    for (float& v : t.values) {
      FEDLORA_ASSIGN_OR_RETURN(double z, noise.Next());
      v = static_cast<float>(static_cast<double>(v) + sigma * z);
    }
  }
  if (dp_.adaptive_clipping().enabled()) {
    const v1::AdaptiveClipping& ac = dp_.adaptive_clipping();
    FEDLORA_ASSIGN_OR_RETURN(privacy::GaussianSampler count_noise,
                             privacy::GaussianSampler::Create(key, 1));
    FEDLORA_ASSIGN_OR_RETURN(double z, count_noise.Next());
    const double fraction =
        (static_cast<double>(unclipped) + ac.count_noise_stddev() * z) / static_cast<double>(n);
    r.unclipped_fraction = fraction;
    r.next_clip_norm =
        clip_norm_ * std::exp(-ac.learning_rate() * (fraction - ac.target_quantile()));
  }
  return absl::OkStatus();
}

absl::Status ServerDp::Commit(const DpRound& r) {
  if (!(std::isfinite(r.next_clip_norm) && r.next_clip_norm > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("next clip norm ", r.next_clip_norm, " is not finite and > 0"));
  }
  FEDLORA_RETURN_IF_ERROR(accountant_.AddSteps(r.noise_multiplier, r.sampling_rate, 1));
  FEDLORA_ASSIGN_OR_RETURN(privacy::PrivacySpent spent, accountant_.GetEpsilon(target_delta()));
  epsilon_ = spent.epsilon;
  clip_norm_ = r.next_clip_norm;
  return absl::OkStatus();
}

int64_t ServerDp::AffordableRounds(int64_t committed, int64_t configured) const {
  if (!dp_.has_max_epsilon() || committed >= configured) return std::max(committed, configured);
  // Every further round is planned at the same cost (the weakest noise it can have): find the most that fit.
  auto fits = [this](int64_t more) {
    privacy::RdpAccountant a = accountant_;
    if (!a.AddSteps(planned_noise_multiplier_, sampling_rate_, static_cast<uint64_t>(more)).ok())
      return false;
    absl::StatusOr<privacy::PrivacySpent> spent = a.GetEpsilon(target_delta());
    return spent.ok() && spent->epsilon <= dp_.max_epsilon();
  };
  if (!fits(0)) return committed;
  int64_t lo = 0, hi = configured - committed;  // fits(lo) holds
  if (fits(hi)) return configured;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return committed + lo;
}

}  // namespace fedlora
