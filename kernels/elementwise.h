// Bias add and residual add: the trivial pointwise ops. The big ops fuse them where that saves a
// pass (LinearForward writes the bias into y before the GEMM accumulates on top of it).
//
//   BiasAdd:  y[r, c] = (accumulate ? y[r, c] : 0) + bias[c]        y [rows, cols], bias [cols]
//   Add:      out[i]  = a[i] + alpha * b[i]                         residual add, axpy (out == a)
//
// Memory-bound: one read and one write per element (Add reads two).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

struct BiasAddArgs {
  int64_t rows = 0, cols = 0;
  const float* bias = nullptr;  // [cols]
  float* y = nullptr;           // [rows, cols]
  bool accumulate = true;       // false: broadcast the bias into y (y's old content ignored)
};

struct AddArgs {
  int64_t n = 0;
  const float* a = nullptr;  // [n]
  const float* b = nullptr;  // [n]
  float alpha = 1.0f;
  float* out = nullptr;  // [n]; may alias a or b
};

absl::Status CanRun(const ExecContext& ctx, const BiasAddArgs& args);
absl::Status CanRun(const ExecContext& ctx, const AddArgs& args);
absl::Status BiasAdd(const ExecContext& ctx, const BiasAddArgs& args);
absl::Status Add(const ExecContext& ctx, const AddArgs& args);

namespace internal {
absl::Status BiasAddCuda(const ExecContext& ctx, const BiasAddArgs& args);
absl::Status AddCuda(const ExecContext& ctx, const AddArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
