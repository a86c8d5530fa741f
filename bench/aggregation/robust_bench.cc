// A round's aggregation with each robust rule (aggregation/robust.h) and LORA_PRODUCT
// (aggregation/lora_product.h) against FedAvg's exact streaming mean (StreamingFedAvg), the
// server's default, on the same updates in the same run: time to add n decoded updates and
// finish, and the memory the aggregator holds.
//
//   aggregation_robust_bench [elements] [reps]
//
// The updates are LoRA-shaped (pairs of 8 x m and m x 8 tensors), Gaussian, one per simulated
// site; n is 7, 15 and 31 (the smallest rounds that allow f = 1, 3, 7 for Bulyan). Validation
// first: with every update equal, each rule returns that update and FedAvg its value.
//
// Napkin math: FedAvg adds each element into a 16-byte sum, O(n x elements) and 16 x elements of
// memory whatever n. The coordinate-wise rules sort n values per element, O(elements x n log n), and
// hold 4 x n x elements bytes; Krum computes n(n-1)/2 distances over every element, O(n^2 x
// elements), and Bulyan ranks n - 2f times over the same distances, then sorts per element.
// LORA_PRODUCT holds the updates as the robust rules do; per pair (A 8 x m, B m x 8) it takes two
// Householder QRs of m x 8n stacks, O(m x (8n)^2) each, and an SVD of an 8n x 8n matrix.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "aggregation/fedavg.h"
#include "aggregation/lora_product.h"
#include "aggregation/robust.h"
#include "bench/aggregation/lora_update.h"
#include "bench/kernels/bench_util.h"

namespace fedlora {
namespace {

using bench::Check;
using bench::MedianSeconds;

// PEFT's names ("<module>.lora_A.weight"), which LORA_PRODUCT pairs by.
std::vector<UpdateTensor> MakeUpdate(int64_t elements, uint32_t seed) {
  std::vector<UpdateTensor> u = bench::LoraShapedUpdate(elements, seed, int64_t{1} << 18);
  for (UpdateTensor& t : u) t.name += ".weight";
  return u;
}

std::vector<KeptTensor> Kept(const std::vector<UpdateTensor>& u) {
  std::vector<KeptTensor> k;
  for (const UpdateTensor& t : u) k.push_back({t.name, t.shape, true, {}, t.values});
  return k;
}

struct Rule {
  const char* name;
  RobustOptions options;
};

std::vector<Rule> Rules(int n) {
  const int64_t f = (n - 3) / 4;  // the most Bulyan allows at n
  return {{"MEDIAN", {RobustRule::kMedian}},
          {"TRIMMED_MEAN 0.2", {RobustRule::kTrimmedMean, 0.2}},
          {"KRUM", {RobustRule::kKrum, 0, f}},
          {"MULTI_KRUM", {RobustRule::kMultiKrum, 0, f}},
          {"BULYAN", {RobustRule::kBulyan, 0, f}}};
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  using namespace fedlora;
  const int64_t elements = argc > 1 ? std::atoll(argv[1]) : int64_t{1} << 20;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  if (elements < 8 || reps < 1) {
    std::fprintf(stderr, "elements (>= 8) and reps must be positive\n");
    return 2;
  }
  const std::vector<TensorSpec> spec = SpecFromUpdate(MakeUpdate(elements, 0));

  // Validation: n equal updates aggregate to that update under every rule.
  {
    const std::vector<UpdateTensor> u = MakeUpdate(elements, 1);
    for (const Rule& r : Rules(7)) {
      auto a = RobustAggregator::Create(spec, r.options);
      Check(a.status(), "RobustAggregator::Create");
      for (int i = 0; i < 7; ++i) Check((*a)->Add(Kept(u), 1), "Add");
      auto out = (*a)->Finish();
      Check(out.status(), "Finish");
      for (size_t t = 0; t < u.size(); ++t) {
        if ((*out)[t].values != u[t].values) {
          std::fprintf(stderr, "validation failed: %s of 7 equal updates is not that update\n",
                       r.name);
          return 1;
        }
      }
    }
  }

  std::printf(
      "| elements | n | f | rule | rule ms | FedAvg ms | rule / FedAvg | rule MB held | FedAvg MB "
      "held |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int n : {7, 15, 31}) {
    std::vector<std::vector<UpdateTensor>> updates;
    for (int i = 0; i < n; ++i) updates.push_back(MakeUpdate(elements, 100 + i));
    std::vector<std::vector<KeptTensor>> kept;
    for (const auto& u : updates) kept.push_back(Kept(u));
    // The baseline: the exact streaming mean of the same updates.
    int64_t fedavg_bytes = 0;
    const double fedavg_s = MedianSeconds(reps, [&] {
      auto avg = StreamingFedAvg::Create(spec);
      Check(avg.status(), "StreamingFedAvg::Create");
      for (const auto& u : kept) Check(avg->Add(u, 1), "StreamingFedAvg::Add");
      Check(avg->Finish().status(), "StreamingFedAvg::Finish");
      fedavg_bytes = avg->accumulator_bytes();
    });
    {
      std::vector<std::vector<std::vector<KeptTensor>>> copies(static_cast<size_t>(reps) + 1, kept);
      const std::vector<UpdateTensor> global = MakeUpdate(elements, 2);
      int64_t held = 0;
      size_t rep = 0;
      const double product_s = MedianSeconds(reps, [&] {
        auto a = LoraProductAggregator::Create(spec, global);
        Check(a.status(), "LoraProductAggregator::Create");
        for (auto& u : copies[rep]) Check((*a)->Add(std::move(u), 1), "LoraProductAggregator::Add");
        held = (*a)->held_bytes();
        Check((*a)->Finish().status(), "LoraProductAggregator::Finish");
        ++rep;
      });
      std::printf("| %lld | %d | - | LORA_PRODUCT | %.1f | %.1f | %.1fx | %.1f | %.1f |\n",
                  static_cast<long long>(elements), n, product_s * 1e3, fedavg_s * 1e3,
                  product_s / fedavg_s, held / 1e6, fedavg_bytes / 1e6);
    }
    for (const Rule& r : Rules(n)) {
      // A rule takes each update by value, as the server hands it over: one copy of the updates
      // per call (MedianSeconds makes reps + 1), made outside the timing.
      std::vector<std::vector<std::vector<KeptTensor>>> copies(static_cast<size_t>(reps) + 1, kept);
      int64_t held = 0;
      size_t rep = 0;
      const double rule_s = MedianSeconds(reps, [&] {
        auto a = RobustAggregator::Create(spec, r.options);
        Check(a.status(), "RobustAggregator::Create");
        for (auto& u : copies[rep]) Check((*a)->Add(std::move(u), 1), "RobustAggregator::Add");
        held = (*a)->held_bytes();
        Check((*a)->Finish().status(), "RobustAggregator::Finish");
        ++rep;
      });
      const std::string f =
          r.options.byzantine > 0 ? std::to_string(r.options.byzantine) : std::string("-");
      std::printf("| %lld | %d | %s | %s | %.1f | %.1f | %.1fx | %.1f | %.1f |\n",
                  static_cast<long long>(elements), n, f.c_str(), r.name, rule_s * 1e3,
                  fedavg_s * 1e3, rule_s / fedavg_s, held / 1e6, fedavg_bytes / 1e6);
    }
  }
  return 0;
}
