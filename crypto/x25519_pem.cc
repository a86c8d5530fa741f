#include "crypto/x25519_pem.h"

#include <openssl/pem.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "crypto/envelope.h"
#include "crypto/openssl_errors.h"
#include "crypto/openssl_ptr.h"

namespace fedlora::crypto {
namespace {

int NoPassword(char*, int, int, void*) { return 0; }  // an encrypted PEM fails instead of prompting

absl::StatusOr<std::string> ToPem(std::string_view raw, bool is_private) {
  if (raw.size() != kX25519KeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an X25519 ", is_private ? "private" : "public",
                                                   " key is 32 bytes, not ", raw.size()));
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(raw.data());
  KeyPtr key(is_private ? EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, bytes, raw.size())
                        : EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, bytes, raw.size()));
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (key == nullptr || bio == nullptr) return absl::InternalError(DrainOpenSslErrors());
  const int ok = is_private ? PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0,
                                                       nullptr, nullptr)
                            : PEM_write_bio_PUBKEY(bio.get(), key.get());
  if (ok != 1) return absl::InternalError(absl::StrCat("writing PEM: ", DrainOpenSslErrors()));
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> FromPem(std::string_view pem, bool is_private) {
  const char* what = is_private ? "private" : "public";
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::InternalError("BIO_new_mem_buf failed");
  KeyPtr key(is_private ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassword, nullptr)
                        : PEM_read_bio_PUBKEY(bio.get(), nullptr, NoPassword, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a PEM ", is_private ? "PRIVATE KEY" : "PUBLIC KEY", " (", DrainOpenSslErrors(), ")"));
  }
  if (EVP_PKEY_get_id(key.get()) != EVP_PKEY_X25519) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", what, " key is ", OBJ_nid2sn(EVP_PKEY_get_id(key.get())), ", not X25519"));
  }
  std::string raw(kX25519KeyBytes, '\0');
  size_t len = raw.size();
  auto* out = reinterpret_cast<unsigned char*>(raw.data());
  const int ok = is_private ? EVP_PKEY_get_raw_private_key(key.get(), out, &len)
                            : EVP_PKEY_get_raw_public_key(key.get(), out, &len);
  if (ok != 1 || len != kX25519KeyBytes) {
    return absl::InternalError(
        absl::StrCat("reading the raw X25519 ", what, " key: ", DrainOpenSslErrors()));
  }
  return raw;
}

}  // namespace

absl::StatusOr<std::string> X25519PublicKeyToPem(std::string_view public_key) {
  return ToPem(public_key, false);
}
absl::StatusOr<std::string> X25519PrivateKeyToPem(std::string_view private_key) {
  return ToPem(private_key, true);
}
absl::StatusOr<std::string> X25519PublicKeyFromPem(std::string_view pem) {
  return FromPem(pem, false);
}
absl::StatusOr<std::string> X25519PrivateKeyFromPem(std::string_view pem) {
  return FromPem(pem, true);
}

}  // namespace fedlora::crypto
