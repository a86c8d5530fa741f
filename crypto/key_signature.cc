#include "crypto/key_signature.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status.h"
#include "crypto/openssl_errors.h"
#include "crypto/openssl_ptr.h"

namespace fedlora::crypto {
namespace {

struct StackFree {
  void operator()(STACK_OF(X509) * s) const {
    sk_X509_free(s);
  }  // the certificates are owned elsewhere
};
using StackPtr = std::unique_ptr<STACK_OF(X509), StackFree>;

constexpr char kLabel[] = "fedlora/v1 aggregation key";

void AppendLittleEndian64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void AppendField(std::string& out, std::string_view field) {
  AppendLittleEndian64(out, field.size());
  out.append(field);
}

std::string Statement(std::string_view run_id, uint64_t round, std::string_view public_key) {
  std::string out;
  AppendField(out, kLabel);
  AppendField(out, run_id);
  AppendLittleEndian64(out, round);
  AppendField(out, public_key);
  return out;
}

BioPtr MemBio(std::string_view bytes) {
  return BioPtr(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

// Every certificate of a PEM bundle, in order.
std::vector<X509Ptr> ReadCertificates(std::string_view pem) {
  std::vector<X509Ptr> out;
  BioPtr bio = MemBio(pem);
  while (bio != nullptr) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    out.push_back(std::move(cert));
  }
  DrainOpenSslErrors();  // the end of the bundle reads as an error
  return out;
}

// The digest the key's algorithm signs with: none for the EdDSA keys, SHA-256 otherwise.
const EVP_MD* DigestFor(const EVP_PKEY* key) {
  const int id = EVP_PKEY_get_id(key);
  return id == EVP_PKEY_ED25519 || id == EVP_PKEY_ED448 ? nullptr : EVP_sha256();
}

}  // namespace

absl::StatusOr<std::string> SignAggregationKey(std::string_view key_pem, std::string_view run_id,
                                               uint64_t round, std::string_view public_key) {
  BioPtr bio = MemBio(key_pem);
  KeyPtr key(bio != nullptr ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr)
                            : nullptr);
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the server's TLS key does not load: ", DrainOpenSslErrors()));
  }
  const std::string statement = Statement(run_id, round, public_key);
  MdCtxPtr ctx(EVP_MD_CTX_new());
  size_t size = 0;
  if (ctx == nullptr ||
      EVP_DigestSignInit(ctx.get(), nullptr, DigestFor(key.get()), nullptr, key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &size,
                     reinterpret_cast<const unsigned char*>(statement.data()),
                     statement.size()) != 1) {
    return absl::InternalError(absl::StrCat("signing the aggregation key: ", DrainOpenSslErrors()));
  }
  std::string signature(size, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &size,
                     reinterpret_cast<const unsigned char*>(statement.data()),
                     statement.size()) != 1) {
    return absl::InternalError(absl::StrCat("signing the aggregation key: ", DrainOpenSslErrors()));
  }
  signature.resize(size);
  return signature;
}

absl::StatusOr<std::string> CertificatePin(std::string_view cert_pem) {
  std::vector<X509Ptr> certs = ReadCertificates(cert_pem);
  if (certs.empty()) return absl::InvalidArgumentError("no PEM certificate to pin");
  unsigned char* der = nullptr;
  const int n = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(certs[0].get()), &der);
  if (n <= 0)
    return absl::InternalError(absl::StrCat("encoding the public key: ", DrainOpenSslErrors()));
  const std::string pin =
      Sha256Hex(std::string_view(reinterpret_cast<const char*>(der), static_cast<size_t>(n)));
  OPENSSL_free(der);
  return pin;
}

absl::Status VerifyAggregationKey(const AggregationKeyTrust& trust,
                                  std::string_view signer_chain_pem, std::string_view signature,
                                  std::string_view run_id, uint64_t round,
                                  std::string_view public_key) {
  if (signature.empty()) return absl::PermissionDeniedError("the aggregation key is not signed");
  std::vector<X509Ptr> chain = ReadCertificates(signer_chain_pem);
  if (chain.empty())
    return absl::InvalidArgumentError("the aggregation key's signer certificate does not parse");
  std::vector<X509Ptr> roots = ReadCertificates(trust.root_ca_pem);
  if (roots.empty())
    return absl::InvalidArgumentError("no CA certificate to check the aggregation key's signer");
  StorePtr store(X509_STORE_new());
  StackPtr untrusted(sk_X509_new_null());
  StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (store == nullptr || untrusted == nullptr || ctx == nullptr)
    return absl::ResourceExhaustedError("OpenSSL allocation");
  for (const X509Ptr& root : roots) X509_STORE_add_cert(store.get(), root.get());
  for (size_t i = 1; i < chain.size(); ++i) sk_X509_push(untrusted.get(), chain[i].get());
  X509* signer = chain[0].get();
  if (X509_STORE_CTX_init(ctx.get(), store.get(), signer, untrusted.get()) != 1 ||
      X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    DrainOpenSslErrors();
    return absl::PermissionDeniedError(
        absl::StrCat("the aggregation key's signer certificate does not chain to the "
                     "client's CA: ",
                     X509_verify_cert_error_string(err)));
  }
  if (!trust.pin_sha256_hex.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(const std::string pin, CertificatePin(signer_chain_pem));
    if (pin != trust.pin_sha256_hex) {
      return absl::PermissionDeniedError(
          absl::StrCat("the aggregation key is signed by a certificate whose key pin is ", pin,
                       ", not the pinned ", trust.pin_sha256_hex));
    }
  } else if (!trust.expected_host.empty()) {
    std::string host = trust.expected_host;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    const bool ip = X509_check_ip_asc(signer, host.c_str(), 0) == 1;
    const bool name = !ip && X509_check_host(signer, host.data(), host.size(), 0, nullptr) == 1;
    DrainOpenSslErrors();
    if (!ip && !name) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the aggregation key's signer certificate is not valid for the server '", host, "'"));
    }
  }
  const std::string statement = Statement(run_id, round, public_key);
  MdCtxPtr md(EVP_MD_CTX_new());
  EVP_PKEY* key = X509_get0_pubkey(signer);
  if (md == nullptr || key == nullptr ||
      EVP_DigestVerifyInit(md.get(), nullptr, DigestFor(key), nullptr, key) != 1 ||
      EVP_DigestVerify(md.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(statement.data()),
                       statement.size()) != 1) {
    DrainOpenSslErrors();
    return absl::PermissionDeniedError(
        absl::StrCat("the signature on round ", round,
                     "'s aggregation key does not verify: a key from anyone but the "
                     "server"));
  }
  return absl::OkStatus();
}

}  // namespace fedlora::crypto
