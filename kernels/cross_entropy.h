// Softmax cross-entropy over class logits with integer labels, as
// torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="mean"):
//
//   loss     = (1 / N) * sum_{b : labels[b] != ignore} (logsumexp(logits[b]) - logits[b, labels[b]])
//   dlogits  = (loss_scale / N) * (softmax(logits[b]) - onehot(labels[b]))   (0 rows for ignored)
//
// N is the number of labels that are not ignore_index (loss 0, dlogits 0 when N == 0).
// Shapes: logits, dlogits [batch, classes]; labels [batch] int32; loss [1] (on ctx.device).
// dlogits may be null (evaluation) and may alias logits.
//
// Bad labels (not ignore_index and outside [0, classes)): InvalidArgument on the CPU. The CUDA
// kernel treats them as ignored (it cannot report without a sync); check labels on the host.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

inline constexpr int32_t kIgnoreIndex = -100;

struct CrossEntropyArgs {
  int64_t batch = 0, classes = 0;
  const float* logits = nullptr;    // [batch, classes]
  const int32_t* labels = nullptr;  // [batch]
  int32_t ignore_index = kIgnoreIndex;
  float* loss = nullptr;     // [1] mean loss
  float* dlogits = nullptr;  // [batch, classes] or null
  float loss_scale = 1.0f;   // multiplies dlogits (e.g. 1 / accumulation steps)
};

absl::Status CanRun(const ExecContext& ctx, const CrossEntropyArgs& args);
absl::Status SoftmaxCrossEntropy(const ExecContext& ctx, const CrossEntropyArgs& args);

namespace internal {
absl::Status SoftmaxCrossEntropyCuda(const ExecContext& ctx, const CrossEntropyArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
