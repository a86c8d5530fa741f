#include "crypto/chain_check.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509_vfy.h>

#include <ctime>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "crypto/certs.h"
#include "crypto/openssl_ptr.h"

namespace fedlora::crypto {
namespace {

struct StackFree {
  void operator()(STACK_OF(X509) * s) const {
    sk_X509_free(s);
  }  // the certificates are owned elsewhere
};
using StackPtr = std::unique_ptr<STACK_OF(X509), StackFree>;

std::vector<X509Ptr> ReadAll(std::string_view pem) {
  std::vector<X509Ptr> out;
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  while (bio != nullptr) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    out.push_back(std::move(cert));
  }
  ERR_clear_error();  // the end of the bundle reads as an error
  return out;
}

std::string Cn(const X509_NAME* name) {
  const int i = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  if (i < 0) return "";
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i)));
  if (n < 0) {
    ERR_clear_error();
    return "";
  }
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return out.substr(0, 128);
}

std::string TimeText(const ASN1_TIME* t) {
  struct tm tm {};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) {
    ERR_clear_error();
    return "an unreadable time";
  }
  return UtcTime(static_cast<int64_t>(timegm(&tm)));
}

// Which certificate of the chain an error is about: "" for the leaf, else "the CA certificate 'X' of its chain ".
std::string Whose(X509_STORE_CTX* ctx) {
  if (X509_STORE_CTX_get_error_depth(ctx) == 0) return "";
  X509* cert = X509_STORE_CTX_get_current_cert(ctx);
  return absl::StrCat("the certificate '", cert != nullptr ? Cn(X509_get_subject_name(cert)) : "?",
                      "' of its chain ");
}

void Classify(X509_STORE_CTX* ctx, const std::string& ca_issuers, ChainVerdict& v) {
  const int err = X509_STORE_CTX_get_error(ctx);
  X509* at = X509_STORE_CTX_get_current_cert(ctx);
  const std::string whose = Whose(ctx);
  switch (err) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
      v.problem = ChainProblem::kExpired;
      v.detail = absl::StrCat(whose, "expired at ",
                              TimeText(at != nullptr ? X509_get0_notAfter(at) : nullptr));
      return;
    case X509_V_ERR_CERT_NOT_YET_VALID:
      v.problem = ChainProblem::kNotYetValid;
      v.detail = absl::StrCat(whose, "is not valid before ",
                              TimeText(at != nullptr ? X509_get0_notBefore(at) : nullptr),
                              " (check this machine's clock too)");
      return;
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
    case X509_V_ERR_CERT_UNTRUSTED:
    case X509_V_ERR_CERT_REJECTED:
      v.problem = ChainProblem::kUnknownCa;
      v.detail = absl::StrCat(
          "is not signed by the expected CA (", ca_issuers, "): its issuer is '", v.issuer_cn, "'",
          err == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT ? " (it is self-signed)" : "",
          err == X509_V_ERR_CERT_SIGNATURE_FAILURE ? " (a signature does not verify)" : "");
      return;
    case X509_V_ERR_INVALID_CA:
    case X509_V_ERR_PATH_LENGTH_EXCEEDED:
    case X509_V_ERR_INVALID_NON_CA:
      v.problem = ChainProblem::kNotACa;
      v.detail = absl::StrCat(
          "has an issuer that may not issue certificates: ", whose.empty() ? "the leaf " : whose,
          "is not a CA (", X509_verify_cert_error_string(err), ")");
      return;
    case X509_V_ERR_INVALID_PURPOSE:
    case X509_V_ERR_KEYUSAGE_NO_CERTSIGN:
    case X509_V_ERR_KEYUSAGE_NO_DIGITAL_SIGNATURE:
      v.problem = ChainProblem::kWrongUsage;
      v.detail = absl::StrCat(whose, "does not allow this use (key usage / extended key usage: ",
                              X509_verify_cert_error_string(err), ")");
      return;
    default:
      v.problem = ChainProblem::kOther;
      v.detail = absl::StrCat(whose, "fails verification: ", X509_verify_cert_error_string(err));
  }
}

}  // namespace

std::string UtcTime(int64_t unix_s) {
  const time_t t = static_cast<time_t>(unix_s);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char text[40];
  strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

std::string ChainVerdict::Describe() const {
  if (subject_cn.empty() && serial_hex.empty()) return "certificate";
  return absl::StrCat("certificate '", subject_cn, "' (issuer '", issuer_cn, "', serial ",
                      serial_hex, ")");
}

ChainVerdict VerifyChain(std::string_view leaf_pem, std::string_view chain_pem,
                         std::string_view ca_pem, ChainPurpose purpose, int64_t now_unix_s) {
  ChainVerdict v;
  if (leaf_pem.empty() && chain_pem.empty()) {
    v.problem = ChainProblem::kNoCertificate;
    v.detail = "no certificate was presented";
    return v;
  }
  std::vector<X509Ptr> leaf = ReadAll(leaf_pem.empty() ? chain_pem : leaf_pem);
  if (leaf.empty()) {
    v.problem = ChainProblem::kUnreadable;
    v.detail = "the certificate does not parse";
    return v;
  }
  X509* cert = leaf.front().get();
  v.subject_cn = Cn(X509_get_subject_name(cert));
  v.issuer_cn = Cn(X509_get_issuer_name(cert));
  absl::StatusOr<CertificateInfo> info = ParseCertificate(leaf_pem.empty() ? chain_pem : leaf_pem);
  if (!info.ok() ||
      info->serial_hex.empty()) {  // the CRL check needs the serial: never pass without it
    v.problem = ChainProblem::kUnreadable;
    v.detail = "does not parse (its serial or validity is unreadable)";
    return v;
  }
  v.serial_hex = info->serial_hex;
  std::vector<X509Ptr> extra = ReadAll(chain_pem);
  std::vector<X509Ptr> cas = ReadAll(ca_pem);
  std::string ca_names;
  for (const X509Ptr& ca : cas)
    absl::StrAppend(&ca_names, ca_names.empty() ? "'" : ", '", Cn(X509_get_subject_name(ca.get())),
                    "'");
  StorePtr store(X509_STORE_new());
  StackPtr untrusted(sk_X509_new_null());
  StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (cas.empty() || store == nullptr || untrusted == nullptr || ctx == nullptr) {
    v.problem = ChainProblem::kOther;
    v.detail = cas.empty() ? "there is no CA certificate to check it against"
                           : "OpenSSL allocation failed";
    return v;
  }
  for (const X509Ptr& ca : cas) X509_STORE_add_cert(store.get(), ca.get());
  for (const X509Ptr& c : extra) sk_X509_push(untrusted.get(), c.get());
  for (size_t i = 1; i < leaf.size(); ++i) sk_X509_push(untrusted.get(), leaf[i].get());
  if (X509_STORE_CTX_init(ctx.get(), store.get(), cert, untrusted.get()) != 1 ||
      X509_STORE_CTX_set_default(
          ctx.get(), purpose == ChainPurpose::kTlsClient ? "ssl_client" : "ssl_server") != 1) {
    ERR_clear_error();
    v.problem = ChainProblem::kOther;
    v.detail = "OpenSSL could not set up the verification";
    return v;
  }
  // As libssl at security level 2 (Debian's default): no weak keys or digests in the chain. And as
  // gRPC's TLS stack: every certificate of the CA bundle is a trust anchor, an intermediate too.
  X509_VERIFY_PARAM_set_auth_level(X509_STORE_CTX_get0_param(ctx.get()), 2);
  X509_VERIFY_PARAM_set_flags(X509_STORE_CTX_get0_param(ctx.get()), X509_V_FLAG_PARTIAL_CHAIN);
  if (now_unix_s != 0) X509_STORE_CTX_set_time(ctx.get(), 0, static_cast<time_t>(now_unix_s));
  const int ok = X509_verify_cert(ctx.get());
  ERR_clear_error();
  if (ok == 1) return v;
  Classify(ctx.get(), ca_names, v);
  if (v.problem == ChainProblem::kNone)
    v.problem = ChainProblem::kOther;  // ok != 1 is never a pass
  return v;
}

}  // namespace fedlora::crypto
