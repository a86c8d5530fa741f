// Updates held as dense rows: one fp32 vector per update, its tensors laid out in the adapter's
// spec order. Shared by the strategies that keep every update of a round until Finish
// (aggregation/robust.h, aggregation/lora_product.h).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "aggregation/fedavg.h"
#include "compression/codec.h"

namespace fedlora {

// Where each spec tensor starts in a row; back() is the row's length. InvalidArgument, prefixed
// by `who`, on an empty spec, an empty or repeated name, or a shape with a negative dimension or
// more than 2^40 elements.
absl::StatusOr<std::vector<int64_t>> RowOffsets(const std::vector<TensorSpec>& spec,
                                                const char* who);

// `update` as a dense row (entries a sparsified tensor does not keep are 0). InvalidArgument,
// prefixed by `who`, when it does not match the spec (a missing, extra or repeated tensor, a
// shape, a value count, a sparse index out of order or range) or a value is not finite.
absl::StatusOr<std::vector<float>> DenseRow(const std::vector<KeptTensor>& update,
                                            const std::vector<TensorSpec>& spec,
                                            const std::vector<int64_t>& offsets, const char* who);

}  // namespace fedlora
