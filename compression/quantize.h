// Blockwise quantization of a run of fp32 values to 1, 2, 4 or 8 bits, the QUANT stage of the
// update wire format (compression/codec.h).
//
// Values are cut into blocks of `block_size` (the last may be shorter). Each block is written as
// its scale s (fp32) followed by one code q in [0, 2^bits) per value, packed least significant bit
// first; a block of n values takes 4 + ceil(n * bits / 8) bytes, and the unused high bits of its
// last byte are 0. A code stands for one of 2^bits evenly spaced levels spanning [-s, s]:
//
//   value(q) = -s + q * 2s / (2^bits - 1)          (1 bit: -s or +s)
//
// Encoding picks s and q:
//   stochastic (unbiased): s = max |x| of the block; q rounds (x + s) / step down or up at random
//     with the probabilities that make E[value(q)] = x exactly (QSGD-style, Alistarh et al. 2017);
//   nearest: s = max |x|, q the nearest level; with 1 bit this is the scaled sign instead:
//     s = mean |x| of the block and q = (x >= 0), the compressor of EF-SignSGD (Karimireddy et
//     al. 2019), biased and meant for use with error feedback.
//
// Decoding needs only the bytes, bits and block size. It refuses a scale that is negative or not
// finite and non-zero padding bits, so that every value decodes finite and each input has one
// reading.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "kernels/base/block_quant.h"

namespace fedlora {

// A block's bytes stay well under the 1 MiB body window.
inline constexpr int64_t kMaxQuantBlockSize = kernels::kMaxQuantBlockSize;

struct QuantSpec {
  int bits = 8;              // 1, 2, 4 or 8
  int64_t block_size = 256;  // values per scale, 8 .. kMaxQuantBlockSize, a multiple of 8
  bool stochastic = true;
  // Stochastic rounding draws from core/rng.h stream (seed, stream): the same inputs give the
  // same bytes.
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// InvalidArgument naming the field when bits or block_size is not one the format allows.
absl::Status CheckQuantSpec(int bits, int64_t block_size);

// Bytes of `n` quantized values: ceil(n / block) scales and ceil(bits * values / 8) per block.
uint64_t QuantizedBytes(uint64_t n, int bits, int64_t block_size);
// Bytes of one block of `n` values (n <= block_size).
using kernels::QuantBlockBytes;

// Appends the encoding of x[0, n) to `out`. The values must be finite (EncodeUpdate checks).
// kernels::BlockQuantize on the CPU (kernels/base/block_quant.h), whose CUDA backend writes the same
// bytes.
void QuantizeAppend(const float* x, int64_t n, const QuantSpec& spec, std::string& out);

// Decodes one block of `n` values from `block` (QuantBlockBytes(n, bits) bytes) into out[0, n)
// (out may be null: validate only). InvalidArgument naming `what` and the block's first value
// index `first` for a bad scale or padding.
absl::Status DequantizeBlock(std::string_view block, int64_t n, int bits, float* out,
                             std::string_view what, uint64_t first);

}  // namespace fedlora
