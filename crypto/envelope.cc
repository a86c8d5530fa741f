#include "crypto/envelope.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/proverr.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/strings.h"
#include "crypto/openssl_errors.h"
#include "crypto/random.h"

namespace fedlora::crypto {
namespace {

constexpr char kMagic[4] = {'F', 'L', 'S', 'E'};
constexpr size_t kNonceOffset = 8;  // magic (4), version (1), reserved zeros (3)
constexpr char kUpdateLabel[] = "fedlora/v2 update";
constexpr char kSealInfo[] = "fedlora/v1 sealed update";
constexpr size_t kHkdfMaxBytes = 255 * 32;
// GCM's limit for one (key, nonce): 2^39 - 256 bits of plaintext (NIST SP 800-38D).
constexpr uint64_t kGcmMaxPlaintextBytes = (uint64_t{1} << 36) - 32;
// EVP takes int lengths: larger inputs go in pieces of this size (a multiple of the AES block).
constexpr size_t kEvpPieceBytes = size_t{1} << 30;

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
struct KdfFree {
  void operator()(EVP_KDF* p) const { EVP_KDF_free(p); }
};
struct KdfCtxFree {
  void operator()(EVP_KDF_CTX* p) const { EVP_KDF_CTX_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;
using Kdf = std::unique_ptr<EVP_KDF, KdfFree>;
using KdfCtx = std::unique_ptr<EVP_KDF_CTX, KdfCtxFree>;

// Overwrites a secret held in a std::string when it goes out of scope.
class WipeOnExit {
 public:
  explicit WipeOnExit(std::string& s) : s_(s) {}
  ~WipeOnExit() { OPENSSL_cleanse(s_.data(), s_.size()); }
  WipeOnExit(const WipeOnExit&) = delete;
  WipeOnExit& operator=(const WipeOnExit&) = delete;

 private:
  std::string& s_;
};

const unsigned char* Bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}
unsigned char* Bytes(char* p) { return reinterpret_cast<unsigned char*>(p); }

absl::Status OpenSslError(std::string_view what) {
  return absl::InternalError(absl::StrCat(ToAbsl(what), " failed: ", DrainOpenSslErrors()));
}

absl::Status CheckSize(std::string_view bytes, size_t want, std::string_view what) {
  if (bytes.size() == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(ToAbsl(what), " must be ", want, " bytes, got ", bytes.size()));
}

absl::StatusOr<std::string> RawKey(EVP_PKEY* key, bool private_part) {
  std::string out(kX25519KeyBytes, '\0');
  size_t len = out.size();
  const int ok = private_part ? EVP_PKEY_get_raw_private_key(key, Bytes(out.data()), &len)
                              : EVP_PKEY_get_raw_public_key(key, Bytes(out.data()), &len);
  if (ok != 1 || len != kX25519KeyBytes) {
    OPENSSL_cleanse(out.data(), out.size());
    return OpenSslError(private_part ? "EVP_PKEY_get_raw_private_key"
                                     : "EVP_PKEY_get_raw_public_key");
  }
  return out;
}

absl::StatusOr<Pkey> X25519Private(std::string_view raw, std::string_view what) {
  FEDLORA_RETURN_IF_ERROR(CheckSize(raw, kX25519KeyBytes, what));
  Pkey key(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, Bytes(raw), raw.size()));
  if (key == nullptr) return OpenSslError(absl::StrCat("loading the ", ToAbsl(what)));
  return key;
}

absl::StatusOr<Pkey> X25519Public(std::string_view raw, std::string_view what) {
  FEDLORA_RETURN_IF_ERROR(CheckSize(raw, kX25519KeyBytes, what));
  Pkey key(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, Bytes(raw), raw.size()));
  if (key == nullptr) return OpenSslError(absl::StrCat("loading the ", ToAbsl(what)));
  return key;
}

// X25519SharedSecret with the keys named in errors (`private_what`, `peer_what`).
absl::StatusOr<std::string> DeriveShared(std::string_view private_key,
                                         std::string_view peer_public_key,
                                         std::string_view private_what,
                                         std::string_view peer_what) {
  FEDLORA_ASSIGN_OR_RETURN(Pkey own, X25519Private(private_key, private_what));
  FEDLORA_ASSIGN_OR_RETURN(Pkey peer, X25519Public(peer_public_key, peer_what));
  PkeyCtx ctx(EVP_PKEY_CTX_new(own.get(), nullptr));
  if (ctx == nullptr) return OpenSslError("EVP_PKEY_CTX_new");
  if (EVP_PKEY_derive_init(ctx.get()) != 1) return OpenSslError("EVP_PKEY_derive_init");
  if (EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1)
    return OpenSslError("EVP_PKEY_derive_set_peer");
  const auto small_order = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(peer_what),
                     " is a point of small order: the X25519 shared secret would be all zero"));
  };
  std::string secret(kX25519KeyBytes, '\0');
  size_t len = secret.size();
  ERR_clear_error();
  if (EVP_PKEY_derive(ctx.get(), Bytes(secret.data()), &len) != 1) {
    // OpenSSL refuses an all-zero X25519 output with this reason; anything else is its own failure.
    const unsigned long err = ERR_peek_last_error();
    if (ERR_GET_LIB(err) == ERR_LIB_PROV &&
        ERR_GET_REASON(err) == PROV_R_FAILED_DURING_DERIVATION) {
      ERR_clear_error();
      return small_order();
    }
    return OpenSslError("EVP_PKEY_derive (X25519)");
  }
  if (len != kX25519KeyBytes)
    return absl::InternalError(absl::StrCat("X25519 derived ", len, " bytes, not 32"));
  static constexpr char kZeros[kX25519KeyBytes] = {};
  if (CRYPTO_memcmp(secret.data(), kZeros, kX25519KeyBytes) == 0) return small_order();
  return secret;
}

// Feeds `in` to EVP_EncryptUpdate / EVP_DecryptUpdate in int-sized pieces; `out` is null for AAD.
// With `progress`, pieces are kProgressPieceBytes and it is told the bytes done after each.
absl::Status GcmUpdate(EVP_CIPHER_CTX* ctx, bool encrypt, std::string_view in, unsigned char* out,
                       const DecryptProgress& progress = nullptr) {
  const size_t max_piece = progress ? kProgressPieceBytes : kEvpPieceBytes;
  for (size_t done = 0; done < in.size();) {
    const size_t piece = std::min(in.size() - done, max_piece);
    int out_len = 0;
    unsigned char* dst = out == nullptr ? nullptr : out + done;
    const unsigned char* src = Bytes(in) + done;
    const int ok = encrypt ? EVP_EncryptUpdate(ctx, dst, &out_len, src, static_cast<int>(piece))
                           : EVP_DecryptUpdate(ctx, dst, &out_len, src, static_cast<int>(piece));
    if (ok != 1)
      return OpenSslError(encrypt ? "EVP_EncryptUpdate (AES-256-GCM)"
                                  : "EVP_DecryptUpdate (AES-256-GCM)");
    if (out != nullptr && static_cast<size_t>(out_len) != piece) {
      return absl::InternalError(
          absl::StrCat("AES-256-GCM returned ", out_len, " bytes for ", piece));
    }
    done += piece;
    if (progress) progress(done);
  }
  return absl::OkStatus();
}

absl::Status CheckGcmInputs(std::string_view key, std::string_view nonce, size_t text_size) {
  FEDLORA_RETURN_IF_ERROR(CheckSize(key, kAes256KeyBytes, "AES-256-GCM key"));
  FEDLORA_RETURN_IF_ERROR(CheckSize(nonce, kGcmNonceBytes, "AES-256-GCM nonce"));
  if (text_size > kGcmMaxPlaintextBytes) {
    return absl::InvalidArgumentError(absl::StrCat("AES-256-GCM input of ", text_size,
                                                   " bytes exceeds GCM's limit of ",
                                                   kGcmMaxPlaintextBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<CipherCtx> GcmContext(std::string_view key, std::string_view nonce, bool encrypt) {
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr) return OpenSslError("EVP_CIPHER_CTX_new");
  const int ok = encrypt
                     ? EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr)
                     : EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr);
  if (ok != 1) return OpenSslError("EVP_CipherInit_ex (AES-256-GCM)");
  if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(kGcmNonceBytes),
                          nullptr) != 1) {
    return OpenSslError("setting the AES-256-GCM nonce length");
  }
  if (EVP_CipherInit_ex(ctx.get(), nullptr, nullptr, Bytes(key), Bytes(nonce), encrypt ? 1 : 0) !=
      1) {
    return OpenSslError("EVP_CipherInit_ex (AES-256-GCM key and nonce)");
  }
  return ctx;
}

// AES-256-GCM over associated data aad1 || aad2: writes plaintext.size() bytes to `ciphertext` and
// the tag to `tag`. Sizes of key and nonce are checked by the caller (CheckGcmInputs).
absl::Status GcmSealInto(std::string_view key, std::string_view nonce, std::string_view aad1,
                         std::string_view aad2, std::string_view plaintext, char* ciphertext,
                         char* tag) {
  FEDLORA_ASSIGN_OR_RETURN(CipherCtx ctx, GcmContext(key, nonce, /*encrypt=*/true));
  FEDLORA_RETURN_IF_ERROR(GcmUpdate(ctx.get(), true, aad1, nullptr));
  FEDLORA_RETURN_IF_ERROR(GcmUpdate(ctx.get(), true, aad2, nullptr));
  FEDLORA_RETURN_IF_ERROR(GcmUpdate(ctx.get(), true, plaintext, Bytes(ciphertext)));
  unsigned char final_block[16];
  int final_len = 0;
  if (EVP_EncryptFinal_ex(ctx.get(), final_block, &final_len) != 1 || final_len != 0) {
    return OpenSslError("EVP_EncryptFinal_ex (AES-256-GCM)");
  }
  if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(kGcmTagBytes), tag) !=
      1) {
    return OpenSslError("reading the AES-256-GCM tag");
  }
  return absl::OkStatus();
}

// The inverse of GcmSealInto, writing ciphertext.size() bytes to `out`. PermissionDenied with
// `unauthenticated` when the tag does not verify; `out` is zeroed on any failure.
absl::Status GcmOpenInto(std::string_view key, std::string_view nonce, std::string_view aad1,
                         std::string_view aad2, std::string_view ciphertext, std::string_view tag,
                         char* out, std::string_view unauthenticated,
                         const DecryptProgress& progress = nullptr) {
  absl::Status status = [&]() -> absl::Status {
    FEDLORA_ASSIGN_OR_RETURN(CipherCtx ctx, GcmContext(key, nonce, /*encrypt=*/false));
    FEDLORA_RETURN_IF_ERROR(GcmUpdate(ctx.get(), false, aad1, nullptr));
    FEDLORA_RETURN_IF_ERROR(GcmUpdate(ctx.get(), false, aad2, nullptr));
    FEDLORA_RETURN_IF_ERROR(GcmUpdate(ctx.get(), false, ciphertext, Bytes(out), progress));
    if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(kGcmTagBytes),
                            const_cast<char*>(tag.data())) != 1) {
      return OpenSslError("setting the AES-256-GCM tag");
    }
    unsigned char final_block[16];
    int final_len = 0;
    if (EVP_DecryptFinal_ex(ctx.get(), final_block, &final_len) != 1) {
      ERR_clear_error();
      return absl::PermissionDeniedError(std::string(unauthenticated));
    }
    return absl::OkStatus();
  }();
  if (!status.ok() && !ciphertext.empty()) OPENSSL_cleanse(out, ciphertext.size());
  return status;
}

void AppendLittleEndian64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void AppendField(std::string& out, std::string_view field) {
  AppendLittleEndian64(out, field.size());
  out.append(field.data(), field.size());
}

// HKDF-SHA256(shared, ephemeral_public || server_public, kSealInfo), the envelope's AES key.
absl::StatusOr<std::string> EnvelopeKey(std::string_view shared, std::string_view ephemeral_public,
                                        std::string_view server_public) {
  std::string salt = absl::StrCat(ToAbsl(ephemeral_public), ToAbsl(server_public));
  return HkdfSha256(shared, salt, kSealInfo, kAes256KeyBytes);
}

constexpr char kUnauthenticatedUpdate[] =
    "sealed update does not authenticate: tampered, or sealed for another run, round, client, "
    "upload or server key";

}  // namespace

absl::StatusOr<X25519KeyPair> GenerateX25519KeyPair() {
  PkeyCtx ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  if (ctx == nullptr) return OpenSslError("EVP_PKEY_CTX_new_id (X25519)");
  if (EVP_PKEY_keygen_init(ctx.get()) != 1) return OpenSslError("EVP_PKEY_keygen_init (X25519)");
  EVP_PKEY* raw = nullptr;
  if (EVP_PKEY_keygen(ctx.get(), &raw) != 1) return OpenSslError("EVP_PKEY_keygen (X25519)");
  Pkey key(raw);
  X25519KeyPair pair;
  FEDLORA_ASSIGN_OR_RETURN(pair.private_key, RawKey(key.get(), /*private_part=*/true));
  FEDLORA_ASSIGN_OR_RETURN(pair.public_key, RawKey(key.get(), /*private_part=*/false));
  return pair;
}

absl::StatusOr<std::string> X25519PublicKey(std::string_view private_key) {
  FEDLORA_ASSIGN_OR_RETURN(Pkey key, X25519Private(private_key, "X25519 private key"));
  return RawKey(key.get(), /*private_part=*/false);
}

absl::StatusOr<std::string> X25519SharedSecret(std::string_view private_key,
                                               std::string_view peer_public_key) {
  return DeriveShared(private_key, peer_public_key, "X25519 private key", "X25519 peer public key");
}

absl::StatusOr<std::string> HkdfSha256(std::string_view ikm, std::string_view salt,
                                       std::string_view info, size_t length) {
  if (length == 0 || length > kHkdfMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat("HKDF-SHA256 output length must be 1..",
                                                   kHkdfMaxBytes, " bytes, got ", length));
  }
  if (ikm.empty()) return absl::InvalidArgumentError("HKDF-SHA256 input key material is empty");
  Kdf kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr));
  if (kdf == nullptr) return OpenSslError("EVP_KDF_fetch (HKDF)");
  KdfCtx ctx(EVP_KDF_CTX_new(kdf.get()));
  if (ctx == nullptr) return OpenSslError("EVP_KDF_CTX_new (HKDF)");
  // OSSL_PARAM wants non-null pointers even for empty strings.
  static unsigned char empty[1] = {0};
  auto octets = [](const char* name, std::string_view s) {
    void* data = s.empty() ? static_cast<void*>(empty) : const_cast<char*>(s.data());
    return OSSL_PARAM_construct_octet_string(name, data, s.size());
  };
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      octets(OSSL_KDF_PARAM_KEY, ikm),
      octets(OSSL_KDF_PARAM_SALT, salt),
      octets(OSSL_KDF_PARAM_INFO, info),
      OSSL_PARAM_construct_end(),
  };
  std::string out(length, '\0');
  if (EVP_KDF_derive(ctx.get(), Bytes(out.data()), out.size(), params) != 1) {
    OPENSSL_cleanse(out.data(), out.size());
    return OpenSslError("EVP_KDF_derive (HKDF-SHA256)");
  }
  return out;
}

absl::StatusOr<std::string> Aes256GcmSeal(std::string_view key, std::string_view nonce,
                                          std::string_view aad, std::string_view plaintext) {
  FEDLORA_RETURN_IF_ERROR(CheckGcmInputs(key, nonce, plaintext.size()));
  std::string out(plaintext.size() + kGcmTagBytes, '\0');
  FEDLORA_RETURN_IF_ERROR(
      GcmSealInto(key, nonce, aad, {}, plaintext, out.data(), out.data() + plaintext.size()));
  return out;
}

absl::StatusOr<std::string> Aes256GcmOpen(std::string_view key, std::string_view nonce,
                                          std::string_view aad,
                                          std::string_view ciphertext_and_tag) {
  const size_t n =
      ciphertext_and_tag.size() < kGcmTagBytes ? 0 : ciphertext_and_tag.size() - kGcmTagBytes;
  FEDLORA_RETURN_IF_ERROR(CheckGcmInputs(key, nonce, n));
  if (ciphertext_and_tag.size() < kGcmTagBytes) {
    return absl::InvalidArgumentError(absl::StrCat("AES-256-GCM ciphertext of ",
                                                   ciphertext_and_tag.size(),
                                                   " bytes is shorter than its 16-byte tag"));
  }
  std::string out(n, '\0');
  FEDLORA_RETURN_IF_ERROR(
      GcmOpenInto(key, nonce, aad, {}, ciphertext_and_tag.substr(0, n),
                  ciphertext_and_tag.substr(n), out.data(),
                  "AES-256-GCM ciphertext does not authenticate: wrong key, nonce or associated "
                  "data, or tampered"));
  return out;
}

std::string UpdateAssociatedData(std::string_view run_id, uint64_t round,
                                 std::string_view client_id, std::string_view upload_id,
                                 uint64_t num_examples) {
  std::string out;
  out.reserve(6 * 8 + sizeof(kUpdateLabel) + run_id.size() + client_id.size() + upload_id.size());
  AppendField(out, kUpdateLabel);
  AppendField(out, run_id);
  AppendLittleEndian64(out, round);
  AppendField(out, client_id);
  AppendField(out, upload_id);
  AppendLittleEndian64(out, num_examples);
  return out;
}

absl::StatusOr<SealedUpdate> SealUpdate(std::string_view server_public_key, std::string_view aad,
                                        std::string_view plaintext) {
  FEDLORA_RETURN_IF_ERROR(CheckSize(server_public_key, kX25519KeyBytes, "server public key"));
  if (plaintext.size() > kGcmMaxPlaintextBytes) {
    return absl::InvalidArgumentError(absl::StrCat("update of ", plaintext.size(),
                                                   " bytes exceeds the envelope's limit of ",
                                                   kGcmMaxPlaintextBytes));
  }
  FEDLORA_ASSIGN_OR_RETURN(X25519KeyPair ephemeral, GenerateX25519KeyPair());
  WipeOnExit wipe_ephemeral(ephemeral.private_key);
  FEDLORA_ASSIGN_OR_RETURN(std::string shared,
                           DeriveShared(ephemeral.private_key, server_public_key,
                                        "ephemeral private key", "server public key"));
  WipeOnExit wipe_shared(shared);
  FEDLORA_ASSIGN_OR_RETURN(std::string key,
                           EnvelopeKey(shared, ephemeral.public_key, server_public_key));
  WipeOnExit wipe_key(key);
  FEDLORA_ASSIGN_OR_RETURN(std::string nonce, RandomBytes(kGcmNonceBytes));

  SealedUpdate sealed;
  sealed.envelope.assign(kEnvelopeOverheadBytes + plaintext.size(), '\0');
  char* header = sealed.envelope.data();
  std::memcpy(header, kMagic, sizeof(kMagic));
  header[4] = static_cast<char>(kEnvelopeVersion);  // bytes 5..7 stay zero
  std::memcpy(header + kNonceOffset, nonce.data(), kGcmNonceBytes);
  FEDLORA_RETURN_IF_ERROR(GcmSealInto(key, nonce, std::string_view(header, kEnvelopeHeaderBytes),
                                      aad, plaintext, header + kEnvelopeHeaderBytes,
                                      header + kEnvelopeHeaderBytes + plaintext.size()));
  sealed.ephemeral_public_key = std::move(ephemeral.public_key);
  return sealed;
}

absl::StatusOr<size_t> EnvelopePlaintextSize(std::string_view envelope) {
  if (envelope.size() < kEnvelopeOverheadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sealed update envelope is too short: ", envelope.size(), " bytes, need at least ",
        kEnvelopeOverheadBytes, " (20-byte header and 16-byte tag)"));
  }
  if (std::memcmp(envelope.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        "sealed update envelope has bad magic: its first 4 bytes are not \"FLSE\"");
  }
  const uint8_t version = static_cast<uint8_t>(envelope[4]);
  if (version != kEnvelopeVersion) {
    return absl::InvalidArgumentError(absl::StrCat("sealed update envelope has unknown version ",
                                                   version, " (this build reads version ",
                                                   kEnvelopeVersion, ")"));
  }
  // The 3 reserved bytes are not checked here: they are authenticated as part of the header.
  return envelope.size() - kEnvelopeOverheadBytes;
}

absl::Status OpenUpdateInto(std::string_view server_private_key,
                            std::string_view ephemeral_public_key, std::string_view aad,
                            std::string_view envelope, char* out, size_t out_size,
                            const DecryptProgress& progress) {
  FEDLORA_RETURN_IF_ERROR(CheckSize(server_private_key, kX25519KeyBytes, "server private key"));
  FEDLORA_RETURN_IF_ERROR(CheckSize(ephemeral_public_key, kX25519KeyBytes, "ephemeral public key"));
  FEDLORA_ASSIGN_OR_RETURN(const size_t n, EnvelopePlaintextSize(envelope));
  if (out_size != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output buffer holds ", out_size, " bytes but the envelope's plaintext is ", n, " bytes"));
  }
  if (out == nullptr && n > 0) return absl::InvalidArgumentError("output buffer is null");
  if (n > kGcmMaxPlaintextBytes) {
    return absl::InvalidArgumentError(absl::StrCat("sealed update envelope holds ", n,
                                                   " bytes of plaintext, over GCM's limit of ",
                                                   kGcmMaxPlaintextBytes));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string server_public, X25519PublicKey(server_private_key));
  FEDLORA_ASSIGN_OR_RETURN(std::string shared,
                           DeriveShared(server_private_key, ephemeral_public_key,
                                        "server private key", "ephemeral public key"));
  WipeOnExit wipe_shared(shared);
  FEDLORA_ASSIGN_OR_RETURN(std::string key,
                           EnvelopeKey(shared, ephemeral_public_key, server_public));
  WipeOnExit wipe_key(key);
  return GcmOpenInto(
      key, envelope.substr(kNonceOffset, kGcmNonceBytes), envelope.substr(0, kEnvelopeHeaderBytes),
      aad, envelope.substr(kEnvelopeHeaderBytes, n), envelope.substr(kEnvelopeHeaderBytes + n), out,
      kUnauthenticatedUpdate, progress);
}

absl::StatusOr<std::string> OpenUpdate(std::string_view server_private_key,
                                       std::string_view ephemeral_public_key, std::string_view aad,
                                       std::string_view envelope) {
  FEDLORA_ASSIGN_OR_RETURN(const size_t n, EnvelopePlaintextSize(envelope));
  std::string out(n, '\0');
  FEDLORA_RETURN_IF_ERROR(
      OpenUpdateInto(server_private_key, ephemeral_public_key, aad, envelope, out.data(), n));
  return out;
}

}  // namespace fedlora::crypto
