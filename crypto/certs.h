// A small development PKI on OpenSSL 3: a CA, server and client certificates, and CRLs, all as PEM
// strings. Keys are ECDSA P-256, signatures ECDSA with SHA-256, serials 128 random bits.
//
//   CertificateRequest r;
//   r.common_name = "fedlora dev CA";
//   r.not_after_unix_s = now + 30 * 86400;
//   FEDLORA_ASSIGN_OR_RETURN(PemPair ca, CreateCertificateAuthority(r));
//   r.common_name = "site-7";
//   FEDLORA_ASSIGN_OR_RETURN(PemPair site, IssueClientCertificate(ca, r));
//   FEDLORA_ASSIGN_OR_RETURN(std::string crl, RevokeCertificates(ca, "", {site.cert_pem}, 30 * 86400));
//
// Bad input (unparsable PEM, a key that does not match its certificate, a bad name or validity)
// is InvalidArgument naming the problem; a certificate or CRL of another CA is FailedPrecondition.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora::crypto {

// A certificate and its private key (PKCS#8, unencrypted), both PEM.
struct PemPair {
  std::string cert_pem;
  std::string key_pem;
};

struct CertificateRequest {
  std::string common_name;
  std::vector<std::string> dns_names;     // subjectAltName DNS entries (server certificates)
  std::vector<std::string> ip_addresses;  // subjectAltName IP entries, IPv4 or IPv6 text
  int64_t not_before_unix_s = 0;          // 0: now - 60 s (tolerates small clock skew)
  int64_t not_after_unix_s = 0;  // required; may lie in the past (expired test certificates)
};

// A self-signed CA: basicConstraints critical CA:TRUE, keyUsage keyCertSign + cRLSign, subject key
// id. common_name must be 1-64 characters. SANs are not allowed.
absl::StatusOr<PemPair> CreateCertificateAuthority(const CertificateRequest& request);

// A TLS server certificate signed by `ca`: CA:FALSE, keyUsage digitalSignature, EKU serverAuth,
// SANs from dns_names and ip_addresses (at least one required). An empty common_name becomes the
// first SAN.
absl::StatusOr<PemPair> IssueServerCertificate(const PemPair& ca,
                                               const CertificateRequest& request);

// A TLS client certificate signed by `ca`: CA:FALSE, keyUsage digitalSignature, EKU clientAuth,
// CN = the site id, which must be 1-128 characters of [A-Za-z0-9._@-]. No SANs.
absl::StatusOr<PemPair> IssueClientCertificate(const PemPair& ca,
                                               const CertificateRequest& request);

// A CRL signed by `ca` listing the entries of `existing_crl_pem` (empty: none; else it must be a
// CRL signed by `ca`) plus the serials of `cert_pems`, each of which must be issued by `ca`.
// Already-listed serials are kept once. lastUpdate is now, nextUpdate now + next_update_seconds
// (> 0); the CRL number is the existing one plus one (1 for a new CRL).
absl::StatusOr<std::string> RevokeCertificates(const PemPair& ca, std::string_view existing_crl_pem,
                                               const std::vector<std::string>& cert_pems,
                                               int64_t next_update_seconds);

struct CertificateInfo {
  std::string common_name;         // empty when the subject has no CN
  std::string serial_hex;          // lower-case hex, no leading zeros
  std::string issuer_common_name;  // empty when the issuer has no CN
  int64_t not_before_unix_s = 0;
  int64_t not_after_unix_s = 0;
  std::vector<std::string> dns_names;
  std::vector<std::string> ip_addresses;  // as inet_ntop writes them
  bool is_ca = false;                     // basicConstraints CA:TRUE
  std::string sha256_hex;  // the fingerprint: SHA-256 of the DER encoding, lower-case hex
};

// Parses the first certificate of a PEM text.
absl::StatusOr<CertificateInfo> ParseCertificate(std::string_view pem);

// The serials (lower-case hex, as in CertificateInfo) a CRL revokes, after checking that it is
// signed by a certificate of `ca_cert_pem` (a PEM bundle; the one whose subject is the CRL's
// issuer). FailedPrecondition when no certificate of the bundle signed it.
absl::StatusOr<std::vector<std::string>> RevokedSerials(std::string_view crl_pem,
                                                        std::string_view ca_cert_pem);

// OK when `key_pem` is the private key of `cert_pem` (the first certificate); InvalidArgument
// naming the certificate otherwise.
absl::Status CheckKeyMatchesCertificate(std::string_view cert_pem, std::string_view key_pem);

// Whether `id` is a valid site id: 1-128 characters of [A-Za-z0-9._@-].
bool IsValidSiteId(std::string_view id);

}  // namespace fedlora::crypto
