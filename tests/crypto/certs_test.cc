// Tests of the development PKI (crypto/certs.h): what the certificates say, that OpenSSL verifies
// them against their CA, and that CRLs list what was revoked and only accept their own CA.
#include "crypto/certs.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <ctime>
#include <set>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora::crypto {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr int64_t kDay = 86400;
int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

CertificateRequest Req(const std::string& cn, int64_t not_after, int64_t not_before = 0) {
  CertificateRequest r;
  r.common_name = cn;
  r.not_before_unix_s = not_before;
  r.not_after_unix_s = not_after;
  return r;
}

CertificateRequest ServerReq(std::vector<std::string> dns, std::vector<std::string> ips,
                             int64_t not_after, int64_t not_before = 0) {
  CertificateRequest r = Req("", not_after, not_before);
  r.dns_names = std::move(dns);
  r.ip_addresses = std::move(ips);
  return r;
}

PemPair MakeCa(const std::string& name) {
  absl::StatusOr<PemPair> ca = CreateCertificateAuthority(Req(name, Now() + 30 * kDay));
  EXPECT_TRUE(ca.ok()) << ca.status();
  return ca.value_or(PemPair{});
}

X509* ReadX509(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return x;
}

// Whether OpenSSL's chain verification accepts `leaf` with `ca` as the only trust anchor.
bool ChainVerifies(const std::string& ca_pem, const std::string& leaf_pem) {
  X509* ca = ReadX509(ca_pem);
  X509* leaf = ReadX509(leaf_pem);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  const bool ok = X509_verify_cert(ctx) == 1;
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(leaf);
  X509_free(ca);
  return ok;
}

TEST(Certs, CaRoundTrip) {
  const int64_t now = Now();
  absl::StatusOr<PemPair> ca = CreateCertificateAuthority(Req("fedlora test CA", now + 10 * kDay));
  ASSERT_TRUE(ca.ok()) << ca.status();
  EXPECT_THAT(ca->cert_pem, HasSubstr("-----BEGIN CERTIFICATE-----"));
  EXPECT_THAT(ca->key_pem, HasSubstr("-----BEGIN PRIVATE KEY-----"));
  absl::StatusOr<CertificateInfo> info = ParseCertificate(ca->cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->common_name, "fedlora test CA");
  EXPECT_EQ(info->issuer_common_name, "fedlora test CA");
  EXPECT_TRUE(info->is_ca);
  EXPECT_NEAR(info->not_before_unix_s, now - 60, 5);
  EXPECT_EQ(info->not_after_unix_s, now + 10 * kDay);
  EXPECT_TRUE(info->dns_names.empty());
  // 128 random bits: up to 32 hex digits, almost never fewer than 24.
  EXPECT_LE(info->serial_hex.size(), 32u);
  EXPECT_GE(info->serial_hex.size(), 24u);
  EXPECT_TRUE(ChainVerifies(ca->cert_pem, ca->cert_pem));
  EXPECT_TRUE(CheckKeyMatchesCertificate(ca->cert_pem, ca->key_pem).ok());
}

TEST(Certs, ServerCertificateRoundTripAndVerifies) {
  const PemPair ca = MakeCa("ca one");
  const int64_t now = Now();
  absl::StatusOr<PemPair> server = IssueServerCertificate(
      ca,
      ServerReq({"localhost", "fl.example.org"}, {"127.0.0.1", "::1"}, now + 5 * kDay, now - 100));
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<CertificateInfo> info = ParseCertificate(server->cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->common_name, "localhost");  // the first SAN when no CN is given
  EXPECT_EQ(info->issuer_common_name, "ca one");
  EXPECT_FALSE(info->is_ca);
  EXPECT_EQ(info->not_before_unix_s, now - 100);
  EXPECT_EQ(info->not_after_unix_s, now + 5 * kDay);
  EXPECT_THAT(info->dns_names, ElementsAre("localhost", "fl.example.org"));
  EXPECT_THAT(info->ip_addresses, ElementsAre("127.0.0.1", "::1"));
  EXPECT_TRUE(CheckKeyMatchesCertificate(server->cert_pem, server->key_pem).ok());

  // X509_verify with the CA's public key, and the full chain check with purpose "SSL server".
  X509* ca_x = ReadX509(ca.cert_pem);
  X509* leaf = ReadX509(server->cert_pem);
  EXPECT_EQ(X509_verify(leaf, X509_get0_pubkey(ca_x)), 1);
  EXPECT_EQ(X509_check_purpose(leaf, X509_PURPOSE_SSL_SERVER, 0), 1);
  EXPECT_NE(X509_check_purpose(leaf, X509_PURPOSE_SSL_CLIENT, 0), 1);  // EKU is serverAuth only
  X509_free(leaf);
  X509_free(ca_x);
  EXPECT_TRUE(ChainVerifies(ca.cert_pem, server->cert_pem));
  EXPECT_FALSE(ChainVerifies(MakeCa("ca two").cert_pem, server->cert_pem));
}

TEST(Certs, FingerprintIsTheSha256OfTheDerEncoding) {
  const PemPair ca = MakeCa("ca one");
  absl::StatusOr<PemPair> client = IssueClientCertificate(ca, Req("site-f", Now() + kDay));
  ASSERT_TRUE(client.ok()) << client.status();
  // The DER is the base64 body of the PEM, between its BEGIN and END lines.
  std::string body;
  for (absl::string_view line : absl::StrSplit(client->cert_pem, '\n')) {
    if (!line.empty() && line[0] != '-') body.append(line.data(), line.size());
  }
  std::string der;
  ASSERT_TRUE(absl::Base64Unescape(body, &der));
  absl::StatusOr<CertificateInfo> info = ParseCertificate(client->cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->sha256_hex, Sha256Hex(der));
  EXPECT_EQ(info->sha256_hex.size(), 64u);
  EXPECT_NE(ParseCertificate(ca.cert_pem)->sha256_hex, info->sha256_hex);
}

TEST(Certs, ClientCertificateRoundTripAndVerifies) {
  const PemPair ca = MakeCa("ca one");
  absl::StatusOr<PemPair> client =
      IssueClientCertificate(ca, Req("site-a@hospital.org", Now() + kDay));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<CertificateInfo> info = ParseCertificate(client->cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->common_name, "site-a@hospital.org");
  EXPECT_EQ(info->issuer_common_name, "ca one");
  EXPECT_FALSE(info->is_ca);
  X509* leaf = ReadX509(client->cert_pem);
  EXPECT_EQ(X509_check_purpose(leaf, X509_PURPOSE_SSL_CLIENT, 0), 1);
  X509_free(leaf);
  EXPECT_TRUE(ChainVerifies(ca.cert_pem, client->cert_pem));

  // Ids up to 128 characters, past the 64 OpenSSL's string table allows a CN.
  const std::string long_id(128, 'x');
  absl::StatusOr<PemPair> long_client = IssueClientCertificate(ca, Req(long_id, Now() + kDay));
  ASSERT_TRUE(long_client.ok()) << long_client.status();
  EXPECT_EQ(ParseCertificate(long_client->cert_pem)->common_name, long_id);
  EXPECT_TRUE(ChainVerifies(ca.cert_pem, long_client->cert_pem));
}

TEST(Certs, SerialsDiffer) {
  const PemPair ca = MakeCa("ca");
  std::set<std::string> serials;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<PemPair> c = IssueClientCertificate(ca, Req("s", Now() + kDay));
    ASSERT_TRUE(c.ok());
    serials.insert(ParseCertificate(c->cert_pem)->serial_hex);
  }
  EXPECT_EQ(serials.size(), 8u);
}

TEST(Certs, ExpiredCertificateIsIssuedButDoesNotVerify) {
  const PemPair ca = MakeCa("ca");
  const int64_t now = Now();
  absl::StatusOr<PemPair> old = IssueClientCertificate(ca, Req("old", now - kDay, now - 2 * kDay));
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(ParseCertificate(old->cert_pem)->not_after_unix_s, now - kDay);
  EXPECT_FALSE(ChainVerifies(ca.cert_pem, old->cert_pem));
}

TEST(Certs, BadRequestsAreRefusedWithReasons) {
  const PemPair ca = MakeCa("ca");
  const int64_t later = Now() + kDay;
  for (const std::string& id :
       {std::string(""), std::string("has space"), std::string("slash/x"),
        std::string("semi;colon"), std::string(129, 'a'), std::string("ümlaut")}) {
    absl::StatusOr<PemPair> c = IssueClientCertificate(ca, Req(id, later));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(c.status().message(), HasSubstr("[A-Za-z0-9._@-]")) << id;
  }
  EXPECT_FALSE(IsValidSiteId("a b"));
  EXPECT_TRUE(IsValidSiteId("Site_1.a@b-c"));

  absl::StatusOr<PemPair> no_validity = IssueClientCertificate(ca, Req("x", 0));
  EXPECT_THAT(no_validity.status().message(), HasSubstr("not_after_unix_s is not set"));
  absl::StatusOr<PemPair> backwards = IssueClientCertificate(ca, Req("x", later - 10, later));
  EXPECT_THAT(backwards.status().message(), HasSubstr("is not after not_before"));
  absl::StatusOr<PemPair> no_san = IssueServerCertificate(ca, ServerReq({}, {}, later));
  EXPECT_THAT(no_san.status().message(), HasSubstr("at least one DNS name or IP address"));
  absl::StatusOr<PemPair> bad_ip = IssueServerCertificate(ca, ServerReq({}, {"300.1.1.1"}, later));
  EXPECT_THAT(bad_ip.status().message(), HasSubstr("'300.1.1.1' is not an IPv4 or IPv6 address"));
  absl::StatusOr<PemPair> bad_dns = IssueServerCertificate(ca, ServerReq({"a,b"}, {}, later));
  EXPECT_THAT(bad_dns.status().message(), HasSubstr("'a,b' is not a valid DNS name"));
  EXPECT_FALSE(CreateCertificateAuthority(Req("", later)).ok());

  // The issuing pair must be a CA whose key matches.
  const PemPair other = MakeCa("other");
  absl::StatusOr<PemPair> mismatched =
      IssueClientCertificate({ca.cert_pem, other.key_pem}, Req("x", later));
  EXPECT_THAT(mismatched.status().message(),
              HasSubstr("the CA key does not match the CA certificate"));
  absl::StatusOr<PemPair> leaf = IssueClientCertificate(ca, Req("x", later));
  ASSERT_TRUE(leaf.ok());
  absl::StatusOr<PemPair> from_leaf = IssueClientCertificate(*leaf, Req("y", later));
  EXPECT_THAT(from_leaf.status().message(), HasSubstr("is not a CA"));
  absl::StatusOr<PemPair> garbage = IssueClientCertificate({"junk", "junk"}, Req("y", later));
  EXPECT_THAT(garbage.status().message(), HasSubstr("holds no PEM certificate"));
  EXPECT_THAT(CheckKeyMatchesCertificate(leaf->cert_pem, ca.key_pem).message(),
              HasSubstr("does not match"));
}

TEST(Certs, ParseRefusesGarbage) {
  EXPECT_EQ(ParseCertificate("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ParseCertificate("hello").status().message(), HasSubstr("no PEM certificate"));
  EXPECT_THAT(ParseCertificate("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
                  .status()
                  .message(),
              HasSubstr("not a valid PEM certificate"));
}

TEST(Certs, RevokeAndReadBack) {
  const PemPair ca = MakeCa("ca");
  const int64_t later = Now() + kDay;
  PemPair a = IssueClientCertificate(ca, Req("a", later)).value();
  PemPair b = IssueClientCertificate(ca, Req("b", later)).value();
  PemPair c = IssueClientCertificate(ca, Req("c", later)).value();
  const std::string sa = ParseCertificate(a.cert_pem)->serial_hex;
  const std::string sb = ParseCertificate(b.cert_pem)->serial_hex;

  absl::StatusOr<std::string> empty = RevokeCertificates(ca, "", {}, kDay);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(*empty, HasSubstr("-----BEGIN X509 CRL-----"));
  EXPECT_TRUE(RevokedSerials(*empty, ca.cert_pem)->empty());

  absl::StatusOr<std::string> crl1 = RevokeCertificates(ca, *empty, {a.cert_pem}, kDay);
  ASSERT_TRUE(crl1.ok()) << crl1.status();
  EXPECT_THAT(RevokedSerials(*crl1, ca.cert_pem).value(), ElementsAre(sa));
  // Extending keeps the old entry, adds the new one once, and bumps the CRL number.
  absl::StatusOr<std::string> crl2 =
      RevokeCertificates(ca, *crl1, {b.cert_pem, a.cert_pem, b.cert_pem}, kDay);
  ASSERT_TRUE(crl2.ok()) << crl2.status();
  EXPECT_THAT(RevokedSerials(*crl2, ca.cert_pem).value(), UnorderedElementsAre(sa, sb));

  auto crl_number = [](const std::string& pem) {
    BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
    X509_CRL* crl = PEM_read_bio_X509_CRL(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    auto* n =
        static_cast<ASN1_INTEGER*>(X509_CRL_get_ext_d2i(crl, NID_crl_number, nullptr, nullptr));
    const long v = n == nullptr ? -1 : ASN1_INTEGER_get(n);
    ASN1_INTEGER_free(n);
    X509_CRL_free(crl);
    return v;
  };
  EXPECT_EQ(crl_number(*empty), 1);
  EXPECT_EQ(crl_number(*crl1), 2);
  EXPECT_EQ(crl_number(*crl2), 3);
  const std::vector<std::string> listed = RevokedSerials(*crl2, ca.cert_pem).value();
  EXPECT_EQ(std::count(listed.begin(), listed.end(), ParseCertificate(c.cert_pem)->serial_hex), 0);

  // A CA bundle works when one of its certificates signed the CRL.
  const PemPair other = MakeCa("other");
  EXPECT_TRUE(RevokedSerials(*crl2, other.cert_pem + ca.cert_pem).ok());
  EXPECT_EQ(RevokeCertificates(ca, "", {}, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Certs, CrlOfAnotherCaIsRefused) {
  const PemPair ca = MakeCa("ca");
  const PemPair other = MakeCa("ca");  // same name, different key: the signature decides
  const std::string crl = RevokeCertificates(other, "", {}, kDay).value();
  absl::StatusOr<std::vector<std::string>> serials = RevokedSerials(crl, ca.cert_pem);
  EXPECT_EQ(serials.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(serials.status().message(),
              HasSubstr("not signed by any certificate of the CA bundle"));
  // Nor can it be extended by the wrong CA.
  absl::StatusOr<std::string> extended = RevokeCertificates(ca, crl, {}, kDay);
  EXPECT_EQ(extended.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(extended.status().message(), HasSubstr("existing CRL"));
  EXPECT_THAT(RevokedSerials("junk", ca.cert_pem).status().message(), HasSubstr("no PEM CRL"));
}

TEST(Certs, RevokingACertificateOfAnotherCaIsRefused) {
  const PemPair ca = MakeCa("ca");
  const PemPair other = MakeCa("ca");
  const PemPair foreign = IssueClientCertificate(other, Req("f", Now() + kDay)).value();
  absl::StatusOr<std::string> crl = RevokeCertificates(ca, "", {foreign.cert_pem}, kDay);
  EXPECT_EQ(crl.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(crl.status().message(), HasSubstr("certificate 'f'"));
  EXPECT_THAT(crl.status().message(), HasSubstr("was not issued by the CA"));
}

}  // namespace
}  // namespace fedlora::crypto
