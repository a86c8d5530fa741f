// The round key's signature: a key signed by the server's certificate key verifies for that run,
// round and key only; a key signed by anyone else is refused, and a pin tells the server apart
// from another certificate the same CA issued for the same name (what a TLS-terminating proxy has).
#include "crypto/key_signature.h"

#include <ctime>

#include "crypto/certs.h"
#include "crypto/envelope.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora::crypto {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kDay = 86'400;

CertificateRequest Request(const std::string& cn) {
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  return {.common_name = cn,
          .dns_names = {"localhost"},
          .ip_addresses = {"127.0.0.1"},
          .not_before_unix_s = 0,
          .not_after_unix_s = now + kDay};
}

CertificateRequest CaRequest(const std::string& cn) {
  CertificateRequest r = Request(cn);
  r.dns_names.clear();
  r.ip_addresses.clear();
  return r;
}

class KeySignatureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ca = CreateCertificateAuthority(CaRequest("run CA"));
    ASSERT_TRUE(ca.ok()) << ca.status();
    ca_ = *ca;
    auto server = IssueServerCertificate(ca_, Request("server"));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *server;
    auto proxy = IssueServerCertificate(ca_, Request("proxy"));  // same CA, same names
    ASSERT_TRUE(proxy.ok());
    proxy_ = *proxy;
    auto other_ca = CreateCertificateAuthority(CaRequest("someone else's CA"));
    ASSERT_TRUE(other_ca.ok());
    auto stranger = IssueServerCertificate(*other_ca, Request("server"));
    ASSERT_TRUE(stranger.ok());
    stranger_ = *stranger;
    auto key = GenerateX25519KeyPair();
    ASSERT_TRUE(key.ok());
    public_key_ = key->public_key;
  }

  AggregationKeyTrust Trust(const std::string& host, const std::string& pin = "") const {
    return {ca_.cert_pem, host, pin};
  }

  PemPair ca_, server_, proxy_, stranger_;
  std::string public_key_;
};

TEST_F(KeySignatureTest, TheServersSignatureVerifiesForItsRunRoundAndKeyOnly) {
  auto sig = SignAggregationKey(server_.key_pem, "run-1", 3, public_key_);
  ASSERT_TRUE(sig.ok()) << sig.status();
  EXPECT_TRUE(
      VerifyAggregationKey(Trust("127.0.0.1"), server_.cert_pem, *sig, "run-1", 3, public_key_)
          .ok());
  EXPECT_TRUE(
      VerifyAggregationKey(Trust("localhost"), server_.cert_pem, *sig, "run-1", 3, public_key_)
          .ok());
  auto pin = CertificatePin(server_.cert_pem);
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(pin->size(), 64u);
  EXPECT_TRUE(VerifyAggregationKey(Trust("127.0.0.1", *pin), server_.cert_pem, *sig, "run-1", 3,
                                   public_key_)
                  .ok());

  std::string other_key = public_key_;
  other_key[0] = static_cast<char>(other_key[0] ^ 1);
  for (const auto& [run, round, key] : std::vector<std::tuple<std::string, uint64_t, std::string>>{
           {"run-2", 3, public_key_}, {"run-1", 4, public_key_}, {"run-1", 3, other_key}}) {
    const absl::Status s =
        VerifyAggregationKey(Trust("127.0.0.1"), server_.cert_pem, *sig, run, round, key);
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << run << " " << round << ": " << s;
  }
  EXPECT_TRUE(absl::IsPermissionDenied(
      VerifyAggregationKey(Trust("127.0.0.1"), server_.cert_pem, "", "run-1", 3, public_key_)));
}

TEST_F(KeySignatureTest, ASubstitutedKeyIsRefused) {
  // A proxy that holds a key of its own signs a key of its own.
  auto stranger_sig = SignAggregationKey(stranger_.key_pem, "run-1", 3, public_key_);
  ASSERT_TRUE(stranger_sig.ok());
  const absl::Status unknown_ca = VerifyAggregationKey(Trust("127.0.0.1"), stranger_.cert_pem,
                                                       *stranger_sig, "run-1", 3, public_key_);
  EXPECT_TRUE(absl::IsPermissionDenied(unknown_ca)) << unknown_ca;
  EXPECT_THAT(unknown_ca.message(), HasSubstr("does not chain"));
  // The server's certificate with another key's signature.
  const absl::Status mismatched = VerifyAggregationKey(Trust("127.0.0.1"), server_.cert_pem,
                                                       *stranger_sig, "run-1", 3, public_key_);
  EXPECT_TRUE(absl::IsPermissionDenied(mismatched)) << mismatched;
  // A valid certificate, but not for the server the client dialed.
  auto sig = SignAggregationKey(server_.key_pem, "run-1", 3, public_key_);
  ASSERT_TRUE(sig.ok());
  const absl::Status other_host = VerifyAggregationKey(Trust("fl.example.org"), server_.cert_pem,
                                                       *sig, "run-1", 3, public_key_);
  EXPECT_TRUE(absl::IsPermissionDenied(other_host)) << other_host;
  EXPECT_THAT(other_host.message(), HasSubstr("not valid for the server"));
}

TEST_F(KeySignatureTest, OnlyAPinTellsTheServerFromACertificateTheSameCaIssuedForTheSameName) {
  auto proxy_sig = SignAggregationKey(proxy_.key_pem, "run-1", 3, public_key_);
  ASSERT_TRUE(proxy_sig.ok());
  // Unpinned, the proxy's certificate passes: same CA, same name (docs/security.md says so).
  EXPECT_TRUE(
      VerifyAggregationKey(Trust("127.0.0.1"), proxy_.cert_pem, *proxy_sig, "run-1", 3, public_key_)
          .ok());
  // Pinned to the server's key, it does not.
  auto pin = CertificatePin(server_.cert_pem);
  ASSERT_TRUE(pin.ok());
  const absl::Status pinned = VerifyAggregationKey(Trust("127.0.0.1", *pin), proxy_.cert_pem,
                                                   *proxy_sig, "run-1", 3, public_key_);
  EXPECT_TRUE(absl::IsPermissionDenied(pinned)) << pinned;
  EXPECT_THAT(pinned.message(), HasSubstr("not the pinned"));
}

}  // namespace
}  // namespace fedlora::crypto
