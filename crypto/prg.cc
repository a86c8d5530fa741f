#include "crypto/prg.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "crypto/openssl_errors.h"

namespace fedlora::crypto {
namespace {

// Keystream bytes produced per EVP call (a multiple of the AES block).
constexpr size_t kChunkBytes = 64 * 1024;

struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};

}  // namespace

struct Prg::Impl {
  std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree> ctx;
  std::vector<unsigned char> zeros = std::vector<unsigned char>(kChunkBytes, 0);
  std::vector<uint64_t> words;  // scratch for AddTo / SubtractFrom
};

Prg::Prg(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Prg::Prg(Prg&&) noexcept = default;
Prg& Prg::operator=(Prg&&) noexcept = default;
Prg::~Prg() = default;

absl::StatusOr<Prg> Prg::Create(std::string_view seed, uint64_t stream) {
  if (seed.size() != kSeedBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("PRG seed must be ", kSeedBytes, " bytes, got ", seed.size()));
  }
  auto impl = std::make_unique<Impl>();
  impl->ctx.reset(EVP_CIPHER_CTX_new());
  unsigned char iv[16] = {};
  for (int i = 0; i < 8; ++i) iv[i] = static_cast<unsigned char>(stream >> (56 - 8 * i));
  if (impl->ctx == nullptr ||
      EVP_EncryptInit_ex(impl->ctx.get(), EVP_aes_256_ctr(), nullptr,
                         reinterpret_cast<const unsigned char*>(seed.data()), iv) != 1) {
    return absl::InternalError(absl::StrCat("AES-256-CTR init failed: ", DrainOpenSslErrors()));
  }
  return Prg(std::move(impl));
}

absl::Status Prg::Fill(void* out, size_t n) {
  auto* dst = static_cast<unsigned char*>(out);
  while (n > 0) {
    const size_t piece = std::min(n, kChunkBytes);
    int written = 0;
    if (EVP_EncryptUpdate(impl_->ctx.get(), dst, &written, impl_->zeros.data(),
                          static_cast<int>(piece)) != 1 ||
        static_cast<size_t>(written) != piece) {
      return absl::InternalError(
          absl::StrCat("AES-256-CTR keystream failed: ", DrainOpenSslErrors()));
    }
    dst += piece;
    n -= piece;
  }
  return absl::OkStatus();
}

namespace {

template <typename Op>
absl::Status Combine(Prg& prg, std::vector<uint64_t>& words, std::span<uint64_t> values, Op op) {
  constexpr size_t kWords = kChunkBytes / sizeof(uint64_t);
  words.resize(kWords);
  for (size_t i = 0; i < values.size(); i += kWords) {
    const size_t n = std::min(kWords, values.size() - i);
    if (absl::Status s = prg.Fill(words.data(), n * sizeof(uint64_t)); !s.ok()) return s;
    for (size_t j = 0; j < n; ++j) {
      uint64_t w = 0;
      unsigned char b[8];
      std::memcpy(b, &words[j], 8);
      for (int k = 7; k >= 0; --k) w = (w << 8) | b[k];  // little-endian on every host
      values[i + j] = op(values[i + j], w);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Prg::AddTo(std::span<uint64_t> values) {
  return Combine(*this, impl_->words, values, [](uint64_t v, uint64_t w) { return v + w; });
}

absl::Status Prg::SubtractFrom(std::span<uint64_t> values) {
  return Combine(*this, impl_->words, values, [](uint64_t v, uint64_t w) { return v - w; });
}

absl::StatusOr<double> Prg::NextUniform() {
  uint64_t w = 0;
  if (absl::Status s = AddTo(std::span<uint64_t>(&w, 1)); !s.ok()) return s;
  return static_cast<double>(w >> 11) * 0x1.0p-53;
}

}  // namespace fedlora::crypto
