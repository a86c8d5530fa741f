// Certificate chain checks in words, shared by the server's handshake check (crypto/tls.cc) and
// the client's TLS probe (crypto/tls_probe.h). The check is OpenSSL's X509_verify_cert with the
// purpose libssl itself uses (a client certificate as a server checks it, or the reverse); only
// its result is turned into a reason a person can act on.
//
//   ChainVerdict v = VerifyChain(peer_leaf_pem, peer_chain_pem, client_ca_pem, ChainPurpose::kTlsClient);
//   if (v.problem != ChainProblem::kNone) LOG << v.Describe("client") << ": " << v.detail;
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fedlora::crypto {

enum class ChainPurpose { kTlsClient, kTlsServer };

// Why a chain failed, grouped by what fixes it.
enum class ChainProblem {
  kNone,
  kNoCertificate,  // nothing to check
  kUnreadable,     // the leaf does not parse
  kUnknownCa,      // not signed by a CA of the bundle (another CA, self-signed, a bad signature)
  kExpired,        // the leaf or a CA of its chain is past notAfter
  kNotYetValid,    // the leaf or a CA of its chain is before notBefore
  kNotACa,         // a certificate between the leaf and the CA is not a CA
  kWrongUsage,     // key usage / extended key usage does not allow this use
  kOther,          // any other verification error (detail says which)
};

struct ChainVerdict {
  ChainProblem problem = ChainProblem::kNone;
  // The leaf's subject CN, issuer CN and serial (lower-case hex); empty when it did not parse.
  std::string subject_cn, issuer_cn, serial_hex;
  // What is wrong, in words (empty when problem is kNone), e.g. "expired at 2026-12-06 00:31:19 UTC".
  std::string detail;
  // "certificate 'site-a' (issuer 'fedlora dev CA', serial 1f...)", for messages and logs.
  std::string Describe() const;
};

// Verifies the leaf (the first certificate of `leaf_pem`) with the other certificates of
// `chain_pem` as untrusted intermediates against the CA certificates of `ca_pem`, at `now_unix_s`
// (0: the current time).
ChainVerdict VerifyChain(std::string_view leaf_pem, std::string_view chain_pem,
                         std::string_view ca_pem, ChainPurpose purpose, int64_t now_unix_s = 0);

// "2026-12-06 00:31:19 UTC".
std::string UtcTime(int64_t unix_s);

}  // namespace fedlora::crypto
