// Linear layer composed from Gemm, BiasAdd and ColumnSum: the same code drives every backend.
#include "kernels/linear.h"

#include <algorithm>

#include "kernels/base/kernel_util.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/reduce.h"

namespace fedlora::kernels {
namespace {

constexpr std::string_view kFwd = "LinearForward";
constexpr std::string_view kBwd = "LinearBackward";

// The workspace both products need for a bf16 or quantized W [out, in]: panels of rows of W, and
// with bf16 math the bf16 copy of x [rows, in] or dy [rows, out] (the larger).
size_t WeightWorkspace(const WeightPtr& w, int64_t rows, int64_t out, int64_t in) {
  GemmArgs g{.trans_b = true,
             .m = rows,
             .n = out,
             .k = in,
             .b_bf16 = w.bf16,
             .b_quant = w.quant,
             .b_quant_type = w.quant_type,
             .bf16_math = w.bf16_math,
             .int8_math = w.int8_math};
  const size_t fwd = GemmWorkspaceBytes(g);
  GemmArgs b{.m = rows,
             .n = in,
             .k = out,
             .b_bf16 = w.bf16,
             .b_quant = w.quant,
             .b_quant_type = w.quant_type,
             .bf16_math = w.bf16_math};
  return std::max(fwd, GemmWorkspaceBytes(b));
}

}  // namespace

size_t LinearWorkspaceBytes(const LinearForwardArgs& a) {
  return WeightWorkspace(a.w, a.rows, a.out_features, a.in_features);
}
size_t LinearWorkspaceBytes(const LinearBackwardArgs& a) {
  return a.dx != nullptr ? WeightWorkspace(a.w, a.rows, a.out_features, a.in_features) : 0;
}

absl::Status CanRun(const ExecContext& ctx, const LinearForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kFwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kFwd, {a.rows, a.in_features, a.out_features}));
  if (a.rows == 0 || a.out_features == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.y, "y"));
  if (a.in_features > 0) {
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.x, "x"));
    if (!a.w.valid())
      return internal::InvalidArg(kFwd, "exactly one of w.f32 / w.bf16 / w.quant must be set");
  }
  const size_t need = LinearWorkspaceBytes(a);
  if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) {
    return internal::InvalidArg(
        kFwd, absl::StrCat("a bf16 or quantized weight needs a workspace of ", need, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CanRun(const ExecContext& ctx, const LinearBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kBwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kBwd, {a.rows, a.in_features, a.out_features}));
  if (a.rows > 0 && a.out_features > 0)
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.dy, "dy"));
  if (a.dx != nullptr && a.out_features > 0 && a.in_features > 0 && !a.w.valid()) {
    return internal::InvalidArg(
        kBwd, "dx requested: exactly one of w.f32 / w.bf16 / w.quant must be set");
  }
  if (a.dw != nullptr && a.rows > 0 && a.in_features > 0)
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.x, "x (for dw)"));
  const size_t need = LinearWorkspaceBytes(a);
  if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) {
    return internal::InvalidArg(
        kBwd, absl::StrCat("a bf16 or quantized weight needs a workspace of ", need, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status LinearForward(const ExecContext& ctx, const LinearForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.rows == 0 || a.out_features == 0) return absl::OkStatus();
  // The bias goes in first and the GEMM accumulates onto it: no extra pass over y afterwards.
  float beta = a.accumulate ? 1.0f : 0.0f;
  if (a.bias != nullptr) {
    FEDLORA_RETURN_IF_ERROR(BiasAdd(ctx, BiasAddArgs{.rows = a.rows,
                                                     .cols = a.out_features,
                                                     .bias = a.bias,
                                                     .y = a.y,
                                                     .accumulate = a.accumulate}));
    beta = 1.0f;
  }
  return Gemm(ctx, GemmArgs{.trans_b = true,
                            .m = a.rows,
                            .n = a.out_features,
                            .k = a.in_features,
                            .beta = beta,
                            .a = a.x,
                            .b = a.w.f32,
                            .b_bf16 = a.w.bf16,
                            .b_quant = a.w.quant,
                            .b_quant_type = a.w.quant_type,
                            .c = a.y,
                            .bf16_math = a.w.bf16_math,
                            .int8_math = a.w.int8_math,
                            .workspace = a.workspace,
                            .workspace_bytes = a.workspace_bytes});
}

absl::Status LinearBackward(const ExecContext& ctx, const LinearBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.dx != nullptr) {  // dx [rows, in] = dy [rows, out] W [out, in]
    FEDLORA_RETURN_IF_ERROR(Gemm(ctx, GemmArgs{.m = a.rows,
                                               .n = a.in_features,
                                               .k = a.out_features,
                                               .beta = a.accumulate_dx ? 1.0f : 0.0f,
                                               .a = a.dy,
                                               .b = a.w.f32,
                                               .b_bf16 = a.w.bf16,
                                               .b_quant = a.w.quant,
                                               .b_quant_type = a.w.quant_type,
                                               .c = a.dx,
                                               .bf16_math = a.w.bf16_math,
                                               .workspace = a.workspace,
                                               .workspace_bytes = a.workspace_bytes}));
  }
  if (a.dw != nullptr) {  // dW [out, in] = dy^T [out, rows] x [rows, in]
    FEDLORA_RETURN_IF_ERROR(Gemm(ctx, GemmArgs{.trans_a = true,
                                               .m = a.out_features,
                                               .n = a.in_features,
                                               .k = a.rows,
                                               .beta = a.accumulate_params ? 1.0f : 0.0f,
                                               .a = a.dy,
                                               .b = a.x,
                                               .c = a.dw}));
  }
  if (a.dbias != nullptr) {  // db [out] = column sums of dy
    FEDLORA_RETURN_IF_ERROR(ColumnSum(ctx, ColumnSumArgs{.rows = a.rows,
                                                         .cols = a.out_features,
                                                         .x = a.dy,
                                                         .out = a.dbias,
                                                         .accumulate = a.accumulate_params}));
  }
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
