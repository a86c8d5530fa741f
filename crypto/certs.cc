#include "crypto/certs.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cctype>
#include <climits>
#include <ctime>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status.h"
#include "crypto/openssl_errors.h"
#include "crypto/openssl_ptr.h"

namespace fedlora::crypto {
namespace {

// Larger PEM inputs are refused rather than handed to OpenSSL (whose BIO lengths are int).
constexpr size_t kMaxPemBytes = 64 << 20;
// 9999-12-31T23:59:59Z, the last instant X.509 can express.
constexpr int64_t kMaxUnixSeconds = 253402300799;

absl::Status OpenSslError(absl::StatusCode code, const std::string& what) {
  return absl::Status(code, absl::StrCat(what, " (", DrainOpenSslErrors(), ")"));
}
absl::Status Internal(const std::string& what) {
  return OpenSslError(absl::StatusCode::kInternal, what);
}

absl::StatusOr<BioPtr> MemBio(std::string_view data, const std::string& what) {
  if (data.size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", data.size(), " bytes; at most ", kMaxPemBytes));
  }
  BioPtr bio(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
  if (bio == nullptr) return Internal("BIO_new_mem_buf failed");
  return bio;
}

// Never prompts for a passphrase: encrypted keys are refused.
int NoPassword(char*, int, int, void*) { return 0; }

// Whether the last PEM read failed only because no (further) PEM block of the kind was found.
bool NoPemFound() {
  const unsigned long e = ERR_peek_last_error();
  return ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
}

absl::StatusOr<X509Ptr> ReadCert(std::string_view pem, const std::string& what) {
  ERR_clear_error();
  FEDLORA_ASSIGN_OR_RETURN(BioPtr bio, MemBio(pem, what));
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassword, nullptr));
  if (cert == nullptr) {
    if (NoPemFound()) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat(what, " holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
    }
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        absl::StrCat(what, " is not a valid PEM certificate"));
  }
  return cert;
}

// Every certificate of a PEM bundle (at least one).
absl::StatusOr<std::vector<X509Ptr>> ReadCertBundle(std::string_view pem, const std::string& what) {
  ERR_clear_error();
  FEDLORA_ASSIGN_OR_RETURN(BioPtr bio, MemBio(pem, what));
  std::vector<X509Ptr> certs;
  while (true) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassword, nullptr));
    if (cert == nullptr) {
      if (!NoPemFound()) {
        return OpenSslError(
            absl::StatusCode::kInvalidArgument,
            absl::StrCat("certificate ", certs.size() + 1, " of ", what, " is not valid PEM"));
      }
      ERR_clear_error();
      break;
    }
    certs.push_back(std::move(cert));
  }
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  return certs;
}

absl::StatusOr<KeyPtr> ReadKey(std::string_view pem, const std::string& what) {
  ERR_clear_error();
  FEDLORA_ASSIGN_OR_RETURN(BioPtr bio, MemBio(pem, what));
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassword, nullptr));
  if (key == nullptr) {
    if (NoPemFound()) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(what, " holds no PEM private key"));
    }
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        absl::StrCat(what, " is not a valid unencrypted PEM private key"));
  }
  return key;
}

absl::StatusOr<CrlPtr> ReadCrl(std::string_view pem, const std::string& what) {
  ERR_clear_error();
  FEDLORA_ASSIGN_OR_RETURN(BioPtr bio, MemBio(pem, what));
  CrlPtr crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, NoPassword, nullptr));
  if (crl == nullptr) {
    if (NoPemFound()) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat(what, " holds no PEM CRL (-----BEGIN X509 CRL-----)"));
    }
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        absl::StrCat(what, " is not a valid PEM CRL"));
  }
  return crl;
}

template <typename T, int (*Write)(BIO*, T*)>
absl::StatusOr<std::string> ToPem(T* object, const std::string& what) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || Write(bio.get(), object) != 1)
    return Internal(absl::StrCat("writing the ", what, " as PEM"));
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}
int WriteCert(BIO* bio, X509* x) { return PEM_write_bio_X509(bio, x); }
int WriteCrl(BIO* bio, X509_CRL* c) { return PEM_write_bio_X509_CRL(bio, c); }
int WriteKey(BIO* bio, EVP_PKEY* k) {
  return PEM_write_bio_PrivateKey(bio, k, nullptr, nullptr, 0, nullptr, nullptr);
}

std::string ToLowerHex(const char* hex) {
  std::string s(hex);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

absl::StatusOr<std::string> SerialHex(const ASN1_INTEGER* serial) {
  BnPtr bn(ASN1_INTEGER_to_BN(serial, nullptr));
  if (bn == nullptr) return Internal("reading a serial number");
  char* hex = BN_bn2hex(bn.get());
  if (hex == nullptr) return Internal("formatting a serial number");
  std::string out = ToLowerHex(hex);
  OPENSSL_free(hex);
  return out;
}

// The first CN of a name as UTF-8; empty when there is none.
std::string CommonName(const X509_NAME* name) {
  const int i = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  if (i < 0) return "";
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, data);
  if (n < 0) {
    ERR_clear_error();
    return "";
  }
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return out;
}

absl::StatusOr<int64_t> UnixSeconds(const ASN1_TIME* t, const std::string& what) {
  struct tm tm {};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) {
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        absl::StrCat("unreadable ", what, " time"));
  }
  return static_cast<int64_t>(timegm(&tm));
}

absl::StatusOr<AsnTimePtr> AsnTime(int64_t unix_s) {
  AsnTimePtr t(ASN1_TIME_set(nullptr, static_cast<time_t>(unix_s)));
  if (t == nullptr) return Internal(absl::StrCat("ASN1_TIME_set(", unix_s, ")"));
  return t;
}

std::string Describe(X509* cert) {
  const std::string cn = CommonName(X509_get_subject_name(cert));
  absl::StatusOr<std::string> serial = SerialHex(X509_get0_serialNumber(cert));
  return absl::StrCat("certificate '", cn, "' (serial ", serial.ok() ? *serial : "?", ")");
}

// ------------------------------------------------------------------------------------------------
// Checks of requests

bool IsPrintableName(std::string_view s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

absl::Status CheckDnsName(const std::string& name) {
  std::string_view rest = name;
  if (rest.substr(0, 2) == "*.") rest.remove_prefix(2);
  bool ok = !rest.empty() && name.size() <= 253;
  size_t label = 0;
  for (size_t i = 0; ok && i <= rest.size(); ++i) {
    if (i == rest.size() || rest[i] == '.') {
      ok = label >= 1 && label <= 63 && rest[i - 1] != '-' && rest[i - label] != '-';
      label = 0;
    } else {
      const char c = rest[i];
      ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
      ++label;
    }
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name.substr(0, 80),
                     "' is not a valid DNS name (labels of [A-Za-z0-9-], dot-separated)"));
  }
  return absl::OkStatus();
}

// The validity interval of a request, with the defaults applied.
absl::StatusOr<std::pair<int64_t, int64_t>> Validity(const CertificateRequest& r) {
  const int64_t not_before = r.not_before_unix_s != 0
                                 ? r.not_before_unix_s
                                 : static_cast<int64_t>(std::time(nullptr)) - 60;
  if (r.not_after_unix_s == 0) {
    return absl::InvalidArgumentError(
        "not_after_unix_s is not set: the caller must choose the validity");
  }
  if (not_before < 0 || r.not_after_unix_s > kMaxUnixSeconds) {
    return absl::InvalidArgumentError(absl::StrCat("validity [", not_before, ", ",
                                                   r.not_after_unix_s, "] is outside 1970..9999"));
  }
  if (r.not_after_unix_s <= not_before) {
    return absl::InvalidArgumentError(absl::StrCat("not_after_unix_s ", r.not_after_unix_s,
                                                   " is not after not_before ", not_before));
  }
  return std::make_pair(not_before, r.not_after_unix_s);
}

// ------------------------------------------------------------------------------------------------
// Building certificates

absl::StatusOr<KeyPtr> NewKey() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (key == nullptr) return Internal("generating a P-256 key");
  return key;
}

absl::Status SetRandomSerial(X509* x) {
  unsigned char bytes[16];
  BnPtr bn;
  do {
    if (RAND_bytes(bytes, sizeof bytes) != 1) return Internal("RAND_bytes for a serial number");
    bn.reset(BN_bin2bn(bytes, sizeof bytes, nullptr));
    if (bn == nullptr) return Internal("BN_bin2bn");
  } while (BN_is_zero(bn.get()));
  if (BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(x)) == nullptr)
    return Internal("setting the serial number");
  return absl::OkStatus();
}

absl::Status AddExtension(X509* x, X509V3_CTX* ctx, int nid, const char* value) {
  ExtPtr ext(X509V3_EXT_nconf_nid(nullptr, ctx, nid, value));
  if (ext == nullptr || X509_add_ext(x, ext.get(), -1) != 1) {
    return Internal(absl::StrCat("adding the ", OBJ_nid2sn(nid), " extension '", value, "'"));
  }
  return absl::OkStatus();
}

absl::Status AddSubjectAltNames(X509* x, const CertificateRequest& r) {
  NamesPtr names(sk_GENERAL_NAME_new_null());
  if (names == nullptr) return Internal("sk_GENERAL_NAME_new_null");
  for (const std::string& dns : r.dns_names) {
    FEDLORA_RETURN_IF_ERROR(CheckDnsName(dns));
    GENERAL_NAME* g = GENERAL_NAME_new();
    ASN1_IA5STRING* s = ASN1_IA5STRING_new();
    if (g == nullptr || s == nullptr ||
        ASN1_STRING_set(s, dns.data(), static_cast<int>(dns.size())) != 1) {
      GENERAL_NAME_free(g);
      ASN1_IA5STRING_free(s);
      return Internal("building a DNS subjectAltName");
    }
    GENERAL_NAME_set0_value(g, GEN_DNS, s);
    sk_GENERAL_NAME_push(names.get(), g);
  }
  for (const std::string& ip : r.ip_addresses) {
    unsigned char addr[16];
    int len = 0;
    if (inet_pton(AF_INET, ip.c_str(), addr) == 1) {
      len = 4;
    } else if (inet_pton(AF_INET6, ip.c_str(), addr) == 1) {
      len = 16;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("'", ip.substr(0, 80), "' is not an IPv4 or IPv6 address"));
    }
    GENERAL_NAME* g = GENERAL_NAME_new();
    ASN1_OCTET_STRING* o = ASN1_OCTET_STRING_new();
    if (g == nullptr || o == nullptr || ASN1_OCTET_STRING_set(o, addr, len) != 1) {
      GENERAL_NAME_free(g);
      ASN1_OCTET_STRING_free(o);
      return Internal("building an IP subjectAltName");
    }
    GENERAL_NAME_set0_value(g, GEN_IPADD, o);
    sk_GENERAL_NAME_push(names.get(), g);
  }
  if (X509_add1_ext_i2d(x, NID_subject_alt_name, names.get(), 0, X509V3_ADD_DEFAULT) != 1) {
    return Internal("adding the subjectAltName extension");
  }
  return absl::OkStatus();
}

// The CA's certificate and key, checked: both parse, they match, the certificate is a CA.
struct LoadedCa {
  X509Ptr cert;
  KeyPtr key;
};

absl::StatusOr<LoadedCa> LoadCa(const PemPair& ca) {
  LoadedCa out;
  FEDLORA_ASSIGN_OR_RETURN(out.cert, ReadCert(ca.cert_pem, "the CA certificate"));
  FEDLORA_ASSIGN_OR_RETURN(out.key, ReadKey(ca.key_pem, "the CA key"));
  if (X509_check_private_key(out.cert.get(), out.key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("the CA key does not match the CA certificate");
  }
  if ((X509_get_extension_flags(out.cert.get()) & EXFLAG_CA) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CA certificate '", CommonName(X509_get_subject_name(out.cert.get())),
                     "' is not a CA (no basicConstraints CA:TRUE)"));
  }
  return out;
}

// A new certificate for a fresh key, with subject CN `cn`, issued by `issuer` (nullptr: itself)
// and the given extensions ("critical,..." values for X509V3_EXT_nconf_nid), then signed.
absl::StatusOr<PemPair> Issue(const LoadedCa* issuer, std::string_view cn,
                              const CertificateRequest& r,
                              const std::vector<std::pair<int, const char*>>& extensions,
                              bool with_sans) {
  ERR_clear_error();
  FEDLORA_ASSIGN_OR_RETURN(auto validity, Validity(r));
  FEDLORA_ASSIGN_OR_RETURN(KeyPtr key, NewKey());
  X509Ptr x(X509_new());
  if (x == nullptr || X509_set_version(x.get(), X509_VERSION_3) != 1) return Internal("X509_new");
  FEDLORA_RETURN_IF_ERROR(SetRandomSerial(x.get()));
  if (ASN1_TIME_set(X509_getm_notBefore(x.get()), static_cast<time_t>(validity.first)) == nullptr ||
      ASN1_TIME_set(X509_getm_notAfter(x.get()), static_cast<time_t>(validity.second)) == nullptr) {
    return Internal("setting the validity");
  }
  X509_NAME* subject = X509_get_subject_name(x.get());
  // A UTF8String set directly (not MBSTRING_UTF8), so that site ids up to 128 characters fit past
  // the 64-character upper bound OpenSSL's string table puts on a CN.
  if (X509_NAME_add_entry_by_NID(subject, NID_commonName, V_ASN1_UTF8STRING,
                                 reinterpret_cast<const unsigned char*>(cn.data()),
                                 static_cast<int>(cn.size()), -1, 0) != 1) {
    return Internal("setting the subject CN");
  }
  X509* issuer_cert = issuer != nullptr ? issuer->cert.get() : x.get();
  EVP_PKEY* signing_key = issuer != nullptr ? issuer->key.get() : key.get();
  if (X509_set_issuer_name(x.get(), X509_get_subject_name(issuer_cert)) != 1 ||
      X509_set_pubkey(x.get(), key.get()) != 1) {
    return Internal("setting the issuer and public key");
  }
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer_cert, x.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : extensions)
    FEDLORA_RETURN_IF_ERROR(AddExtension(x.get(), &ctx, nid, value));
  FEDLORA_RETURN_IF_ERROR(AddExtension(x.get(), &ctx, NID_subject_key_identifier, "hash"));
  if (issuer != nullptr) {
    FEDLORA_RETURN_IF_ERROR(
        AddExtension(x.get(), &ctx, NID_authority_key_identifier, "keyid:always"));
  }
  if (with_sans) FEDLORA_RETURN_IF_ERROR(AddSubjectAltNames(x.get(), r));
  if (X509_sign(x.get(), signing_key, EVP_sha256()) == 0)
    return Internal("signing the certificate");
  PemPair out;
  FEDLORA_ASSIGN_OR_RETURN(out.cert_pem, (ToPem<X509, WriteCert>(x.get(), "certificate")));
  FEDLORA_ASSIGN_OR_RETURN(out.key_pem, (ToPem<EVP_PKEY, WriteKey>(key.get(), "private key")));
  return out;
}

// Whether `cert` was issued (named and signed) by `ca`.
bool IssuedBy(X509* ca, X509* cert) {
  const bool ok =
      X509_check_issued(ca, cert) == X509_V_OK && X509_verify(cert, X509_get0_pubkey(ca)) == 1;
  ERR_clear_error();
  return ok;
}

// Whether `crl` was issued (named and signed) by `ca`.
bool CrlIssuedBy(X509* ca, X509_CRL* crl) {
  const bool ok = X509_NAME_cmp(X509_CRL_get_issuer(crl), X509_get_subject_name(ca)) == 0 &&
                  X509_CRL_verify(crl, X509_get0_pubkey(ca)) == 1;
  ERR_clear_error();
  return ok;
}

}  // namespace

bool IsValidSiteId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '@' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::StatusOr<PemPair> CreateCertificateAuthority(const CertificateRequest& request) {
  const std::string& cn = request.common_name;
  if (cn.empty() || cn.size() > 64 || !IsPrintableName(cn)) {
    return absl::InvalidArgumentError(
        "the CA common name must be 1-64 characters without control characters");
  }
  if (!request.dns_names.empty() || !request.ip_addresses.empty()) {
    return absl::InvalidArgumentError("a CA certificate takes no DNS or IP subjectAltNames");
  }
  return Issue(nullptr, cn, request,
               {{NID_basic_constraints, "critical,CA:TRUE"},
                {NID_key_usage, "critical,keyCertSign,cRLSign"}},
               /*with_sans=*/false);
}

absl::StatusOr<PemPair> IssueServerCertificate(const PemPair& ca,
                                               const CertificateRequest& request) {
  if (request.dns_names.empty() && request.ip_addresses.empty()) {
    return absl::InvalidArgumentError(
        "a server certificate needs at least one DNS name or IP address (clients check the address "
        "they dial)");
  }
  std::string cn = request.common_name;
  if (cn.empty())
    cn = !request.dns_names.empty() ? request.dns_names.front() : request.ip_addresses.front();
  if (cn.size() > 64 || !IsPrintableName(cn)) {
    return absl::InvalidArgumentError(
        "the server common name must be at most 64 characters without control characters");
  }
  FEDLORA_ASSIGN_OR_RETURN(LoadedCa loaded, LoadCa(ca));
  return Issue(&loaded, cn, request,
               {{NID_basic_constraints, "critical,CA:FALSE"},
                {NID_key_usage, "critical,digitalSignature"},
                {NID_ext_key_usage, "serverAuth"}},
               /*with_sans=*/true);
}

absl::StatusOr<PemPair> IssueClientCertificate(const PemPair& ca,
                                               const CertificateRequest& request) {
  if (!IsValidSiteId(request.common_name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("site id '", request.common_name.substr(0, 64),
                     "' must be 1-128 characters of [A-Za-z0-9._@-]"));
  }
  if (!request.dns_names.empty() || !request.ip_addresses.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate takes no subjectAltNames: its identity is the CN");
  }
  FEDLORA_ASSIGN_OR_RETURN(LoadedCa loaded, LoadCa(ca));
  return Issue(&loaded, request.common_name, request,
               {{NID_basic_constraints, "critical,CA:FALSE"},
                {NID_key_usage, "critical,digitalSignature"},
                {NID_ext_key_usage, "clientAuth"}},
               /*with_sans=*/false);
}

absl::StatusOr<std::string> RevokeCertificates(const PemPair& ca, std::string_view existing_crl_pem,
                                               const std::vector<std::string>& cert_pems,
                                               int64_t next_update_seconds) {
  if (next_update_seconds <= 0 || next_update_seconds > int64_t{100} * 366 * 86400) {
    return absl::InvalidArgumentError(absl::StrCat("next_update_seconds is ", next_update_seconds,
                                                   "; must be in (0, 100 years]"));
  }
  FEDLORA_ASSIGN_OR_RETURN(LoadedCa loaded, LoadCa(ca));
  X509* ca_cert = loaded.cert.get();
  const int64_t now = static_cast<int64_t>(std::time(nullptr));

  CrlPtr crl(X509_CRL_new());
  if (crl == nullptr || X509_CRL_set_version(crl.get(), X509_CRL_VERSION_2) != 1 ||
      X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(ca_cert)) != 1) {
    return Internal("X509_CRL_new");
  }
  std::set<std::string> listed;
  BnPtr number(BN_new());
  if (number == nullptr) return Internal("BN_new");
  BN_zero(number.get());
  if (!existing_crl_pem.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(CrlPtr old, ReadCrl(existing_crl_pem, "the existing CRL"));
    if (!CrlIssuedBy(ca_cert, old.get())) {
      return absl::FailedPreconditionError(absl::StrCat("the existing CRL (issuer '",
                                                        CommonName(X509_CRL_get_issuer(old.get())),
                                                        "') is not signed by this CA"));
    }
    STACK_OF(X509_REVOKED)* entries = X509_CRL_get_REVOKED(old.get());
    for (int i = 0; i < sk_X509_REVOKED_num(entries); ++i) {
      X509_REVOKED* entry = sk_X509_REVOKED_value(entries, i);
      FEDLORA_ASSIGN_OR_RETURN(std::string serial,
                               SerialHex(X509_REVOKED_get0_serialNumber(entry)));
      if (!listed.insert(serial).second) continue;
      RevokedPtr copy(X509_REVOKED_dup(entry));
      if (copy == nullptr || X509_CRL_add0_revoked(crl.get(), copy.get()) != 1)
        return Internal("copying a CRL entry");
      copy.release();
    }
    AsnIntPtr old_number(static_cast<ASN1_INTEGER*>(
        X509_CRL_get_ext_d2i(old.get(), NID_crl_number, nullptr, nullptr)));
    if (old_number != nullptr && ASN1_INTEGER_to_BN(old_number.get(), number.get()) == nullptr) {
      return Internal("reading the existing CRL number");
    }
    ERR_clear_error();
  }
  FEDLORA_ASSIGN_OR_RETURN(AsnTimePtr now_time, AsnTime(now));
  for (size_t i = 0; i < cert_pems.size(); ++i) {
    FEDLORA_ASSIGN_OR_RETURN(
        X509Ptr cert, ReadCert(cert_pems[i], absl::StrCat("certificate ", i + 1, " to revoke")));
    if (!IssuedBy(ca_cert, cert.get())) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(cert.get()), " was not issued by the CA '",
                       CommonName(X509_get_subject_name(ca_cert)), "'"));
    }
    FEDLORA_ASSIGN_OR_RETURN(std::string serial, SerialHex(X509_get0_serialNumber(cert.get())));
    if (!listed.insert(serial).second) continue;
    RevokedPtr entry(X509_REVOKED_new());
    AsnIntPtr serial_copy(ASN1_INTEGER_dup(X509_get0_serialNumber(cert.get())));
    if (entry == nullptr || serial_copy == nullptr ||
        X509_REVOKED_set_serialNumber(entry.get(), serial_copy.get()) != 1 ||
        X509_REVOKED_set_revocationDate(entry.get(), now_time.get()) != 1 ||
        X509_CRL_add0_revoked(crl.get(), entry.get()) != 1) {
      return Internal("adding a CRL entry");
    }
    entry.release();
  }
  FEDLORA_ASSIGN_OR_RETURN(AsnTimePtr next_time, AsnTime(now + next_update_seconds));
  if (X509_CRL_set1_lastUpdate(crl.get(), now_time.get()) != 1 ||
      X509_CRL_set1_nextUpdate(crl.get(), next_time.get()) != 1) {
    return Internal("setting the CRL times");
  }
  AsnIntPtr new_number(BN_add_word(number.get(), 1) == 1 ? BN_to_ASN1_INTEGER(number.get(), nullptr)
                                                         : nullptr);
  if (new_number == nullptr ||
      X509_CRL_add1_ext_i2d(crl.get(), NID_crl_number, new_number.get(), 0, 0) != 1) {
    return Internal("setting the CRL number");
  }
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, ca_cert, nullptr, nullptr, crl.get(), 0);
  ExtPtr akid(X509V3_EXT_nconf_nid(nullptr, &ctx, NID_authority_key_identifier, "keyid"));
  if (akid == nullptr || X509_CRL_add_ext(crl.get(), akid.get(), -1) != 1)
    return Internal("adding the CRL's AKID");
  if (X509_CRL_sort(crl.get()) != 1 ||
      X509_CRL_sign(crl.get(), loaded.key.get(), EVP_sha256()) == 0) {
    return Internal("signing the CRL");
  }
  return ToPem<X509_CRL, WriteCrl>(crl.get(), "CRL");
}

absl::StatusOr<CertificateInfo> ParseCertificate(std::string_view pem) {
  FEDLORA_ASSIGN_OR_RETURN(X509Ptr cert, ReadCert(pem, "the certificate"));
  CertificateInfo info;
  info.common_name = CommonName(X509_get_subject_name(cert.get()));
  info.issuer_common_name = CommonName(X509_get_issuer_name(cert.get()));
  FEDLORA_ASSIGN_OR_RETURN(info.serial_hex, SerialHex(X509_get0_serialNumber(cert.get())));
  FEDLORA_ASSIGN_OR_RETURN(info.not_before_unix_s,
                           UnixSeconds(X509_get0_notBefore(cert.get()), "notBefore"));
  FEDLORA_ASSIGN_OR_RETURN(info.not_after_unix_s,
                           UnixSeconds(X509_get0_notAfter(cert.get()), "notAfter"));
  info.is_ca = (X509_get_extension_flags(cert.get()) & EXFLAG_CA) != 0;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  if (X509_digest(cert.get(), EVP_sha256(), digest, &digest_len) != 1) {
    return Internal("hashing the certificate");
  }
  info.sha256_hex = ToHex(digest, digest_len);
  NamesPtr names(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(names.get(), i);
    if (g->type == GEN_DNS) {
      const ASN1_STRING* s = g->d.dNSName;
      info.dns_names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                                  static_cast<size_t>(ASN1_STRING_length(s)));
    } else if (g->type == GEN_IPADD) {
      const ASN1_STRING* s = g->d.iPAddress;
      const int len = ASN1_STRING_length(s);
      char text[INET6_ADDRSTRLEN] = {};
      if ((len == 4 || len == 16) &&
          inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(s), text, sizeof text) !=
              nullptr) {
        info.ip_addresses.emplace_back(text);
      }
    }
  }
  ERR_clear_error();
  return info;
}

absl::StatusOr<std::vector<std::string>> RevokedSerials(std::string_view crl_pem,
                                                        std::string_view ca_cert_pem) {
  FEDLORA_ASSIGN_OR_RETURN(CrlPtr crl, ReadCrl(crl_pem, "the CRL"));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<X509Ptr> cas, ReadCertBundle(ca_cert_pem, "the CA bundle"));
  bool signed_by_ca = false;
  for (const X509Ptr& ca : cas) signed_by_ca = signed_by_ca || CrlIssuedBy(ca.get(), crl.get());
  if (!signed_by_ca) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CRL (issuer '", CommonName(X509_CRL_get_issuer(crl.get())),
                     "') is not signed by any certificate of the CA bundle"));
  }
  std::vector<std::string> serials;
  STACK_OF(X509_REVOKED)* entries = X509_CRL_get_REVOKED(crl.get());
  for (int i = 0; i < sk_X509_REVOKED_num(entries); ++i) {
    FEDLORA_ASSIGN_OR_RETURN(
        std::string serial,
        SerialHex(X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(entries, i))));
    serials.push_back(std::move(serial));
  }
  return serials;
}

absl::Status CheckKeyMatchesCertificate(std::string_view cert_pem, std::string_view key_pem) {
  FEDLORA_ASSIGN_OR_RETURN(X509Ptr cert, ReadCert(cert_pem, "the certificate"));
  FEDLORA_ASSIGN_OR_RETURN(KeyPtr key, ReadKey(key_pem, "the key"));
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("the key does not match ", Describe(cert.get())));
  }
  return absl::OkStatus();
}

}  // namespace fedlora::crypto
