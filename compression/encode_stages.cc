#include "compression/encode_stages.h"

#include "compression/sparsify.h"
#include "core/status.h"
#include "kernels/base/backend.h"
#include "kernels/base/block_quant.h"
#include "kernels/base/topk.h"

namespace fedlora::compression_internal {
namespace {

using kernels::DeviceArray;

// The ascending top-k of the `n` values already on the device at `x`.
absl::StatusOr<std::vector<int64_t>> DeviceTopK(kernels::Backend& backend, const float* x,
                                                int64_t n, int64_t k) {
  std::vector<int64_t> out(static_cast<size_t>(k));
  if (k == 0) return out;
  FEDLORA_ASSIGN_OR_RETURN(auto idx, DeviceArray<int64_t>::Zeros(backend, out.size()));
  kernels::TopKArgs args{.n = n, .k = k, .x = x, .indices = idx.data()};
  FEDLORA_ASSIGN_OR_RETURN(args.workspace_bytes, kernels::TopKWorkspaceBytes(backend.ctx(), args));
  FEDLORA_ASSIGN_OR_RETURN(auto ws, DeviceArray<uint8_t>::Zeros(backend, args.workspace_bytes));
  args.workspace = ws.data();
  FEDLORA_RETURN_IF_ERROR(kernels::TopK(backend.ctx(), args));
  FEDLORA_RETURN_IF_ERROR(backend.Download(out.data(), idx.data(), idx.bytes()));
  return out;
}

}  // namespace

EncodeStages::EncodeStages(kernels::Backend* backend)
    : backend_(backend != nullptr && backend->device() == Device::kCuda ? backend : nullptr) {}

absl::StatusOr<std::vector<int64_t>> EncodeStages::TopK(const float* x, int64_t n, int64_t k) {
  if (backend_ == nullptr) return TopKIndices(x, n, k);
  if (k <= 0) return std::vector<int64_t>();
  FEDLORA_ASSIGN_OR_RETURN(auto xd, DeviceArray<float>::Zeros(*backend_, static_cast<size_t>(n)));
  FEDLORA_RETURN_IF_ERROR(backend_->Upload(xd.data(), x, xd.bytes()));
  return DeviceTopK(*backend_, xd.data(), n, k);
}

absl::StatusOr<std::vector<std::vector<int64_t>>> EncodeStages::GlobalTopK(
    const std::vector<UpdateTensor>& tensors, double fraction) {
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const UpdateTensor& t : tensors) {
    sizes.push_back(static_cast<int64_t>(t.values.size()));
    total += sizes.back();
  }
  if (backend_ == nullptr) {
    std::vector<const std::vector<float>*> all;
    for (const UpdateTensor& t : tensors) all.push_back(&t.values);
    return GlobalTopKIndices(all, fraction);
  }
  const int64_t k = KeptCount(total, fraction);
  if (k == 0) return std::vector<std::vector<int64_t>>(tensors.size());
  // The tensors uploaded back to back: top-k over the concatenation, as GlobalTopKIndices.
  FEDLORA_ASSIGN_OR_RETURN(auto xd,
                           DeviceArray<float>::Zeros(*backend_, static_cast<size_t>(total)));
  size_t at = 0;
  for (const UpdateTensor& t : tensors) {
    if (t.values.empty()) continue;
    FEDLORA_RETURN_IF_ERROR(
        backend_->Upload(xd.data() + at, t.values.data(), t.values.size() * sizeof(float)));
    at += t.values.size();
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<int64_t> flat, DeviceTopK(*backend_, xd.data(), total, k));
  return SplitIndices(flat, sizes);
}

absl::Status EncodeStages::QuantizeAppend(const float* x, int64_t n, const QuantSpec& spec,
                                          std::string& out) {
  if (backend_ == nullptr) {
    fedlora::QuantizeAppend(x, n, spec, out);
    return absl::OkStatus();
  }
  if (n == 0) return absl::OkStatus();
  const size_t bytes = QuantizedBytes(static_cast<uint64_t>(n), spec.bits, spec.block_size);
  FEDLORA_ASSIGN_OR_RETURN(auto xd, DeviceArray<float>::Zeros(*backend_, static_cast<size_t>(n)));
  FEDLORA_RETURN_IF_ERROR(backend_->Upload(xd.data(), x, xd.bytes()));
  FEDLORA_ASSIGN_OR_RETURN(auto od, DeviceArray<uint8_t>::Zeros(*backend_, bytes));
  kernels::BlockQuantizeArgs args{.n = n,
                                  .x = xd.data(),
                                  .bits = spec.bits,
                                  .block_size = spec.block_size,
                                  .stochastic = spec.stochastic,
                                  .seed = spec.seed,
                                  .stream = spec.stream,
                                  .out = od.data()};
  FEDLORA_ASSIGN_OR_RETURN(args.workspace_bytes,
                           kernels::BlockQuantizeWorkspaceBytes(backend_->ctx(), args));
  FEDLORA_ASSIGN_OR_RETURN(auto ws, DeviceArray<uint8_t>::Zeros(*backend_, args.workspace_bytes));
  args.workspace = ws.data();
  FEDLORA_RETURN_IF_ERROR(kernels::BlockQuantize(backend_->ctx(), args));
  const size_t start = out.size();
  out.resize(start + bytes);
  return backend_->Download(out.data() + start, od.data(), bytes);
}

}  // namespace fedlora::compression_internal
