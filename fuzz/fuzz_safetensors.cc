// Fuzzes the safetensors reader (core/safetensors.h) on arbitrary file images: models and
// adapters come from disk and, for adapters, from the network (AdapterFromSafetensors on a
// downloaded global adapter).
//
// Checks beyond "no crash, no sanitizer report": every tensor Get returns lies inside the image
// and has numel * dtype size bytes; an image that parses and that the writer accepts back parses
// again to the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "compression/update_io.h"
#include "core/safetensors.h"
#include "fuzz/fuzz_util.h"

namespace {

uint64_t Touch(const uint8_t* p, size_t n) {
  uint64_t h = 0;
  for (size_t i = 0; i < n; ++i) h = h * 31 + p[i];  // reads every byte: ASan sees any overrun
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlora;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto file = SafetensorsFile::FromBytes(bytes, "fuzz input");
  // The client's view of a downloaded global adapter: the same reader plus an F32-only rule.
  auto adapter = AdapterFromSafetensors(bytes);
  FUZZ_TRACE("%zu bytes: %s; as an adapter: %s\n", size, file.status().ToString().c_str(),
             adapter.status().ToString().c_str());
  if (!file.ok()) {
    FUZZ_CHECK(!adapter.ok(), "AdapterFromSafetensors accepted what SafetensorsFile refused");
    return 0;
  }

  std::vector<SafetensorsTensorToWrite> back;
  volatile uint64_t sink = 0;
  for (const std::string& name : (*file)->names()) {
    FUZZ_CHECK((*file)->Contains(name), name);
    auto t = (*file)->Get(name);
    FUZZ_CHECK(t.ok(), t.status());
    auto numel = CheckedNumel(t->shape);
    FUZZ_CHECK(numel.ok(), numel.status());
    FUZZ_CHECK(t->numel() == *numel, name);
    FUZZ_CHECK(t->size == static_cast<size_t>(*numel) * DTypeSize(t->dtype), name);
    if (t->size > 0) sink = sink + Touch(t->data, t->size);
    auto view = t->view();
    (void)view;
    back.push_back({t->name, t->dtype, t->shape, t->data, t->size});
  }
  FUZZ_CHECK(!(*file)->Contains("__metadata__"), "");
  FUZZ_CHECK(!(*file)->Get("\x01not a tensor").ok(), "");

  // Round trip through the writer. It refuses some names the reader takes (e.g. an empty one),
  // so only an image it accepts is compared.
  auto image = SerializeSafetensors(back, (*file)->metadata());
  if (!image.ok()) return 0;
  auto again = SafetensorsFile::FromBytes(*image, "rewritten");
  FUZZ_CHECK(again.ok(), again.status());
  FUZZ_CHECK((*again)->names() == (*file)->names(), "names differ after a round trip");
  FUZZ_CHECK((*again)->metadata() == (*file)->metadata(), "metadata differs after a round trip");
  for (const std::string& name : (*file)->names()) {
    auto a = (*file)->Get(name);
    auto b = (*again)->Get(name);
    FUZZ_CHECK(a.ok() && b.ok(), name);
    FUZZ_CHECK(a->dtype == b->dtype && a->shape == b->shape && a->size == b->size, name);
    FUZZ_CHECK(a->size == 0 || std::memcmp(a->data, b->data, a->size) == 0, name);
  }
  return 0;
}
