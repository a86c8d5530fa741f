// X25519 keys as PEM (crypto/x25519_pem.h): RFC 8410's example private key and the public key
// `openssl pkey -pubout` derives from it read to the right raw bytes, our PEM round-trips and is
// what OpenSSL writes, and a key of another algorithm, a private key where a public one belongs, or
// garbage is refused saying what it is.
#include "crypto/x25519_pem.h"

#include <string>

#include "crypto/envelope.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora::crypto {
namespace {

using ::testing::HasSubstr;

// RFC 8410, section 10.3.
constexpr const char* kRfcPrivatePem =
    "-----BEGIN PRIVATE KEY-----\n"
    "MC4CAQAwBQYDK2VuBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n"
    "-----END PRIVATE KEY-----\n";
// `openssl pkey -in rfc.key -pubout`.
constexpr const char* kRfcPublicPem =
    "-----BEGIN PUBLIC KEY-----\n"
    "MCowBQYDK2VuAyEAImrY+PYreyY3JH5rIf+1cj1jMMTV3VqNEefn3mXBxQE=\n"
    "-----END PUBLIC KEY-----\n";
// The same 32 bytes under Ed25519's OID (1.3.101.112).
constexpr const char* kEd25519PrivatePem =
    "-----BEGIN PRIVATE KEY-----\n"
    "MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n"
    "-----END PRIVATE KEY-----\n";

std::string Bytes(std::initializer_list<int> b) {
  std::string out;
  for (int x : b) out.push_back(static_cast<char>(x));
  return out;
}

const std::string kRfcPrivate =
    Bytes({0xd4, 0xee, 0x72, 0xdb, 0xf9, 0x13, 0x58, 0x4a, 0xd5, 0xb6, 0xd8,
           0xf1, 0xf7, 0x69, 0xf8, 0xad, 0x3a, 0xfe, 0x7c, 0x28, 0xcb, 0xf1,
           0xd4, 0xfb, 0xe0, 0x97, 0xa8, 0x8f, 0x44, 0x75, 0x58, 0x42});
const std::string kRfcPublic =
    Bytes({0x22, 0x6a, 0xd8, 0xf8, 0xf6, 0x2b, 0x7b, 0x26, 0x37, 0x24, 0x7e,
           0x6b, 0x21, 0xff, 0xb5, 0x72, 0x3d, 0x63, 0x30, 0xc4, 0xd5, 0xdd,
           0x5a, 0x8d, 0x11, 0xe7, 0xe7, 0xde, 0x65, 0xc1, 0xc5, 0x01});

TEST(X25519Pem, ReadsTheRfcExampleAndWritesWhatOpenSslWrites) {
  auto priv = X25519PrivateKeyFromPem(kRfcPrivatePem);
  ASSERT_TRUE(priv.ok()) << priv.status();
  EXPECT_TRUE(*priv == kRfcPrivate);
  auto pub = X25519PublicKeyFromPem(kRfcPublicPem);
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_TRUE(*pub == kRfcPublic);
  EXPECT_TRUE(*X25519PublicKey(*priv) == kRfcPublic);
  EXPECT_EQ(*X25519PrivateKeyToPem(kRfcPrivate), kRfcPrivatePem);
  EXPECT_EQ(*X25519PublicKeyToPem(kRfcPublic), kRfcPublicPem);
}

TEST(X25519Pem, RefusesOtherKeysAndGarbageSayingWhy) {
  auto ed = X25519PrivateKeyFromPem(kEd25519PrivatePem);
  EXPECT_TRUE(absl::IsInvalidArgument(ed.status())) << ed.status();
  EXPECT_THAT(std::string(ed.status().message()), HasSubstr("ED25519, not X25519"));
  auto swapped = X25519PublicKeyFromPem(kRfcPrivatePem);
  EXPECT_TRUE(absl::IsInvalidArgument(swapped.status())) << swapped.status();
  EXPECT_THAT(std::string(swapped.status().message()), HasSubstr("not a PEM PUBLIC KEY"));
  EXPECT_TRUE(absl::IsInvalidArgument(X25519PublicKeyFromPem("not a key").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(X25519PublicKeyToPem("short").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(X25519PrivateKeyToPem(std::string(33, 'k')).status()));
}

}  // namespace
}  // namespace fedlora::crypto
