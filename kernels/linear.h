// Dense layer, as torch.nn.Linear:  y = x W^T + b.  Backward:  dx = dy W,  dW = dy^T x,
// db = sum over rows of dy  (dW and db only when requested: frozen layers need only dx).
// Composed from Gemm and the row/column helpers in elementwise.h, so it runs on every backend.
//
//   x [rows, in], W [out, in] (fp32, bf16 or quantized: weight.h), b [out], y / dy [rows, out], dx [rows, in].
//
// FLOPs: forward 2*rows*in*out; backward 2*rows*in*out for dx, as much again for dW.
// Workspace: only for a bf16 or quantized W, LinearWorkspaceBytes() (the Gemm panel buffer; see gemm.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"
#include "kernels/weight.h"

namespace fedlora::kernels {

struct LinearForwardArgs {
  int64_t rows = 0, in_features = 0, out_features = 0;
  const float* x = nullptr;     // [rows, in]
  WeightPtr w{};                // [out, in]
  const float* bias = nullptr;  // [out] or null
  float* y = nullptr;           // [rows, out]
  bool accumulate = false;      // y += x W^T + b instead of y =
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct LinearBackwardArgs {
  int64_t rows = 0, in_features = 0, out_features = 0;
  const float* x = nullptr;   // [rows, in]; needed only when dw is requested
  WeightPtr w{};              // [out, in]; needed only when dx is requested
  const float* dy = nullptr;  // [rows, out]
  float* dx = nullptr;        // [rows, in] or null
  bool accumulate_dx = false;
  float* dw = nullptr;             // [out, in] or null
  float* dbias = nullptr;          // [out] or null
  bool accumulate_params = false;  // dw / dbias += instead of =
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

size_t LinearWorkspaceBytes(const LinearForwardArgs& args);
size_t LinearWorkspaceBytes(const LinearBackwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const LinearForwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const LinearBackwardArgs& args);
absl::Status LinearForward(const ExecContext& ctx, const LinearForwardArgs& args);
absl::Status LinearBackward(const ExecContext& ctx, const LinearBackwardArgs& args);

}  // namespace fedlora::kernels
