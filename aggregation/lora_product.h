// LORA_PRODUCT: aggregates what a LoRA adapter computes, the product B A, rather than A and B
// apart. Averaging the factors gives mean(B_k) mean(A_k), which is not the mean of the clients'
// products mean(B_k A_k); this strategy forms that mean and factors it back to the adapter's rank.
//
// For each adapter pair (tensors "<module>.lora_A.weight" [r, in] and "<module>.lora_B.weight"
// [out, r]) and the round's updates k with weights w_k (normalised to sum 1), client k's factors
// are A_k = A + dA_k and B_k = B + dB_k (A, B: the global pair the round started from), and
//
//   M = sum_k w_k B_k A_k = Bs As,  Bs = [sqrt(w_1) B_1 ... sqrt(w_n) B_n]  (out x nr),
//                                   As = [sqrt(w_1) A_1; ...; sqrt(w_n) A_n]  (nr x in).
//
// M is never formed: QR factorisations Bs = Qb Rb and As^T = Qa Ra reduce it to the small
// K = Rb Ra^T, whose SVD U S V^T gives M = (Qb U) S (Qa V)^T. The new pair keeps the r largest
// singular values: B' = Qb U_r S_r and A' = (Qa V_r)^T (orthonormal rows, as FlexLoRA splits
// them). B' A' is M exactly (to rounding) when M has rank <= r, and otherwise M's best rank-r
// approximation (Eckart-Young). Tensors outside a pair (a task head) get the weighted mean of
// their updates, summed exactly by StreamingFedAvg. Finish returns the deltas A' - A and B' - B:
// a server step of plain SGD with learning rate 1 makes the global pair (A', B').
//
// Determinism: the updates are stacked in a canonical order (by their values, then weights) and
// each singular pair's sign is fixed (the largest-magnitude entry of A's row is positive), so the
// result depends on the set of updates, not on the order they arrive in. Linear algebra in double.
//
// Memory: every update is held until Finish as a dense fp32 row, 4 bytes x elements x updates
// (held_bytes()), plus per pair O((out + in) x n r) doubles while it is factored.
//
// Thread-safety: one aggregator per aggregation, used from one thread. Runs on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregation/fedavg.h"
#include "aggregation/update_aggregator.h"
#include "compression/codec.h"

namespace fedlora {

class LoraProductAggregator final : public UpdateAggregator {
 public:
  // `global`: the adapter the round's clients trained from, with the spec's tensors. InvalidArgument
  // on a malformed spec, a global adapter that does not match it, a lora_A without its lora_B (or
  // the reverse), a pair whose shapes are not [r, in] and [out, r], or a spec with no pair.
  static absl::StatusOr<std::unique_ptr<LoraProductAggregator>> Create(
      std::vector<TensorSpec> spec, const std::vector<UpdateTensor>& global);

  std::string_view name() const override { return "lora_product"; }
  bool needs_all_updates() const override { return true; }
  // InvalidArgument when the update does not match the spec, a value is not finite or out of
  // StreamingFedAvg's range, or the weight is outside [1, 2^32]. A refused update is not held.
  absl::Status Add(std::vector<KeptTensor> update, int64_t weight) override;
  int64_t num_updates() const override { return static_cast<int64_t>(rows_.size()); }
  // FailedPrecondition when nothing was added.
  absl::StatusOr<std::vector<UpdateTensor>> Finish() override;

  int64_t held_bytes() const {
    return static_cast<int64_t>(rows_.size()) * offsets_.back() *
           static_cast<int64_t>(sizeof(float));
  }

 private:
  struct Pair {
    size_t a = 0, b = 0;  // spec slots of lora_A [r, in] and lora_B [out, r]
    int64_t rank = 0, in = 0, out = 0;
  };
  struct Held {
    std::vector<float> row;  // the update, dense, in spec order
    int64_t weight = 0;
  };

  LoraProductAggregator(std::vector<TensorSpec> spec, std::vector<int64_t> offsets,
                        std::vector<Pair> pairs, std::vector<float> global, StreamingFedAvg sum);
  // The pair's new (A', B') minus the global pair, written into `out` (a dense row).
  void FactorPair(const Pair& p, const std::vector<const Held*>& held, double total_weight,
                  std::vector<float>& out) const;

  std::vector<TensorSpec> spec_;
  std::vector<int64_t> offsets_;  // spec_[i] starts at offsets_[i] in a row
  std::vector<Pair> pairs_;
  std::vector<float> global_;  // the global adapter as a row
  StreamingFedAvg sum_;        // every tensor's exact weighted mean (used for the unpaired ones)
  std::vector<Held> rows_;
};

}  // namespace fedlora
