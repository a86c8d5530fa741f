#include "server/crash_point.h"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"

namespace fedlora {
namespace {

struct CrashSpec {
  std::string point;  // empty: disabled
  int64_t nth = 1;
};

const CrashSpec& Spec() {
  static const CrashSpec spec = [] {
    CrashSpec s;
    const char* env = std::getenv("FEDLORA_TEST_CRASH_AT");
    if (env == nullptr) return s;
    std::string text = env;
    const size_t at = text.find('@');
    if (at != std::string::npos) {
      int64_t n = 1;
      if (absl::SimpleAtoi(text.substr(at + 1), &n) && n >= 1) s.nth = n;
      text.resize(at);
    }
    s.point = text;
    return s;
  }();
  return spec;
}

std::atomic<int64_t> hits{0};

}  // namespace

void MaybeCrashAt(std::string_view point) {
  const CrashSpec& spec = Spec();
  if (spec.point.empty() || spec.point != point) return;
  if (hits.fetch_add(1) + 1 == spec.nth) std::raise(SIGKILL);
}

}  // namespace fedlora
