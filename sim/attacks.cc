#include "sim/attacks.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "config/defaults.h"
#include "core/rng.h"

namespace fedlora::sim {
namespace {

constexpr uint64_t kAttackSalt = 0x6174'7461'636b'0001ull;  // "attack"

// Min-max's search (Shejwalkar and Houmansadr's code): the first gamma and step, and the step
// below which it stops.
constexpr double kMinMaxGammaInit = 10.0;
constexpr double kMinMaxStopStep = 1e-5;

double SquaredDistance(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    const double x = static_cast<double>(a[k]) - b[k];
    d += x * x;
  }
  return d;
}

// The deltas' values end to end, in the order of the first delta's tensors; InvalidArgument when
// a delta's names or sizes differ from the first's.
absl::StatusOr<std::vector<std::vector<float>>> Flatten(const ClientDeltas& honest) {
  const std::vector<NamedTensor>& first = honest.begin()->second;
  std::vector<std::vector<float>> flat;
  for (const auto& [client, delta] : honest) {
    if (delta.size() != first.size()) {
      return absl::InvalidArgumentError(absl::StrCat("client ", client, "'s delta has ",
                                                     delta.size(), " tensors, not ", first.size()));
    }
    std::vector<float>& v = flat.emplace_back();
    for (size_t t = 0; t < delta.size(); ++t) {
      if (delta[t].name != first[t].name || delta[t].values.size() != first[t].values.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("client ", client, "'s delta tensor ", t, " (", delta[t].name, ", ",
                         delta[t].values.size(), " values) differs from ", first[t].name, " (",
                         first[t].values.size(), " values)"));
      }
      v.insert(v.end(), delta[t].values.begin(), delta[t].values.end());
    }
  }
  return flat;
}

// simulation.attack.scale, or its kind's default when unset (configs built in code skip
// ApplyRunConfigDefaults).
double AttackScale(const v1::SimulationAttack& attack) {
  if (attack.has_scale()) return attack.scale();
  switch (attack.kind()) {
    case v1::SimulationAttack::SIGN_FLIP:
      return kDefaultSignFlipScale;
    case v1::SimulationAttack::SCALE:
      return kDefaultScaleAttackFactor;
    case v1::SimulationAttack::GAUSSIAN:
      return kDefaultGaussianAttackStddev;
    default:
      return 0;
  }
}

}  // namespace

bool IsMalicious(const v1::RunConfig& config, int client) {
  return client >= 0 && static_cast<uint32_t>(client) < config.simulation().malicious_clients();
}

bool AttackReadsTheRound(const v1::RunConfig& config) {
  const v1::SimulationAttack::Kind kind = config.simulation().attack().kind();
  return config.simulation().malicious_clients() > 0 &&
         (kind == v1::SimulationAttack::LITTLE_IS_ENOUGH || kind == v1::SimulationAttack::MIN_MAX);
}

bool ForgeUpdate(const v1::RunConfig& config, uint64_t round, int client,
                 std::vector<NamedTensor>& delta) {
  if (!IsMalicious(config, client) || AttackReadsTheRound(config)) return false;
  const v1::SimulationAttack& attack = config.simulation().attack();
  const double scale = AttackScale(attack);
  Rng rng(config.seed() ^ kAttackSalt,
          MakeStream(static_cast<uint32_t>(round), static_cast<uint32_t>(client)));
  for (NamedTensor& t : delta) {
    for (float& x : t.values) {
      switch (attack.kind()) {
        case v1::SimulationAttack::SIGN_FLIP:
          x = static_cast<float>(-scale * x);
          break;
        case v1::SimulationAttack::SCALE:
          x = static_cast<float>(scale * x);
          break;
        case v1::SimulationAttack::GAUSSIAN:
          x = static_cast<float>(scale * rng.Normal());
          break;
        default:
          break;  // refused by validation
      }
    }
  }
  return true;
}

double NormalQuantile(double p) {
  if (!(p > 0)) return -std::numeric_limits<double>::infinity();
  if (!(p < 1)) return std::numeric_limits<double>::infinity();
  // Phi(x) = erfc(-x / sqrt(2)) / 2 is increasing: halve [lo, hi] until no double lies between.
  double lo = -40, hi = 40;
  while (true) {
    const double mid = lo + (hi - lo) / 2;
    if (mid <= lo || mid >= hi) break;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return lo + (hi - lo) / 2;
}

double LittleIsEnoughZ(int n, int f) {
  if (n <= 0) return 0;
  const int s = std::max(1, n / 2 + 1 - f);  // floor(n / 2 + 1) for n >= 0
  const double p = static_cast<double>(n - s) / n;
  return p <= 0.5 ? 0.0 : NormalQuantile(p);
}

CoordinateStats MeanAndStddev(const std::vector<std::vector<float>>& g) {
  CoordinateStats s;
  if (g.empty()) return s;
  const size_t d = g.front().size();
  const double n = static_cast<double>(g.size());
  s.mean.assign(d, 0.0);
  s.stddev.assign(d, 0.0);
  for (const auto& v : g)
    for (size_t k = 0; k < d; ++k) s.mean[k] += v[k];
  for (double& m : s.mean) m /= n;
  if (g.size() < 2) return s;
  for (const auto& v : g) {
    for (size_t k = 0; k < d; ++k) {
      const double x = v[k] - s.mean[k];
      s.stddev[k] += x * x;
    }
  }
  for (double& x : s.stddev) x = std::sqrt(x / (n - 1));
  return s;
}

std::vector<float> LittleIsEnough(const CoordinateStats& s, double z) {
  std::vector<float> forged(s.mean.size());
  for (size_t k = 0; k < forged.size(); ++k)
    forged[k] = static_cast<float>(s.mean[k] - z * s.stddev[k]);
  return forged;
}

MinMaxForgery MinMax(const std::vector<std::vector<float>>& g, const CoordinateStats& s) {
  double bound = 0;  // max_{i,j} ||g_i - g_j||^2
  for (size_t i = 0; i < g.size(); ++i)
    for (size_t j = i + 1; j < g.size(); ++j) bound = std::max(bound, SquaredDistance(g[i], g[j]));
  // Whether mean - gamma * stddev is within the bound of every g_i, computed in double.
  auto meets = [&](double gamma) {
    for (const auto& v : g) {
      double d = 0;
      for (size_t k = 0; k < v.size(); ++k) {
        const double x = s.mean[k] - gamma * s.stddev[k] - v[k];
        d += x * x;
      }
      if (d > bound) return false;
    }
    return true;
  };
  double gamma = kMinMaxGammaInit, step = kMinMaxGammaInit, kept = 0;
  while (step > kMinMaxStopStep) {
    if (meets(gamma)) {
      kept = gamma;
      gamma += step / 2;
    } else {
      gamma -= step / 2;
    }
    step /= 2;
  }
  MinMaxForgery out;
  out.gamma = kept;
  out.forged = LittleIsEnough(s, kept);  // mean - gamma * stddev
  return out;
}

absl::StatusOr<std::vector<NamedTensor>> ForgeFromRound(const v1::SimulationAttack& attack,
                                                        const ClientDeltas& honest, int n, int f) {
  if (honest.empty()) return absl::InvalidArgumentError("no honest delta to forge from");
  std::vector<std::vector<float>> g;
  {
    absl::StatusOr<std::vector<std::vector<float>>> flat = Flatten(honest);
    if (!flat.ok()) return flat.status();
    g = *std::move(flat);
  }
  const CoordinateStats stats = MeanAndStddev(g);
  std::vector<float> forged;
  if (attack.kind() == v1::SimulationAttack::LITTLE_IS_ENOUGH) {
    forged = LittleIsEnough(stats, attack.has_scale() ? attack.scale() : LittleIsEnoughZ(n, f));
  } else if (attack.kind() == v1::SimulationAttack::MIN_MAX) {
    forged = MinMax(g, stats).forged;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("simulation.attack.kind ",
                                                   v1::SimulationAttack::Kind_Name(attack.kind()),
                                                   " does not read the round's updates"));
  }
  std::vector<NamedTensor> out = honest.begin()->second;  // names and shapes
  size_t k = 0;
  for (NamedTensor& t : out)
    for (float& x : t.values) x = forged[k++];
  return out;
}

}  // namespace fedlora::sim
