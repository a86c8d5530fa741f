#include "core/sha256.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/file.h"
#include "core/sha256_blocks.h"
#include "core/status.h"

namespace fedlora {
namespace {

using sha256_internal::Compress;

// Pads the message whose first whole blocks `state` has consumed and whose last `tail_size` (< 64)
// bytes are `tail` (FIPS 180-4, 5.1.1: a 1 bit, zeros, the length in bits as 64 bits big-endian),
// runs the final block or two through a copy of `state`, and returns the digest.
Sha256DigestBytes FinishDigest(const uint32_t state[8], uint64_t total_bytes, const uint8_t* tail,
                               size_t tail_size) {
  uint8_t last[128] = {};
  if (tail_size > 0) std::memcpy(last, tail, tail_size);
  last[tail_size] = 0x80;
  const size_t blocks = tail_size < 56 ? 1 : 2;
  const uint64_t bits = total_bytes * 8;
  for (int i = 0; i < 8; ++i) last[blocks * 64 - 1 - i] = static_cast<uint8_t>(bits >> (8 * i));
  uint32_t h[8];
  std::memcpy(h, state, sizeof(h));
  Compress(h, last, blocks);
  Sha256DigestBytes out;
  for (int i = 0; i < 8; ++i) {
    for (int b = 0; b < 4; ++b) out[4 * i + b] = static_cast<uint8_t>(h[i] >> (24 - 8 * b));
  }
  return out;
}

}  // namespace

Sha256::Sha256() { std::memcpy(state_, sha256_internal::kInitialState, sizeof(state_)); }

void Sha256::Update(const void* data, size_t size) {
  if (size == 0) return;  // data may be null
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_bytes_ += size;
  if (buffered_ > 0) {
    const size_t take = std::min(size, sizeof(buffer_) - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < sizeof(buffer_)) return;
    Compress(state_, buffer_, 1);
    buffered_ = 0;
  }
  const size_t blocks = size / 64;
  Compress(state_, p, blocks);
  p += blocks * 64;
  size -= blocks * 64;
  if (size > 0) std::memcpy(buffer_, p, size);
  buffered_ = size;
}

Sha256DigestBytes Sha256::Final() {
  const Sha256DigestBytes out = FinishDigest(state_, total_bytes_, buffer_, buffered_);
  *this = Sha256();
  return out;
}

Sha256DigestBytes Sha256::UpdateAndDigest(std::string_view bytes) {
  if (buffered_ > 0) {  // the two hashes' blocks do not line up: one after the other
    Update(bytes);
    return Sha256Digest(bytes);
  }
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t blocks = bytes.size() / 64;
  uint32_t own[8];
  std::memcpy(own, sha256_internal::kInitialState, sizeof(own));
  sha256_internal::Compress2(own, state_, p, blocks);
  total_bytes_ += blocks * 64;
  const size_t tail = bytes.size() - blocks * 64;
  Update(p + blocks * 64, tail);
  return FinishDigest(own, bytes.size(), p + blocks * 64, tail);
}

Sha256DigestBytes Sha256Digest(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.Final();
}

std::string Sha256Hex(std::string_view bytes) {
  const Sha256DigestBytes d = Sha256Digest(bytes);
  return ToHex(d);
}

absl::StatusOr<std::string> Sha256FileHex(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  // 1 MiB chunks: large enough that syscall overhead is negligible next to hashing
  // (~1.5 GB/s with SHA-NI), small enough to keep memory flat for multi-GB checkpoints.
  constexpr size_t kChunk = 1 << 20;
  std::vector<char> buf(kChunk);
  Sha256 h;
  absl::Status status;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      status = ErrnoToStatus(errno, "read", path);
      break;
    }
    if (n == 0) break;
    h.Update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  if (!status.ok()) return status;
  const Sha256DigestBytes d = h.Final();
  return ToHex(d);
}

std::string ToHex(const uint8_t* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(size * 2, '\0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0xf];
  }
  return out;
}

}  // namespace fedlora
