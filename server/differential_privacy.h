// The server's client-level differential privacy (config.privacy.dp, CENTRAL mode): clipping each
// decoded update, Gaussian noise on the sum, adaptive clipping, and the accountant.
//
//   FEDLORA_ASSIGN_OR_RETURN(std::optional<ServerDp> dp, ServerDp::Create(config, rounds));
//   ...  // aggregation: for each update, unclipped += dp->Clip(update); avg.Add(update, 1)
//   FEDLORA_ASSIGN_OR_RETURN(DpRound r, dp->Release(mean, n, unclipped));   // noise in `mean`
//   r.AddTo(metrics_json);  // committed with the round: the accountant's durable state
//   dp->Commit(r);          // once the round is committed
//
// The noise is N(0, (z * C)^2) per coordinate of the sum of the n clipped updates (z the noise
// multiplier, C the round's clip norm), drawn from a generator keyed by 32 fresh bytes of the
// CSPRNG per release that are never stored: nothing on the server's disk regenerates the noise to
// strip it from a released adapter (a round redone after a crash draws new noise; only the
// committed one is released). With adaptive clipping (Andrew et al. 2021) the count of updates within
// C is released with noise of standard deviation sigma_b, the update noise multiplier becomes
// (z^-2 - (2 sigma_b)^-2)^-1/2, and the pair costs exactly what one Gaussian release at z costs.
// Each committed round's metrics hold what the accountant needs (its noise multiplier and sampling
// rate), so the epsilon survives restarts with the rounds themselves. The sampling rate is 1: the
// server's cohorts are the first clients to ask, not a uniform sample of a population, so no
// amplification by subsampling is claimed (privacy.dp.population_size is refused).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "fedlora/v1/config.pb.h"
#include "privacy/rdp_accountant.h"
#include "server/store.h"

namespace fedlora {

// What one round released, as stored in its metrics JSON (the "dp_*" keys).
struct DpRound {
  double noise_multiplier = 0;  // the round's total z (what the accountant composes)
  double sampling_rate = 1;
  double clip_norm = 0;                      // C the round clipped to
  double next_clip_norm = 0;                 // C the next round clips to
  std::optional<double> unclipped_fraction;  // the noisy fraction, with adaptive clipping
  double epsilon = 0;                        // spent by this round and the ones before it

  void AddTo(nlohmann::json& metrics) const;
  // Reads the keys back; NotFound when the round has none (committed without DP).
  static absl::StatusOr<DpRound> From(const nlohmann::json& metrics);
};

// The most stochastic or nearest rounding to a grid of step 2^-frac_bits can add, in L2 norm, to a
// vector of `elements` values: each value moves by less than one step, so sqrt(elements) steps.
double FixedPointRoundingBound(uint32_t frac_bits, int64_t elements);

class ServerDp {
 public:
  // nullopt without privacy.dp.enabled (FailedPrecondition then if a committed round had DP).
  // `rounds` the run's rounds from the store, whose committed metrics restore the accountant;
  // `min_clients` and `max_cohort` bound a DISTRIBUTED round's survivors and cohort (the budget
  // plans with the weakest noise they allow). FailedPrecondition when a committed round lacks the
  // DP record (the run did not always have DP), InvalidArgument when the budget affords no round.
  // `encoding_bound` bounds, in L2 norm, what a client's encoding may add to its clipped update
  // beyond the clip norm C (secure aggregation's fixed-point rounding: FixedPointRoundingBound):
  // the accountant then takes the sensitivity C + encoding_bound, i.e. the noise multiplier
  // z * C / (C + encoding_bound).
  static absl::StatusOr<std::optional<ServerDp>> Create(const v1::RunConfig& config,
                                                        const std::vector<RoundRecord>& rounds,
                                                        int64_t min_clients = 1,
                                                        int64_t max_cohort = 1,
                                                        double encoding_bound = 0);

  // Clips `update` in place to the round's clip norm (its L2 norm, summed in double, is then at
  // most clip_norm()); returns whether it was already within it.
  bool Clip(std::vector<KeptTensor>& update) const;

  // Adds the noise for the mean of `n` clipped updates to `mean` (the sum's noise divided by n),
  // and works out the round's release: the next clip norm and the epsilon after it. DISTRIBUTED:
  // the n updates carry their clients' noise shares, each 1/cohort of the variance, so the server
  // adds nothing and the round's noise multiplier is z * sqrt(n / cohort).
  absl::StatusOr<DpRound> Release(std::vector<UpdateTensor>& mean, int64_t n, int64_t unclipped,
                                  int64_t cohort = 0) const;

  // The round is committed: the accountant takes its step and the clip norm moves.
  absl::Status Commit(const DpRound& r);

  double clip_norm() const { return clip_norm_; }
  // What the accountant assumes for the next round: its sampling rate, the noise multiplier it
  // composes (the weakest a round may have, scaled to the sensitivity), and the sensitivity (the
  // clip norm plus what a client's encoding can add to it); Assumptions() says all of it in words.
  double sampling_rate() const { return sampling_rate_; }
  double accounted_noise_multiplier() const { return planned_noise_multiplier_; }
  double sensitivity() const { return clip_norm_ / sensitivity_scale_; }
  std::string Assumptions() const;
  double epsilon() const { return epsilon_; }
  double target_delta() const { return dp_.target_delta(); }
  std::optional<double> max_epsilon() const {
    return dp_.has_max_epsilon() ? std::optional<double>(dp_.max_epsilon()) : std::nullopt;
  }
  // Committed rounds plus the rounds the budget still affords at the configured noise, at most
  // `configured` (everything, without a budget).
  int64_t AffordableRounds(int64_t committed, int64_t configured) const;

 private:
  explicit ServerDp(const v1::RunConfig& config);
  double UpdateNoiseMultiplier() const;
  // CENTRAL: the noise on `mean` and, with adaptive clipping, the noisy count and next clip norm.
  absl::Status AddServerNoise(std::vector<UpdateTensor>& mean, int64_t n, int64_t unclipped,
                              DpRound& r) const;

  v1::DifferentialPrivacyConfig dp_;
  double sensitivity_scale_ = 1;  // C / (C + encoding_bound): what the accountant's z is scaled by
  double planned_noise_multiplier_ = 0;  // the weakest a future round can have (the budget's plan)
  double sampling_rate_ = 1;
  double clip_norm_ = 0;
  double epsilon_ = 0;
  privacy::RdpAccountant accountant_;
};

}  // namespace fedlora
