// The run's identity and length, and the selection, aggregation, data and simulation sections:
// their defaults (config/defaults.h holds the values) and their checks.
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "config/config_io.h"
#include "config/defaults.h"
#include "config/robust_options.h"
#include "config/sections.h"
#include "train/training_defaults.h"

namespace fedlora::config_internal {
namespace {

using v1::AggregationConfig;
using v1::RunConfig;
using v1::SimulationConfig;
using v1::TaskConfig;

bool IsValidRunId(const std::string& id) {
  if (id.empty() || id.size() > 64 || id == "." || id == "..") return false;
  for (char c : id) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

void ApplySelectionDefaults(v1::SelectionConfig* s) {
  if (!s->has_clients_per_round()) s->set_clients_per_round(kDefaultClientsPerRound);
  if (!s->has_over_selection()) s->set_over_selection(kDefaultOverSelection);
  if (!s->has_min_clients()) s->set_min_clients(DefaultMinClients(s->clients_per_round()));
  if (!s->has_round_deadline_seconds()) s->set_round_deadline_seconds(kDefaultRoundDeadlineSeconds);
  if (!s->has_heartbeat_interval_seconds())
    s->set_heartbeat_interval_seconds(kDefaultHeartbeatIntervalSeconds);
  if (!s->has_heartbeat_timeout_seconds())
    s->set_heartbeat_timeout_seconds(kDefaultHeartbeatTimeoutSeconds);
  if (!s->has_retry_after_seconds()) s->set_retry_after_seconds(kDefaultRetryAfterSeconds);
}

void ApplyAggregationDefaults(RunConfig* c) {
  auto* a = c->mutable_aggregation();
  if (a->strategy() == AggregationConfig::STRATEGY_UNSPECIFIED)
    a->set_strategy(AggregationConfig::FEDAVG);
  if (!a->has_proximal_mu()) {
    a->set_proximal_mu(a->strategy() == AggregationConfig::FEDPROX ? kDefaultFedProxProximalMu
                                                                   : kDefaultProximalMu);
  }
  if (!a->has_server_learning_rate()) {
    a->set_server_learning_rate(IsAdaptiveServerStrategy(a->strategy())
                                    ? kDefaultAdaptiveServerLearningRate
                                    : kDefaultServerLearningRate);
  }
  if (!a->has_server_momentum()) a->set_server_momentum(0.0);
  if (!a->has_server_beta1()) a->set_server_beta1(kDefaultServerBeta1);
  if (!a->has_server_beta2()) a->set_server_beta2(kDefaultServerBeta2);
  if (!a->has_server_tau()) a->set_server_tau(kDefaultServerTau);
  // Differential privacy bounds each client's influence, secure aggregation sums without weights
  // and the robust statistics weigh equally: with any of them, every update weighs the same; so
  // does every update without a bound on the count a client may claim.
  if (!a->has_weight_by_examples()) {
    a->set_weight_by_examples(!c->privacy().dp().enabled() && !c->privacy().secure_aggregation() &&
                              !NeedsIndividualUpdates(a->strategy()) &&
                              a->max_examples_per_client() > 0);
  }
}

}  // namespace

void ApplyFederationDefaults(RunConfig* c) {
  if (c->run_id().empty()) c->set_run_id(kDefaultRunId);
  if (!c->has_rounds()) c->set_rounds(kDefaultRounds);
  ApplySelectionDefaults(c->mutable_selection());
  ApplyAggregationDefaults(c);

  auto* d = c->mutable_data();
  if (!d->has_eval_every_rounds()) d->set_eval_every_rounds(kDefaultEvalEveryRounds);
  if (!d->has_eval_batch_size()) d->set_eval_batch_size(kDefaultEvalBatchSize);

  auto* sim = c->mutable_simulation();
  if (!sim->has_num_clients()) sim->set_num_clients(kDefaultSimulatedClients);
  if (sim->partition() == SimulationConfig::PARTITION_UNSPECIFIED)
    sim->set_partition(SimulationConfig::IID);
  if (!sim->has_dirichlet_alpha()) sim->set_dirichlet_alpha(kDefaultDirichletAlpha);
  if (!sim->has_shards_per_client()) sim->set_shards_per_client(kDefaultShardsPerClient);
  v1::SimulationAttack* attack = sim->mutable_attack();
  if (!attack->has_scale()) {
    switch (attack->kind()) {
      case v1::SimulationAttack::SIGN_FLIP:
        attack->set_scale(kDefaultSignFlipScale);
        break;
      case v1::SimulationAttack::SCALE:
        attack->set_scale(kDefaultScaleAttackFactor);
        break;
      case v1::SimulationAttack::GAUSSIAN:
        attack->set_scale(kDefaultGaussianAttackStddev);
        break;
      default:
        break;  // no attack; LITTLE_IS_ENOUGH computes z unless set; MIN_MAX takes no scale
    }
  }
}

void ValidateRun(Problems& p, const RunConfig& c) {
  if (!IsValidRunId(c.run_id())) {
    p.Bad("run_id", Quoted(c.run_id()), "must be 1-64 characters from [A-Za-z0-9._-]");
  }
  p.Range<uint32_t>("rounds", c.rounds(), 1, 1'000'000);
}

void ValidateSelection(Problems& p, const v1::SelectionConfig& s) {
  p.Range<uint32_t>("selection.clients_per_round", s.clients_per_round(), 1, 100'000);
  p.RealRange("selection.over_selection", s.over_selection(), 1, false, 10, false);
  if (s.min_clients() < 1) {
    p.Bad("selection.min_clients", s.min_clients(), "must be >= 1");
  } else if (s.min_clients() > s.clients_per_round()) {
    p.Bad("selection.min_clients", s.min_clients(),
          absl::StrCat("exceeds selection.clients_per_round (", s.clients_per_round(), ")"));
  }
  p.Range<uint32_t>("selection.round_deadline_seconds", s.round_deadline_seconds(), 1, 604'800);
  p.Range<uint32_t>("selection.heartbeat_interval_seconds", s.heartbeat_interval_seconds(), 1,
                    3600);
  if (s.heartbeat_timeout_seconds() <= s.heartbeat_interval_seconds()) {
    p.Bad("selection.heartbeat_timeout_seconds", s.heartbeat_timeout_seconds(),
          absl::StrCat("must exceed selection.heartbeat_interval_seconds (",
                       s.heartbeat_interval_seconds(), ")"));
  } else {
    p.Range<uint32_t>("selection.heartbeat_timeout_seconds", s.heartbeat_timeout_seconds(), 1,
                      86'400);
  }
  p.Range<uint32_t>("selection.retry_after_seconds", s.retry_after_seconds(), 1, 3600);
}

bool IsAdaptiveServerStrategy(AggregationConfig::Strategy s) {
  return s == AggregationConfig::FEDADAM || s == AggregationConfig::FEDYOGI ||
         s == AggregationConfig::FEDADAGRAD;
}

}  // namespace fedlora::config_internal

namespace fedlora {

std::optional<RobustOptions> RobustOptionsOf(const v1::AggregationConfig& a) {
  RobustOptions o;
  o.trim_fraction = a.trim_fraction();
  o.byzantine = a.krum_byzantine_clients();
  o.multi_krum_keep = a.multi_krum_keep();
  switch (a.strategy()) {
    case v1::AggregationConfig::MEDIAN:
      o.rule = RobustRule::kMedian;
      return o;
    case v1::AggregationConfig::TRIMMED_MEAN:
      o.rule = RobustRule::kTrimmedMean;
      return o;
    case v1::AggregationConfig::KRUM:
      o.rule = RobustRule::kKrum;
      return o;
    case v1::AggregationConfig::MULTI_KRUM:
      o.rule = RobustRule::kMultiKrum;
      return o;
    case v1::AggregationConfig::BULYAN:
      o.rule = RobustRule::kBulyan;
      return o;
    default:
      return std::nullopt;
  }
}

}  // namespace fedlora

namespace fedlora::config_internal {

bool NeedsIndividualUpdates(AggregationConfig::Strategy s) {
  AggregationConfig a;
  a.set_strategy(s);
  return RobustOptionsOf(a).has_value();
}

namespace {

// A robust strategy's settings, its bound on the round's update count (the fewest updates it
// aggregates, as aggregation/robust.h's RobustMinUpdates), and what it cannot be combined with.
void ValidateRobust(Problems& p, const RunConfig& c) {
  const AggregationConfig& a = c.aggregation();
  const AggregationConfig::Strategy s = a.strategy();
  const std::string name = AggregationConfig::Strategy_Name(s);
  const bool krum = s == AggregationConfig::KRUM || s == AggregationConfig::MULTI_KRUM ||
                    s == AggregationConfig::BULYAN;
  if (a.has_trim_fraction() && s != AggregationConfig::TRIMMED_MEAN) {
    p.Add(absl::StrCat("aggregation.trim_fraction belongs to strategy TRIMMED_MEAN, not ", name));
  }
  if (a.has_krum_byzantine_clients() && !krum) {
    p.Add(absl::StrCat(
        "aggregation.krum_byzantine_clients belongs to strategies KRUM, MULTI_KRUM and BULYAN, "
        "not ",
        name));
  }
  if (a.has_multi_krum_keep() && s != AggregationConfig::MULTI_KRUM) {
    p.Add(absl::StrCat("aggregation.multi_krum_keep belongs to strategy MULTI_KRUM, not ", name));
  }
  if (!NeedsIndividualUpdates(s)) return;
  const int64_t min_clients = c.selection().min_clients();
  const std::optional<RobustOptions> rule = RobustOptionsOf(a);
  if (s == AggregationConfig::TRIMMED_MEAN) {
    if (!a.has_trim_fraction()) {
      p.Add(
          "aggregation.trim_fraction must be set with strategy TRIMMED_MEAN: the fraction of "
          "updates dropped at each end of every coordinate, in (0, 0.5)");
    } else if (!(a.trim_fraction() > 0 && a.trim_fraction() < 0.5)) {
      p.Bad("aggregation.trim_fraction", a.trim_fraction(), "must be in (0, 0.5)");
    } else if (min_clients < RobustMinUpdates(*rule)) {
      p.Bad("selection.min_clients", min_clients,
            absl::StrCat("trims nothing with aggregation.trim_fraction ", a.trim_fraction(),
                         " (floor(trim_fraction x min_clients) must be >= 1): a round of that "
                         "many updates would be aggregated by the plain mean"));
    }
  }
  if (krum) {
    const int64_t f = a.krum_byzantine_clients();
    if (!a.has_krum_byzantine_clients() || f < 1) {
      p.Add(absl::StrCat("aggregation.krum_byzantine_clients must be set to >= 1 with strategy ",
                         name, ": the number of malicious clients f the rule tolerates"));
    } else {
      const bool bulyan = s == AggregationConfig::BULYAN;
      RobustOptions without_keep = *rule;  // the rule's own bound; multi_krum_keep's is below
      without_keep.multi_krum_keep = 0;
      const int64_t bound = RobustMinUpdates(without_keep);
      if (min_clients < bound) {
        p.Bad("selection.min_clients", min_clients,
              absl::StrCat("must be >= ", bulyan ? "4f + 3" : "2f + 3", " = ", bound,
                           " with strategy ", name, " and aggregation.krum_byzantine_clients ", f));
      }
      if (a.has_multi_krum_keep()) {
        if (a.multi_krum_keep() < 1) {
          p.Bad("aggregation.multi_krum_keep", a.multi_krum_keep(), "must be >= 1");
        } else if (static_cast<int64_t>(a.multi_krum_keep()) + f > min_clients) {
          p.Bad("aggregation.multi_krum_keep", a.multi_krum_keep(),
                absl::StrCat("plus aggregation.krum_byzantine_clients (", f,
                             ") exceeds selection.min_clients (", min_clients,
                             "): a round may have too few updates to keep that many"));
        }
      }
    }
  }
  if (c.privacy().secure_aggregation()) {
    p.Add(absl::StrCat("aggregation.strategy ", name,
                       " needs each client's update, which privacy.secure_aggregation hides from "
                       "the server: use FEDAVG, FEDPROX, FEDADAM, FEDYOGI or FEDADAGRAD with it"));
  }
  if (c.privacy().dp().enabled()) {
    p.Add(absl::StrCat("aggregation.strategy ", name,
                       " with differential privacy: the accountant's noise is calibrated to the "
                       "clipped mean's sensitivity, not to ",
                       name, "'s; use the FedAvg family with privacy.dp"));
  }
  if (a.weight_by_examples()) {
    p.Add(absl::StrCat("aggregation.weight_by_examples must be false with strategy ", name,
                       ": robust statistics weigh every update the same"));
  }
}

// LORA_PRODUCT factors the mean of the clients' products: it needs each client's factors, and
// its aggregate is the next global pair itself.
void ValidateLoraProduct(Problems& p, const RunConfig& c) {
  const AggregationConfig& a = c.aggregation();
  if (a.strategy() != AggregationConfig::LORA_PRODUCT) return;
  if (c.privacy().secure_aggregation()) {
    p.Add(
        "aggregation.strategy LORA_PRODUCT needs each client's lora_A and lora_B to form their "
        "product, which privacy.secure_aggregation hides from the server: use the FedAvg family, "
        "or lora.freeze_a (FFA-LoRA), whose mean is exact, with it");
  }
  if (c.privacy().dp().enabled()) {
    p.Add(
        "aggregation.strategy LORA_PRODUCT with differential privacy: the accountant's noise is "
        "calibrated to the clipped mean of the updates, not to a factored product; use the FedAvg "
        "family with privacy.dp");
  }
  if (c.lora().freeze_a()) {
    p.Add(
        "aggregation.strategy LORA_PRODUCT with lora.freeze_a: FFA-LoRA keeps every lora_A fixed, "
        "so FEDAVG's mean of the B's is already the exact mean product; LORA_PRODUCT would "
        "replace the frozen A");
  }
  if (a.server_learning_rate() != 1.0) {
    p.Bad("aggregation.server_learning_rate", a.server_learning_rate(),
          "must be 1 with strategy LORA_PRODUCT: the aggregate is the next global lora_A / lora_B "
          "pair, not a step to scale");
  }
  if (a.average_last_rounds() > 1) {
    p.Bad("aggregation.average_last_rounds", a.average_last_rounds(),
          "must be 0 or 1 with strategy LORA_PRODUCT: averaging rounds' A and B apart is not the "
          "mean of their products");
  }
}

}  // namespace

void ValidateAggregation(Problems& p, const RunConfig& c) {
  const AggregationConfig& a = c.aggregation();
  if (!AggregationConfig::Strategy_IsValid(a.strategy()) ||
      a.strategy() == AggregationConfig::STRATEGY_UNSPECIFIED) {
    p.Bad("aggregation.strategy", a.strategy(), "is not a known strategy");
  }
  ValidateRobust(p, c);
  ValidateLoraProduct(p, c);
  p.NonNegative("aggregation.proximal_mu", a.proximal_mu());
  if (a.strategy() == AggregationConfig::FEDPROX && a.proximal_mu() == 0) {
    p.Bad("aggregation.proximal_mu", a.proximal_mu(), "must be > 0 with strategy FEDPROX");
  }
  p.Positive("aggregation.server_learning_rate", a.server_learning_rate());
  p.RealRange("aggregation.server_momentum", a.server_momentum(), 0, false, 1, true);
  if (a.server_momentum() > 0 && a.strategy() != AggregationConfig::FEDAVG &&
      a.strategy() != AggregationConfig::FEDPROX) {
    p.Bad("aggregation.server_momentum", a.server_momentum(),
          absl::StrCat("applies to FEDAVG and FEDPROX only, not ",
                       AggregationConfig::Strategy_Name(a.strategy())));
  }
  p.RealRange("aggregation.server_beta1", a.server_beta1(), 0, false, 1, true);
  p.RealRange("aggregation.server_beta2", a.server_beta2(), 0, false, 1, true);
  p.Positive("aggregation.server_tau", a.server_tau());
  p.NonNegative("aggregation.max_update_norm", a.max_update_norm());
  if (a.max_examples_per_client() > (uint64_t{1} << 32)) {
    p.Bad("aggregation.max_examples_per_client", a.max_examples_per_client(),
          "must be at most 2^32");
  }
  if (a.weight_by_examples() && a.max_examples_per_client() == 0) {
    p.Add(
        "aggregation.weight_by_examples needs aggregation.max_examples_per_client: a client's "
        "example count is "
        "its own claim and its weight in the mean, so without a bound one site could set the mean "
        "alone");
  }
  const uint32_t rounds = ConfiguredRounds(c);
  if (a.average_last_rounds() > rounds) {
    p.Bad("aggregation.average_last_rounds", a.average_last_rounds(),
          absl::StrCat("exceeds the run's rounds (", rounds,
                       "): there are not that many adapters to average"));
  }
}

void ValidateData(Problems& p, const v1::DataConfig& d) {
  p.Range<uint32_t>("data.eval_every_rounds", d.eval_every_rounds(), 1, 1'000'000);
  p.Range<uint32_t>("data.eval_batch_size", d.eval_batch_size(), 1, 65536);
}

void ValidateSimulation(Problems& p, const SimulationConfig& s) {
  p.Range<uint32_t>("simulation.num_clients", s.num_clients(), 1, 100'000);
  if (!SimulationConfig::Partition_IsValid(s.partition()) ||
      s.partition() == SimulationConfig::PARTITION_UNSPECIFIED) {
    p.Bad("simulation.partition", s.partition(), "is not a known partition");
  }
  p.Positive("simulation.dirichlet_alpha", s.dirichlet_alpha());
  if (s.partition() == SimulationConfig::BY_KEY && s.partition_key_field().empty()) {
    p.Add("simulation.partition_key_field must be set with partition BY_KEY");
  }
  p.RealRange("simulation.dropout_probability", s.dropout_probability(), 0, false, 1, false);
  p.RealRange("simulation.straggler_probability", s.straggler_probability(), 0, false, 1, false);
  p.NonNegative("simulation.straggler_delay_seconds", s.straggler_delay_seconds());
  p.RealRange("simulation.crash_probability", s.crash_probability(), 0, false, 1, false);
  p.Range<uint32_t>("simulation.parallelism", s.parallelism(), 0, 4096);
  if (s.has_shards_per_client())
    p.Range<uint32_t>("simulation.shards_per_client", s.shards_per_client(), 1, 100'000);
  const v1::SimulationAttack& a = s.attack();
  if (s.malicious_clients() > s.num_clients()) {
    p.Bad("simulation.malicious_clients", s.malicious_clients(),
          absl::StrCat("exceeds simulation.num_clients (", s.num_clients(), ")"));
  }
  if (!v1::SimulationAttack::Kind_IsValid(a.kind())) {
    p.Bad("simulation.attack.kind", a.kind(), "is not a known attack");
  } else if (s.malicious_clients() > 0 && a.kind() == v1::SimulationAttack::KIND_UNSPECIFIED) {
    p.Add("simulation.attack.kind must be set with simulation.malicious_clients > 0");
  } else if (s.malicious_clients() == 0 &&
             (a.kind() != v1::SimulationAttack::KIND_UNSPECIFIED || a.has_scale())) {
    p.Add("simulation.attack is set but simulation.malicious_clients is 0: no client attacks");
  }
  if (a.has_scale()) p.Positive("simulation.attack.scale", a.scale());
  if (a.has_scale() && a.kind() == v1::SimulationAttack::MIN_MAX) {
    p.Add("simulation.attack.scale is not used by MIN_MAX (its search sizes it): unset it");
  }
}

void ValidatePartitionForTask(Problems& p, const RunConfig& c) {
  const SimulationConfig::Partition partition = c.simulation().partition();
  if (c.task().kind() == TaskConfig::CAUSAL_LM &&
      (partition == SimulationConfig::DIRICHLET || partition == SimulationConfig::LABEL_SHARDS)) {
    p.Add(absl::StrCat("simulation.partition ", SimulationConfig::Partition_Name(partition),
                       " splits by label and CAUSAL_LM has none: use IID or BY_KEY"));
  }
}

}  // namespace fedlora::config_internal
