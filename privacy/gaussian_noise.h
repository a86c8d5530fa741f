// Gaussian noise from a cryptographic generator, for the server's differential-privacy noise.
//
//   FEDLORA_ASSIGN_OR_RETURN(privacy::GaussianSampler noise, privacy::GaussianSampler::Create(key, round));
//   for (float& v : values) { FEDLORA_ASSIGN_OR_RETURN(double z, noise.Next()); v += sigma * z; }
//
// Standard normal draws by the Box-Muller transform on 53-bit uniforms from crypto::Prg (AES-256-
// CTR keyed by a 32-byte secret): the same key and stream give the same draws on every machine, so
// a server that restarts mid-round adds the same noise again, and nobody without the key can
// predict or subtract it. The draws are doubles: the known attacks on floating-point Laplace and
// Gaussian samplers (Mironov 2012) are not defended against. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "crypto/prg.h"

namespace fedlora::privacy {

class GaussianSampler {
 public:
  // InvalidArgument when `key` is not 32 bytes.
  static absl::StatusOr<GaussianSampler> Create(std::string_view key, uint64_t stream);

  // The next N(0, 1) draw.
  absl::StatusOr<double> Next();

 private:
  explicit GaussianSampler(crypto::Prg prg) : prg_(std::move(prg)) {}
  crypto::Prg prg_;
  std::optional<double> spare_;  // Box-Muller's second value
};

}  // namespace fedlora::privacy
