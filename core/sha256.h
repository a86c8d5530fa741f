// SHA-256 through OpenSSL 3's EVP interface: incremental, one-shot, hex and file helpers.
//
//   Sha256 h;
//   h.Update(chunk.data(), chunk.size());      // any number of times
//   std::array<uint8_t, 32> digest = h.Final();
//   std::string hex = Sha256Hex("abc");         // "ba7816bf..."
//
// A Sha256 object is not thread-safe; the free functions are.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

// Forward declaration so that callers do not pull in OpenSSL headers.
typedef struct evp_md_ctx_st EVP_MD_CTX;

namespace fedlora {

inline constexpr size_t kSha256DigestSize = 32;  // bytes
using Sha256DigestBytes = std::array<uint8_t, kSha256DigestSize>;

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  void Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // Returns the digest and resets the object so it can hash a new message.
  Sha256DigestBytes Final();

 private:
  EVP_MD_CTX* ctx_;
};

Sha256DigestBytes Sha256Digest(std::string_view bytes);
// Lowercase hex of the digest (64 characters).
std::string Sha256Hex(std::string_view bytes);
// Hashes a file in fixed-size chunks (constant memory). Errors as ReadFileToString.
absl::StatusOr<std::string> Sha256FileHex(const std::string& path);

// Lowercase hex encoding, two characters per byte.
std::string ToHex(const uint8_t* data, size_t size);

}  // namespace fedlora
