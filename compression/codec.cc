#include "compression/codec.h"

#include <zstd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>

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

// The window the zstd stage decompresses through: DecodeUpdate and ValidateUpdate never hold more
// than this much decompressed body at once (plus zstd's own history window, at most
// 2^kMaxZstdWindowLog and 2 MiB for what our encoder writes at level 3). 1 MiB keeps the per-refill
// overhead (one ZSTD_decompressStream call, a memmove of at most one partial table entry, ~1 KB)
// negligible next to decompressing 1 MiB (~1 ms).
constexpr size_t kBodyWindowBytes = size_t{1} << 20;

// The largest single read of the tensor table (a name) must fit in the window.
static_assert(kMaxTensorNameBytes < kBodyWindowBytes);

// ValidateUpdate's `consumed` hook is told of progress once at least this much more input is
// consumed, and the values of an uncompressed payload are checked in pieces of this size: so the
// reports are at most 2 x 4 = 8 MiB apart (a zstd pump consumes ~1 MiB), and a mapped 1 GB update
// keeps at most ~8 MiB of itself resident beyond what the caller has dropped.
constexpr uint64_t kConsumedReportBytes = uint64_t{4} << 20;

// The update body, delivered in order: the payload itself when there is no zstd stage (zero copy),
// or the output of the payload's zstd frame streamed through a window of at most kBodyWindowBytes.
//
// Two kinds of error. A stage error (the zstd frame is corrupt, ends early, or decompresses to more
// or fewer bytes than the header's raw size) is sticky: once seen, every later call and Finish()
// return it. A body error (a read past the declared raw size: the table disagrees with it) is
// InvalidArgument and is the caller's to report, after Finish() has checked the whole stage, so that
// a corrupt frame is reported as corrupt whatever bytes it decoded to before the corruption.
class BodySource {
 public:
  // No zstd stage: the body is `payload`, whose size the caller checked against the header.
  explicit BodySource(std::string_view payload) : plain_(payload), raw_bytes_(payload.size()) {}

  // A zstd stage: checks the frame's header and block structure (cheap, decompresses nothing),
  // then prepares to stream it.
  static absl::StatusOr<BodySource> ForZstd(std::string_view payload, uint64_t raw_bytes) {
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
    BodySource source(std::string_view{});
    source.raw_bytes_ = raw_bytes;
    source.dctx_.reset(ZSTD_createDCtx());
    if (source.dctx_ == nullptr) return absl::ResourceExhaustedError("update payload: ZSTD_createDCtx failed");
    const size_t rc = ZSTD_DCtx_setParameter(source.dctx_.get(), ZSTD_d_windowLogMax, kMaxZstdWindowLog);
    if (ZSTD_isError(rc)) return absl::InternalError(absl::StrCat("ZSTD_d_windowLogMax: ", ZSTD_getErrorName(rc)));
    source.in_ = ZSTD_inBuffer{payload.data(), payload.size(), 0};
    // raw_bytes was checked against DecodeLimits by the caller; a small body needs no bigger window
    // (no read is ever longer than what remains of the body).
    source.window_size_ = static_cast<size_t>(std::min<uint64_t>(kBodyWindowBytes, raw_bytes));
    source.window_ = std::make_unique<char[]>(source.window_size_);
    return source;
  }

  // `hook` (may be null or empty) is told, at least every kConsumedReportBytes, how many leading
  // bytes of the encoded update (header included) will not be read again. Must outlive this.
  void SetConsumedHook(const std::function<void(uint64_t)>* hook) { hook_ = hook; }

  // Offset of the next unread body byte, and how many remain of the declared raw size.
  uint64_t pos() const { return dctx_ ? produced_ - (tail_ - head_) : plain_pos_; }
  uint64_t remaining() const { return raw_bytes_ - pos(); }

  // The next `n` bytes (n <= kMaxTensorNameBytes for the table), contiguous; valid until the next call.
  absl::StatusOr<std::string_view> Read(size_t n, std::string_view what) {
    if (remaining() < n) {
      return absl::InvalidArgumentError(absl::StrCat("update body: ", ToAbsl(what), " at offset ", pos(), " needs ",
                                                     n, " bytes but only ", remaining(),
                                                     " remain of the declared raw size ", raw_bytes_));
    }
    if (!dctx_) {
      const std::string_view v = plain_.substr(plain_pos_, n);
      plain_pos_ += n;
      // The caller is done with the previous read, so everything before `v` is consumed.
      Report(plain_pos_ - n);
      return v;
    }
    if (tail_ - head_ < n) FEDLORA_RETURN_IF_ERROR(Refill(n));
    const std::string_view v(window_.get() + head_, n);
    head_ += n;
    return v;
  }

  // The next whole `unit`s of the body, at least one and at most `max_bytes` (>= unit); the caller
  // checked that enough remain. Valid until the next call.
  absl::StatusOr<std::string_view> ReadSome(size_t unit, size_t max_bytes) {
    if (!dctx_) {
      // In pieces of kConsumedReportBytes, so that the consumed hook hears of progress that often.
      size_t n = static_cast<size_t>(std::min<uint64_t>({max_bytes, remaining(), kConsumedReportBytes}));
      n -= n % unit;
      return Read(n, "values");
    }
    if (tail_ - head_ < unit) FEDLORA_RETURN_IF_ERROR(Refill(unit));
    size_t n = std::min(max_bytes, tail_ - head_);
    n -= n % unit;
    return Read(n, "values");
  }

  // Decompresses (and discards) whatever the body parse did not read, then checks that the frame
  // is intact (zstd's block checks and content checksum) and produced exactly the declared raw
  // size, refusing to produce even one byte more (decompression bombs). OK without a zstd stage.
  absl::Status Finish() {
    if (!dctx_) {
      Report(plain_pos_);
      return absl::OkStatus();
    }
    while (stage_error_.ok() && !frame_done_) {
      head_ = tail_ = 0;
      (void)Pump();
    }
    return stage_error_;
  }

 private:
  // Moves the unread bytes to the front of the window and decompresses until at least `need`
  // (<= remaining(), <= window_size_) are available.
  absl::Status Refill(size_t need) {
    FEDLORA_RETURN_IF_ERROR(stage_error_);
    if (head_ > 0) {
      std::memmove(window_.get(), window_.get() + head_, tail_ - head_);
      tail_ -= head_;
      head_ = 0;
    }
    while (tail_ < need) {
      FEDLORA_RETURN_IF_ERROR(Pump());
      if (frame_done_ && tail_ < need) return stage_error_;  // set by Pump: the frame ended short
    }
    return absl::OkStatus();
  }

  // One ZSTD_decompressStream call into the free part of the window, never past the declared raw
  // size. Once that size is reached, zstd gets a one-byte scratch buffer instead: any byte it
  // writes there is output beyond the declared size.
  absl::Status Pump() {
    const uint64_t left = raw_bytes_ - produced_;
    char overflow_byte;
    ZSTD_outBuffer out = left == 0
                             ? ZSTD_outBuffer{&overflow_byte, 1, 0}
                             : ZSTD_outBuffer{window_.get() + tail_,
                                              static_cast<size_t>(std::min<uint64_t>(window_size_ - tail_, left)), 0};
    const size_t in_before = in_.pos;
    const size_t ret = ZSTD_decompressStream(dctx_.get(), &out, &in_);
    if (ZSTD_isError(ret)) return Fail(ZstdError("decompression failed", ret));
    Report(in_.pos);  // zstd keeps no pointer into the input it has consumed
    if (left == 0 && out.pos > 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("update payload: zstd frame decompresses to more than the declared ", raw_bytes_,
                       " bytes (decompression bomb refused)")));
    }
    if (left > 0) {
      tail_ += out.pos;
      produced_ += out.pos;
    }
    if (ret == 0) {  // frame complete and flushed
      frame_done_ = true;
      if (produced_ != raw_bytes_) {
        return Fail(absl::InvalidArgumentError(absl::StrCat("update payload: zstd frame decompresses to ", produced_,
                                                            " bytes but the header declares a raw size of ",
                                                            raw_bytes_)));
      }
      return absl::OkStatus();
    }
    if (in_.pos == in_before && out.pos == 0) {
      return Fail(absl::DataLossError(absl::StrCat("update payload: zstd frame ends early after ", produced_, " of ",
                                                   raw_bytes_, " decompressed bytes")));
    }
    return absl::OkStatus();
  }

  // Tells the hook that payload bytes [0, payload_pos) are consumed, if that is news enough.
  void Report(uint64_t payload_pos) {
    if (hook_ == nullptr || !*hook_) return;
    const uint64_t payload_size = dctx_ ? in_.size : plain_.size();
    if (payload_pos < reported_ + kConsumedReportBytes && payload_pos != payload_size) return;
    if (payload_pos <= reported_) return;
    reported_ = payload_pos;
    (*hook_)(kUpdateHeaderSize + payload_pos);
  }

  absl::Status Fail(absl::Status status) {
    frame_done_ = true;
    stage_error_ = status;
    return status;
  }

  // Without a zstd stage.
  std::string_view plain_;
  uint64_t plain_pos_ = 0;
  uint64_t raw_bytes_ = 0;  // the declared body size
  // With a zstd stage: the frame, the decoder, and the window holding decompressed bytes
  // [head_, tail_) not yet read; produced_ counts all bytes decompressed so far.
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  std::unique_ptr<char[]> window_;
  size_t window_size_ = 0;
  size_t head_ = 0, tail_ = 0;
  uint64_t produced_ = 0;
  bool frame_done_ = false;
  absl::Status stage_error_;
  const std::function<void(uint64_t)>* hook_ = nullptr;
  uint64_t reported_ = 0;  // payload bytes reported consumed so far
};

// Index of the first fp32 value of `n` at `src` (unaligned) that is NaN or Inf, or n.
size_t FirstNonFiniteF32(const char* src, size_t n) {
  // Branch-free blocks (the compiler vectorises the OR-reduction), then a scalar search only in the
  // block that holds a bad value: validating is memory-bound, ~10 GB/s on one core.
  constexpr size_t kBlock = 1024;
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    uint32_t bad = 0;
    for (size_t j = 0; j < m; ++j) bad |= (Load<uint32_t>(src + 4 * (i + j)) & 0x7F800000u) == 0x7F800000u;
    if (bad != 0) {
      for (size_t j = 0; j < m; ++j) {
        if ((Load<uint32_t>(src + 4 * (i + j)) & 0x7F800000u) == 0x7F800000u) return i + j;
      }
    }
  }
  return n;
}

// The same for fp16/bf16 bits (see IsFiniteHalfBits).
size_t FirstNonFiniteHalf(const char* src, size_t n, CodecId codec) {
  const uint16_t exp_mask = codec == CodecId::kF16 ? 0x7C00 : 0x7F80;
  constexpr size_t kBlock = 2048;
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    uint32_t bad = 0;
    for (size_t j = 0; j < m; ++j) bad |= (Load<uint16_t>(src + 2 * (i + j)) & exp_mask) == exp_mask;
    if (bad != 0) {
      for (size_t j = 0; j < m; ++j) {
        if (!IsFiniteHalfBits(Load<uint16_t>(src + 2 * (i + j)), codec)) return i + j;
      }
    }
  }
  return n;
}

// Checks that the `n` encoded values at `src` are finite and, when `out` is non-null, writes them
// there as fp32. `first` is the index of src's first value within tensor `name` (for messages).
absl::Status CheckValues(CodecId codec, const char* src, size_t n, float* out, std::string_view name, uint64_t first) {
  if (codec == CodecId::kRawF32) {
    const size_t bad = FirstNonFiniteF32(src, n);
    if (bad < n) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor '", ToAbsl(name), "' value ", first + bad,
                                                     " is not finite (", Load<float>(src + 4 * bad), ")"));
    }
    if (out != nullptr && n > 0) std::memcpy(out, src, n * 4);
    return absl::OkStatus();
  }
  const size_t bad = FirstNonFiniteHalf(src, n, codec);
  if (bad < n) {
    return absl::InvalidArgumentError(absl::StrCat("update body: tensor '", ToAbsl(name), "' value ", first + bad,
                                                   " is not finite (", ToAbsl(CodecName(codec)), " bits 0x",
                                                   absl::Hex(Load<uint16_t>(src + 2 * bad)), ")"));
  }
  if (out == nullptr) return absl::OkStatus();
  // `src` may be odd-aligned: convert through an aligned block.
  constexpr size_t kBlock = 4096;
  uint16_t block[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    std::memcpy(block, src + 2 * i, m * 2);
    if (codec == CodecId::kF16) {
      ConvertF16ToF32(block, out + i, m);
    } else {
      ConvertBF16ToF32(block, out + i, m);
    }
  }
  return absl::OkStatus();
}

// Parses the tensor table from `source` into `tensors` (names and shapes) and checks every value;
// with `materialize`, also fills each tensor's values. Body errors only (see BodySource).
absl::Status WalkBody(const UpdateHeader& h, const DecodeLimits& limits, bool materialize, BodySource& source,
                      std::vector<UpdateTensor>& tensors) {
  FEDLORA_ASSIGN_OR_RETURN(std::string_view field, source.Read(4, "tensor count"));
  const uint32_t count = Load<uint32_t>(field.data());
  if (count == 0) return absl::InvalidArgumentError("update body: tensor count is 0");
  if (count > static_cast<uint64_t>(std::max<int64_t>(limits.max_tensors, 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("update body: tensor count ", count, " exceeds the limit of ", limits.max_tensors));
  }
  if (count > source.remaining() / kMinTableEntryBytes) {
    return absl::InvalidArgumentError(absl::StrCat("update body: tensor count ", count, " cannot fit in the ",
                                                   source.remaining(), " remaining body bytes"));
  }

  // `tensors` is sized once, so the views of its names in `names` stay valid.
  tensors.assign(count, UpdateTensor{});
  std::vector<uint64_t> numel(count);
  absl::flat_hash_set<std::string_view> names;
  uint64_t total = 0;
  for (uint32_t t = 0; t < count; ++t) {
    UpdateTensor& tensor = tensors[t];
    FEDLORA_ASSIGN_OR_RETURN(field, source.Read(2, "tensor name length"));
    const uint16_t name_len = Load<uint16_t>(field.data());
    if (name_len == 0 || name_len > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor ", t, " name length ", name_len,
                                                     " is not in [1, ", kMaxTensorNameBytes, "]"));
    }
    FEDLORA_ASSIGN_OR_RETURN(field, source.Read(name_len, "tensor name"));
    if (field.find('\0') != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor ", t, " name contains a NUL byte"));
    }
    tensor.name = std::string(field);
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("update body: duplicate tensor name '", tensor.name, "'"));
    }
    FEDLORA_ASSIGN_OR_RETURN(field, source.Read(1, "tensor rank"));
    const uint8_t rank = Load<uint8_t>(field.data());
    if (rank > kMaxTensorRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("update body: tensor '", tensor.name, "' rank ", rank, " exceeds ", kMaxTensorRank));
    }
    tensor.shape.resize(rank);
    for (uint8_t d = 0; d < rank; ++d) {
      FEDLORA_ASSIGN_OR_RETURN(field, source.Read(8, "tensor dimension"));
      const uint64_t dim = Load<uint64_t>(field.data());
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat("update body: tensor '", tensor.name, "' dimension ", d, " is negative"));
      }
      tensor.shape[d] = static_cast<int64_t>(dim);
    }
    auto n = CheckedNumel(tensor.shape);
    if (!n.ok()) return Annotate(n.status(), absl::StrCat("update body: tensor '", tensor.name, "'"));
    if (static_cast<uint64_t>(*n) > h.element_count - total) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor '", tensor.name, "' with ", *n,
                                                     " elements takes the table past the header's element count ",
                                                     h.element_count));
    }
    numel[t] = static_cast<uint64_t>(*n);
    total += numel[t];
  }
  if (total != h.element_count) {
    return absl::InvalidArgumentError(absl::StrCat("update body: the tensor shapes hold ", total,
                                                   " elements but the header declares ", h.element_count));
  }
  const size_t esize = CodecElementSize(h.codec);
  if (source.remaining() != h.element_count * esize) {
    return absl::InvalidArgumentError(
        absl::StrCat("update body: ", source.remaining(), " bytes follow the tensor table but ", h.element_count, " ",
                     ToAbsl(CodecName(h.codec)), " values need ", h.element_count * esize));
  }

  // element_count <= max_elements was checked with the header: the values fit the limits.
  if (materialize) {
    for (uint32_t t = 0; t < count; ++t) tensors[t].values.resize(static_cast<size_t>(numel[t]));
  }
  for (uint32_t t = 0; t < count; ++t) {
    for (uint64_t done = 0; done < numel[t];) {
      FEDLORA_ASSIGN_OR_RETURN(field, source.ReadSome(esize, static_cast<size_t>((numel[t] - done) * esize)));
      const size_t n = field.size() / esize;
      float* out = materialize ? tensors[t].values.data() + done : nullptr;
      FEDLORA_RETURN_IF_ERROR(CheckValues(h.codec, field.data(), n, out, tensors[t].name, done));
      done += n;
    }
  }
  return absl::OkStatus();
}

// Everything DecodeUpdate and ValidateUpdate check, in one walk over the encoded update: header,
// payload size, zstd stage, tensor table, values. Fills `tensors` with names and shapes, and with
// values too when `materialize`.
absl::Status WalkUpdate(std::string_view encoded, const DecodeLimits& limits, bool materialize,
                        std::vector<UpdateTensor>& tensors, const std::function<void(uint64_t)>* consumed = nullptr) {
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
  std::optional<BodySource> source;
  if (h.zstd()) {
    FEDLORA_ASSIGN_OR_RETURN(source, BodySource::ForZstd(payload, h.raw_bytes));
  } else {
    source.emplace(payload);
  }
  source->SetConsumedHook(consumed);
  const absl::Status body = WalkBody(h, limits, materialize, *source, tensors);
  // A broken zstd stage explains any body error it caused, so it is reported first.
  FEDLORA_RETURN_IF_ERROR(source->Finish());
  return body;
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
  std::vector<UpdateTensor> tensors;
  FEDLORA_RETURN_IF_ERROR(WalkUpdate(encoded, limits, /*materialize=*/true, tensors));
  return tensors;
}

absl::StatusOr<std::vector<UpdateTensorInfo>> ValidateUpdate(std::string_view encoded, const DecodeLimits& limits,
                                                             const std::function<void(uint64_t)>& consumed) {
  std::vector<UpdateTensor> tensors;
  FEDLORA_RETURN_IF_ERROR(WalkUpdate(encoded, limits, /*materialize=*/false, tensors, &consumed));
  std::vector<UpdateTensorInfo> table(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    table[t].name = std::move(tensors[t].name);
    table[t].shape = std::move(tensors[t].shape);
  }
  return table;
}

}  // namespace fedlora
