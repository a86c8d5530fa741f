// Blockwise quantization to 1, 2, 4 or 8 bits: writes exactly the bytes of the update wire
// format's QUANT stage (compression/quantize.h describes the format and the rounding modes; its
// QuantizeAppend runs this kernel's CPU backend). Per block of block_size values (the last may be
// shorter): the fp32 scale s, then one code per value packed least significant bit first.
//
// The per-value arithmetic below is shared by both backends (core/host_device.h), in double, so
// the CUDA bytes are the CPU's bit for bit. Stochastic rounding draws from core/rng.h's stream
// (seed, stream) in value order, one word per value that can round up (a code below the top with
// s > 0): the draw of value i is word D(i) of the stream, D(i) = the number of such values before
// i. The CPU reads the stream sequentially; CUDA computes D by a device-wide exclusive scan
// (CUB) and reads U32At(seed, stream, D(i)) directly. The scaled sign (1 bit, nearest) sums the
// block's |x| in double in index order: on CUDA one thread per block does that sum, so that it
// rounds as the CPU's; every other pass is parallel over values or bytes.
//
// Workspace (BlockQuantizeWorkspaceBytes): 0 on the CPU; on CUDA the scales, and for stochastic
// rounding 8 bytes per value and CUB's scan scratch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/host_device.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

inline constexpr int64_t kMaxQuantBlockSize = 65536;

struct BlockQuantizeArgs {
  int64_t n = 0;
  const float* x = nullptr;  // [n], finite
  int bits = 8;              // 1, 2, 4 or 8
  int64_t block_size = 256;  // a multiple of 8 in [8, kMaxQuantBlockSize]
  bool stochastic = true;
  uint64_t seed = 0;  // stochastic rounding: core/rng.h stream (seed, stream)
  uint64_t stream = 0;
  uint8_t* out = nullptr;     // [BlockQuantizedBytes(n, bits, block_size)]
  void* workspace = nullptr;  // BlockQuantizeWorkspaceBytes(ctx, args) bytes on ctx.device
  size_t workspace_bytes = 0;
};

// Bytes of one block of m values, and of n values in blocks of block_size.
FEDLORA_HOST_DEVICE inline uint64_t QuantBlockBytes(uint64_t m, int bits) {
  return 4 + (m * static_cast<uint64_t>(bits) + 7) / 8;
}
inline uint64_t BlockQuantizedBytes(uint64_t n, int bits, int64_t block_size) {
  const uint64_t block = static_cast<uint64_t>(block_size);
  const uint64_t full = n / block, rest = n % block;
  return full * QuantBlockBytes(block, bits) + (rest > 0 ? QuantBlockBytes(rest, bits) : 0);
}

// The scaled sign: 1 bit with nearest rounding.
FEDLORA_HOST_DEVICE inline bool QuantSignMode(int bits, bool stochastic) {
  return bits == 1 && !stochastic;
}

// The scale of the sign mode: mean |x| of the block, summed in double in index order.
FEDLORA_HOST_DEVICE inline float QuantMeanAbs(const float* v, int64_t m) {
  double sum = 0.0;
  for (int64_t i = 0; i < m; ++i) sum += fabsf(v[i]);
  return static_cast<float>(sum / static_cast<double>(m));
}

// 1 / step of a block: t = (x + s) * inv_step in [0, top] is a value's position between levels. In
// double, so that a subnormal or huge scale gives a finite 1 / step.
FEDLORA_HOST_DEVICE inline double QuantInvStep(float s, uint32_t top) {
  return s > 0.0f ? top / (2.0 * static_cast<double>(s)) : 0.0;
}

// A value's code rounded down, and how far it is towards the next one (in [0, 1)).
struct QuantPosition {
  uint32_t q;
  float frac;
};
FEDLORA_HOST_DEVICE inline QuantPosition QuantPositionOf(float v, float s, double inv_step,
                                                         uint32_t top) {
  double t = (static_cast<double>(v) + s) * inv_step;
  const double dtop = top;
  t = t < 0.0 ? 0.0 : (t > dtop ? dtop : t);
  const uint32_t q = static_cast<uint32_t>(t);  // floor: t >= 0
  return QuantPosition{q, static_cast<float>(t - q)};
}

// Whether value v of a block with scale s takes a random draw (stochastic rounding only).
FEDLORA_HOST_DEVICE inline bool QuantDraws(float v, float s, double inv_step, uint32_t top) {
  return s > 0.0f && QuantPositionOf(v, s, inv_step, top).q < top;
}

// The code of v. `uniform` is the value's draw (read only when stochastic and QuantDraws).
FEDLORA_HOST_DEVICE inline uint32_t QuantCode(float v, float s, double inv_step, uint32_t top,
                                              bool sign_mode, bool stochastic, float uniform) {
  if (sign_mode) return v >= 0.0f ? 1u : 0u;
  if (!(s > 0.0f)) return 0u;
  QuantPosition p = QuantPositionOf(v, s, inv_step, top);
  if (stochastic) {
    // P(up) = frac, so E[value] = x up to float rounding and the 2^-24 grid of the draw.
    if (p.q < top && uniform < p.frac) ++p.q;
  } else if (p.frac >= 0.5f && p.q < top) {
    ++p.q;
  }
  return p.q;
}

// Workspace BlockQuantize needs on ctx.device. CUDA asks CUB (errors as a CUDA failure).
absl::StatusOr<size_t> BlockQuantizeWorkspaceBytes(const ExecContext& ctx,
                                                   const BlockQuantizeArgs& args);

absl::Status CanRun(const ExecContext& ctx, const BlockQuantizeArgs& args);
absl::Status BlockQuantize(const ExecContext& ctx, const BlockQuantizeArgs& args);

namespace internal {
absl::StatusOr<size_t> BlockQuantizeWorkspaceBytesCuda(const ExecContext& ctx,
                                                       const BlockQuantizeArgs& args);
absl::Status BlockQuantizeCuda(const ExecContext& ctx, const BlockQuantizeArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
