// A cryptographic pseudo-random generator: AES-256 in counter mode (OpenSSL EVP), keyed by a
// 32-byte seed. The secure-aggregation masks and the server's DP noise are expanded with it.
//
//   FEDLORA_ASSIGN_OR_RETURN(crypto::Prg prg, crypto::Prg::Create(seed, /*stream=*/round));
//   FEDLORA_RETURN_IF_ERROR(prg.AddTo(masked));   // masked[i] += next keystream word (mod 2^64)
//
// Output is the AES-256-CTR keystream for key = seed and the 16-byte initial counter block
// stream (8 bytes big-endian) || 0 (8 bytes): the same seed and stream give the same bytes on
// every machine, and distinct streams under one seed never overlap (each holds 2^64 blocks).
// Words are read little-endian. Not thread-safe; a Prg is movable, not copyable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora::crypto {

class Prg {
 public:
  static constexpr size_t kSeedBytes = 32;

  // InvalidArgument when `seed` is not 32 bytes; Internal when OpenSSL fails.
  static absl::StatusOr<Prg> Create(std::string_view seed, uint64_t stream = 0);

  Prg(Prg&&) noexcept;
  Prg& operator=(Prg&&) noexcept;
  ~Prg();

  // The next `n` keystream bytes.
  absl::Status Fill(void* out, size_t n);
  // values[i] += / -= the next 64-bit keystream word, modulo 2^64.
  absl::Status AddTo(std::span<uint64_t> values);
  absl::Status SubtractFrom(std::span<uint64_t> values);
  // A uniform double in [0, 1) from the top 53 bits of the next word.
  absl::StatusOr<double> NextUniform();

 private:
  struct Impl;
  explicit Prg(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedlora::crypto
