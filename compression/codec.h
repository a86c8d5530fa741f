// The update wire format: a versioned, self-describing encoding of a model update (a list of named
// fp32 tensors): an optional sparsifying stage (top-k, random-k; compression/sparsify.h), an
// element codec (fp32, fp16, bf16, or blockwise quantization to 1/2/4/8 bits;
// compression/quantize.h) and an optional lossless zstd stage.
//
//   CodecOptions opts{.codec = CodecId::kBF16, .zstd = true};
//   FEDLORA_ASSIGN_OR_RETURN(std::string wire, EncodeUpdate(tensors, opts));
//   ...
//   FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> back, DecodeUpdate(wire, DecodeLimits{}));
//
// Layout (all integers little-endian):
//
//   header (40 bytes, kUpdateHeaderSize; 48 in format version 2)
//     [0, 4)   magic "FLU1"
//     [4, 6)   u16 format version: 1 for a dense fp32/fp16/bf16 update, 2 otherwise
//     [6, 7)   u8  codec id (CodecId)
//     [7, 8)   u8  codec version (kCodecVersion for every codec today)
//     [8, 12)  u32 flags (kUpdateFlagZstd; every other bit must be 0)
//     [12, 16) u32 reserved, must be 0
//     [16, 24) u64 element count: total number of values over all tensors
//     [24, 32) u64 raw byte size: size of the body before the zstd stage
//     [32, 40) u64 payload byte size: size of what follows the header (== raw size without zstd)
//     version 2 only:
//     [40, 41) u8  sparsifier (Sparsifier: 0 none, 1 top-k, 2 random-k, 3 low-rank)
//     [41, 42) u8  quantization bits (1, 2, 4, 8 with kQuant; else 0)
//     [42, 44) u16 low-rank rank (1..kMaxLowRank with the low-rank sparsifier; else 0)
//     [44, 48) u32 quantization block size (kQuant: a multiple of 8 up to 65536; else 0)
//   payload: the body, or one zstd frame holding the body (our encoder writes the frame's content
//            size and content checksum; the decoder checks both when present)
//
//   body
//     u32 tensor count
//     per tensor: u16 name length, name bytes (UTF-8, 1..kMaxTensorNameBytes, no NUL),
//                 u8 rank (0..kMaxTensorRank), rank x i64 dims (each >= 0)
//     values: element count x element size (4 for kRawF32, 2 for kF16/kBF16), the tensors'
//             row-major values concatenated in table order
//
//   body, version 2: the tensor count and table as above, then per tensor in table order:
//     with a sparsifier: u64 k, the values that travel (k <= the tensor's element count), then
//       top-k:    u64 index bytes, then that many bytes of gap varints giving k ascending indices
//       random-k: u64 seed; the indices are RandomKIndices(seed, element count, k)
//       low-rank: nothing; k must be LowRankLayoutFor(shape, rank).values (compression/low_rank.h)
//     the k values (all entries without a sparsifier), in the element codec:
//       fp32/fp16/bf16 as in version 1; kQuant as compression/quantize.h (blocks of scale + codes)
//     Entries not kept decode as 0. A factored low-rank tensor's values are P then Q, and it
//     decodes as P Q^T; the factors must bound the product below FLT_MAX / 2 (rank x max|P| x
//     max|Q|), so that no decoded value overflows.
//
// The decoder treats its input as hostile: every size is checked against the input and against
// DecodeLimits before anything is allocated, the zstd stage streams through a bounded window (1 MiB)
// and refuses to produce one byte more than the declared raw size (decompression bombs), and decoded
// values must be finite. When the zstd stage is broken, that is the error reported, even if the
// bytes it produced before the break already made the table or a value invalid. Error codes:
//   DataLoss        - the input ends early (truncated header, payload or body), or the zstd frame is
//                     corrupt / ends early.
//   InvalidArgument - everything else that is malformed: bad magic, unknown format/codec/version or
//                     flags, sizes that disagree with each other or exceed the limits, trailing bytes,
//                     names/shapes inconsistent with the element count, NaN/Inf values.
// Each message names the field and the offending values.
//
// Thread-safety: all functions are thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/low_rank.h"
#include "core/named_tensor.h"

namespace fedlora {

namespace kernels {
class Backend;  // kernels/base/backend.h
}  // namespace kernels

// One named tensor of an update (usually the delta of one adapter parameter): the SDK's NamedTensor
// (core/named_tensor.h), so a trainer's delta is encoded as it is.
using UpdateTensor = NamedTensor;

// Element codecs. The numeric ids are part of the wire format: never renumber.
enum class CodecId : uint8_t {
  kRawF32 = 1,  // IEEE fp32, exact
  kF16 = 2,     // IEEE half, round to nearest even; relative error <= 2^-11 in the normal range
                //   (|x| >= 2^-14), absolute <= 2^-25 below it; |x| must round to <= 65504
  kBF16 = 3,    // bfloat16, round to nearest even; relative error <= 2^-8
  kQuant = 4,   // blockwise quantization (compression/quantize.h); format version 2
};

// Sparsifying stages. The numeric ids are part of the wire format: never renumber.
enum class Sparsifier : uint8_t {
  kNone = 0,
  kTopK = 1,     // the largest-magnitude entries, indices sent as gap varints
  kRandomK = 2,  // entries drawn from a seed that travels instead of the indices
  kLowRank = 3,  // matrices as rank-r factors (compression/low_rank.h)
};

inline constexpr char kUpdateMagic[4] = {'F', 'L', 'U', '1'};
inline constexpr uint16_t kUpdateFormatVersion = 1;   // dense fp32 / fp16 / bf16
inline constexpr uint16_t kUpdateFormatVersion2 = 2;  // a sparsifier or kQuant
inline constexpr uint8_t kCodecVersion = 1;
inline constexpr size_t kUpdateHeaderSize = 40;    // bytes, version 1
inline constexpr size_t kUpdateHeaderSizeV2 = 48;  // bytes, version 2
inline constexpr uint32_t kUpdateFlagZstd = 1u << 0;
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr int kMaxTensorRank = 8;
inline constexpr int64_t kMaxLowRank = 4096;

// The codec stages' parameters unless a run config's stage sets them (config.proto's TopKParams,
// RandomKParams, LowRankParams, QuantParams, ZstdParams), and CodecOptions' own defaults.
inline constexpr double kDefaultSparsifyFraction = 0.01;
inline constexpr int64_t kDefaultLowRank = 4;
inline constexpr int kDefaultQuantBits = 8;
inline constexpr int64_t kDefaultQuantBlockSize = 256;
inline constexpr bool kDefaultQuantStochastic = true;
inline constexpr int kDefaultZstdLevel = 3;

// "fp32", "fp16", "bf16", "quant".
std::string_view CodecName(CodecId codec);
// "none", "top-k", "random-k", "low-rank".
std::string_view SparsifierName(Sparsifier sparsifier);
// Inverse of CodecName; also accepts "f32"/"f16" spellings. InvalidArgument naming the text.
absl::StatusOr<CodecId> ParseCodecName(std::string_view name);
// Bytes per encoded element: 4 for kRawF32, 2 for kF16 and kBF16 (kQuant has no fixed size: 0).
size_t CodecElementSize(CodecId codec);

struct CodecOptions {
  // Which entries travel: all, or fraction of them (per tensor; with global_top_k, of the whole
  // update, so that a tensor may keep more or fewer than its share). KeptCount gives k.
  Sparsifier sparsifier = Sparsifier::kNone;
  double fraction = kDefaultSparsifyFraction;
  bool global_top_k = false;
  // kLowRank: the factors' rank (1..kMaxLowRank), and the warm start it reads and updates (each
  // factored tensor's Q; may be null: Q0 is then drawn from `seed`).
  int64_t low_rank = kDefaultLowRank;
  LowRankWarmStart* warm_start = nullptr;
  CodecId codec = CodecId::kRawF32;
  // kQuant: bits per value, values per scale, stochastic (unbiased) or nearest rounding.
  int quant_bits = kDefaultQuantBits;
  int64_t quant_block_size = kDefaultQuantBlockSize;
  bool quant_stochastic = kDefaultQuantStochastic;
  // Random-k indices and stochastic rounding draw from this seed (the same seed gives the same
  // bytes); a client passes a value derived from its task's seed.
  uint64_t seed = 0;
  // Follow the element codec with a lossless zstd stage. Pays off for sparse or low-entropy
  // updates; dense fp32 noise compresses by only a few percent.
  bool zstd = false;
  // zstd compression level (1..19 are sensible; 3 is zstd's default: ~300 MB/s on one core).
  int zstd_level = kDefaultZstdLevel;
  // Whether the client keeps what the lossy stages did not send and adds it to its next update
  // (compression/error_feedback.h). Not part of the wire format; EncodeUpdate ignores it.
  bool error_feedback = false;

  // The stages the receiver can see on the wire, compared by a server enforcing its run's codec.
  bool SameWireFormat(const CodecOptions& o) const {
    return sparsifier == o.sparsifier && codec == o.codec && zstd == o.zstd &&
           (codec != CodecId::kQuant ||
            (quant_bits == o.quant_bits && quant_block_size == o.quant_block_size)) &&
           (sparsifier != Sparsifier::kLowRank || low_rank == o.low_rank);
  }
  // What the format writes ("top-k 1% + quant 8 bit/256 + zstd"), for messages and reports.
  std::string Describe() const;
};

// Hard caps the decoder enforces before allocating. The defaults fit a LoRA update of a 7B-class
// decoder at rank 64 (~160M values) with room to spare; servers should set them from the run's
// adapter size (exact element count plus a small slack).
struct DecodeLimits {
  int64_t max_elements = int64_t{1} << 28;       // total values over all tensors (268M)
  int64_t max_decoded_bytes = int64_t{2} << 30;  // raw body bytes (2 GiB), also the bomb cap
  int64_t max_tensors = 1 << 16;                 // entries in the tensor table
};

// The parsed fixed header (no payload checks beyond the header's own consistency).
struct UpdateHeader {
  uint16_t format_version = 0;
  CodecId codec = CodecId::kRawF32;
  uint8_t codec_version = 0;
  uint32_t flags = 0;
  uint64_t element_count = 0;
  uint64_t raw_bytes = 0;
  uint64_t payload_bytes = 0;
  // Version 2 fields (kNone / 0 in version 1).
  Sparsifier sparsifier = Sparsifier::kNone;
  int quant_bits = 0;
  int64_t quant_block_size = 0;
  int64_t low_rank = 0;
  bool zstd() const { return (flags & kUpdateFlagZstd) != 0; }
  size_t header_bytes() const {
    return format_version == kUpdateFormatVersion ? kUpdateHeaderSize : kUpdateHeaderSizeV2;
  }
  // The wire-visible options this header stands for (fraction, seed and error feedback unset).
  CodecOptions options() const;
};

// Encodes `tensors` (in the given order). InvalidArgument when a tensor's values do not match its
// shape, a name is empty/too long/has a NUL or repeats, a rank exceeds kMaxTensorRank, a value is
// NaN/Inf, a value overflows the chosen codec (|x| > 65504 for fp16), or an option is out of range
// (fraction not in (0, 1], quantization bits or block size); Internal on a zstd failure.
absl::StatusOr<std::string> EncodeUpdate(const std::vector<UpdateTensor>& tensors,
                                         const CodecOptions& options);

// EncodeUpdate with the value-dependent stages on `backend`'s device: top-k selection (per tensor
// or global, kernels/base/topk.h) and quantization (kernels/base/block_quant.h) run there, and the bytes are
// EncodeUpdate's bit for bit. What works on the seed or on bytes the host holds stays on the host:
// random-k indices, the fp32/fp16/bf16 element formats, zstd. The low-rank stage has no device
// path: Unimplemented on CUDA. A null or CPU backend is EncodeUpdate(tensors, options).
absl::StatusOr<std::string> EncodeUpdate(const std::vector<UpdateTensor>& tensors,
                                         const CodecOptions& options, kernels::Backend* backend);

// Parses and validates only the header (40 or 48 bytes) against `limits` (cheap; lets a server reject an
// upload early from its first chunk). Errors as DecodeUpdate.
absl::StatusOr<UpdateHeader> ParseUpdateHeader(std::string_view encoded,
                                               const DecodeLimits& limits);

// Decodes and validates a whole encoded update. Errors as described at the top of this file.
// Memory: the decoded values plus, with zstd, a 1 MiB window and zstd's history window.
absl::StatusOr<std::vector<UpdateTensor>> DecodeUpdate(std::string_view encoded,
                                                       const DecodeLimits& limits);

// One tensor of a decoded update holding only the entries that travelled: a top-k or random-k
// tensor's kept values and their ascending positions, else (`dense`) all product(shape) values.
// Entries not kept are 0. Aggregation adds it without expanding it (StreamingFedAvg::Add).
struct KeptTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool dense = true;
  std::vector<int64_t> indices;  // !dense: one per value, strictly ascending, < product(shape)
  std::vector<float> values;
};

// DecodeUpdate without expanding the sparsified tensors: the same checks and errors, and each
// tensor's values equal DecodeUpdate's at its kept positions (low-rank tensors come back dense).
// Memory: the kept values plus 8 bytes of index per kept value, instead of the dense update.
absl::StatusOr<std::vector<KeptTensor>> DecodeUpdateKept(std::string_view encoded,
                                                         const DecodeLimits& limits);

// Name and shape of one tensor of an encoded update, as ValidateUpdate reports it.
struct UpdateTensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t kept = 0;  // values that travel: the element count without a sparsifier, else k
};

// Checks everything DecodeUpdate checks, with the same result (OK, or the same error code and
// message), without materialising the values: a raw payload is checked in place, a zstd payload is
// streamed through the 1 MiB window. Returns the tensor table in wire order. Memory: the table, plus
// with zstd the window and zstd's history window (<= 128 MiB for a hostile frame, 2 MiB for ours),
// independent of the update's size. Lets a server accept an upload without a second copy of it.
//
// `consumed`, when set, is told as validation proceeds (reports at most 8 MiB of input apart, and
// one at the end) that the first `bytes` bytes of `encoded` will not be read again; `bytes` only
// grows. A caller validating a mapped file can drop those pages (madvise MADV_DONTNEED) so that the
// file never counts in its RSS all at once.
absl::StatusOr<std::vector<UpdateTensorInfo>> ValidateUpdate(
    std::string_view encoded, const DecodeLimits& limits,
    const std::function<void(uint64_t bytes)>& consumed = {});

}  // namespace fedlora
