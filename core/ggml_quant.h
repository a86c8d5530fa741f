// ggml's tensor element types (the ones GGUF files store) and dequantization of their rows to fp32.
//
//   // A Q4_1 row of 576 elements is 18 blocks of 20 bytes.
//   FEDLORA_ASSIGN_OR_RETURN(int64_t row_bytes, GgmlRowBytes(GgmlType::kQ4_1, 576));  // 360
//   std::vector<float> row(576);
//   FEDLORA_RETURN_IF_ERROR(DequantizeRow(GgmlType::kQ4_1, src, 576, row.data()));
//   // A panel of 16 rows into a 16 x 576 fp32 buffer:
//   FEDLORA_RETURN_IF_ERROR(DequantizeRows(GgmlType::kQ4_1, src, 16, 576, panel.data(), 576));
//
// Quantized types group the elements of a row (ggml's ne[0]) into blocks that each carry their own
// scale: 32 elements for the classic formats, 256 for the K-quants. A row is a whole number of
// blocks and is stored as its blocks one after another; the Block* structs below are the byte
// layouts (little-endian, no padding; fp16 fields are raw IEEE half bits). Source bytes need no
// alignment (they are read with memcpy). Values are those of ggml's reference dequantize_row_*
// (ggml-quants.c) evaluated in fp32 with each multiply and add rounded on its own (no fused
// multiply-add, whatever the target), which is what gguf-py's gguf.quants.dequantize computes;
// tests/core/gguf_reference_test.py checks every supported type against it bit for bit.
//
// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K. Every other ggml
// type (Q8_1, Q2_K, Q3_K, Q8_K, the IQ*, TQ* and integer types, ...) is named by GgmlTypeName but
// refused by GgmlRowBytes and the dequantizers (Unimplemented), and by GgufFile::Open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora {

// The numbers are ggml's enum ggml_type (gguf-py's GGMLQuantizationType); 4 and 5 were removed.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kQ4_0_4_4 = 31,
  kQ4_0_4_8 = 32,
  kQ4_0_8_8 = 33,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
};

// ggml's spelling ("Q4_K", "BF16"), or "" for a number ggml has no type for.
std::string_view GgmlTypeName(GgmlType type);
// True for the types DequantizeRow handles (the list above).
bool GgmlTypeSupported(GgmlType type);
// "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K", for error messages.
std::string_view SupportedGgmlTypeNames();
// Elements per block and bytes per block of a supported type (1 and the element size for F32,
// F16, BF16); 0 for any other type.
int64_t GgmlBlockSize(GgmlType type);
int64_t GgmlBlockBytes(GgmlType type);
// Bytes of a row of n elements. Unimplemented for an unsupported type; InvalidArgument when n is
// negative or not a multiple of the block size, or the byte count overflows int64.
absl::StatusOr<int64_t> GgmlRowBytes(GgmlType type, int64_t n);

// Dequantizes one row of n elements (GgmlRowBytes(type, n) bytes at src) into dst[0, n). The
// errors are GgmlRowBytes's; nothing is written on error.
absl::Status DequantizeRow(GgmlType type, const uint8_t* src, int64_t n, float* dst);
// `rows` consecutive rows of n elements (row r at src + r * GgmlRowBytes(type, n)) into
// dst + r * dst_stride. InvalidArgument also for negative rows or dst_stride < n.
absl::Status DequantizeRows(GgmlType type, const uint8_t* src, int64_t rows, int64_t n, float* dst,
                            int64_t dst_stride);

// Quantizes `rows` rows of n floats (row r at src + r * n) to Q8_0 as ggml's reference does: per
// block of 32, d = max|x| / 127 (stored as fp16), q = round-half-away(x / d) (0 for an all-zero
// block). InvalidArgument when n is not a positive multiple of 32 or rows is negative; dst holds
// rows * GgmlRowBytes(kQ8_0, n) bytes.
absl::Status QuantizeRowsQ8_0(const float* src, int64_t rows, int64_t n, uint8_t* dst);

// --- Block layouts ----------------------------------------------------------------------------
// qs nibbles: byte j holds element j in its low nibble and element j + 16 (classic formats) in its
// high nibble. qh (Q5_0, Q5_1): bit i is the fifth bit of element i.

inline constexpr int kGgmlQK = 32;     // elements per block, classic formats
inline constexpr int kGgmlQK_K = 256;  // elements per super-block, K-quants

struct BlockQ4_0 {  // value = (q - 8) * d
  uint16_t d;
  uint8_t qs[kGgmlQK / 2];
};
struct BlockQ4_1 {  // value = q * d + m
  uint16_t d;
  uint16_t m;
  uint8_t qs[kGgmlQK / 2];
};
struct BlockQ5_0 {  // value = (q - 16) * d, q = nibble | qh bit << 4
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kGgmlQK / 2];
};
struct BlockQ5_1 {  // value = q * d + m
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kGgmlQK / 2];
};
struct BlockQ8_0 {  // value = q * d
  uint16_t d;
  int8_t qs[kGgmlQK];
};
// K-quants: a super-block of 256 elements in sub-blocks with 6-bit scales and mins (Q4_K, Q5_K:
// 8 sub-blocks of 32, value = d * scale * q - dmin * min) or 8-bit signed scales (Q6_K: 16
// sub-blocks of 16, value = d * scale * (q - 32)). In Q4_K/Q5_K, 64-element chunk c takes the low
// nibbles of qs[32c, 32c + 32) for sub-block 2c and the high nibbles for sub-block 2c + 1.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // 8 scales and 8 mins of 6 bits each
  uint8_t qs[kGgmlQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kGgmlQK_K / 8];  // bit s of qh[l]: fifth bit of element l of sub-block s
  uint8_t qs[kGgmlQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kGgmlQK_K / 2];  // low 4 bits
  uint8_t qh[kGgmlQK_K / 4];  // high 2 bits
  int8_t scales[kGgmlQK_K / 16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

}  // namespace fedlora
