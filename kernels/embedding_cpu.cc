// Embedding lookup sum: validation, dispatch, CPU backend.
#include <algorithm>

#include "kernels/base/kernel_util.h"
#include "kernels/embedding.h"

namespace fedlora::kernels {
namespace {

constexpr std::string_view kOp = "EmbeddingForward";

// Adds (or, with assign, writes) row `row` of table `w` to out[0, hidden).
inline void AddRow(const WeightPtr& w, int64_t row, int64_t hidden, bool assign,
                   float* __restrict__ out) {
  if (w.bf16 != nullptr) {
    const uint16_t* src = w.bf16 + row * hidden;
    if (assign) {
      for (int64_t j = 0; j < hidden; ++j) out[j] = Bf16BitsToF32(src[j]);
    } else {
      for (int64_t j = 0; j < hidden; ++j) out[j] += Bf16BitsToF32(src[j]);
    }
  } else {
    const float* src = w.f32 + row * hidden;
    if (assign) {
      for (int64_t j = 0; j < hidden; ++j) out[j] = src[j];
    } else {
      for (int64_t j = 0; j < hidden; ++j) out[j] += src[j];
    }
  }
}

absl::Status CheckIds(const int32_t* ids, int64_t n, int64_t limit, std::string_view what) {
  for (int64_t t = 0; t < n; ++t) {
    if (ids[t] < 0 || ids[t] >= limit) {
      return internal::InvalidArg(
          kOp, absl::StrCat(absl::string_view(what.data(), what.size()), "[", t, "] = ", ids[t],
                            " outside [0, ", limit, ")"));
    }
  }
  return absl::OkStatus();
}

bool HasTypes(const EmbeddingForwardArgs& a) {
  return a.token_type.f32 != nullptr || a.token_type.bf16 != nullptr;
}

}  // namespace

absl::Status CanRun(const ExecContext& ctx, const EmbeddingForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.tokens, a.hidden}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.vocab, a.hidden}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.max_positions, a.hidden}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.type_vocab, a.hidden}));
  if (a.tokens == 0 || a.hidden == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.input_ids, "input_ids"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.out, "out"));
  if (a.word.is_quant() || a.position.is_quant() || a.token_type.is_quant()) {
    return absl::UnimplementedError(
        "EmbeddingForward: quantized embedding tables (fp32 and bf16 only)");
  }
  if (!a.word.valid())
    return internal::InvalidArg(kOp, "exactly one of word.f32 / word.bf16 must be set");
  if (!a.position.valid())
    return internal::InvalidArg(kOp, "exactly one of position.f32 / position.bf16 must be set");
  if (HasTypes(a) && !a.token_type.valid())
    return internal::InvalidArg(kOp, "token_type has both f32 and bf16 set");
  if (a.token_type_ids != nullptr && !HasTypes(a))
    return internal::InvalidArg(kOp, "token_type_ids given without a table");
  if (HasTypes(a) && a.type_vocab < 1) return internal::InvalidArg(kOp, "type_vocab must be >= 1");
  if (a.position_ids == nullptr) {
    if (a.seq_len <= 0 || a.tokens % a.seq_len != 0) {
      return internal::InvalidArg(
          kOp, absl::StrCat("default positions need seq_len > 0 dividing tokens (", a.tokens,
                            " tokens, seq_len ", a.seq_len, ")"));
    }
    if (a.seq_len > a.max_positions) {
      return internal::InvalidArg(
          kOp, absl::StrCat("seq_len ", a.seq_len, " > max_positions ", a.max_positions));
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingForward(const ExecContext& ctx, const EmbeddingForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.tokens == 0 || a.hidden == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::EmbeddingForwardCuda(ctx, a));
  // Ids are host memory here: check them all before touching any table.
  FEDLORA_RETURN_IF_ERROR(CheckIds(a.input_ids, a.tokens, a.vocab, "input_ids"));
  if (a.position_ids != nullptr)
    FEDLORA_RETURN_IF_ERROR(CheckIds(a.position_ids, a.tokens, a.max_positions, "position_ids"));
  if (a.token_type_ids != nullptr)
    FEDLORA_RETURN_IF_ERROR(CheckIds(a.token_type_ids, a.tokens, a.type_vocab, "token_type_ids"));
  const int64_t H = a.hidden;
  ctx.Pool().ParallelFor(
      0, a.tokens, std::max<int64_t>(1, internal::kElementwiseGrain / H),
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          float* out = a.out + t * H;
          AddRow(a.word, a.input_ids[t], H, /*assign=*/true, out);
          AddRow(a.position, a.position_ids != nullptr ? a.position_ids[t] : t % a.seq_len, H,
                 false, out);
          if (HasTypes(a))
            AddRow(a.token_type, a.token_type_ids != nullptr ? a.token_type_ids[t] : 0, H, false,
                   out);
        }
      });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
