// Fuzzes the client's side of the downlink (compression/downlink.h): ApplyDownlinkDelta, which
// rebuilds the next global adapter from the one held and a delta blob the server sent.
//
// Input: one control byte, then the delta blob. The held adapter is, by the control byte's low bit,
// either a fixed two-tensor adapter or one laid out as the blob's own tensor table (ValidateUpdate),
// so that the sum is reached; bit 1 fills it with values near FLT_MAX, so that the sum can overflow.
//
// Checks beyond "no crash, no sanitizer report", all promised by downlink.h:
// - on error the held adapter is unchanged, bit for bit;
// - it succeeds exactly when DecodeUpdate does, the layouts match and no sum is Inf or NaN;
// - on success names and shapes are unchanged and every value is the fp32 sum of the held value
//   and DecodeUpdate's, bit for bit.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "compression/codec.h"
#include "compression/downlink.h"
#include "fuzz/fuzz_util.h"

namespace {

fedlora::DecodeLimits FuzzLimits() {
  fedlora::DecodeLimits limits;
  limits.max_elements = int64_t{1} << 20;
  limits.max_decoded_bytes = int64_t{8} << 20;
  limits.max_tensors = 1024;
  return limits;
}

bool SameBits(const std::vector<fedlora::UpdateTensor>& a,
              const std::vector<fedlora::UpdateTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape ||
        a[i].values.size() != b[i].values.size())
      return false;
    if (!a[i].values.empty() && std::memcmp(a[i].values.data(), b[i].values.data(),
                                            a[i].values.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

float HeldValue(size_t i, bool huge) {
  const float base = huge ? std::numeric_limits<float>::max() * 0.75f : 0.25f;
  return (i % 2 == 0 ? base : -base) * static_cast<float>(1 + i % 3);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlora;
  if (size == 0) return 0;
  const uint8_t control = data[0];
  const std::string_view blob(reinterpret_cast<const char*>(data + 1), size - 1);
  const DecodeLimits limits = FuzzLimits();
  const bool huge = (control & 2) != 0;

  std::vector<UpdateTensor> held;
  auto table = ValidateUpdate(blob, limits);
  if ((control & 1) != 0 && table.ok()) {
    for (const UpdateTensorInfo& info : *table) {
      int64_t n = 1;
      for (int64_t d : info.shape) n *= d;  // ValidateUpdate bounds the element count by the limits
      UpdateTensor t{info.name, info.shape, std::vector<float>(static_cast<size_t>(n))};
      for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = HeldValue(i, huge);
      held.push_back(std::move(t));
    }
  } else {
    held.push_back(UpdateTensor{"lora_A", {2, 3}, {}});
    held.push_back(UpdateTensor{"lora_B", {3}, {}});
    for (UpdateTensor& t : held) {
      t.values.resize(t.shape.size() == 2 ? 6 : 3);
      for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = HeldValue(i, huge);
    }
  }
  const std::vector<UpdateTensor> before = held;

  const absl::Status applied = ApplyDownlinkDelta(held, blob, limits);
  auto decoded = DecodeUpdate(blob, limits);
  FUZZ_TRACE("%zu bytes, control %u: %s\n", size, control, applied.ToString().c_str());

  // What the result must be: DecodeUpdate's values added to the held ones, when the layouts match
  // and every sum is finite.
  bool expect_ok = decoded.ok() && decoded->size() == before.size();
  std::vector<UpdateTensor> expected = before;
  for (size_t t = 0; expect_ok && t < before.size(); ++t) {
    const UpdateTensor& d = (*decoded)[t];
    if (d.name != before[t].name || d.shape != before[t].shape ||
        d.values.size() != before[t].values.size()) {
      expect_ok = false;
      break;
    }
    for (size_t i = 0; i < d.values.size(); ++i) {
      expected[t].values[i] = before[t].values[i] + d.values[i];
      if (!std::isfinite(expected[t].values[i])) expect_ok = false;
    }
  }
  if (!applied.ok()) {
    FUZZ_CHECK(!expect_ok, applied);
    FUZZ_CHECK(applied.code() == absl::StatusCode::kInvalidArgument || !decoded.ok(), applied);
    FUZZ_CHECK(!applied.message().empty(), "an error without a message");
    FUZZ_CHECK(SameBits(held, before), "a failed apply changed the held adapter");
    return 0;
  }
  FUZZ_CHECK(expect_ok, "applied a delta that does not decode, does not match or overflows");
  FUZZ_CHECK(SameBits(held, expected),
             "the rebuilt adapter is not the held one plus the decoded delta");
  return 0;
}
