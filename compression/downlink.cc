#include "compression/downlink.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace fedlora {
namespace {

absl::Status CheckSameLayout(const std::vector<UpdateTensor>& a, const std::vector<UpdateTensor>& b,
                             const char* what) {
  if (a.size() != b.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", b.size(), " tensors; the adapter has ", a.size()));
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape ||
        a[i].values.size() != b[i].values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "'s tensor ", i, " ('", b[i].name.substr(0, 200),
          "') does not match the adapter's ('", a[i].name.substr(0, 200), "') in name or shape"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DownlinkDelta> EncodeDownlinkDelta(const std::vector<UpdateTensor>& base,
                                                  const std::vector<UpdateTensor>& target,
                                                  const CodecOptions& options) {
  FEDLORA_RETURN_IF_ERROR(CheckSameLayout(base, target, "the target adapter"));
  std::vector<UpdateTensor> delta = target;
  for (size_t t = 0; t < delta.size(); ++t) {
    std::vector<float>& d = delta[t].values;
    const std::vector<float>& b = base[t].values;
    for (size_t i = 0; i < d.size(); ++i) d[i] -= b[i];
  }
  DownlinkDelta out;
  FEDLORA_ASSIGN_OR_RETURN(out.blob, EncodeUpdate(delta, options));
  std::vector<UpdateTensor>().swap(delta);
  out.rebuilt = base;
  FEDLORA_RETURN_IF_ERROR_CTX(ApplyDownlinkDelta(out.rebuilt, out.blob, DecodeLimits{}),
                              "rebuilding the adapter");
  return out;
}

absl::Status ApplyDownlinkDelta(std::vector<UpdateTensor>& adapter, std::string_view blob,
                                const DecodeLimits& limits) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> delta, DecodeUpdate(blob, limits));
  FEDLORA_RETURN_IF_ERROR(CheckSameLayout(adapter, delta, "the delta"));
  // Summed into the delta first, so that a failure leaves the adapter as it was.
  for (size_t t = 0; t < delta.size(); ++t) {
    std::vector<float>& d = delta[t].values;
    const std::vector<float>& a = adapter[t].values;
    for (size_t i = 0; i < d.size(); ++i) {
      d[i] = a[i] + d[i];
      if (!std::isfinite(d[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the delta overflows tensor '", delta[t].name.substr(0, 200), "' at element ", i));
      }
    }
  }
  for (size_t t = 0; t < delta.size(); ++t) adapter[t].values = std::move(delta[t].values);
  return absl::OkStatus();
}

}  // namespace fedlora
