#include "train/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/strings.h"

namespace fedlora {
namespace {

// Rng streams, one per purpose, so that changing one scheme's draws never shifts another's.
constexpr uint64_t kStreamIid = 0x7061'7274'0001ull;
constexpr uint64_t kStreamDirichlet = 0x7061'7274'0002ull;
constexpr uint64_t kStreamShards = 0x7061'7274'0003ull;
constexpr uint64_t kStreamKeys = 0x7061'7274'0004ull;

absl::Status CheckCounts(int64_t n, int num_clients) {
  if (num_clients < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: num_clients must be >= 1, got ", num_clients));
  }
  if (n < num_clients) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: ", num_clients, " clients but only ", n,
                     " examples; every client needs at least one example"));
  }
  return absl::OkStatus();
}

void SortAll(Partition& p) {
  for (auto& v : p.client_indices) std::sort(v.begin(), v.end());
}

Partition Iid(int64_t n, int num_clients, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed, kStreamIid);
  rng.Shuffle(order);
  Partition p;
  p.client_indices.resize(static_cast<size_t>(num_clients));
  // Client i gets [i*n/N, (i+1)*n/N): sizes floor or ceil of n/N.
  for (int i = 0; i < num_clients; ++i) {
    const int64_t begin = n * i / num_clients;
    const int64_t end = n * (i + 1) / num_clients;
    p.client_indices[static_cast<size_t>(i)].assign(order.begin() + begin, order.begin() + end);
  }
  return p;
}

Partition Dirichlet(std::span<const int> labels, int num_labels, int num_clients, double alpha,
                    uint64_t seed) {
  std::vector<std::vector<int64_t>> by_label(static_cast<size_t>(num_labels));
  for (size_t i = 0; i < labels.size(); ++i)
    by_label[static_cast<size_t>(labels[i])].push_back(static_cast<int64_t>(i));
  Rng rng(seed, kStreamDirichlet);
  Partition p;
  p.client_indices.resize(static_cast<size_t>(num_clients));
  for (auto& members : by_label) {
    // Always draw (even for an empty label) so that one label's size never shifts another's draws.
    rng.Shuffle(members);
    const std::vector<double> prop = SampleDirichlet(rng, num_clients, alpha);
    const int64_t m = static_cast<int64_t>(members.size());
    double cum = 0.0;
    int64_t begin = 0;
    for (int c = 0; c < num_clients; ++c) {
      cum += prop[static_cast<size_t>(c)];
      int64_t end = c == num_clients - 1
                        ? m
                        : std::clamp<int64_t>(std::llround(cum * static_cast<double>(m)), begin, m);
      auto& dst = p.client_indices[static_cast<size_t>(c)];
      dst.insert(dst.end(), members.begin() + begin, members.begin() + end);
      begin = end;
    }
  }
  // Fix-up (documented in the header): empty clients take one example from the largest.
  while (true) {
    auto empty = std::find_if(p.client_indices.begin(), p.client_indices.end(),
                              [](const auto& v) { return v.empty(); });
    if (empty == p.client_indices.end()) break;
    auto largest =
        std::max_element(p.client_indices.begin(), p.client_indices.end(),
                         [](const auto& a, const auto& b) { return a.size() < b.size(); });
    // n >= N guarantees the largest holds >= 2 examples while any client is empty.
    const size_t pick = static_cast<size_t>(rng.UniformInt(largest->size()));
    empty->push_back((*largest)[pick]);
    largest->erase(largest->begin() + static_cast<std::ptrdiff_t>(pick));
  }
  return p;
}

absl::StatusOr<Partition> Shards(std::span<const int> labels, int num_labels, int num_clients,
                                 int k, uint64_t seed) {
  std::vector<std::vector<int64_t>> by_label(static_cast<size_t>(num_labels));
  for (size_t i = 0; i < labels.size(); ++i)
    by_label[static_cast<size_t>(labels[i])].push_back(static_cast<int64_t>(i));
  std::vector<int> present;
  for (int c = 0; c < num_labels; ++c) {
    if (!by_label[static_cast<size_t>(c)].empty()) present.push_back(c);
  }
  const int num_present = static_cast<int>(present.size());
  if (k < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("partition: shards_per_client must be >= 1, got ", k));
  if (k > num_present) {
    return absl::InvalidArgumentError(absl::StrCat("partition: shards_per_client ", k,
                                                   " exceeds the ", num_present,
                                                   " labels present in the data"));
  }
  if (static_cast<int64_t>(num_clients) * k < num_present) {
    return absl::InvalidArgumentError(absl::StrCat("partition: ", num_clients, " clients x ", k,
                                                   " labels each cannot cover the ", num_present,
                                                   " labels present; raise shards_per_client"));
  }
  Rng rng(seed, kStreamShards);
  rng.Shuffle(present);
  // holders[j]: clients holding present[j], in increasing client order.
  std::vector<std::vector<int>> holders(static_cast<size_t>(num_present));
  for (int i = 0; i < num_clients; ++i) {
    for (int j = 0; j < k; ++j) {
      holders[static_cast<size_t>((static_cast<int64_t>(i) * k + j) % num_present)].push_back(i);
    }
  }
  Partition p;
  p.client_indices.resize(static_cast<size_t>(num_clients));
  for (int j = 0; j < num_present; ++j) {
    auto& members = by_label[static_cast<size_t>(present[static_cast<size_t>(j)])];
    const auto& h = holders[static_cast<size_t>(j)];
    const int64_t m = static_cast<int64_t>(members.size());
    const int64_t nh = static_cast<int64_t>(h.size());
    if (m < nh) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: label ", present[static_cast<size_t>(j)], " has ", m, " examples but ", nh,
          " clients hold it; lower the number of "
          "clients or shards_per_client"));
    }
    rng.Shuffle(members);
    for (int64_t s = 0; s < nh; ++s) {
      auto& dst = p.client_indices[static_cast<size_t>(h[static_cast<size_t>(s)])];
      dst.insert(dst.end(), members.begin() + m * s / nh, members.begin() + m * (s + 1) / nh);
    }
  }
  return p;
}

}  // namespace

std::string_view PartitionSchemeName(PartitionScheme scheme) {
  switch (scheme) {
    case PartitionScheme::kIid:
      return "iid";
    case PartitionScheme::kDirichlet:
      return "dirichlet";
    case PartitionScheme::kLabelShards:
      return "shards";
  }
  return "unknown";
}

absl::StatusOr<PartitionScheme> ParsePartitionScheme(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(ToAbsl(name));
  for (PartitionScheme s :
       {PartitionScheme::kIid, PartitionScheme::kDirichlet, PartitionScheme::kLabelShards}) {
    if (lower == PartitionSchemeName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown partition scheme '", ToAbsl(name),
                                                 "' (expected iid, dirichlet or shards)"));
}

std::vector<int64_t> Partition::Sizes() const {
  std::vector<int64_t> out;
  out.reserve(client_indices.size());
  for (const auto& v : client_indices) out.push_back(static_cast<int64_t>(v.size()));
  return out;
}

absl::StatusOr<Partition> PartitionByLabel(std::span<const int> labels, int num_labels,
                                           const PartitionOptions& options) {
  const int64_t n = static_cast<int64_t>(labels.size());
  if (auto s = CheckCounts(n, options.num_clients); !s.ok()) return s;
  if (num_labels < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("partition: num_labels must be >= 1, got ", num_labels));
  for (int64_t i = 0; i < n; ++i) {
    const int y = labels[static_cast<size_t>(i)];
    if (y < 0 || y >= num_labels) {
      return absl::InvalidArgumentError(absl::StrCat("partition: example ", i, " has label ", y,
                                                     " outside [0, ", num_labels, ")"));
    }
  }
  Partition p;
  switch (options.scheme) {
    case PartitionScheme::kIid:
      p = Iid(n, options.num_clients, options.seed);
      break;
    case PartitionScheme::kDirichlet:
      if (!(options.dirichlet_alpha > 0.0) || !std::isfinite(options.dirichlet_alpha)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "partition: dirichlet_alpha must be > 0 and finite, got ", options.dirichlet_alpha));
      }
      p = Dirichlet(labels, num_labels, options.num_clients, options.dirichlet_alpha, options.seed);
      break;
    case PartitionScheme::kLabelShards: {
      auto shards =
          Shards(labels, num_labels, options.num_clients, options.shards_per_client, options.seed);
      if (!shards.ok()) return shards.status();
      p = *std::move(shards);
      break;
    }
  }
  SortAll(p);
  return p;
}

absl::StatusOr<Partition> PartitionByKey(std::span<const std::string> keys, int num_clients,
                                         uint64_t seed) {
  const int64_t n = static_cast<int64_t>(keys.size());
  if (auto s = CheckCounts(n, num_clients); !s.ok()) return s;
  std::map<std::string_view, std::vector<int64_t>> by_key;  // sorted: independent of file order
  for (int64_t i = 0; i < n; ++i) by_key[keys[static_cast<size_t>(i)]].push_back(i);
  if (static_cast<int64_t>(by_key.size()) < num_clients) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: ", num_clients, " clients but only ", by_key.size(),
                     " distinct keys; every client needs at least one key"));
  }
  std::vector<const std::vector<int64_t>*> shards;
  for (const auto& [key, members] : by_key) shards.push_back(&members);
  Rng rng(seed, kStreamKeys);
  rng.Shuffle(shards);
  Partition p;
  p.client_indices.resize(static_cast<size_t>(num_clients));
  for (size_t s = 0; s < shards.size(); ++s) {
    auto& dst = p.client_indices[s % static_cast<size_t>(num_clients)];
    dst.insert(dst.end(), shards[s]->begin(), shards[s]->end());
  }
  SortAll(p);
  return p;
}

std::vector<std::vector<int64_t>> LabelHistograms(const Partition& partition,
                                                  std::span<const int> labels, int num_labels) {
  std::vector<std::vector<int64_t>> hist(
      partition.client_indices.size(),
      std::vector<int64_t>(static_cast<size_t>(std::max(num_labels, 0)), 0));
  for (size_t c = 0; c < partition.client_indices.size(); ++c) {
    for (int64_t i : partition.client_indices[c]) {
      if (i < 0 || i >= static_cast<int64_t>(labels.size())) continue;
      const int y = labels[static_cast<size_t>(i)];
      if (y >= 0 && y < num_labels) ++hist[c][static_cast<size_t>(y)];
    }
  }
  return hist;
}

std::string FormatPartitionReport(const Partition& partition, std::span<const int> labels,
                                  int num_labels) {
  const auto hist = LabelHistograms(partition, labels, num_labels);
  std::string out = absl::StrFormat("%-8s %8s  %s\n", "client", "examples", "label histogram");
  for (size_t c = 0; c < hist.size(); ++c) {
    std::string h;
    for (size_t y = 0; y < hist[c].size(); ++y) absl::StrAppend(&h, y ? " " : "", hist[c][y]);
    absl::StrAppendFormat(&out, "%-8d %8d  [%s]\n", c, partition.client_indices[c].size(), h);
  }
  return out;
}

double SampleLogGamma(Rng& rng, double shape) {
  if (!(shape > 0.0) || !std::isfinite(shape)) return std::numeric_limits<double>::quiet_NaN();
  // Boost for shape < 1: X = Y * U^(1/shape) with Y ~ Gamma(shape + 1), so log X = log Y + log(U)/shape.
  double log_boost = 0.0;
  double a = shape;
  if (a < 1.0) {
    const double u = 1.0 - rng.Uniform();  // (0, 1]: the log is finite
    log_boost = std::log(u) / shape;
    a += 1.0;
  }
  // Marsaglia-Tsang for a >= 1: d = a - 1/3, c = 1/sqrt(9d); accept v = (1 + c z)^3 when
  // log U < z^2/2 + d - d v + d log v. The acceptance rate is > 95% for every a >= 1.
  const double d = a - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    const double z = rng.Normal();
    const double t = 1.0 + c * z;
    if (t <= 0.0) continue;
    const double v = t * t * t;
    const double u = 1.0 - rng.Uniform();
    if (std::log(u) < 0.5 * z * z + d - d * v + d * std::log(v)) return std::log(d * v) + log_boost;
  }
}

double SampleGamma(Rng& rng, double shape) { return std::exp(SampleLogGamma(rng, shape)); }

std::vector<double> SampleDirichlet(Rng& rng, int k, double alpha) {
  std::vector<double> logs(static_cast<size_t>(std::max(k, 0)));
  for (double& l : logs) l = SampleLogGamma(rng, alpha);
  if (logs.empty()) return logs;
  // Normalise in log space (a softmax): tiny alphas give gamma draws like 1e-300 that would
  // underflow to an all-zero vector if exponentiated first.
  const double max_log = *std::max_element(logs.begin(), logs.end());
  double sum = 0.0;
  for (double& l : logs) {
    l = std::exp(l - max_log);
    sum += l;
  }
  for (double& l : logs) l /= sum;
  return logs;
}

}  // namespace fedlora
