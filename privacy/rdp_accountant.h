// The privacy accountant: Rényi differential privacy (RDP) of the Poisson-subsampled Gaussian
// mechanism (Mironov, Talwar and Zhang 2019), composed over the rounds of a run and converted to
// an (epsilon, delta) guarantee, as Opacus's RDPAccountant computes it.
//
//   privacy::RdpAccountant accountant;
//   FEDLORA_RETURN_IF_ERROR(accountant.AddSteps(/*noise_multiplier=*/1.1, /*sampling_rate=*/0.1, 1));
//   FEDLORA_ASSIGN_OR_RETURN(privacy::PrivacySpent spent, accountant.GetEpsilon(1e-5));
//
// One federated round with client-level DP is one step: the cohort is the sample (sampling_rate =
// cohort / population, 1 when every client takes part) and the noise standard deviation on the
// sum of clipped updates is noise_multiplier * clip_norm.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora::privacy {

// Opacus's default RDP orders: 1.1, 1.2, ..., 10.9, then 12, 13, ..., 63.
std::vector<double> DefaultRdpOrders();

// RDP at `order` (> 1) of one step of the Gaussian mechanism with this noise multiplier (> 0),
// applied to a Poisson sample with this rate (in [0, 1]). InvalidArgument naming the argument
// otherwise.
absl::StatusOr<double> SubsampledGaussianRdp(double sampling_rate, double noise_multiplier,
                                             double order);

struct PrivacySpent {
  double epsilon = 0;
  double order = 0;  // the RDP order the epsilon was read at
};

// (epsilon, delta) from an RDP curve, minimised over the orders (the conversion of Balle et al.
// 2020, as Opacus's get_privacy_spent). `rdp` and `orders` have the same size; delta in (0, 1).
absl::StatusOr<PrivacySpent> EpsilonFromRdp(const std::vector<double>& orders,
                                            const std::vector<double>& rdp, double delta);

class RdpAccountant {
 public:
  // With DefaultRdpOrders().
  RdpAccountant();
  explicit RdpAccountant(std::vector<double> orders);

  // Composes `steps` steps of the subsampled Gaussian mechanism. InvalidArgument for a noise
  // multiplier <= 0 or not finite, or a rate outside [0, 1]; the accountant is then unchanged.
  // Zero steps change nothing.
  absl::Status AddSteps(double noise_multiplier, double sampling_rate, uint64_t steps);

  // Epsilon at `delta` (in (0, 1)) for everything added; 0 before any step.
  absl::StatusOr<PrivacySpent> GetEpsilon(double delta) const;

  const std::vector<double>& orders() const { return orders_; }
  const std::vector<double>& rdp() const { return rdp_; }

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;  // summed over the steps, one per order
  bool any_steps_ = false;
};

}  // namespace fedlora::privacy
