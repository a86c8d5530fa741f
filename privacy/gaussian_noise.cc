#include "privacy/gaussian_noise.h"

#include <cmath>
#include <numbers>

#include "core/status.h"

namespace fedlora::privacy {

absl::StatusOr<GaussianSampler> GaussianSampler::Create(std::string_view key, uint64_t stream) {
  FEDLORA_ASSIGN_OR_RETURN(crypto::Prg prg, crypto::Prg::Create(key, stream));
  return GaussianSampler(std::move(prg));
}

absl::StatusOr<double> GaussianSampler::Next() {
  if (spare_.has_value()) {
    const double z = *spare_;
    spare_.reset();
    return z;
  }
  FEDLORA_ASSIGN_OR_RETURN(double u1, prg_.NextUniform());
  FEDLORA_ASSIGN_OR_RETURN(double u2, prg_.NextUniform());
  const double r = std::sqrt(-2.0 * std::log(1.0 - u1));  // 1 - u1 is in (0, 1]
  const double theta = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(theta);
  return r * std::cos(theta);
}

}  // namespace fedlora::privacy
