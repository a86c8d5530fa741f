#include "compression/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/rng.h"
#include "core/strings.h"

namespace fedlora {
namespace {

// The value of code q: one formula, used by every decoder (the server's, and the client's own for
// error feedback), so both see the same bits.
inline float Level(double s, double step, uint32_t q) { return static_cast<float>(-s + q * step); }

}  // namespace

absl::Status CheckQuantSpec(int bits, int64_t block_size) {
  if (bits != 1 && bits != 2 && bits != 4 && bits != 8) {
    return absl::InvalidArgumentError(absl::StrCat("quantization bits ", bits, " must be 1, 2, 4 or 8"));
  }
  if (block_size < 8 || block_size > kMaxQuantBlockSize || block_size % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("quantization block size ", block_size,
                                                   " must be a multiple of 8 in [8, ", kMaxQuantBlockSize, "]"));
  }
  return absl::OkStatus();
}

uint64_t QuantizedBytes(uint64_t n, int bits, int64_t block_size) {
  const uint64_t block = static_cast<uint64_t>(block_size);
  const uint64_t full = n / block, rest = n % block;
  return full * QuantBlockBytes(block, bits) + (rest > 0 ? QuantBlockBytes(rest, bits) : 0);
}

void QuantizeAppend(const float* x, int64_t n, const QuantSpec& spec, std::string& out) {
  const uint32_t top = (1u << spec.bits) - 1;  // highest code
  const bool sign_mode = spec.bits == 1 && !spec.stochastic;
  Rng rng(spec.seed, spec.stream);
  for (int64_t b = 0; b < n; b += spec.block_size) {
    const int64_t m = std::min<int64_t>(spec.block_size, n - b);
    const float* v = x + b;
    float s = 0.0f;
    if (sign_mode) {
      double sum = 0.0;
      for (int64_t i = 0; i < m; ++i) sum += std::fabs(v[i]);
      s = static_cast<float>(sum / static_cast<double>(m));
    } else {
      for (int64_t i = 0; i < m; ++i) s = std::max(s, std::fabs(v[i]));
    }
    out.append(reinterpret_cast<const char*>(&s), 4);
    // t = (x + s) / step in [0, top]: the code's position between levels. In double, so that a
    // subnormal or huge scale gives a finite 1 / step (in float, 255 / 2e-45 overflows).
    const double inv_step = s > 0.0f ? top / (2.0 * static_cast<double>(s)) : 0.0, dtop = top;
    uint32_t acc = 0;
    int filled = 0;
    for (int64_t i = 0; i < m; ++i) {
      uint32_t q = 0;
      if (sign_mode) {
        q = v[i] >= 0.0f ? 1 : 0;
      } else if (s > 0.0f) {
        const double t = std::clamp((static_cast<double>(v[i]) + s) * inv_step, 0.0, dtop);
        q = static_cast<uint32_t>(t);  // floor: t >= 0
        const float frac = static_cast<float>(t - q);
        if (spec.stochastic) {
          // P(up) = frac, so E[value] = -s + step * t = x (up to float rounding and the 2^-24 grid
          // of the draw).
          if (q < top && rng.UniformFloat() < frac) ++q;
        } else if (frac >= 0.5f && q < top) {
          ++q;
        }
      }
      acc |= q << filled;
      filled += spec.bits;
      if (filled == 8) {
        out.push_back(static_cast<char>(acc));
        acc = 0;
        filled = 0;
      }
    }
    if (filled > 0) out.push_back(static_cast<char>(acc));
  }
}

absl::Status DequantizeBlock(std::string_view block, int64_t n, int bits, float* out, std::string_view what,
                             uint64_t first) {
  float s;
  std::memcpy(&s, block.data(), 4);
  if (!std::isfinite(s) || s < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": quantization block at value ", first,
                                                   " has scale ", s, " (must be finite and >= 0)"));
  }
  const uint64_t code_bytes = block.size() - 4;
  const uint64_t used_bits = static_cast<uint64_t>(n) * bits;
  if (used_bits % 8 != 0) {
    const uint8_t last = static_cast<uint8_t>(block[block.size() - 1]);
    if ((last >> (used_bits % 8)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": quantization block at value ", first,
                                                     " has non-zero padding bits"));
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
