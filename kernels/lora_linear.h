// LoRA linear layer (Hu et al. 2021; PEFT's lora.Linear), the hot op of adapter fine-tuning:
//
//   xd = dropout(x)                       (lora_dropout; identity when p == 0)
//   h  = xd A^T                           [rows, rank]      saved for the backward
//   y  = x W^T + b + s * h B^T            s = alpha / rank  ("scaling")
//
// Backward (W and b are frozen: no dW, no db):
//   g  = dy B                             [rows, rank]
//   dB = s * dy^T h                       [out, rank]
//   dA = s * g^T xd                       [rank, in]
//   dx = dy W + s * dropout'(g A)         dropout' applies the same mask and 1/(1-p)
//
// Shapes: x [rows, in], W [out, in] (fp32, bf16 or quantized: weight.h), b [out], A [rank, in], B [out, rank],
// y / dy [rows, out]. Composed from Gemm/Dropout, so it runs on every backend.
//
// FLOPs (T = rows, I = in, O = out, r = rank):
//   forward  2*T*I*O (frozen) + 2*T*I*r + 2*T*r*O
//   backward 2*T*I*O (dx through W) + 2*T*O*r (g) + 2*T*r*I (g A) + 2*T*r*I (dA) + 2*T*O*r (dB)
// At BERT-base (T=1024, I=O=768, r=8) that is 1.21 GFLOP + 2*25 MFLOP forward and
// 1.21 GFLOP + 4*12.6 MFLOP backward: the frozen GEMMs are ~96% of the work, the adapter ~4%, so
// the step runs at the speed of the two big sgemms when the small ones and the passes are cheap.
//
// Workspace (LoraLinearWorkspaceBytes): the panel buffer when W is bf16 or quantized, plus, when dropout
// is active, rows*in floats for xd (forward and backward recompute it from the seed instead of
// saving it; the backward reuses it for g A), plus in the backward rows*rank floats for g.
// Regions are laid out back to back, each 256-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"
#include "kernels/dropout.h"
#include "kernels/weight.h"

namespace fedlora::kernels {

struct LoraLinearForwardArgs {
  int64_t rows = 0, in_features = 0, out_features = 0, rank = 0;
  const float* x = nullptr;       // [rows, in]
  WeightPtr w{};                  // [out, in] frozen
  const float* bias = nullptr;    // [out] or null, frozen
  const float* lora_a = nullptr;  // [rank, in]
  const float* lora_b = nullptr;  // [out, rank]
  float scaling = 1.0f;           // alpha / rank
  DropoutSpec dropout{};          // lora_dropout on the adapter path's input
  float* y = nullptr;             // [rows, out]
  float* h = nullptr;             // [rows, rank] saved: dropout(x) A^T
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct LoraLinearBackwardArgs {
  int64_t rows = 0, in_features = 0, out_features = 0, rank = 0;
  const float* x = nullptr;       // [rows, in] the forward's input (for dA, through the mask)
  WeightPtr w{};                  // [out, in]
  const float* lora_a = nullptr;  // [rank, in]
  const float* lora_b = nullptr;  // [out, rank]
  float scaling = 1.0f;
  DropoutSpec dropout{};      // the forward's, unchanged
  const float* h = nullptr;   // [rows, rank] saved by the forward
  const float* dy = nullptr;  // [rows, out]
  float* dx = nullptr;        // [rows, in] or null (first layer)
  bool accumulate_dx = false;
  float* da = nullptr;             // [rank, in] or null
  float* db = nullptr;             // [out, rank] or null
  bool accumulate_params = false;  // da / db += instead of =
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

size_t LoraLinearWorkspaceBytes(const LoraLinearForwardArgs& args);
size_t LoraLinearWorkspaceBytes(const LoraLinearBackwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const LoraLinearForwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const LoraLinearBackwardArgs& args);
absl::Status LoraLinearForward(const ExecContext& ctx, const LoraLinearForwardArgs& args);
absl::Status LoraLinearBackward(const ExecContext& ctx, const LoraLinearBackwardArgs& args);

// FLOP counts above, for benchmarks and logs.
double LoraLinearForwardFlops(int64_t rows, int64_t in, int64_t out, int64_t rank);
double LoraLinearBackwardFlops(int64_t rows, int64_t in, int64_t out, int64_t rank);

}  // namespace fedlora::kernels
