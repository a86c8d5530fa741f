#include "compression/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/strings.h"
#include "kernels/base/block_quant.h"

namespace fedlora {
namespace {

// The value of code q: one formula, used by every decoder (the server's, and the client's own for
// error feedback), so both see the same bits.
inline float Level(double s, double step, uint32_t q) { return static_cast<float>(-s + q * step); }

}  // namespace

absl::Status CheckQuantSpec(int bits, int64_t block_size) {
  if (bits != 1 && bits != 2 && bits != 4 && bits != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantization bits ", bits, " must be 1, 2, 4 or 8"));
  }
  if (block_size < 8 || block_size > kMaxQuantBlockSize || block_size % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("quantization block size ", block_size,
                                                   " must be a multiple of 8 in [8, ",
                                                   kMaxQuantBlockSize, "]"));
  }
  return absl::OkStatus();
}

uint64_t QuantizedBytes(uint64_t n, int bits, int64_t block_size) {
  return kernels::BlockQuantizedBytes(n, bits, block_size);
}

void QuantizeAppend(const float* x, int64_t n, const QuantSpec& spec, std::string& out) {
  const size_t start = out.size();
  out.resize(start + QuantizedBytes(static_cast<uint64_t>(n), spec.bits, spec.block_size));
  // kernels::BlockQuantize on the CPU needs no workspace and refuses only a spec CheckQuantSpec
  // refuses.
  const absl::Status status = kernels::BlockQuantize(
      kernels::ExecContext{},
      kernels::BlockQuantizeArgs{.n = n,
                                 .x = x,
                                 .bits = spec.bits,
                                 .block_size = spec.block_size,
                                 .stochastic = spec.stochastic,
                                 .seed = spec.seed,
                                 .stream = spec.stream,
                                 .out = reinterpret_cast<uint8_t*>(out.data() + start)});
  FEDLORA_CHECK(status.ok());
}

absl::Status DequantizeBlock(std::string_view block, int64_t n, int bits, float* out,
                             std::string_view what, uint64_t first) {
  float s;
  std::memcpy(&s, block.data(), 4);
  if (!std::isfinite(s) || s < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": quantization block at value ",
                                                   first, " has scale ", s,
                                                   " (must be finite and >= 0)"));
  }
  const uint64_t code_bytes = block.size() - 4;
  const uint64_t used_bits = static_cast<uint64_t>(n) * bits;
  if (used_bits % 8 != 0) {
    const uint8_t last = static_cast<uint8_t>(block[block.size() - 1]);
    if ((last >> (used_bits % 8)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": quantization block at value ",
                                                     first, " has non-zero padding bits"));
    }
  }
  if (out == nullptr) return absl::OkStatus();
  const uint32_t top = (1u << bits) - 1;
  const double sd = s, step = 2.0 * sd / top;
  const auto* codes = reinterpret_cast<const uint8_t*>(block.data() + 4);
  const int per_byte = 8 / bits;
  for (uint64_t byte = 0, i = 0; byte < code_bytes; ++byte) {
    uint32_t c = codes[byte];
    for (int j = 0; j < per_byte && i < static_cast<uint64_t>(n); ++j, ++i) {
      out[i] = Level(sd, step, c & top);
      c >>= bits;
    }
  }
  return absl::OkStatus();
}

}  // namespace fedlora
