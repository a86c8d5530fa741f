// The simulator's attacks (simulation.attack): what a malicious virtual client (index <
// simulation.malicious_clients) sends in place of the delta it trained honestly. SIGN_FLIP, SCALE
// and GAUSSIAN need only that delta (ForgeUpdate); LITTLE_IS_ENOUGH and MIN_MAX are computed from
// the round's honest deltas (ForgeFromRound), which the simulator gathers on a board
// (sim/attack_board.h). Pure functions; the math is in double, the results fp32.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "core/named_tensor.h"
#include "fedlora/v1/config.pb.h"

namespace fedlora::sim {

// Whether virtual client `client` is malicious (index < simulation.malicious_clients).
bool IsMalicious(const v1::RunConfig& config, int client);
// Whether the run's attack reads the round's honest deltas (LITTLE_IS_ENOUGH, MIN_MAX).
bool AttackReadsTheRound(const v1::RunConfig& config);

// The attacks from the client's own delta, applied to `delta` in place: SIGN_FLIP (x -scale),
// SCALE (x scale), GAUSSIAN (values drawn from N(0, scale^2), seeded by the run's seed, the round
// and the client); an unset scale is the kind's default (config/defaults.h). Returns whether it forged: false for an honest client and for the attacks that
// read the round, whose `delta` is left as it is.
bool ForgeUpdate(const v1::RunConfig& config, uint64_t round, int client,
                 std::vector<NamedTensor>& delta);

// Phi^{-1}(p), the standard normal quantile, for p in (0, 1), to double precision (bisection on
// std::erfc); -inf and +inf at 0 and 1.
double NormalQuantile(double p);

// The z of "A little is enough" (Baruch et al., NeurIPS 2019, Algorithm 1) for n clients of which
// f are malicious: s = floor(n / 2 + 1) - f honest clients the attackers need on their side for a
// majority (taken as at least 1), and z = Phi^{-1}((n - s) / n); 0 where (n - s) / n <= 1/2.
double LittleIsEnoughZ(int n, int f);

// Per coordinate, the mean and the sample standard deviation (n - 1 in the denominator; 0 for a
// single vector) of `g`: equally long vectors, at least one.
struct CoordinateStats {
  std::vector<double> mean;
  std::vector<double> stddev;
};
CoordinateStats MeanAndStddev(const std::vector<std::vector<float>>& g);

// LIE: mean - z * stddev per coordinate.
std::vector<float> LittleIsEnough(const CoordinateStats& s, double z);

// Min-max (Shejwalkar and Houmansadr, NDSS 2021, AGR-agnostic), perturbation p = -stddev (their
// "inverse std"): forged = mean - gamma * stddev with the largest gamma found such that
// max_i ||forged - g_i|| <= max_{i,j} ||g_i - g_j|| over the vectors g. The search is their
// code's: gamma starts at 10 with a step of 10; a gamma that meets the bound moves up by half the
// step, one that does not down by half; the step halves each time, 20 times (until it is below
// 1e-5), and the last gamma that met the bound is kept (0, the mean, which always meets it, when
// none did). The feasible gammas form an interval [0, gamma*] (each distance is convex in gamma), so
// this finds min(gamma*, 20) from below, within 2e-5.
struct MinMaxForgery {
  std::vector<float> forged;
  double gamma = 0.0;
};
MinMaxForgery MinMax(const std::vector<std::vector<float>>& g, const CoordinateStats& s);

// The honest deltas of a round's clients (client index -> its delta).
using ClientDeltas = std::map<int, std::vector<NamedTensor>>;

// LITTLE_IS_ENOUGH or MIN_MAX over `honest` (at least one delta; all with the same names and
// shapes), for a round of n clients with updates of which f are malicious: LIE's z is
// attack.scale when set, else LittleIsEnoughZ(n, f); MIN_MAX ignores n and f. Returns the forged
// delta with the deltas' names and shapes; InvalidArgument when they differ or there are none,
// or for another attack kind.
absl::StatusOr<std::vector<NamedTensor>> ForgeFromRound(const v1::SimulationAttack& attack,
                                                        const ClientDeltas& honest, int n, int f);

}  // namespace fedlora::sim
