#include "privacy/rdp_accountant.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

// Follows Opacus 1.5.2's opacus/accountants/analysis/rdp.py (itself from TF Privacy): A_alpha of
// Mironov, Talwar and Zhang 2019, section 3.3, summed in log space.
namespace fedlora::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Shortest round-trip text of `v`, for error messages.
std::string Str(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

absl::Status CheckOrder(double order) {
  if (!(order > 1) || !std::isfinite(order)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RDP order must be finite and > 1, got ", Str(order)));
  }
  return absl::OkStatus();
}

absl::Status CheckNoiseAndRate(double noise_multiplier, double sampling_rate) {
  if (!(noise_multiplier > 0) || !std::isfinite(noise_multiplier)) {
    return absl::InvalidArgumentError(
        absl::StrCat("noise_multiplier must be finite and > 0, got ", Str(noise_multiplier)));
  }
  if (!(sampling_rate >= 0 && sampling_rate <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling_rate must be in [0, 1], got ", Str(sampling_rate)));
  }
  return absl::OkStatus();
}

// log(exp(x) + exp(y)).
double LogAdd(double x, double y) {
  const double a = std::min(x, y), b = std::max(x, y);
  if (a == -kInf || b == kInf) return b;  // Opacus gives NaN for inf + inf
  return std::log1p(std::exp(a - b)) + b;
}

// log(exp(x) - exp(y)) for x >= y; false when x < y (Opacus raises there).
bool LogSub(double x, double y, double* out) {
  if (x < y) return false;
  if (y == -kInf) {
    *out = x;
  } else if (x == y) {
    *out = -kInf;
  } else {
    const double d = std::expm1(x - y);
    *out = std::isinf(d) ? x : std::log(d) + y;  // Opacus returns x when expm1 overflows
  }
  return true;
}

// log(erfc(x)). Past x = 26 erfc nears underflow: -x^2 - log(x sqrt(pi)) + log of the asymptotic series.
double LogErfc(double x) {
  if (x < 26) return std::log(std::erfc(x));
  const double r = 1 / (x * x);
  const double series = 1 + r * (-0.5 + r * (0.75 + r * (-1.875 + r * (6.5625 - r * 29.53125))));
  return -x * x - std::log(x) - 0.5 * std::log(std::numbers::pi) + std::log(series);
}

// log |binom(alpha, i)| for real alpha >= 0 and integer i >= 0 (alpha - i + 1 is no pole here).
double LogAbsBinom(double alpha, double i) {
  return std::lgamma(alpha + 1) - std::lgamma(i + 1) - std::lgamma(alpha - i + 1);
}

// log A_alpha for integer alpha: sum over i of binom(alpha, i) q^i (1-q)^(alpha-i) exp((i^2 - i) / (2 sigma^2)).
double LogAInt(double q, double sigma, double alpha) {
  double log_a = -kInf;
  for (double i = 0; i <= alpha; ++i) {
    const double log_coef = LogAbsBinom(alpha, i) + i * std::log(q) + (alpha - i) * std::log(1 - q);
    log_a = LogAdd(log_a, log_coef + (i * i - i) / (2 * (sigma * sigma)));
  }
  return log_a;
}

// log A_alpha for fractional alpha: the two half-line integrals, as series in i until both terms are
// below e^-30.
absl::StatusOr<double> LogAFrac(double q, double sigma, double alpha) {
  double log_a0 = -kInf, log_a1 = -kInf;
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  const double floor_alpha = std::floor(alpha);
  for (double i = 0;; ++i) {
    // binom(alpha, i) is negative when an odd number of its factors alpha - k (k < i) are.
    const bool positive = std::fmod(std::max(0.0, i - 1 - floor_alpha), 2.0) == 0;
    const double log_coef = LogAbsBinom(alpha, i);
    const double j = alpha - i;
    const double log_t0 = log_coef + i * std::log(q) + j * std::log(1 - q);
    const double log_t1 = log_coef + j * std::log(q) + i * std::log(1 - q);
    const double log_e0 = std::log(0.5) + LogErfc((i - z0) / (std::sqrt(2.0) * sigma));
    const double log_e1 = std::log(0.5) + LogErfc((z0 - j) / (std::sqrt(2.0) * sigma));
    const double log_s0 = log_t0 + (i * i - i) / (2 * (sigma * sigma)) + log_e0;
    const double log_s1 = log_t1 + (j * j - j) / (2 * (sigma * sigma)) + log_e1;
    // Overflow (sigma near 0): Opacus never leaves this loop; A_alpha is past double range.
    if (std::isnan(log_s0) || std::isnan(log_s1) || log_s0 == kInf || log_s1 == kInf) return kInf;
    if (positive) {
      log_a0 = LogAdd(log_a0, log_s0);
      log_a1 = LogAdd(log_a1, log_s1);
    } else if (!LogSub(log_a0, log_s0, &log_a0) || !LogSub(log_a1, log_s1, &log_a1)) {
      return absl::InternalError(absl::StrCat("RDP series went negative at q=", Str(q),
                                              " sigma=", Str(sigma), " alpha=", Str(alpha)));
    }
    if (std::max(log_s0, log_s1) < -30) break;
  }
  return LogAdd(log_a0, log_a1);
}

}  // namespace

std::vector<double> DefaultRdpOrders() {
  std::vector<double> orders;
  for (int x = 1; x < 100; ++x) orders.push_back(1 + x / 10.0);
  for (int x = 12; x < 64; ++x) orders.push_back(x);
  return orders;
}

absl::StatusOr<double> SubsampledGaussianRdp(double sampling_rate, double noise_multiplier,
                                             double order) {
  FEDLORA_RETURN_IF_ERROR(CheckNoiseAndRate(noise_multiplier, sampling_rate));
  FEDLORA_RETURN_IF_ERROR(CheckOrder(order));
  const double q = sampling_rate, sigma = noise_multiplier;
  if (q == 0) return 0.0;
  if (sigma * sigma == 0) return kInf;  // underflows: no privacy, as Opacus's sigma == 0
  if (q == 1) return order / (2 * (sigma * sigma));
  double log_a;
  if (std::floor(order) == order) {
    log_a = LogAInt(q, sigma, order);
  } else {
    FEDLORA_ASSIGN_OR_RETURN(log_a, LogAFrac(q, sigma, order));
  }
  return log_a / (order - 1);
}

absl::StatusOr<PrivacySpent> EpsilonFromRdp(const std::vector<double>& orders,
                                            const std::vector<double>& rdp, double delta) {
  if (orders.size() != rdp.size()) {
    return absl::InvalidArgumentError(absl::StrCat("orders and rdp must have the same size, got ",
                                                   orders.size(), " and ", rdp.size()));
  }
  if (orders.empty()) return absl::InvalidArgumentError("orders must not be empty");
  if (!(delta > 0 && delta < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("delta must be in (0, 1), got ", Str(delta)));
  }
  for (double order : orders) FEDLORA_RETURN_IF_ERROR(CheckOrder(order));
  // Opacus: (inf, nan) when every epsilon is NaN; otherwise np.nanargmin, which reads NaN as +inf and
  // takes the first minimum.
  PrivacySpent best{kInf, std::numeric_limits<double>::quiet_NaN()};
  double best_key = kInf;
  bool all_nan = true;
  for (size_t k = 0; k < orders.size(); ++k) {
    const double a = orders[k];
    const double eps = rdp[k] - (std::log(delta) + std::log(a)) / (a - 1) + std::log((a - 1) / a);
    const double key = std::isnan(eps) ? kInf : eps;
    if (!std::isnan(eps)) all_nan = false;
    if (k == 0 || key < best_key) {
      best_key = key;
      best = {eps, a};
    }
  }
  if (all_nan) return PrivacySpent{kInf, std::numeric_limits<double>::quiet_NaN()};
  return best;
}

RdpAccountant::RdpAccountant() : RdpAccountant(DefaultRdpOrders()) {}

RdpAccountant::RdpAccountant(std::vector<double> orders)
    : orders_(std::move(orders)), rdp_(orders_.size(), 0.0) {}

absl::Status RdpAccountant::AddSteps(double noise_multiplier, double sampling_rate,
                                     uint64_t steps) {
  std::vector<double> rdp = rdp_;
  for (size_t k = 0; k < orders_.size(); ++k) {
    FEDLORA_ASSIGN_OR_RETURN(double one,
                             SubsampledGaussianRdp(sampling_rate, noise_multiplier, orders_[k]));
    rdp[k] += one * static_cast<double>(steps);
  }
  if (steps == 0) return absl::OkStatus();  // validated above; nothing to compose
  rdp_ = std::move(rdp);
  any_steps_ = true;
  return absl::OkStatus();
}

absl::StatusOr<PrivacySpent> RdpAccountant::GetEpsilon(double delta) const {
  if (!(delta > 0 && delta < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("delta must be in (0, 1), got ", Str(delta)));
  }
  if (!any_steps_) return PrivacySpent{};
  return EpsilonFromRdp(orders_, rdp_, delta);
}

}  // namespace fedlora::privacy
