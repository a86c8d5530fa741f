#include "server/adapter_io.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace fedlora {

absl::Status CanonicalizeAdapter(std::vector<UpdateTensor>& adapter) {
  std::sort(adapter.begin(), adapter.end(),
            [](const UpdateTensor& a, const UpdateTensor& b) { return a.name < b.name; });
  for (size_t i = 0; i < adapter.size(); ++i) {
    const UpdateTensor& t = adapter[i];
    if (t.name.empty()) return absl::InvalidArgumentError("adapter tensor with an empty name");
    if (i > 0 && adapter[i - 1].name == t.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter tensor '", t.name, "' appears twice"));
    }
    FEDLORA_ASSIGN_OR_RETURN(int64_t numel, CheckedNumel(t.shape));
    if (numel != static_cast<int64_t>(t.values.size())) {
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", t.name, "' has ",
                                                     t.values.size(), " values for ", numel,
                                                     " elements"));
    }
  }
  return absl::OkStatus();
}

void FillTensorSpecs(const std::vector<UpdateTensor>& adapter, v1::AdapterManifest* manifest) {
  manifest->clear_tensors();
  for (const UpdateTensor& t : adapter) {
    v1::TensorSpec* spec = manifest->add_tensors();
    spec->set_name(t.name);
    spec->set_dtype("F32");
    for (int64_t d : t.shape) spec->add_shape(d);
  }
}

}  // namespace fedlora
