#include "core/ggml_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "core/strings.h"
#include "core/tensor.h"

// Exactness against ggml's reference and gguf-py needs q * d + m rounded twice, never fused: keep
// the compiler from contracting to FMA even when the target has it (-march=native builds).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace fedlora {
namespace {

struct TypeInfo {
  GgmlType type;
  std::string_view name;
  int64_t block_size;  // 0: not supported
  int64_t block_bytes;
};

// Indexed by the type's number; 4 and 5 (removed from ggml) have no name.
constexpr TypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},
    {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", kGgmlQK, sizeof(BlockQ4_0)},
    {GgmlType::kQ4_1, "Q4_1", kGgmlQK, sizeof(BlockQ4_1)},
    {static_cast<GgmlType>(4), "", 0, 0},
    {static_cast<GgmlType>(5), "", 0, 0},
    {GgmlType::kQ5_0, "Q5_0", kGgmlQK, sizeof(BlockQ5_0)},
    {GgmlType::kQ5_1, "Q5_1", kGgmlQK, sizeof(BlockQ5_1)},
    {GgmlType::kQ8_0, "Q8_0", kGgmlQK, sizeof(BlockQ8_0)},
    {GgmlType::kQ8_1, "Q8_1", 0, 0},
    {GgmlType::kQ2_K, "Q2_K", 0, 0},
    {GgmlType::kQ3_K, "Q3_K", 0, 0},
    {GgmlType::kQ4_K, "Q4_K", kGgmlQK_K, sizeof(BlockQ4_K)},
    {GgmlType::kQ5_K, "Q5_K", kGgmlQK_K, sizeof(BlockQ5_K)},
    {GgmlType::kQ6_K, "Q6_K", kGgmlQK_K, sizeof(BlockQ6_K)},
    {GgmlType::kQ8_K, "Q8_K", 0, 0},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", 0, 0},
    {GgmlType::kIQ2_XS, "IQ2_XS", 0, 0},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", 0, 0},
    {GgmlType::kIQ1_S, "IQ1_S", 0, 0},
    {GgmlType::kIQ4_NL, "IQ4_NL", 0, 0},
    {GgmlType::kIQ3_S, "IQ3_S", 0, 0},
    {GgmlType::kIQ2_S, "IQ2_S", 0, 0},
    {GgmlType::kIQ4_XS, "IQ4_XS", 0, 0},
    {GgmlType::kI8, "I8", 0, 0},
    {GgmlType::kI16, "I16", 0, 0},
    {GgmlType::kI32, "I32", 0, 0},
    {GgmlType::kI64, "I64", 0, 0},
    {GgmlType::kF64, "F64", 0, 0},
    {GgmlType::kIQ1_M, "IQ1_M", 0, 0},
    {GgmlType::kBF16, "BF16", 1, 2},
    {GgmlType::kQ4_0_4_4, "Q4_0_4_4", 0, 0},
    {GgmlType::kQ4_0_4_8, "Q4_0_4_8", 0, 0},
    {GgmlType::kQ4_0_8_8, "Q4_0_8_8", 0, 0},
    {GgmlType::kTQ1_0, "TQ1_0", 0, 0},
    {GgmlType::kTQ2_0, "TQ2_0", 0, 0},
};

constexpr bool TableIsIndexed() {
  for (size_t i = 0; i < std::size(kTypes); ++i) {
    if (static_cast<size_t>(kTypes[i].type) != i) return false;
  }
  return true;
}
static_assert(TableIsIndexed());

const TypeInfo* Find(GgmlType type) {
  const uint32_t i = static_cast<uint32_t>(type);
  if (i >= std::size(kTypes) || kTypes[i].name.empty()) return nullptr;
  return &kTypes[i];
}

template <class Block>
Block LoadBlock(const uint8_t* p) {
  Block b;
  std::memcpy(&b, p, sizeof(Block));
  return b;
}

// Each Dequantize* reads nb blocks at x and writes their elements to y (F32/F16/BF16 blocks are one
// element).

void DequantizeF32(const uint8_t* x, int64_t n, float* y) {
  std::memcpy(y, x, static_cast<size_t>(n) * 4);
}

// F16 / BF16: through an aligned buffer, since the source need not be 2-byte aligned.
template <float (*Convert)(uint16_t)>
void DequantizeHalf(const uint8_t* x, int64_t n, float* y) {
  constexpr int64_t kChunk = 256;
  uint16_t buf[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t k = std::min(kChunk, n - i);
    std::memcpy(buf, x + 2 * i, static_cast<size_t>(k) * 2);
    for (int64_t j = 0; j < k; ++j) y[i + j] = Convert(buf[j]);
  }
}

void DequantizeQ4_0(const uint8_t* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kGgmlQK) {
    const auto b = LoadBlock<BlockQ4_0>(x + i * sizeof(BlockQ4_0));
    const float d = F16ToF32(b.d);
    for (int j = 0; j < kGgmlQK / 2; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0x0F) - 8) * d;
      y[j + kGgmlQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantizeQ4_1(const uint8_t* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kGgmlQK) {
    const auto b = LoadBlock<BlockQ4_1>(x + i * sizeof(BlockQ4_1));
    const float d = F16ToF32(b.d), m = F16ToF32(b.m);
    for (int j = 0; j < kGgmlQK / 2; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0x0F) * d + m;
      y[j + kGgmlQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // GGUF is little-endian, as is every host we build for
  return v;
}

void DequantizeQ5_0(const uint8_t* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kGgmlQK) {
    const auto b = LoadBlock<BlockQ5_0>(x + i * sizeof(BlockQ5_0));
    const float d = F16ToF32(b.d);
    const uint32_t qh = LoadU32(b.qh);
    for (int j = 0; j < kGgmlQK / 2; ++j) {
      const int lo = (b.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + kGgmlQK / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void DequantizeQ5_1(const uint8_t* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kGgmlQK) {
    const auto b = LoadBlock<BlockQ5_1>(x + i * sizeof(BlockQ5_1));
    const float d = F16ToF32(b.d), m = F16ToF32(b.m);
    const uint32_t qh = LoadU32(b.qh);
    for (int j = 0; j < kGgmlQK / 2; ++j) {
      const int lo = (b.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + kGgmlQK / 2] = static_cast<float>(hi) * d + m;
    }
  }
}

void DequantizeQ8_0(const uint8_t* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kGgmlQK) {
    const auto b = LoadBlock<BlockQ8_0>(x + i * sizeof(BlockQ8_0));
    const float d = F16ToF32(b.d);
    for (int j = 0; j < kGgmlQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block. Sub-blocks 0-3 keep
// them in the low 6 bits of bytes j and j + 4; sub-blocks 4-7 in the nibbles of byte j + 4 with
// the top two bits taken from bytes j - 4 and j.
void ScaleMinK4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void DequantizeQ4_K(const uint8_t* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ4_K>(x + i * sizeof(BlockQ4_K));
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    for (int c = 0; c < 4; ++c, y += 64) {
      int sc0, m0, sc1, m1;
      ScaleMinK4(2 * c, b.scales, &sc0, &m0);
      ScaleMinK4(2 * c + 1, b.scales, &sc1, &m1);
      const float d0 = d * static_cast<float>(sc0), min0 = dmin * static_cast<float>(m0);
      const float d1 = d * static_cast<float>(sc1), min1 = dmin * static_cast<float>(m1);
      const uint8_t* q = b.qs + 32 * c;
      for (int l = 0; l < 32; ++l) y[l] = d0 * static_cast<float>(q[l] & 0x0F) - min0;
      for (int l = 0; l < 32; ++l) y[32 + l] = d1 * static_cast<float>(q[l] >> 4) - min1;
    }
  }
}

void DequantizeQ5_K(const uint8_t* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ5_K>(x + i * sizeof(BlockQ5_K));
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    for (int c = 0; c < 4; ++c, y += 64) {
      int sc0, m0, sc1, m1;
      ScaleMinK4(2 * c, b.scales, &sc0, &m0);
      ScaleMinK4(2 * c + 1, b.scales, &sc1, &m1);
      const float d0 = d * static_cast<float>(sc0), min0 = dmin * static_cast<float>(m0);
      const float d1 = d * static_cast<float>(sc1), min1 = dmin * static_cast<float>(m1);
      const uint8_t* q = b.qs + 32 * c;
      const int s0 = 2 * c, s1 = 2 * c + 1;  // the qh bit of each sub-block
      for (int l = 0; l < 32; ++l) {
        y[l] = d0 * static_cast<float>((q[l] & 0x0F) | (((b.qh[l] >> s0) & 1) << 4)) - min0;
      }
      for (int l = 0; l < 32; ++l) {
        y[32 + l] = d1 * static_cast<float>((q[l] >> 4) | (((b.qh[l] >> s1) & 1) << 4)) - min1;
      }
    }
  }
}

void DequantizeQ6_K(const uint8_t* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ6_K>(x + i * sizeof(BlockQ6_K));
    const float d = F16ToF32(b.d);
    // Two halves of 128 elements; in each, 32-element group g takes the low (g = 0, 1) or high
    // (g = 2, 3) nibbles of ql[64h + 32(g % 2) + l] and bits 2g..2g+1 of qh[32h + l].
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = b.ql + 64 * h;
      const uint8_t* qh = b.qh + 32 * h;
      for (int g = 0; g < 4; ++g) {
        const uint8_t* lo = ql + 32 * (g % 2);
        const int shift = g < 2 ? 0 : 4;
        for (int l = 0; l < 32; ++l) {
          const int q = (((lo[l] >> shift) & 0x0F) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
          const int e = 128 * h + 32 * g + l;  // element within the super-block
          const float scale = d * static_cast<float>(b.scales[e / 16]);
          y[32 * g + l] = scale * static_cast<float>(q);
        }
      }
    }
  }
}

absl::Status Unsupported(GgmlType type) {
  const std::string_view name = GgmlTypeName(type);
  return absl::UnimplementedError(absl::StrCat(
      "ggml type ", name.empty() ? "unknown" : ToAbsl(name), " (", static_cast<uint32_t>(type),
      ") is not supported; supported types: ", ToAbsl(SupportedGgmlTypeNames())));
}

}  // namespace

std::string_view GgmlTypeName(GgmlType type) {
  const TypeInfo* t = Find(type);
  return t == nullptr ? std::string_view() : t->name;
}

bool GgmlTypeSupported(GgmlType type) {
  const TypeInfo* t = Find(type);
  return t != nullptr && t->block_size > 0;
}

std::string_view SupportedGgmlTypeNames() {
  return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";
}

int64_t GgmlBlockSize(GgmlType type) {
  const TypeInfo* t = Find(type);
  return t == nullptr ? 0 : t->block_size;
}

int64_t GgmlBlockBytes(GgmlType type) {
  const TypeInfo* t = Find(type);
  return t == nullptr ? 0 : t->block_bytes;
}

absl::StatusOr<int64_t> GgmlRowBytes(GgmlType type, int64_t n) {
  if (!GgmlTypeSupported(type)) return Unsupported(type);
  const int64_t block = GgmlBlockSize(type);
  if (n < 0 || n % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", ToAbsl(GgmlTypeName(type)), " row of ", n,
                     " elements: must be a non-negative multiple of the block size ", block));
  }
  int64_t bytes;
  if (__builtin_mul_overflow(n / block, GgmlBlockBytes(type), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("a ", ToAbsl(GgmlTypeName(type)), " row of ", n,
                                                   " elements: byte size overflows int64"));
  }
  return bytes;
}

absl::Status DequantizeRow(GgmlType type, const uint8_t* src, int64_t n, float* dst) {
  return DequantizeRows(type, src, 1, n, dst, n);
}

absl::Status DequantizeRows(GgmlType type, const uint8_t* src, int64_t rows, int64_t n, float* dst,
                            int64_t dst_stride) {
  auto row_bytes = GgmlRowBytes(type, n);
  if (!row_bytes.ok()) return row_bytes.status();
  if (rows < 0)
    return absl::InvalidArgumentError(absl::StrCat("DequantizeRows: negative row count ", rows));
  if (dst_stride < n) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeRows: dst_stride ", dst_stride,
                                                   " is less than the row length ", n));
  }
  if (n == 0) return absl::OkStatus();
  const int64_t nb = n / GgmlBlockSize(type);
  void (*row)(const uint8_t*, int64_t, float*) = nullptr;  // (src, blocks, dst)
  switch (type) {
    case GgmlType::kF32:
      row = DequantizeF32;
      break;
    case GgmlType::kF16:
      row = DequantizeHalf<F16ToF32>;
      break;
    case GgmlType::kBF16:
      row = DequantizeHalf<BF16ToF32>;
      break;
    case GgmlType::kQ4_0:
      row = DequantizeQ4_0;
      break;
    case GgmlType::kQ4_1:
      row = DequantizeQ4_1;
      break;
    case GgmlType::kQ5_0:
      row = DequantizeQ5_0;
      break;
    case GgmlType::kQ5_1:
      row = DequantizeQ5_1;
      break;
    case GgmlType::kQ8_0:
      row = DequantizeQ8_0;
      break;
    case GgmlType::kQ4_K:
      row = DequantizeQ4_K;
      break;
    case GgmlType::kQ5_K:
      row = DequantizeQ5_K;
      break;
    case GgmlType::kQ6_K:
      row = DequantizeQ6_K;
      break;
    default:
      return Unsupported(type);  // unreachable: GgmlRowBytes checked the type
  }
  for (int64_t r = 0; r < rows; ++r) row(src + r * *row_bytes, nb, dst + r * dst_stride);
  return absl::OkStatus();
}

absl::Status QuantizeRowsQ8_0(const float* src, int64_t rows, int64_t n, uint8_t* dst) {
  if (n <= 0 || n % kGgmlQK != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeRowsQ8_0: row length ", n, " is not a positive multiple of 32"));
  }
  if (rows < 0)
    return absl::InvalidArgumentError(absl::StrCat("QuantizeRowsQ8_0: negative row count ", rows));
  BlockQ8_0* out = reinterpret_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < rows * (n / kGgmlQK); ++b) {
    const float* x = src + b * kGgmlQK;
    float amax = 0.0f;
    for (int i = 0; i < kGgmlQK; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 blk;
    blk.d = F32ToF16(d);
    for (int i = 0; i < kGgmlQK; ++i) blk.qs[i] = static_cast<int8_t>(std::lround(x[i] * id));
    std::memcpy(out + b, &blk, sizeof(blk));
  }
  return absl::OkStatus();
}

}  // namespace fedlora
