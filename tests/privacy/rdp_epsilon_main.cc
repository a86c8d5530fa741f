// rdp_epsilon: a test helper for tests/privacy/opacus_rdp_check.py. Reads lines "noise rate steps delta"
// on stdin and prints, per line, "epsilon order" from an RdpAccountant with the default orders, with 17
// significant digits. Exit status: 0, or 2 for a malformed line or a refused setting.
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "core/status.h"
#include "privacy/rdp_accountant.h"

namespace {

absl::StatusOr<fedlora::privacy::PrivacySpent> Spent(double noise, double rate, uint64_t steps,
                                                     double delta) {
  fedlora::privacy::RdpAccountant accountant;
  FEDLORA_RETURN_IF_ERROR(accountant.AddSteps(noise, rate, steps));
  return accountant.GetEpsilon(delta);
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    double noise, rate, delta;
    uint64_t steps;
    if (!(in >> noise >> rate >> steps >> delta)) {
      std::fprintf(stderr, "rdp_epsilon: malformed line: %s\n", line.c_str());
      return 2;
    }
    auto spent = Spent(noise, rate, steps, delta);
    if (!spent.ok()) {
      std::fprintf(stderr, "rdp_epsilon: %s\n", std::string(spent.status().message()).c_str());
      return 2;
    }
    std::printf("%.17g %.17g\n", spent->epsilon, spent->order);
  }
  return 0;
}
