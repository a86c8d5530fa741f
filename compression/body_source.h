// Internal to compression/: the body of an encoded update delivered in order, from the payload
// itself or through a bounded zstd window (see BodySource). Not an API.
#pragma once

#include <zstd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora::compression_internal {

// Largest zstd window (back-reference distance, allocated by the decoder) a frame may ask for:
// 2^27 = 128 MiB, zstd's own default limit and what levels <= 19 use at most. Stated explicitly so
// a hostile frame cannot make the decoder allocate more whatever the library default becomes.
constexpr int kMaxZstdWindowLog = 27;

template <class T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

inline absl::Status ZstdError(std::string_view what, size_t code) {
  return absl::DataLossError(
      absl::StrCat("update payload: ", ToAbsl(what), ": zstd: ", ZSTD_getErrorName(code)));
}

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
    const unsigned long long content_size =
        ZSTD_getFrameContentSize(payload.data(), payload.size());
    if (content_size == ZSTD_CONTENTSIZE_ERROR) {
      // Too short for a frame header, or bad zstd magic.
      return absl::DataLossError(
          absl::StrCat("update payload: not a valid zstd frame (", payload.size(), " bytes)"));
    }
    if (content_size != ZSTD_CONTENTSIZE_UNKNOWN && content_size != raw_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("update payload: zstd frame declares ", content_size,
                       " decompressed bytes but the header declares a raw size of ", raw_bytes));
    }
    const size_t frame_size = ZSTD_findFrameCompressedSize(payload.data(), payload.size());
    if (ZSTD_isError(frame_size)) return ZstdError("truncated or corrupt frame", frame_size);
    if (frame_size != payload.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("update payload: ", payload.size() - frame_size,
                       " trailing bytes after the zstd frame (frame is ", frame_size, " of ",
                       payload.size(), " payload bytes)"));
    }
    BodySource source(std::string_view{});
    source.raw_bytes_ = raw_bytes;
    source.dctx_.reset(ZSTD_createDCtx());
    if (source.dctx_ == nullptr)
      return absl::ResourceExhaustedError("update payload: ZSTD_createDCtx failed");
    const size_t rc =
        ZSTD_DCtx_setParameter(source.dctx_.get(), ZSTD_d_windowLogMax, kMaxZstdWindowLog);
    if (ZSTD_isError(rc))
      return absl::InternalError(absl::StrCat("ZSTD_d_windowLogMax: ", ZSTD_getErrorName(rc)));
    source.in_ = ZSTD_inBuffer{payload.data(), payload.size(), 0};
    // raw_bytes was checked against DecodeLimits by the caller; a small body needs no bigger window
    // (no read is ever longer than what remains of the body).
    source.window_size_ = static_cast<size_t>(std::min<uint64_t>(kBodyWindowBytes, raw_bytes));
    source.window_ = std::make_unique<char[]>(source.window_size_);
    return source;
  }

  // `hook` (may be null or empty) is told, at least every kConsumedReportBytes, how many leading
  // bytes of the encoded update (header included) will not be read again. Must outlive this.
  // `header_bytes` is the size of the header before the payload.
  void SetConsumedHook(const std::function<void(uint64_t)>* hook, uint64_t header_bytes) {
    hook_ = hook;
    header_bytes_ = header_bytes;
  }

  // Offset of the next unread body byte, and how many remain of the declared raw size.
  uint64_t pos() const { return dctx_ ? produced_ - (tail_ - head_) : plain_pos_; }
  uint64_t remaining() const { return raw_bytes_ - pos(); }

  // The next `n` bytes (n <= kMaxTensorNameBytes for the table), contiguous; valid until the next call.
  absl::StatusOr<std::string_view> Read(size_t n, std::string_view what) {
    if (remaining() < n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "update body: ", ToAbsl(what), " at offset ", pos(), " needs ", n, " bytes but only ",
          remaining(), " remain of the declared raw size ", raw_bytes_));
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
      size_t n =
          static_cast<size_t>(std::min<uint64_t>({max_bytes, remaining(), kConsumedReportBytes}));
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
    ZSTD_outBuffer out =
        left == 0 ? ZSTD_outBuffer{&overflow_byte, 1, 0}
                  : ZSTD_outBuffer{
                        window_.get() + tail_,
                        static_cast<size_t>(std::min<uint64_t>(window_size_ - tail_, left)), 0};
    const size_t in_before = in_.pos;
    const size_t ret = ZSTD_decompressStream(dctx_.get(), &out, &in_);
    if (ZSTD_isError(ret)) return Fail(ZstdError("decompression failed", ret));
    Report(in_.pos);  // zstd keeps no pointer into the input it has consumed
    if (left == 0 && out.pos > 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("update payload: zstd frame decompresses to more than the declared ",
                       raw_bytes_, " bytes (decompression bomb refused)")));
    }
    if (left > 0) {
      tail_ += out.pos;
      produced_ += out.pos;
    }
    if (ret == 0) {  // frame complete and flushed
      frame_done_ = true;
      if (produced_ != raw_bytes_) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("update payload: zstd frame decompresses to ", produced_,
                         " bytes but the header declares a raw size of ", raw_bytes_)));
      }
      return absl::OkStatus();
    }
    if (in_.pos == in_before && out.pos == 0) {
      return Fail(
          absl::DataLossError(absl::StrCat("update payload: zstd frame ends early after ",
                                           produced_, " of ", raw_bytes_, " decompressed bytes")));
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
    (*hook_)(header_bytes_ + payload_pos);
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
  uint64_t header_bytes_ = 0;
};

}  // namespace fedlora::compression_internal
