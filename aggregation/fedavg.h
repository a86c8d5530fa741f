// Streaming, order-independent federated averaging.
//
//   FEDLORA_ASSIGN_OR_RETURN(StreamingFedAvg avg, StreamingFedAvg::Create(SpecFromUpdate(global)));
//   for (const auto& u : accepted) FEDLORA_RETURN_IF_ERROR(avg.Add(u.tensors, u.num_examples));
//   FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> mean_delta, avg.Finish());
//   FEDLORA_RETURN_IF_ERROR(server_optimizer.Step(mean_delta, global));  // aggregation/server_optimizer.h
//
// Determinism (why the accumulator is fixed point): the server must produce a bit-identical global
// adapter for the same set of accepted updates whatever their arrival order and whether it restarted
// mid-round (then it re-adds the durably stored updates). Floating-point sums depend on the order, so
// each element accumulates in an exact 128-bit two's-complement fixed-point integer instead:
//
//   term_i = round_half_even(w_i * x_i * 2^kFracBits)   w_i = num_examples (integer), x_i = the fp32 value
//   S      = sum_i term_i   (mod 2^128; exact, so any order and any grouping gives the same bits)
//   W      = sum_i w_i      (exact uint64)
//   mean   = fp32(S * 2^-kFracBits / W)
//
// w_i * x_i is formed exactly (24-bit mantissa times a <= 2^32 weight fits in 56 bits), so the only
// rounding before the final division is per term and depends on that term alone. Partial sums may
// wrap, but because every term is bounded by 2^kMaxTermLog2 and at most kMaxUpdates terms are added,
// the true total fits in int128 and modular arithmetic returns it exactly.
//
// Error bound: |mean - exact weighted mean| <= 0.5 ulp_fp32(mean) (final rounding)
//   + 2^-62 * |mean| (long-double conversion and division on x86-64)
//   + n * 2^-(kFracBits+1) / W (per-term rounding; n updates, W total weight).
// With kFracBits = 64 the last term is n * 2.7e-20 / W: a product |w * x| below 2^-65 (~2.7e-20)
// rounds to 0, far below anything an fp32 adapter entry can carry next to its other entries.
// Range: every |w_i * x_i| must be < 2^kMaxTermLog2 / 2^kFracBits = 2^43 (~8.8e12); Add refuses
// updates outside it with InvalidArgument (a delta of 1e6 with a million examples still fits).
// Memory: 16 bytes per model element (one int128) plus the tensor names/shapes, independent of the
// number of clients: O(model).
//
// Sparse updates: Add also takes an update as DecodeUpdateKept hands it over (compression/codec.h),
// a top-k or random-k tensor as its kept values and their positions. Only those entries are added:
// an entry not kept is 0, whose term is 0, so the sums are bit-identical to adding the expanded
// update, at the cost of the kept entries rather than the model.
//
// Device: Create(spec, Device::kCuda) keeps the sums in GPU memory and adds each update there with
// kernels::FixedPointAccumulate (the term computed by the same code as on the CPU): integer sums,
// so the result is bit-identical to the CPU accumulator's. Add uploads the update's values (one
// host-to-device copy of 4 bytes per element; for a sparse update, 4 bytes per kept value and 8 for
// its position, and the kernel adds each into its sum in place); Finish downloads the sums once and
// divides on the host.
//
// Merge() adds another accumulator's exact sums, so that accumulators filled separately (several
// threads or processes, each with a share of the clients) combine with the same bit-exact result.
// The server (FedAvgAggregator, aggregation/update_aggregator.h) uses a single accumulator.
//
// Thread-safety: not thread-safe; use one StreamingFedAvg per aggregation, from one thread (or
// guard it). Finish() is const and may be called repeatedly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "kernels/base/backend.h"
#include "kernels/base/fixed_point.h"

namespace fedlora {

// Name and shape of one tensor of the global adapter: what every update must match.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// The spec of an update (or adapter), in the given order.
std::vector<TensorSpec> SpecFromUpdate(const std::vector<UpdateTensor>& tensors);

class StreamingFedAvg {
 public:
  static constexpr int kFracBits =
      kernels::kFixedFracBits;  // fixed-point fraction bits of each term
  static constexpr int kMaxTermLog2 =
      kernels::kFixedMaxTermLog2;                           // |term| < 2^107 (i.e. |w*x| < 2^43)
  static constexpr int64_t kMaxUpdates = int64_t{1} << 20;  // 127 - 107 bits of headroom
  static constexpr int64_t kMaxWeight = int64_t{1} << 32;   // num_examples per update

  // An empty accumulator for an adapter with these tensors. InvalidArgument on an empty spec,
  // empty/duplicate names, negative dimensions or an element count that overflows. On kCuda the sums
  // live in GPU memory: FailedPrecondition naming the reason when CUDA is not usable,
  // ResourceExhausted when the GPU lacks the memory.
  static absl::StatusOr<StreamingFedAvg> Create(std::vector<TensorSpec> spec,
                                                Device device = Device::kCpu);

  StreamingFedAvg(StreamingFedAvg&&) = default;
  StreamingFedAvg& operator=(StreamingFedAvg&&) = default;

  // Adds one client's update with weight `num_examples`. Tensors are matched by name (their order
  // may differ from the spec). Structure is checked before any value; values are checked as they
  // are accumulated, and a refused update's partial sums are subtracted again (exactly: the sums are
  // modular), so a refused update leaves the accumulator bit-identical. InvalidArgument when:
  // num_examples is not in
  // [1, kMaxWeight]; a spec tensor is missing, an extra or duplicate name appears, a shape differs,
  // or values.size() != product(shape); a value is NaN/Inf; |num_examples * value| >= 2^43 (on the
  // CPU the first such value in the update's order is named, on CUDA the first in the spec's).
  // ResourceExhausted after kMaxUpdates updates.
  absl::Status Add(const std::vector<UpdateTensor>& update, int64_t num_examples);
  // The same for an update of kept entries, with the same result as Add of its expansion. Also
  // InvalidArgument when a sparse tensor's indices and values differ in number, or an index is
  // outside the tensor or not above the one before it (a message names the tensor). Errors name a
  // value by its position in the tensor; on CUDA, a sparse update's first bad value in its order.
  absl::Status Add(const std::vector<KeptTensor>& update, int64_t num_examples);

  // Adds the sums of `other` (built from an identical spec, else InvalidArgument). The result is
  // bit-identical to having added other's updates here directly.
  absl::Status Merge(const StreamingFedAvg& other);

  // The weighted mean of everything added, in spec order. FailedPrecondition when nothing was added.
  absl::StatusOr<std::vector<UpdateTensor>> Finish() const;

  Device device() const { return backend_ == nullptr ? Device::kCpu : backend_->device(); }
  int64_t num_updates() const { return num_updates_; }
  uint64_t total_weight() const { return total_weight_; }
  const std::vector<TensorSpec>& spec() const { return spec_; }
  // Bytes held by the accumulators (16 per element): the O(model) memory figure.
  int64_t accumulator_bytes() const {
    return offsets_.back() * static_cast<int64_t>(sizeof(unsigned __int128));
  }

 private:
  struct TensorView;  // one tensor of either form of update (fedavg.cc)

  StreamingFedAvg() = default;
  absl::Status AddViews(const std::vector<TensorView>& update, int64_t num_examples);
  absl::Status AddOnHost(const std::vector<TensorView>& update, const std::vector<size_t>& slot,
                         uint64_t w);
  absl::Status AddOnDevice(const std::vector<TensorView>& update, const std::vector<size_t>& slot,
                           uint64_t w);
  // The sums as host memory: sums_ itself on the CPU, a download on CUDA.
  absl::StatusOr<std::vector<unsigned __int128>> HostSums() const;

  std::vector<TensorSpec> spec_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> position in spec_
  std::vector<int64_t> offsets_;                    // start of each spec tensor in sums_
  std::vector<unsigned __int128> sums_;  // two's-complement fixed point, wraps (see above); CPU
  std::shared_ptr<kernels::Backend>
      backend_;  // CUDA only (null on the CPU); outlives the arrays below
  kernels::DeviceArray<unsigned __int128> dev_sums_;  // CUDA: the sums
  kernels::DeviceArray<float>
      dev_values_;  // CUDA: one update's values, in spec order, or its kept values
  kernels::DeviceArray<int64_t>
      dev_index_;               // CUDA: a sparse update's positions in the sums (grown on demand)
  std::vector<float> staging_;  // CUDA: the values, on the host
  std::vector<int64_t> index_staging_;  // CUDA: the positions, on the host
  int64_t num_updates_ = 0;
  uint64_t total_weight_ = 0;
};

// The L2 norm of `update` over all its tensors, summed in double in tensor order. The kept form
// gives its expansion's norm to the bit (an entry not kept adds +0 to the sum).
double UpdateNorm(const std::vector<UpdateTensor>& update);
double UpdateNorm(const std::vector<KeptTensor>& update);

// Scales `update` down so that its L2 norm (UpdateNorm) is at most `max_norm` (> 0), and returns
// the norm it had. An update already within it is unchanged. The result's norm never exceeds
// max_norm: should rounding to fp32 leave it a hair above, the update is shrunk a little more. The
// result depends on the update alone (aggregation stays order-independent). Non-finite values are
// left for StreamingFedAvg::Add to refuse.
double ClipUpdateNorm(std::vector<UpdateTensor>& update, double max_norm);
// The same on the kept entries: they become the clipped expansion's entries, bit for bit.
double ClipUpdateNorm(std::vector<KeptTensor>& update, double max_norm);

}  // namespace fedlora
