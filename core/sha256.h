// SHA-256: incremental, one-shot, hex and file helpers, and a chunk's own digest computed in the
// same pass that feeds the chunk to a running hash.
//
//   Sha256 h;
//   h.Update(chunk.data(), chunk.size());      // any number of times
//   std::array<uint8_t, 32> digest = h.Final();
//   std::string hex = Sha256Hex("abc");         // "ba7816bf..."
//
//   Sha256 blob;                                // chunked transfers: each chunk and the whole
//   Sha256DigestBytes c = blob.UpdateAndDigest(chunk);  // == Sha256Digest(chunk), and blob advanced
//
// The block function is SHA-NI where the CPU has it and OpenSSL's otherwise (core/sha256_blocks.h);
// UpdateAndDigest runs two interleaved SHA-NI lanes, so both digests cost about one pass.
// A Sha256 object is not thread-safe; the free functions are.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fedlora {

inline constexpr size_t kSha256DigestSize = 32;  // bytes
using Sha256DigestBytes = std::array<uint8_t, kSha256DigestSize>;

// A value type: copying it forks the hash (both copies go on from the same prefix).
class Sha256 {
 public:
  Sha256();

  void Update(const void* data, size_t size);
  void Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // Returns the digest and resets the object so it can hash a new message.
  Sha256DigestBytes Final();

  // Feeds `bytes` to this hash and returns the SHA-256 of `bytes` alone: the same as
  // `Update(bytes); return Sha256Digest(bytes);`, but where this hash has consumed a whole number
  // of 64-byte blocks so far (every chunk of a chunked transfer but the last is such a multiple),
  // the bytes are read once and the two hashes advance side by side.
  Sha256DigestBytes UpdateAndDigest(std::string_view bytes);

  // Bytes fed so far.
  uint64_t size() const { return total_bytes_; }

 private:
  uint32_t state_[8];
  uint64_t total_bytes_ = 0;
  uint8_t buffer_[64];  // the first buffered_ bytes: a block not yet complete
  size_t buffered_ = 0;
};

Sha256DigestBytes Sha256Digest(std::string_view bytes);
// Lowercase hex of the digest (64 characters).
std::string Sha256Hex(std::string_view bytes);
// Hashes a file in fixed-size chunks (constant memory). Errors as ReadFileToString.
absl::StatusOr<std::string> Sha256FileHex(const std::string& path);

// Lowercase hex encoding, two characters per byte.
std::string ToHex(const uint8_t* data, size_t size);
inline std::string ToHex(const Sha256DigestBytes& digest) {
  return ToHex(digest.data(), digest.size());
}

}  // namespace fedlora
