// LoRA linear composed from LinearForward/Backward, Gemm, Dropout and Add (every backend).
#include "kernels/lora_linear.h"

#include "kernels/base/kernel_util.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/linear.h"

namespace fedlora::kernels {
namespace {

constexpr std::string_view kFwd = "LoraLinearForward";
constexpr std::string_view kBwd = "LoraLinearBackward";

// Workspace regions, back to back: [weight panel (and bf16 math copy)][xd (dropout only)][g (backward only)].
struct Layout {
  size_t panel = 0, xd = 0, g = 0;
  size_t total() const { return panel + xd + g; }
};

Layout MakeLayout(const WeightPtr& w, int64_t rows, int64_t in, int64_t out, int64_t rank,
                  bool dropout, bool backward) {
  Layout l;
  l.panel = internal::AlignUp(LinearWorkspaceBytes(
      LinearForwardArgs{.rows = rows, .in_features = in, .out_features = out, .w = w}));
  if (dropout) l.xd = internal::AlignUp(static_cast<size_t>(rows * in) * sizeof(float));
  if (backward) l.g = internal::AlignUp(static_cast<size_t>(rows * rank) * sizeof(float));
  return l;
}

float* At(void* ws, size_t offset) {
  return reinterpret_cast<float*>(static_cast<char*>(ws) + offset);
}

template <class Args>
absl::Status CheckCommon(std::string_view op, const Args& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(op, {a.rows, a.in_features, a.out_features}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(op, {a.rows, a.rank}));
  if (a.rank < 1) return internal::InvalidArg(op, "rank must be >= 1");
  if (a.in_features < 1 || a.out_features < 1)
    return internal::InvalidArg(op, "in_features and out_features must be >= 1");
  if (!(a.dropout.p >= 0.0f && a.dropout.p < 1.0f))
    return internal::InvalidArg(op, "dropout p not in [0, 1)");
  if (!a.w.valid())
    return internal::InvalidArg(op, "exactly one of w.f32 / w.bf16 / w.quant must be set");
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(op, a.lora_a, "lora_a"));
  return internal::CheckPtr(op, a.lora_b, "lora_b");
}

}  // namespace

size_t LoraLinearWorkspaceBytes(const LoraLinearForwardArgs& a) {
  return MakeLayout(a.w, a.rows, a.in_features, a.out_features, a.rank, a.dropout.active(), false)
      .total();
}
size_t LoraLinearWorkspaceBytes(const LoraLinearBackwardArgs& a) {
  return MakeLayout(a.w, a.rows, a.in_features, a.out_features, a.rank, a.dropout.active(), true)
      .total();
}

double LoraLinearForwardFlops(int64_t T, int64_t I, int64_t O, int64_t r) {
  return 2.0 * T * I * O + 2.0 * T * I * r + 2.0 * T * r * O;
}
double LoraLinearBackwardFlops(int64_t T, int64_t I, int64_t O, int64_t r) {
  return 2.0 * T * I * O + 2.0 * T * O * r + 2.0 * T * r * I + 2.0 * T * r * I + 2.0 * T * O * r;
}

absl::Status CanRun(const ExecContext& ctx, const LoraLinearForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kFwd));
  FEDLORA_RETURN_IF_ERROR(CheckCommon(kFwd, a));
  if (a.rows == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.x, "x"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.y, "y"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.h, "h (saved for the backward)"));
  const size_t need = LoraLinearWorkspaceBytes(a);
  if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) {
    return internal::InvalidArg(kFwd, absl::StrCat("needs a workspace of ", need, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CanRun(const ExecContext& ctx, const LoraLinearBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kBwd));
  FEDLORA_RETURN_IF_ERROR(CheckCommon(kBwd, a));
  if (a.rows == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.dy, "dy"));
  if (a.da != nullptr) FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.x, "x (for da)"));
  if (a.db != nullptr) FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.h, "h (for db)"));
  const size_t need = LoraLinearWorkspaceBytes(a);
  if (a.workspace == nullptr || a.workspace_bytes < need) {
    return internal::InvalidArg(kBwd, absl::StrCat("needs a workspace of ", need, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status LoraLinearForward(const ExecContext& ctx, const LoraLinearForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.rows == 0) return absl::OkStatus();
  const Layout l =
      MakeLayout(a.w, a.rows, a.in_features, a.out_features, a.rank, a.dropout.active(), false);
  // y = x W^T + b  (frozen path)
  FEDLORA_RETURN_IF_ERROR(LinearForward(ctx, LinearForwardArgs{.rows = a.rows,
                                                               .in_features = a.in_features,
                                                               .out_features = a.out_features,
                                                               .x = a.x,
                                                               .w = a.w,
                                                               .bias = a.bias,
                                                               .y = a.y,
                                                               .workspace = a.workspace,
                                                               .workspace_bytes = l.panel}));
  // xd = dropout(x)
  const float* xd = a.x;
  if (a.dropout.active()) {
    float* buf = At(a.workspace, l.panel);
    FEDLORA_RETURN_IF_ERROR(Dropout(
        ctx, DropoutArgs{.n = a.rows * a.in_features, .spec = a.dropout, .x = a.x, .out = buf}));
    xd = buf;
  }
  // h = xd A^T   [rows, rank]
  FEDLORA_RETURN_IF_ERROR(Gemm(ctx, GemmArgs{.trans_b = true,
                                             .m = a.rows,
                                             .n = a.rank,
                                             .k = a.in_features,
                                             .a = xd,
                                             .b = a.lora_a,
                                             .c = a.h}));
  // y += s * h B^T
  return Gemm(ctx, GemmArgs{.trans_b = true,
                            .m = a.rows,
                            .n = a.out_features,
                            .k = a.rank,
                            .alpha = a.scaling,
                            .beta = 1.0f,
                            .a = a.h,
                            .b = a.lora_b,
                            .c = a.y});
}

absl::Status LoraLinearBackward(const ExecContext& ctx, const LoraLinearBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.rows == 0) return absl::OkStatus();
  const Layout l =
      MakeLayout(a.w, a.rows, a.in_features, a.out_features, a.rank, a.dropout.active(), true);
  const float params_beta = a.accumulate_params ? 1.0f : 0.0f;
  float* g = At(a.workspace, l.panel + l.xd);
  // g = dy B   [rows, rank]
  FEDLORA_RETURN_IF_ERROR(Gemm(
      ctx,
      GemmArgs{.m = a.rows, .n = a.rank, .k = a.out_features, .a = a.dy, .b = a.lora_b, .c = g}));
  // dB = s * dy^T h   [out, rank]
  if (a.db != nullptr) {
    FEDLORA_RETURN_IF_ERROR(Gemm(ctx, GemmArgs{.trans_a = true,
                                               .m = a.out_features,
                                               .n = a.rank,
                                               .k = a.rows,
                                               .alpha = a.scaling,
                                               .beta = params_beta,
                                               .a = a.dy,
                                               .b = a.h,
                                               .c = a.db}));
  }
  // dA = s * g^T xd   [rank, in]
  if (a.da != nullptr) {
    const float* xd = a.x;
    if (a.dropout.active()) {
      float* buf = At(a.workspace, l.panel);
      FEDLORA_RETURN_IF_ERROR(Dropout(
          ctx, DropoutArgs{.n = a.rows * a.in_features, .spec = a.dropout, .x = a.x, .out = buf}));
      xd = buf;
    }
    FEDLORA_RETURN_IF_ERROR(Gemm(ctx, GemmArgs{.trans_a = true,
                                               .m = a.rank,
                                               .n = a.in_features,
                                               .k = a.rows,
                                               .alpha = a.scaling,
                                               .beta = params_beta,
                                               .a = g,
                                               .b = xd,
                                               .c = a.da}));
  }
  if (a.dx == nullptr) return absl::OkStatus();
  // dx = dy W  (+ dx)
  FEDLORA_RETURN_IF_ERROR(LinearBackward(ctx, LinearBackwardArgs{.rows = a.rows,
                                                                 .in_features = a.in_features,
                                                                 .out_features = a.out_features,
                                                                 .w = a.w,
                                                                 .dy = a.dy,
                                                                 .dx = a.dx,
                                                                 .accumulate_dx = a.accumulate_dx,
                                                                 .workspace = a.workspace,
                                                                 .workspace_bytes = l.panel}));
  // dx += s * dropout'(g A)
  if (!a.dropout.active()) {
    return Gemm(ctx, GemmArgs{.m = a.rows,
                              .n = a.in_features,
                              .k = a.rank,
                              .alpha = a.scaling,
                              .beta = 1.0f,
                              .a = g,
                              .b = a.lora_a,
                              .c = a.dx});
  }
  float* ga = At(a.workspace, l.panel);  // the xd region, free again
  const int64_t n = a.rows * a.in_features;
  FEDLORA_RETURN_IF_ERROR(Gemm(ctx, GemmArgs{.m = a.rows,
                                             .n = a.in_features,
                                             .k = a.rank,
                                             .alpha = a.scaling,
                                             .a = g,
                                             .b = a.lora_a,
                                             .c = ga}));
  FEDLORA_RETURN_IF_ERROR(Dropout(ctx, DropoutArgs{.n = n, .spec = a.dropout, .x = ga, .out = ga}));
  return Add(ctx, AddArgs{.n = n, .a = a.dx, .b = ga, .out = a.dx});
}

}  // namespace fedlora::kernels
