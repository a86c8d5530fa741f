// Partitioning a labelled dataset across N (virtual) clients, for `fedlora simulate` and for
// experiments on non-IID data.
//
//   PartitionOptions opts;
//   opts.scheme = PartitionScheme::kDirichlet;
//   opts.num_clients = 10;
//   opts.dirichlet_alpha = 0.5;
//   opts.seed = 7;
//   FEDLORA_ASSIGN_OR_RETURN(Partition p, PartitionByLabel(labels, num_labels, opts));
//   for (const auto& idx : p.client_indices) { ... the examples of one client ... }
//   auto hist = LabelHistograms(p, labels, num_labels);   // [client][label] counts
//
// Schemes:
//   kIid        examples shuffled and dealt in contiguous runs of floor(n/N) or ceil(n/N).
//   kDirichlet  label skew (Hsu et al. 2019, "Measuring the effects of non-identical data
//               distribution"): for every label c, proportions p_c ~ Dirichlet(alpha, ..., alpha)
//               over the clients; the label's shuffled examples are cut at the cumulative
//               proportions. Small alpha (0.1) gives clients dominated by one or two labels; large
//               alpha (100) approaches IID.
//   kLabelShards  every client gets exactly `shards_per_client` distinct labels (McMahan et al.
//               2017's pathological non-IID, made exact): the present labels are shuffled, client i
//               holds labels (i*k + j) mod L for j < k, and each label's examples are split evenly
//               among its holders. Needs k <= L and N*k >= L (so that every label has a holder and
//               coverage is exact), and every label at least as many examples as holders.
//   By key (PartitionByKey): the distinct keys (e.g. a "site" or "author" column) are shuffled and
//               dealt round-robin to the clients, so that all examples of one key land on one
//               client. Needs at least as many distinct keys as clients.
//
// Rules every scheme keeps:
//   - Exact coverage: every example index in [0, n) is assigned to exactly one client.
//   - Every client gets at least one example. Only kDirichlet can draw an empty client; it is then
//     fixed up deterministically: while some client is empty, the lowest-numbered empty client takes
//     one randomly chosen example from the currently largest client (lowest id on ties).
//   - Deterministic: the same inputs and seed give the same partition on every platform (all draws
//     come from core/rng.h's Philox streams).
//   - Each client's indices are sorted ascending (dataset order); local training shuffles anyway.
// Errors (InvalidArgument, naming the values): num_clients < 1, more clients than examples,
// dirichlet_alpha <= 0 or not finite, a label outside [0, num_labels), shards_per_client < 1 or the
// shard conditions above, fewer distinct keys than clients.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/rng.h"

namespace fedlora {

enum class PartitionScheme { kIid, kDirichlet, kLabelShards };

// "iid", "dirichlet", "shards".
std::string_view PartitionSchemeName(PartitionScheme scheme);
// Inverse of PartitionSchemeName (case-insensitive); InvalidArgument naming the text.
absl::StatusOr<PartitionScheme> ParsePartitionScheme(std::string_view name);

struct PartitionOptions {
  PartitionScheme scheme = PartitionScheme::kIid;
  int num_clients = 10;          // N >= 1
  double dirichlet_alpha = 0.5;  // concentration of kDirichlet, > 0
  int shards_per_client = 2;     // k of kLabelShards, >= 1
  uint64_t seed = 0;
};

struct Partition {
  // client_indices[i]: the example indices of client i, sorted ascending, never empty.
  std::vector<std::vector<int64_t>> client_indices;

  int num_clients() const { return static_cast<int>(client_indices.size()); }
  // Examples per client.
  std::vector<int64_t> Sizes() const;
};

// Partitions examples with labels[i] in [0, num_labels) by `options.scheme`.
absl::StatusOr<Partition> PartitionByLabel(std::span<const int> labels, int num_labels,
                                           const PartitionOptions& options);

// Partitions by a key per example (one shard per distinct key; keys dealt to clients).
absl::StatusOr<Partition> PartitionByKey(std::span<const std::string> keys, int num_clients,
                                         uint64_t seed);

// [client][label] example counts. Labels outside [0, num_labels) are not counted.
std::vector<std::vector<int64_t>> LabelHistograms(const Partition& partition,
                                                  std::span<const int> labels, int num_labels);

// A human-readable table: one line per client with its size and label histogram.
std::string FormatPartitionReport(const Partition& partition, std::span<const int> labels,
                                  int num_labels);

// One draw from Gamma(shape, 1) by Marsaglia & Tsang (2000), "A simple method for generating
// gamma variables", on top of rng.Normal() and rng.Uniform(); shape < 1 uses the boost
// Gamma(shape) = Gamma(shape + 1) * U^(1/shape). shape must be > 0 (returns NaN otherwise).
double SampleGamma(Rng& rng, double shape);
// log of a Gamma(shape, 1) draw, computed without underflow for tiny shapes (alpha = 0.01 makes
// U^(1/alpha) underflow to 0 in double); what the Dirichlet sampler uses.
double SampleLogGamma(Rng& rng, double shape);
// One draw from the symmetric Dirichlet(alpha, ..., alpha) over `k` categories (sums to 1).
std::vector<double> SampleDirichlet(Rng& rng, int k, double alpha);

}  // namespace fedlora
