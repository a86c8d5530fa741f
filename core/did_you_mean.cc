#include "core/did_you_mean.h"

#include <algorithm>

#include "absl/strings/ascii.h"

namespace fedlora {

size_t EditDistance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  // d[i][j]: distance between a[0, i) and b[0, j), rows kept as three rolling vectors.
  std::vector<size_t> before(m + 1), prev(m + 1), cur(m + 1);
  for (size_t j = 0; j <= m; ++j) prev[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    const char ai = absl::ascii_tolower(static_cast<unsigned char>(a[i - 1]));
    for (size_t j = 1; j <= m; ++j) {
      const char bj = absl::ascii_tolower(static_cast<unsigned char>(b[j - 1]));
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ai == bj ? 0 : 1)});
      if (i > 1 && j > 1 && ai == absl::ascii_tolower(static_cast<unsigned char>(b[j - 2])) &&
          absl::ascii_tolower(static_cast<unsigned char>(a[i - 2])) == bj) {
        cur[j] = std::min(cur[j], before[j - 2] + 1);
      }
    }
    before.swap(prev);
    prev.swap(cur);
  }
  return prev[m];
}

std::optional<std::string> NearestName(std::string_view typed,
                                       const std::vector<std::string>& candidates) {
  const size_t limit = std::min<size_t>(2, std::max<size_t>(1, typed.size() / 3));
  std::optional<std::string> best;
  size_t best_distance = limit + 1;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(typed, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace fedlora
