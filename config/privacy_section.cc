// The privacy section (differential privacy and secure aggregation): its defaults and its checks,
// including what it needs of the codec, the aggregation weights and bounds and min_clients.
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "config/defaults.h"
#include "config/sections.h"

namespace fedlora::config_internal {
namespace {

using v1::AdaptiveClipping;
using v1::AggregationConfig;
using v1::CodecStage;
using v1::DifferentialPrivacyConfig;
using v1::RunConfig;

void ValidateSecureAggregation(Problems& p, const RunConfig& c) {
  if (!c.privacy().secure_aggregation()) return;
  if (!c.server().audit_public_key_file().empty()) {
    p.Add(
        "server.audit_public_key_file cannot be used with privacy.secure_aggregation: the server "
        "never sees an "
        "individual update there, so it has none to keep");
  }
  // The masked fixed-point vector is the update's wire format: sparse or per-client-scaled codecs
  // cannot be summed under masks. A QUANT stage sets the fixed point's precision instead, with one
  // power-of-two scale for every client.
  const bool quant_only =
      c.codec().stages_size() == 1 && c.codec().stages(0).id() == CodecStage::QUANT;
  if (c.codec().stages_size() > 0 && !quant_only) {
    p.Add(
        "codec with privacy.secure_aggregation takes no stage but QUANT: the masked fixed-point "
        "vector is the "
        "update's wire format, and sparse, half-precision or compressed updates cannot be summed "
        "under masks");
  }
  if (quant_only) {
    const v1::QuantParams& q = c.codec().stages(0).quant();
    if (q.bits() < 2) {
      p.Bad("codec.stages[0].quant.bits", q.bits(),
            "must be 2, 4 or 8 with privacy.secure_aggregation");
    }
    if (!q.stochastic()) {
      p.Add(
          "codec.stages[0].quant.stochastic must be true with privacy.secure_aggregation (unbiased "
          "rounding)");
    }
    if (q.error_feedback()) {
      p.Add("codec.stages[0].quant.error_feedback does not apply with privacy.secure_aggregation");
    }
    if (q.has_block_size()) {
      p.Add(
          "codec.stages[0].quant.block_size does not apply with privacy.secure_aggregation: every "
          "client "
          "quantizes with one scale for the whole update, so that the levels add up");
    }
  }
  if (c.aggregation().weight_by_examples()) {
    p.Add(
        "aggregation.weight_by_examples must be false with privacy.secure_aggregation: the server "
        "only learns "
        "the plain sum of the updates");
  }
  if (!c.privacy().dp().enabled() && c.aggregation().max_update_norm() <= 0) {
    p.Add(
        "privacy.secure_aggregation needs a bound on every update for its fixed-point encoding: "
        "set "
        "aggregation.max_update_norm (clients clip to it) or privacy.dp.clip_norm");
  }
  if (c.selection().min_clients() < 3) {
    p.Bad("selection.min_clients", c.selection().min_clients(),
          "must be >= 3 with privacy.secure_aggregation: with two clients each would learn the "
          "other's update");
  }
}

}  // namespace

void ApplyPrivacyDefaults(RunConfig* c) {
  if (!c->privacy().dp().enabled()) return;
  auto* dp = c->mutable_privacy()->mutable_dp();
  if (dp->mode() == DifferentialPrivacyConfig::MODE_UNSPECIFIED)
    dp->set_mode(DifferentialPrivacyConfig::CENTRAL);
  if (!dp->has_target_delta()) dp->set_target_delta(kDefaultDpTargetDelta);
  if (!dp->adaptive_clipping().enabled()) return;
  auto* ac = dp->mutable_adaptive_clipping();
  if (!ac->has_target_quantile()) ac->set_target_quantile(kDefaultAdaptiveClippingTargetQuantile);
  if (!ac->has_learning_rate()) ac->set_learning_rate(kDefaultAdaptiveClippingLearningRate);
  if (!ac->has_count_noise_stddev() && dp->has_noise_multiplier()) {
    const double per_round = static_cast<double>(c->selection().clients_per_round()) / 20.0;
    ac->set_count_noise_stddev(per_round > dp->noise_multiplier() / 2 ? per_round
                                                                      : dp->noise_multiplier());
  }
}

void ValidatePrivacy(Problems& p, const RunConfig& c) {
  ValidateSecureAggregation(p, c);
  const DifferentialPrivacyConfig& dp = c.privacy().dp();
  const AdaptiveClipping& ac = dp.adaptive_clipping();
  if (!dp.enabled()) {
    // Settings of a switched-off feature would be silently ignored: refuse them.
    const bool any = dp.mode() != DifferentialPrivacyConfig::MODE_UNSPECIFIED ||
                     dp.has_clip_norm() || dp.has_noise_multiplier() || dp.has_target_delta() ||
                     dp.has_max_epsilon() || dp.has_population_size() || dp.has_adaptive_clipping();
    if (any)
      p.Add(
          "privacy.dp settings are given but privacy.dp.enabled is false: enable it or remove "
          "them");
    return;
  }
  if (!DifferentialPrivacyConfig::Mode_IsValid(dp.mode()))
    p.Bad("privacy.dp.mode", dp.mode(), "is not a known mode");
  if (!dp.has_clip_norm()) {
    p.Add("privacy.dp.clip_norm is required with differential privacy");
  } else {
    p.Positive("privacy.dp.clip_norm", dp.clip_norm());
  }
  if (!dp.has_noise_multiplier()) {
    p.Add("privacy.dp.noise_multiplier is required with differential privacy");
  } else {
    p.RealRange("privacy.dp.noise_multiplier", dp.noise_multiplier(), 0, true, 1e6, false);
  }
  p.RealRange("privacy.dp.target_delta", dp.target_delta(), 0, true, 0.1, false);
  if (dp.has_max_epsilon()) p.Positive("privacy.dp.max_epsilon", dp.max_epsilon());
  if (dp.has_population_size()) {
    // Amplification by subsampling needs each round's cohort to be a uniformly random sample of a
    // population the server knows; the server selects the first clients that ask, so the only
    // sampling rate it can honour is 1.
    p.Add(
        "privacy.dp.population_size is refused: the server selects the first clients that ask for "
        "a task, not a "
        "uniformly random sample of a population, so the accountant takes the sampling rate 1; "
        "remove it");
  }
  const AggregationConfig& a = c.aggregation();
  if (dp.mode() == DifferentialPrivacyConfig::DISTRIBUTED && !c.privacy().secure_aggregation()) {
    p.Add(
        "privacy.dp.mode DISTRIBUTED needs privacy.secure_aggregation: without it the server sees "
        "each update "
        "with only its client's share of the noise (use CENTRAL)");
  }
  if (a.weight_by_examples()) {
    p.Add(
        "aggregation.weight_by_examples must be false with differential privacy: each client's "
        "weight must be "
        "bounded, so every update weighs the same");
  }
  if (a.max_update_norm() != 0) {
    p.Add(
        "aggregation.max_update_norm is replaced by privacy.dp.clip_norm with differential "
        "privacy: remove it");
  }
  if (ac.enabled()) {
    p.RealRange("privacy.dp.adaptive_clipping.target_quantile", ac.target_quantile(), 0, true, 1,
                true);
    p.Positive("privacy.dp.adaptive_clipping.learning_rate", ac.learning_rate());
    if (!std::isfinite(ac.count_noise_stddev()) ||
        (dp.has_noise_multiplier() && !(ac.count_noise_stddev() > dp.noise_multiplier() / 2))) {
      p.Bad("privacy.dp.adaptive_clipping.count_noise_stddev", ac.count_noise_stddev(),
            absl::StrCat("must be finite and > noise_multiplier / 2 (", dp.noise_multiplier() / 2,
                         "), or the count's noise would leave none for the update"));
    }
  } else if (ac.has_target_quantile() || ac.has_learning_rate() || ac.has_count_noise_stddev()) {
    p.Add("privacy.dp.adaptive_clipping settings are given but adaptive_clipping.enabled is false");
  }
}

}  // namespace fedlora::config_internal
