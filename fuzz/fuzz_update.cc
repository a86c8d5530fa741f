// Fuzzes the update wire format decoder (compression/codec.h) on arbitrary blobs: what a client
// uploads, after the server has opened its seal.
//
// Checks beyond "no crash, no sanitizer report", all promised by codec.h:
// - ValidateUpdate gives the same result as DecodeUpdate (OK, or the same code and message) and
//   the same tensor table; its `consumed` reports only grow and stay within the input;
// - an update that decodes has a header ParseUpdateHeader accepts, with the same codec;
// - every tensor keeps at most its element count (all of them without a sparsifier);
// - DecodeUpdateKept gives the same result as DecodeUpdate, and its kept entries (at strictly
//   ascending positions inside the tensor) expand to DecodeUpdate's values bit for bit;
// - a decoded update encodes again (same stages, keeping every entry) and decodes to the same bits
//   unless quantized or low-rank; a version 1 encoding without zstd is the input itself (every
//   field of the format is determined). A low-rank update is only encoded and decoded again: its
//   projection is approximate, and the factors of huge values may not bound their product.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "compression/codec.h"
#include "fuzz/fuzz_util.h"

namespace {

// Small caps, so that a hostile size field costs the fuzzer little memory; the checks that
// compare against them are the same at any size.
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlora;
  const std::string_view encoded(reinterpret_cast<const char*>(data), size);
  const DecodeLimits limits = FuzzLimits();

  auto header = ParseUpdateHeader(encoded, limits);
  auto decoded = DecodeUpdate(encoded, limits);
  auto kept = DecodeUpdateKept(encoded, limits);
  uint64_t last_consumed = 0;
  bool consumed_ok = true;
  auto table = ValidateUpdate(encoded, limits, [&](uint64_t bytes) {
    if (bytes < last_consumed || bytes > size) consumed_ok = false;
    last_consumed = bytes;
  });
  FUZZ_TRACE("%zu bytes: %s\n", size, decoded.status().ToString().c_str());
  FUZZ_CHECK(consumed_ok, "consumed went backwards or past the input");

  FUZZ_CHECK(decoded.ok() == table.ok(), decoded.status(), table.status());
  FUZZ_CHECK(decoded.status() == kept.status(), decoded.status(), kept.status());
  if (!decoded.ok()) {
    FUZZ_CHECK(decoded.status() == table.status(), decoded.status(), table.status());
    return 0;
  }
  FUZZ_CHECK(kept->size() == decoded->size(),
             "DecodeUpdateKept and DecodeUpdate list different tensors");
  for (size_t i = 0; i < kept->size(); ++i) {
    const KeptTensor& k = (*kept)[i];
    std::vector<float> expanded = k.values;
    if (!k.dense) {
      FUZZ_CHECK(k.indices.size() == k.values.size(), k.name);
      expanded.assign((*decoded)[i].values.size(), 0.0f);
      for (size_t j = 0; j < k.indices.size(); ++j) {
        FUZZ_CHECK(k.indices[j] >= (j == 0 ? 0 : k.indices[j - 1] + 1) &&
                       k.indices[j] < static_cast<int64_t>(expanded.size()),
                   k.name + ": kept positions out of order or range");
        expanded[static_cast<size_t>(k.indices[j])] = k.values[j];
      }
    }
    FUZZ_CHECK(k.name == (*decoded)[i].name && k.shape == (*decoded)[i].shape &&
                   SameBits({{k.name, k.shape, expanded}}, {(*decoded)[i]}),
               k.name + ": kept entries differ from the decoded tensor");
  }
  FUZZ_CHECK(header.ok(), header.status());
  FUZZ_CHECK(table->size() == decoded->size(),
             "ValidateUpdate and DecodeUpdate list different tensors");
  uint64_t elements = 0;
  for (size_t i = 0; i < decoded->size(); ++i) {
    const UpdateTensor& t = (*decoded)[i];
    FUZZ_CHECK((*table)[i].name == t.name && (*table)[i].shape == t.shape, t.name);
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;  // bounded by the limits: the decoder checked it
    FUZZ_CHECK(static_cast<size_t>(n) == t.values.size(), t.name);
    elements += t.values.size();
  }
  FUZZ_CHECK(elements == header->element_count, "element count differs from the header");

  for (size_t i = 0; i < table->size(); ++i) {
    FUZZ_CHECK((*table)[i].kept >= 0 &&
                   static_cast<size_t>((*table)[i].kept) <= (*decoded)[i].values.size(),
               "a tensor keeps more entries than it has");
    if (header->sparsifier == Sparsifier::kNone) {
      FUZZ_CHECK(static_cast<size_t>((*table)[i].kept) == (*decoded)[i].values.size(),
                 "a dense tensor kept less");
    }
  }

  CodecOptions options = header->options();
  options.fraction = 1.0;  // a sparsifier keeping everything: the decoded values travel as they are
  auto again = EncodeUpdate(*decoded, options);
  if (!again.ok()) return 0;  // the encoder refuses some updates the decoder takes (no tensors)
  auto redecoded = DecodeUpdate(*again, limits);
  if (options.sparsifier == Sparsifier::kLowRank) return 0;
  FUZZ_CHECK(redecoded.ok(), redecoded.status());
  // Quantizing again picks new scales, so only the exact element codecs round-trip bit for bit.
  if (options.codec != CodecId::kQuant)
    FUZZ_CHECK(SameBits(*decoded, *redecoded), "values differ after a round trip");
  if (!options.zstd && header->format_version == kUpdateFormatVersion) {
    FUZZ_CHECK(*again == encoded, "the decoder took a non-canonical encoding");
  }
  return 0;
}
