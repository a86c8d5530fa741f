#include "aggregation/dense_rows.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fedlora {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> RowOffsets(const std::vector<TensorSpec>& spec,
                                                const char* who) {
  if (spec.empty()) return absl::InvalidArgumentError(absl::StrCat(who, ": the spec is empty"));
  std::vector<int64_t> offsets = {0};
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i].name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": a spec tensor has no name"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (spec[j].name == spec[i].name) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": the spec repeats tensor '", spec[i].name, "'"));
      }
    }
    int64_t n = 1;
    for (int64_t dim : spec[i].shape) {
      if (dim < 0 || (dim > 0 && n > (int64_t{1} << 40) / dim)) {
        return absl::InvalidArgumentError(absl::StrCat(who, ": tensor '", spec[i].name,
                                                       "' has shape ", ShapeText(spec[i].shape)));
      }
      n *= dim;
    }
    offsets.push_back(offsets.back() + n);
  }
  return offsets;
}

absl::StatusOr<std::vector<float>> DenseRow(const std::vector<KeptTensor>& update,
                                            const std::vector<TensorSpec>& spec,
                                            const std::vector<int64_t>& offsets, const char* who) {
  if (update.size() != spec.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": update has ", update.size(), " tensors, the global adapter has ", spec.size()));
  }
  std::vector<float> row(static_cast<size_t>(offsets.back()), 0.0f);
  std::vector<bool> seen(spec.size(), false);
  for (const KeptTensor& u : update) {
    size_t slot = 0;
    while (slot < spec.size() && spec[slot].name != u.name) ++slot;
    if (slot == spec.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": update tensor '", u.name, "' is not in the global adapter"));
    }
    if (seen[slot]) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": update repeats tensor '", u.name, "'"));
    }
    seen[slot] = true;
    if (u.shape != spec[slot].shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": tensor '", u.name, "' has shape ", ShapeText(u.shape),
                       ", the global adapter has ", ShapeText(spec[slot].shape)));
    }
    const int64_t n = offsets[slot + 1] - offsets[slot];
    const int64_t count = static_cast<int64_t>(u.values.size());
    if (u.dense ? count != n : u.indices.size() != u.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": tensor '", u.name, "' has ", count, " values for ",
          u.dense ? absl::StrCat(n, " elements") : absl::StrCat(u.indices.size(), " indices")));
    }
    float* out = row.data() + offsets[slot];
    for (int64_t i = 0; i < count; ++i) {
      int64_t at = i;
      if (!u.dense) {
        at = u.indices[static_cast<size_t>(i)];
        const int64_t floor = i == 0 ? 0 : u.indices[static_cast<size_t>(i) - 1] + 1;
        if (at < floor || at >= n) {
          return absl::InvalidArgumentError(absl::StrCat(who, ": tensor '", u.name, "' kept index ",
                                                         i, " (", at, ") is not in [", floor, ", ",
                                                         n, ")"));
        }
      }
      const float x = u.values[static_cast<size_t>(i)];
      if (!std::isfinite(x)) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": tensor '", u.name, "' value ", at, " is not finite (", x, ")"));
      }
      out[at] = x;
    }
  }
  return row;
}

}  // namespace fedlora
