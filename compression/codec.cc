#include "compression/codec.h"

#include <zstd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/tensor.h"

namespace fedlora {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the update wire format is little-endian; add byte swapping for big-endian hosts");

// Largest zstd window (back-reference distance, allocated by the decoder) a frame may ask for:
// 2^27 = 128 MiB, zstd's own default limit and what levels <= 19 use at most. Stated explicitly so
// a hostile frame cannot make the decoder allocate more whatever the library default becomes.
constexpr int kMaxZstdWindowLog = 27;

// Smallest tensor-table entry: 2 (name length)
// + 1 (name) + 1 (rank). Used to refuse tensor counts that cannot fit before reserving memory.
constexpr uint64_t kMinTableEntryBytes = 4;

void PutU8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }
void PutU16(std::string& out, uint16_t v) { out.append(reinterpret_cast<const char*>(&v), 2); }
void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

template <class T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Sequential bounds-checked reader over the decoded body. Running past the end means the tensor
// table disagrees with the declared body size: InvalidArgument (the body itself is complete; the
// payload length was already checked).
class BodyReader {
 public:
  explicit BodyReader(std::string_view body) : body_(body) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return body_.size() - pos_; }

  template <class T>
  absl::StatusOr<T> Read(std::string_view what) {
    if (remaining() < sizeof(T)) return PastEnd(what, sizeof(T));
    T v = Load<T>(body_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<std::string_view> ReadBytes(size_t n, std::string_view what) {
    if (remaining() < n) return PastEnd(what, n);
    std::string_view v = body_.substr(pos_, n);
    pos_ += n;
    return v;
  }

 private:
  absl::Status PastEnd(std::string_view what, size_t need) const {
    return absl::InvalidArgumentError(absl::StrCat("update body: ", ToAbsl(what), " at offset ", pos_, " needs ", need,
                                                   " bytes but only ", remaining(), " remain of the declared raw size ",
                                                   body_.size()));
  }

  std::string_view body_;
  size_t pos_ = 0;
};

bool IsFiniteHalfBits(uint16_t bits, CodecId codec) {
  // Inf/NaN have an all-ones exponent: 5 bits (0x7C00) for fp16, 8 bits (0x7F80) for bf16.
  const uint16_t exp_mask = codec == CodecId::kF16 ? 0x7C00 : 0x7F80;
  return (bits & exp_mask) != exp_mask;
}

absl::Status ValidateTensorsForEncode(const std::vector<UpdateTensor>& tensors, uint64_t& element_count) {
  if (tensors.empty()) return absl::InvalidArgumentError("EncodeUpdate: update has no tensors");
  if (tensors.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: ", tensors.size(), " tensors is too many"));
  }
  absl::flat_hash_set<std::string_view> names;
  element_count = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const UpdateTensor& tensor = tensors[t];
    if (tensor.name.empty() || tensor.name.size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor ", t, " name length ", tensor.name.size(),
                                                     " is not in [1, ", kMaxTensorNameBytes, "]"));
    }
    if (tensor.name.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor ", t, " name contains a NUL byte"));
    }
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: duplicate tensor name '", tensor.name, "'"));
    }
    if (tensor.shape.size() > static_cast<size_t>(kMaxTensorRank)) {
      return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor '", tensor.name, "' has rank ",
                                                     tensor.shape.size(), " > ", kMaxTensorRank));
    }
    auto numel = CheckedNumel(tensor.shape);
    if (!numel.ok()) return Annotate(numel.status(), absl::StrCat("EncodeUpdate: tensor '", tensor.name, "'"));
    if (static_cast<uint64_t>(*numel) != tensor.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor '", tensor.name, "' has ",
                                                     tensor.values.size(), " values but its shape holds ", *numel));
    }
    for (size_t i = 0; i < tensor.values.size(); ++i) {
      if (!std::isfinite(tensor.values[i])) {
        return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor '", tensor.name, "' value ", i,
                                                       " is not finite (", tensor.values[i], ")"));
      }
    }
    element_count += tensor.values.size();
  }
  return absl::OkStatus();
}

// Appends the values of all tensors in `codec`'s element format.
absl::Status AppendValues(const std::vector<UpdateTensor>& tensors, CodecId codec, std::string& out) {
  for (const UpdateTensor& tensor : tensors) {
    const size_t n = tensor.values.size();
    if (codec == CodecId::kRawF32) {
      if (n > 0) out.append(reinterpret_cast<const char*>(tensor.values.data()), n * sizeof(float));
      continue;
    }
    const size_t start = out.size();
    out.resize(start + n * 2);
    // std::string storage is suitably aligned only for char; convert through a local buffer in
    // blocks so the uint16_t writes are aligned.
    constexpr size_t kBlock = 4096;
    uint16_t block[kBlock];
    for (size_t i = 0; i < n; i += kBlock) {
      const size_t m = std::min(kBlock, n - i);
      if (codec == CodecId::kF16) {
        ConvertF32ToF16(tensor.values.data() + i, block, m);
      } else {
        ConvertF32ToBF16(tensor.values.data() + i, block, m);
      }
      for (size_t j = 0; j < m; ++j) {
        if (!IsFiniteHalfBits(block[j], codec)) {
          return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor '", tensor.name, "' value ", i + j, " (",
                                                         tensor.values[i + j], ") overflows ",
                                                         ToAbsl(CodecName(codec))));
        }
      }
      std::memcpy(out.data() + start + i * 2, block, m * 2);
    }
  }
  return absl::OkStatus();
}

absl::Status ZstdError(std::string_view what, size_t code) {
  return absl::DataLossError(absl::StrCat("update payload: ", ToAbsl(what), ": zstd: ", ZSTD_getErrorName(code)));
}

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// Decompresses exactly one zstd frame (`payload`) into exactly `raw_bytes` bytes, never writing or
// allocating more: a frame that would produce more is refused as a decompression bomb.
absl::StatusOr<std::string> DecompressCapped(std::string_view payload, uint64_t raw_bytes) {
  const unsigned long long content_size = ZSTD_getFrameContentSize(payload.data(), payload.size());
  if (content_size == ZSTD_CONTENTSIZE_ERROR) {
    // Too short for a frame header, or bad zstd magic.
    return absl::DataLossError(absl::StrCat("update payload: not a valid zstd frame (", payload.size(), " bytes)"));
  }
  if (content_size != ZSTD_CONTENTSIZE_UNKNOWN && content_size != raw_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("update payload: zstd frame declares ", content_size,
                                                   " decompressed bytes but the header declares a raw size of ",
                                                   raw_bytes));
  }
  const size_t frame_size = ZSTD_findFrameCompressedSize(payload.data(), payload.size());
  if (ZSTD_isError(frame_size)) return ZstdError("truncated or corrupt frame", frame_size);
  if (frame_size != payload.size()) {
    return absl::InvalidArgumentError(absl::StrCat("update payload: ", payload.size() - frame_size,
                                                   " trailing bytes after the zstd frame (frame is ", frame_size,
                                                   " of ", payload.size(), " payload bytes)"));
  }

  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx(ZSTD_createDCtx());
  if (dctx == nullptr) return absl::ResourceExhaustedError("update payload: ZSTD_createDCtx failed");
  const size_t rc = ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, kMaxZstdWindowLog);
  if (ZSTD_isError(rc)) return absl::InternalError(absl::StrCat("ZSTD_d_windowLogMax: ", ZSTD_getErrorName(rc)));

  std::string out(raw_bytes, '\0');  // raw_bytes was checked against DecodeLimits by the caller
  ZSTD_inBuffer in{payload.data(), payload.size(), 0};
  ZSTD_outBuffer main_out{out.data(), out.size(), 0};
  char overflow_byte;
  for (;;) {
    const bool main_full = main_out.pos == main_out.size;
    // Once our buffer is full, offer zstd a one-byte scratch buffer: any byte it writes there is
    // output beyond the declared size.
    ZSTD_outBuffer overflow{&overflow_byte, 1, 0};
    ZSTD_outBuffer* target = main_full ? &overflow : &main_out;
    const size_t in_before = in.pos, out_before = target->pos;
    const size_t ret = ZSTD_decompressStream(dctx.get(), target, &in);
    if (ZSTD_isError(ret)) return ZstdError("decompression failed", ret);
    if (overflow.pos > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("update payload: zstd frame decompresses to more than the declared ", raw_bytes,
                       " bytes (decompression bomb refused)"));
    }
    if (ret == 0) break;  // frame complete and flushed
    if (in.pos == in_before && target->pos == out_before) {
      return absl::DataLossError(absl::StrCat("update payload: zstd frame ends early after ", main_out.pos, " of ",
                                              raw_bytes, " decompressed bytes"));
    }
  }
  if (main_out.pos != raw_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("update payload: zstd frame decompresses to ", main_out.pos,
                                                   " bytes but the header declares a raw size of ", raw_bytes));
  }
  return out;
}

}  // namespace

std::string_view CodecName(CodecId codec) {
  switch (codec) {
    case CodecId::kRawF32:
      return "fp32";
    case CodecId::kF16:
      return "fp16";
    case CodecId::kBF16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<CodecId> ParseCodecName(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(ToAbsl(name));
  if (lower == "fp32" || lower == "f32") return CodecId::kRawF32;
  if (lower == "fp16" || lower == "f16") return CodecId::kF16;
  if (lower == "bf16") return CodecId::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown update codec '", ToAbsl(name), "' (expected fp32, fp16 or bf16)"));
}

size_t CodecElementSize(CodecId codec) { return codec == CodecId::kRawF32 ? 4 : 2; }

absl::StatusOr<std::string> EncodeUpdate(const std::vector<UpdateTensor>& tensors, const CodecOptions& options) {
  if (options.codec != CodecId::kRawF32 && options.codec != CodecId::kF16 && options.codec != CodecId::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: unknown codec id ", static_cast<int>(options.codec)));
  }
  uint64_t element_count = 0;
  FEDLORA_RETURN_IF_ERROR(ValidateTensorsForEncode(tensors, element_count));

  std::string body;
  size_t table_bytes = 4;
  for (const UpdateTensor& t : tensors) table_bytes += 2 + t.name.size() + 1 + 8 * t.shape.size();
  body.reserve(table_bytes + element_count * CodecElementSize(options.codec));
  PutU32(body, static_cast<uint32_t>(tensors.size()));
  for (const UpdateTensor& t : tensors) {
    PutU16(body, static_cast<uint16_t>(t.name.size()));
    body.append(t.name);
    PutU8(body, static_cast<uint8_t>(t.shape.size()));
    for (int64_t d : t.shape) PutU64(body, static_cast<uint64_t>(d));
  }
  FEDLORA_RETURN_IF_ERROR(AppendValues(tensors, options.codec, body));

  std::string payload;
  if (options.zstd) {
    std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx(ZSTD_createCCtx());
    if (cctx == nullptr) return absl::ResourceExhaustedError("EncodeUpdate: ZSTD_createCCtx failed");
    // The frame carries its content size (the decoder cross-checks it against the header) and a
    // checksum of the content (the decoder reports a mismatch as DataLoss).
    for (auto [param, value] : {std::pair{ZSTD_c_compressionLevel, options.zstd_level},
                                std::pair{ZSTD_c_contentSizeFlag, 1}, std::pair{ZSTD_c_checksumFlag, 1}}) {
      const size_t rc = ZSTD_CCtx_setParameter(cctx.get(), param, value);
      if (ZSTD_isError(rc)) {
        return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: zstd parameter ", static_cast<int>(param), " = ",
                                                       value, ": ", ZSTD_getErrorName(rc)));
      }
    }
    payload.resize(ZSTD_compressBound(body.size()));
    const size_t n = ZSTD_compress2(cctx.get(), payload.data(), payload.size(), body.data(), body.size());
    if (ZSTD_isError(n)) return absl::InternalError(absl::StrCat("EncodeUpdate: zstd: ", ZSTD_getErrorName(n)));
    payload.resize(n);
  }
  const std::string& data = options.zstd ? payload : body;

  std::string out;
  out.reserve(kUpdateHeaderSize + data.size());
  out.append(kUpdateMagic, 4);
  PutU16(out, kUpdateFormatVersion);
  PutU8(out, static_cast<uint8_t>(options.codec));
  PutU8(out, kCodecVersion);
  PutU32(out, options.zstd ? kUpdateFlagZstd : 0u);
  PutU32(out, 0);  // reserved
  PutU64(out, element_count);
  PutU64(out, body.size());
  PutU64(out, data.size());
  out.append(data);
  return out;
}

absl::StatusOr<UpdateHeader> ParseUpdateHeader(std::string_view encoded, const DecodeLimits& limits) {
  if (encoded.size() < kUpdateHeaderSize) {
    return absl::DataLossError(
        absl::StrCat("update header truncated: ", encoded.size(), " bytes, need ", kUpdateHeaderSize));
  }
  const char* p = encoded.data();
  if (std::memcmp(p, kUpdateMagic, 4) != 0) {
    return absl::InvalidArgumentError("update header: bad magic (expected \"FLU1\"); not an encoded update");
  }
  UpdateHeader h;
  h.format_version = Load<uint16_t>(p + 4);
  const uint8_t codec = Load<uint8_t>(p + 6);
  h.codec_version = Load<uint8_t>(p + 7);
  h.flags = Load<uint32_t>(p + 8);
  const uint32_t reserved = Load<uint32_t>(p + 12);
  h.element_count = Load<uint64_t>(p + 16);
  h.raw_bytes = Load<uint64_t>(p + 24);
  h.payload_bytes = Load<uint64_t>(p + 32);

  if (h.format_version != kUpdateFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("update header: unsupported format version ", h.format_version,
                                                   " (this build reads version ", kUpdateFormatVersion, ")"));
  }
  if (codec != static_cast<uint8_t>(CodecId::kRawF32) && codec != static_cast<uint8_t>(CodecId::kF16) &&
      codec != static_cast<uint8_t>(CodecId::kBF16)) {
    return absl::InvalidArgumentError(absl::StrCat("update header: unknown codec id ", codec));
  }
  h.codec = static_cast<CodecId>(codec);
  if (h.codec_version != kCodecVersion) {
    return absl::InvalidArgumentError(absl::StrCat("update header: unsupported ", ToAbsl(CodecName(h.codec)),
                                                   " codec version ", h.codec_version, " (this build reads version ",
                                                   kCodecVersion, ")"));
  }
  if ((h.flags & ~kUpdateFlagZstd) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("update header: unknown flag bits 0x", absl::Hex(h.flags & ~kUpdateFlagZstd)));
  }
  if (reserved != 0) {
    return absl::InvalidArgumentError(absl::StrCat("update header: reserved field is ", reserved, ", must be 0"));
  }
  const uint64_t max_elements = static_cast<uint64_t>(std::max<int64_t>(limits.max_elements, 0));
  const uint64_t max_bytes = static_cast<uint64_t>(std::max<int64_t>(limits.max_decoded_bytes, 0));
  if (h.element_count > max_elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("update header: element count ", h.element_count, " exceeds the limit of ", max_elements));
  }
  if (h.raw_bytes > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("update header: raw size ", h.raw_bytes, " bytes exceeds the limit of ", max_bytes));
  }
  // element_count <= max_elements (int64) and element size <= 4: no overflow in uint64.
  const uint64_t min_raw = 4 + h.element_count * CodecElementSize(h.codec);
  if (h.raw_bytes < min_raw) {
    return absl::InvalidArgumentError(absl::StrCat("update header: raw size ", h.raw_bytes, " bytes cannot hold ",
                                                   h.element_count, " ", ToAbsl(CodecName(h.codec)),
                                                   " values plus a tensor table (needs at least ", min_raw, ")"));
  }
  if (!h.zstd() && h.payload_bytes != h.raw_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("update header: payload size ", h.payload_bytes,
                                                   " differs from raw size ", h.raw_bytes,
                                                   " without a compression stage"));
  }
  return h;
}

absl::StatusOr<std::vector<UpdateTensor>> DecodeUpdate(std::string_view encoded, const DecodeLimits& limits) {
  FEDLORA_ASSIGN_OR_RETURN(const UpdateHeader h, ParseUpdateHeader(encoded, limits));
  const std::string_view payload = encoded.substr(kUpdateHeaderSize);
  if (payload.size() < h.payload_bytes) {
    return absl::DataLossError(
        absl::StrCat("update payload truncated: ", payload.size(), " of ", h.payload_bytes, " declared bytes present"));
  }
  if (payload.size() > h.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("update: ", payload.size() - h.payload_bytes,
                                                   " trailing bytes after the declared payload of ", h.payload_bytes));
  }

  std::string decompressed;
  std::string_view body = payload;
  if (h.zstd()) {
    FEDLORA_ASSIGN_OR_RETURN(decompressed, DecompressCapped(payload, h.raw_bytes));
    body = decompressed;
  }

  BodyReader reader(body);
  FEDLORA_ASSIGN_OR_RETURN(const uint32_t count, reader.Read<uint32_t>("tensor count"));
  if (count == 0) return absl::InvalidArgumentError("update body: tensor count is 0");
  if (count > static_cast<uint64_t>(std::max<int64_t>(limits.max_tensors, 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("update body: tensor count ", count, " exceeds the limit of ", limits.max_tensors));
  }
  if (count > reader.remaining() / kMinTableEntryBytes) {
    return absl::InvalidArgumentError(absl::StrCat("update body: tensor count ", count, " cannot fit in the ",
                                                   reader.remaining(), " remaining body bytes"));
  }

  std::vector<UpdateTensor> tensors(count);
  absl::flat_hash_set<std::string_view> names;
  uint64_t total = 0;
  for (uint32_t t = 0; t < count; ++t) {
    UpdateTensor& tensor = tensors[t];
    FEDLORA_ASSIGN_OR_RETURN(const uint16_t name_len, reader.Read<uint16_t>("tensor name length"));
    if (name_len == 0 || name_len > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor ", t, " name length ", name_len,
                                                     " is not in [1, ", kMaxTensorNameBytes, "]"));
    }
    FEDLORA_ASSIGN_OR_RETURN(const std::string_view name, reader.ReadBytes(name_len, "tensor name"));
    if (name.find('\0') != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor ", t, " name contains a NUL byte"));
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("update body: duplicate tensor name '", ToAbsl(name), "'"));
    }
    tensor.name = std::string(name);
    FEDLORA_ASSIGN_OR_RETURN(const uint8_t rank, reader.Read<uint8_t>("tensor rank"));
    if (rank > kMaxTensorRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("update body: tensor '", tensor.name, "' rank ", rank, " exceeds ", kMaxTensorRank));
    }
    tensor.shape.resize(rank);
    for (uint8_t d = 0; d < rank; ++d) {
      FEDLORA_ASSIGN_OR_RETURN(const uint64_t dim, reader.Read<uint64_t>("tensor dimension"));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat("update body: tensor '", tensor.name, "' dimension ", d, " is negative"));
      }
      tensor.shape[d] = static_cast<int64_t>(dim);
    }
    auto numel = CheckedNumel(tensor.shape);
    if (!numel.ok()) return Annotate(numel.status(), absl::StrCat("update body: tensor '", tensor.name, "'"));
    if (static_cast<uint64_t>(*numel) > h.element_count - total) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor '", tensor.name, "' with ", *numel,
                                                     " elements takes the table past the header's element count ",
                                                     h.element_count));
    }
    total += static_cast<uint64_t>(*numel);
  }
  if (total != h.element_count) {
    return absl::InvalidArgumentError(absl::StrCat("update body: the tensor shapes hold ", total,
                                                   " elements but the header declares ", h.element_count));
  }
  const size_t esize = CodecElementSize(h.codec);
  if (reader.remaining() != h.element_count * esize) {
    return absl::InvalidArgumentError(
        absl::StrCat("update body: ", reader.remaining(), " bytes follow the tensor table but ", h.element_count, " ",
                     ToAbsl(CodecName(h.codec)), " values need ", h.element_count * esize));
  }

  const char* values = body.data() + reader.pos();
  for (UpdateTensor& tensor : tensors) {
    const size_t n = static_cast<size_t>(CheckedNumel(tensor.shape).value());
    tensor.values.resize(n);
    if (h.codec == CodecId::kRawF32) {
      if (n > 0) std::memcpy(tensor.values.data(), values, n * 4);
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(tensor.values[i])) {
          return absl::InvalidArgumentError(absl::StrCat("update body: tensor '", tensor.name, "' value ", i,
                                                         " is not finite (", tensor.values[i], ")"));
        }
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        const uint16_t bits = Load<uint16_t>(values + 2 * i);
        if (!IsFiniteHalfBits(bits, h.codec)) {
          return absl::InvalidArgumentError(absl::StrCat("update body: tensor '", tensor.name, "' value ", i,
                                                         " is not finite (", ToAbsl(CodecName(h.codec)), " bits 0x",
                                                         absl::Hex(bits), ")"));
        }
        tensor.values[i] = h.codec == CodecId::kF16 ? F16ToF32(bits) : BF16ToF32(bits);
      }
    }
    values += n * esize;
  }
  return tensors;
}

}  // namespace fedlora
