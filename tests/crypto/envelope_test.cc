#include "crypto/envelope.h"

#include <openssl/evp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "crypto/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora::crypto {
namespace {

using ::testing::HasSubstr;

std::string FromHex(std::string_view hex) {
  EXPECT_EQ(hex.size() % 2, 0u) << hex;
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

std::string ToHexString(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

// Bytes first, first + 1, ..., last (inclusive).
std::string ByteRange(int first, int last) {
  std::string out;
  for (int b = first; b <= last; ++b) out.push_back(static_cast<char>(b));
  return out;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// ---------------------------------------------------------------------------------------------
// Randomness and comparison.

TEST(Random, BytesHaveTheRequestedLength) {
  for (size_t n : {0, 1, 12, 32, 1000, 1 << 20}) {
    auto r = RandomBytes(n);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->size(), n);
  }
}

TEST(Random, TwoCallsDiffer) {
  auto a = RandomBytes(32);
  auto b = RandomBytes(32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_NE(*a, std::string(32, '\0'));
}

TEST(Random, EveryByteIsDrawn) {
  // 1 MiB holds each byte value about 4096 times; a buffer only partly filled is mostly zeros.
  auto r = RandomBytes(1 << 20);
  ASSERT_TRUE(r.ok()) << r.status();
  size_t count[256] = {};
  for (unsigned char c : *r) ++count[c];
  for (int v = 0; v < 256; ++v) EXPECT_GT(count[v], 3000u) << "byte value " << v;
  for (int v = 0; v < 256; ++v) EXPECT_LT(count[v], 5200u) << "byte value " << v;
  auto tail_a = RandomBytes(33);
  auto tail_b = RandomBytes(33);
  ASSERT_TRUE(tail_a.ok() && tail_b.ok());
  EXPECT_NE(tail_a->substr(17), tail_b->substr(17));
}

TEST(Random, HexIsLowercaseTwoCharactersPerByte) {
  auto a = RandomHex(16);
  auto b = RandomHex(16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  for (char c : *a) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << *a;
  auto empty = RandomHex(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "");
}

TEST(Random, ConstantTimeEqualsTruthTable) {
  const std::string nul_b("a\0b", 3), nul_c("a\0c", 3);
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("a", "a"));
  EXPECT_TRUE(ConstantTimeEquals("token-123", "token-123"));
  EXPECT_TRUE(ConstantTimeEquals(nul_b, std::string("a\0b", 3)));
  EXPECT_FALSE(ConstantTimeEquals("a", "b"));
  EXPECT_FALSE(ConstantTimeEquals("xbc", "abc"));  // first byte differs
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));  // last byte differs
  EXPECT_FALSE(ConstantTimeEquals(nul_b, nul_c));  // differs after a NUL
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));   // a prefix is not equal
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals("a", ""));
}

// ---------------------------------------------------------------------------------------------
// X25519: RFC 7748.

TEST(X25519, Rfc7748Section52ScalarMultiplication) {
  struct Case {
    const char* scalar;
    const char* u;
    const char* out;
  };
  const Case cases[] = {
      {"a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
       "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
       "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"},
      // The input u-coordinate has its top bit set, which X25519 must ignore.
      {"4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
       "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
       "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957"},
  };
  for (const Case& c : cases) {
    auto out = X25519SharedSecret(FromHex(c.scalar), FromHex(c.u));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(ToHexString(*out), c.out);
  }
}

TEST(X25519, Rfc7748Section61DiffieHellman) {
  const std::string alice_private =
      FromHex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
  const std::string alice_public =
      "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a";
  const std::string bob_private =
      FromHex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
  const std::string bob_public = "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f";
  const std::string shared = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742";

  auto a_pub = X25519PublicKey(alice_private);
  auto b_pub = X25519PublicKey(bob_private);
  ASSERT_TRUE(a_pub.ok() && b_pub.ok());
  EXPECT_EQ(ToHexString(*a_pub), alice_public);
  EXPECT_EQ(ToHexString(*b_pub), bob_public);
  auto k_ab = X25519SharedSecret(alice_private, FromHex(bob_public));
  auto k_ba = X25519SharedSecret(bob_private, FromHex(alice_public));
  ASSERT_TRUE(k_ab.ok() && k_ba.ok());
  EXPECT_EQ(ToHexString(*k_ab), shared);
  EXPECT_EQ(ToHexString(*k_ba), shared);
}

TEST(X25519, GeneratedPairsAreConsistentAndFresh) {
  auto a = GenerateX25519KeyPair();
  auto b = GenerateX25519KeyPair();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->private_key.size(), kX25519KeyBytes);
  EXPECT_EQ(a->public_key.size(), kX25519KeyBytes);
  EXPECT_NE(a->private_key, b->private_key);
  EXPECT_NE(a->public_key, b->public_key);
  auto pub = X25519PublicKey(a->private_key);
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(*pub, a->public_key);
  auto k_ab = X25519SharedSecret(a->private_key, b->public_key);
  auto k_ba = X25519SharedSecret(b->private_key, a->public_key);
  ASSERT_TRUE(k_ab.ok() && k_ba.ok());
  EXPECT_EQ(*k_ab, *k_ba);
}

TEST(X25519, WrongKeySizesAreInvalidArgument) {
  const std::string good(32, '\x42');
  for (size_t n : {0, 31, 33}) {
    const std::string bad(n, '\x42');
    EXPECT_EQ(X25519PublicKey(bad).status().code(), absl::StatusCode::kInvalidArgument);
    auto s1 = X25519SharedSecret(bad, good);
    EXPECT_EQ(s1.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(s1.status()), HasSubstr("private key must be 32 bytes"));
    auto s2 = X25519SharedSecret(good, bad);
    EXPECT_EQ(s2.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(s2.status()), HasSubstr("peer public key must be 32 bytes"));
  }
}

// u-coordinates whose X25519 with any scalar is all zero: 0, 1, the two points of order 8, and
// the non-canonical encodings p - 1, p, p + 1.
const char* const kSmallOrderPoints[] = {
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0100000000000000000000000000000000000000000000000000000000000000",
    "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
    "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
};

TEST(X25519, SmallOrderPeerKeyIsRefused) {
  auto pair = GenerateX25519KeyPair();
  ASSERT_TRUE(pair.ok());
  for (const char* point : kSmallOrderPoints) {
    auto s = X25519SharedSecret(pair->private_key, FromHex(point));
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << point << ": " << s.status();
    EXPECT_THAT(Msg(s.status()), HasSubstr("small order")) << point;
  }
}

// ---------------------------------------------------------------------------------------------
// HKDF-SHA256: RFC 5869 appendix A.

TEST(Hkdf, Rfc5869TestCase1) {
  auto okm = HkdfSha256(std::string(22, '\x0b'), FromHex("000102030405060708090a0b0c"),
                        FromHex("f0f1f2f3f4f5f6f7f8f9"), 42);
  ASSERT_TRUE(okm.ok()) << okm.status();
  EXPECT_EQ(ToHexString(*okm),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
}

TEST(Hkdf, Rfc5869TestCase2LongInputs) {
  auto okm = HkdfSha256(ByteRange(0x00, 0x4f), ByteRange(0x60, 0xaf), ByteRange(0xb0, 0xff), 82);
  ASSERT_TRUE(okm.ok()) << okm.status();
  EXPECT_EQ(ToHexString(*okm),
            "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c"
            "59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71"
            "cc30c58179ec3e87c14c01d5c1f3434f1d87");
}

TEST(Hkdf, Rfc5869TestCase3EmptySaltAndInfo) {
  auto okm = HkdfSha256(std::string(22, '\x0b'), "", "", 42);
  ASSERT_TRUE(okm.ok()) << okm.status();
  EXPECT_EQ(ToHexString(*okm),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8");
}

TEST(Hkdf, BadLengthsAndEmptyKeyAreInvalidArgument) {
  const std::string ikm(32, 'k');
  EXPECT_EQ(HkdfSha256(ikm, "", "", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HkdfSha256(ikm, "", "", 255 * 32 + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto longest = HkdfSha256(ikm, "", "", 255 * 32);
  ASSERT_TRUE(longest.ok()) << longest.status();
  EXPECT_EQ(longest->size(), 255u * 32);
  EXPECT_EQ(HkdfSha256("", "salt", "info", 32).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// AES-256-GCM: McGrew & Viega, "The Galois/Counter Mode of Operation (GCM)", test cases 13-16.

struct GcmCase {
  const char* name;
  const char* key;
  const char* nonce;
  const char* aad;
  const char* plaintext;
  const char* ciphertext;
  const char* tag;
};

constexpr char kGcmKey[] = "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308";
constexpr char kGcmNonce[] = "cafebabefacedbaddecaf888";
constexpr char kGcmPlaintext[] =
    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
    "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255";
constexpr char kGcmCiphertext[] =
    "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
    "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad";

std::vector<GcmCase> GcmCases() {
  static const std::string p60 = std::string(kGcmPlaintext, 120);
  static const std::string c60 = std::string(kGcmCiphertext, 120);
  return {
      {"13 (zero key, empty plaintext)",
       "0000000000000000000000000000000000000000000000000000000000000000",
       "000000000000000000000000", "", "", "", "530f8afbc74536b9a963b4f1c4cb738b"},
      {"14 (zero key, one zero block)",
       "0000000000000000000000000000000000000000000000000000000000000000",
       "000000000000000000000000", "", "00000000000000000000000000000000",
       "cea7403d4d606b6e074ec5d3baf39d18", "d0d1c8a799996bf0265b98b5d48ab919"},
      {"15 (plaintext, no AAD)", kGcmKey, kGcmNonce, "", kGcmPlaintext, kGcmCiphertext,
       "b094dac5d93471bdec1a502270e3cc6c"},
      {"16 (60-byte plaintext with AAD)", kGcmKey, kGcmNonce,
       "feedfacedeadbeeffeedfacedeadbeefabaddad2", p60.c_str(), c60.c_str(),
       "76fc6ece0f4e1768cddf8853bb2d551b"},
  };
}

TEST(Aes256Gcm, McGrewViegaKnownAnswers) {
  for (const GcmCase& c : GcmCases()) {
    SCOPED_TRACE(c.name);
    auto sealed =
        Aes256GcmSeal(FromHex(c.key), FromHex(c.nonce), FromHex(c.aad), FromHex(c.plaintext));
    ASSERT_TRUE(sealed.ok()) << sealed.status();
    EXPECT_EQ(ToHexString(*sealed), std::string(c.ciphertext) + c.tag);
    auto opened = Aes256GcmOpen(FromHex(c.key), FromHex(c.nonce), FromHex(c.aad),
                                FromHex(c.ciphertext) + FromHex(c.tag));
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(ToHexString(*opened), c.plaintext);
  }
}

TEST(Aes256Gcm, OpenRefusesTamperingWithPermissionDenied) {
  const GcmCase c = GcmCases()[3];
  const std::string key = FromHex(c.key), nonce = FromHex(c.nonce), aad = FromHex(c.aad);
  const std::string sealed = FromHex(c.ciphertext) + FromHex(c.tag);
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::string bad = sealed;
    bad[i] ^= 0x01;
    auto r = Aes256GcmOpen(key, nonce, aad, bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << "byte " << i;
    EXPECT_THAT(Msg(r.status()), HasSubstr("does not authenticate"));
  }
  std::string other_aad = aad;
  other_aad[0] ^= 0x80;
  EXPECT_EQ(Aes256GcmOpen(key, nonce, other_aad, sealed).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Aes256GcmOpen(key, nonce, "", sealed).status().code(),
            absl::StatusCode::kPermissionDenied);
  std::string other_nonce = nonce;
  other_nonce[11] ^= 0x01;
  EXPECT_EQ(Aes256GcmOpen(key, other_nonce, aad, sealed).status().code(),
            absl::StatusCode::kPermissionDenied);
  std::string other_key = key;
  other_key[31] ^= 0x01;
  EXPECT_EQ(Aes256GcmOpen(other_key, nonce, aad, sealed).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Aes256GcmOpen(key, nonce, aad, sealed.substr(0, sealed.size() - 1)).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Aes256Gcm, MalformedSizesAreInvalidArgument) {
  const std::string key(32, 'k'), nonce(12, 'n');
  auto short_key = Aes256GcmSeal(key.substr(1), nonce, "", "x");
  EXPECT_EQ(short_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(short_key.status()), HasSubstr("key must be 32 bytes"));
  auto long_nonce = Aes256GcmSeal(key, nonce + "n", "", "x");
  EXPECT_EQ(long_nonce.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(long_nonce.status()), HasSubstr("nonce must be 12 bytes"));
  EXPECT_EQ(Aes256GcmOpen(key + "k", nonce, "", std::string(16, 't')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Aes256GcmOpen(key, nonce.substr(1), "", std::string(16, 't')).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto short_tag = Aes256GcmOpen(key, nonce, "", std::string(15, 't'));
  EXPECT_EQ(short_tag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(short_tag.status()), HasSubstr("shorter than its 16-byte tag"));
}

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
uint64_t AvailableMemory() {
  std::ifstream in("/proc/meminfo");
  std::string name, unit;
  uint64_t kib = 0;
  while (in >> name >> kib >> unit) {
    if (name == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// n bytes of the AES-256-GCM keystream from byte `offset` (a multiple of 16) of the plaintext on:
// GCM encrypts plaintext block i with AES-CTR at counter nonce || be32(i + 2).
std::string GcmKeystream(const std::string& key, const std::string& nonce, size_t offset,
                         size_t n) {
  std::string iv = nonce;
  const uint32_t counter = static_cast<uint32_t>(offset / 16 + 2);
  for (int i = 3; i >= 0; --i) iv.push_back(static_cast<char>(counter >> (8 * i)));
  std::string out(n, '\0');
  const std::string zeros(n, '\0');
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int len = 0;
  const bool ok = ctx != nullptr &&
                  EVP_EncryptInit_ex(ctx, EVP_aes_256_ctr(), nullptr,
                                     reinterpret_cast<const unsigned char*>(key.data()),
                                     reinterpret_cast<const unsigned char*>(iv.data())) == 1 &&
                  EVP_EncryptUpdate(ctx, reinterpret_cast<unsigned char*>(out.data()), &len,
                                    reinterpret_cast<const unsigned char*>(zeros.data()),
                                    static_cast<int>(n)) == 1;
  EVP_CIPHER_CTX_free(ctx);
  EXPECT_TRUE(ok);
  return out;
}

// EVP takes int lengths, so a plaintext above 2 GiB goes through in pieces. The plaintext is zeros
// (unallocated pages) but for marker bytes at the piece boundaries; the ciphertext around each
// marker is checked against an AES-256-CTR keystream, so a piece read from or written to the wrong
// place, or skipped, shows.
TEST(Aes256Gcm, PlaintextAbove2GiB) {
  constexpr size_t kSize = (size_t{1} << 31) + (size_t{1} << 20) + 7;
  if (AvailableMemory() < (size_t{8} << 30)) GTEST_SKIP() << "needs about 5 GiB of free memory";
  void* map = mmap(nullptr, kSize, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  std::unique_ptr<void, std::function<void(void*)>> unmap(map, [](void* p) { munmap(p, kSize); });
  madvise(map, kSize, MADV_HUGEPAGE);  // reads of untouched pages then map the huge zero page
  char* pt = static_cast<char*>(map);
  const size_t marks[] = {
      0, (size_t{1} << 30) - 1, size_t{1} << 30, (size_t{1} << 31) - 1, size_t{1} << 31, kSize - 1};
  for (size_t i = 0; i < std::size(marks); ++i) pt[marks[i]] = static_cast<char>(0x11 * (i + 1));
  const std::string_view plaintext(pt, kSize);
  const std::string key(32, '\x42'), nonce = FromHex("000102030405060708090a0b"), aad = "aad";

  auto sealed = Aes256GcmSeal(key, nonce, aad, plaintext);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  ASSERT_EQ(sealed->size(), kSize + 16);
  for (size_t mark : marks) {
    SCOPED_TRACE(mark);
    const size_t from = mark / 16 * 16 >= 16 ? mark / 16 * 16 - 16 : 0;
    const size_t n = std::min<size_t>(64, kSize - from);
    const std::string keystream = GcmKeystream(key, nonce, from, n);
    std::string decrypted = sealed->substr(from, n);
    for (size_t i = 0; i < n; ++i) decrypted[i] ^= keystream[i];
    EXPECT_EQ(ToHexString(decrypted), ToHexString(plaintext.substr(from, n)));
  }

  // Open checks the tag over every piece: one that skipped or repeated a piece would not authenticate.
  auto opened = Aes256GcmOpen(key, nonce, aad, *sealed);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_EQ(opened->size(), kSize);
  EXPECT_TRUE(std::string_view(*opened) == plaintext);
}

// ---------------------------------------------------------------------------------------------
// Associated data.

TEST(UpdateAssociatedData, CanonicalLayout) {
  std::string expected;
  expected += std::string("\x11\0\0\0\0\0\0\0", 8) + "fedlora/v2 update";  // label, 17 bytes
  expected += std::string("\x03\0\0\0\0\0\0\0", 8) + "run";
  expected += std::string("\x07\x01\0\0\0\0\0\0", 8);  // round 263
  expected += std::string("\x02\0\0\0\0\0\0\0", 8) + "c1";
  expected += std::string("\0\0\0\0\0\0\0\0", 8);        // empty upload id
  expected += std::string("\x40\x42\x0f\0\0\0\0\0", 8);  // num_examples 1,000,000
  EXPECT_EQ(ToHexString(UpdateAssociatedData("run", 263, "c1", "", 1'000'000)),
            ToHexString(expected));
}

TEST(UpdateAssociatedData, DistinctInputsGiveDistinctEncodings) {
  const std::vector<std::string> all = {
      UpdateAssociatedData("run", 1, "client", "upload", 1),
      UpdateAssociatedData("run2", 1, "client", "upload", 1),
      UpdateAssociatedData("run", 2, "client", "upload", 1),
      UpdateAssociatedData("run", 256, "client", "upload", 1),
      UpdateAssociatedData("run", 1, "client2", "upload", 1),
      UpdateAssociatedData("run", 1, "client", "upload2", 1),
      // Moving bytes between neighbouring fields must change the encoding.
      UpdateAssociatedData("ru", 1, "nclient", "upload", 1),
      UpdateAssociatedData("run", 1, "clientu", "pload", 1),
      UpdateAssociatedData("", 1, "", "", 1),
      UpdateAssociatedData("", 0, "", "", 1),
      UpdateAssociatedData("run", 1, "client", "upload", 2),
      UpdateAssociatedData("run", 1, "client", "upload", 0),
  };
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), all.size());
}

// ---------------------------------------------------------------------------------------------
// The sealed-update envelope.

class EnvelopeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = GenerateX25519KeyPair();
    ASSERT_TRUE(pair.ok()) << pair.status();
    server_ = *pair;
  }

  SealedUpdate Seal(std::string_view plaintext, std::string_view aad) {
    auto sealed = SealUpdate(server_.public_key, aad, plaintext);
    EXPECT_TRUE(sealed.ok()) << sealed.status();
    return sealed.ok() ? *sealed : SealedUpdate{};
  }

  X25519KeyPair server_;
  const std::string aad_ = UpdateAssociatedData("run-7", 3, "client-a", "upload-0123", 40);
};

TEST_F(EnvelopeTest, RoundTripsAndHasTheDocumentedLayout) {
  for (size_t n : {size_t{0}, size_t{1}, (size_t{1} << 20) + 3}) {
    SCOPED_TRACE(n);
    std::string plaintext(n, '\0');
    for (size_t i = 0; i < n; ++i) plaintext[i] = static_cast<char>(i * 131 + 7);
    const SealedUpdate sealed = Seal(plaintext, aad_);
    ASSERT_EQ(sealed.envelope.size(), n + kEnvelopeOverheadBytes);
    EXPECT_EQ(sealed.ephemeral_public_key.size(), kX25519KeyBytes);
    EXPECT_EQ(sealed.envelope.substr(0, 8), std::string("FLSE\x01\0\0\0", 8));
    auto size = EnvelopePlaintextSize(sealed.envelope);
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(*size, n);

    auto opened =
        OpenUpdate(server_.private_key, sealed.ephemeral_public_key, aad_, sealed.envelope);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_TRUE(*opened == plaintext);

    std::string buffer(n, '\x5a');
    ASSERT_TRUE(OpenUpdateInto(server_.private_key, sealed.ephemeral_public_key, aad_,
                               sealed.envelope, buffer.data(), buffer.size())
                    .ok());
    EXPECT_TRUE(buffer == plaintext);
  }
}

// Recomputes the construction from its parts: key = HKDF-SHA256(X25519(server, ephemeral),
// ephemeral_public || server_public, "fedlora/v1 sealed update"), GCM over header || aad.
TEST_F(EnvelopeTest, MatchesTheDocumentedConstruction) {
  const std::string plaintext = "lora delta bytes";
  const SealedUpdate sealed = Seal(plaintext, aad_);
  auto shared = X25519SharedSecret(server_.private_key, sealed.ephemeral_public_key);
  ASSERT_TRUE(shared.ok());
  auto key = HkdfSha256(*shared, sealed.ephemeral_public_key + server_.public_key,
                        "fedlora/v1 sealed update", 32);
  ASSERT_TRUE(key.ok());
  const std::string header = sealed.envelope.substr(0, 20);
  auto opened =
      Aes256GcmOpen(*key, header.substr(8, 12), header + aad_, sealed.envelope.substr(20));
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(*opened, plaintext);
}

TEST_F(EnvelopeTest, TwoSealsOfTheSamePlaintextDiffer) {
  const std::string plaintext(64, 'p');
  const SealedUpdate a = Seal(plaintext, aad_);
  const SealedUpdate b = Seal(plaintext, aad_);
  EXPECT_NE(a.ephemeral_public_key, b.ephemeral_public_key);
  EXPECT_NE(a.envelope.substr(8, 12), b.envelope.substr(8, 12));  // nonce
  EXPECT_NE(a.envelope.substr(20), b.envelope.substr(20));        // ciphertext and tag
}

TEST_F(EnvelopeTest, EveryFlippedByteFailsToOpen) {
  const std::string plaintext = "8 bytes!";
  const SealedUpdate sealed = Seal(plaintext, aad_);
  ASSERT_EQ(sealed.envelope.size(), 44u);
  for (size_t i = 0; i < sealed.envelope.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80}) {
      std::string bad = sealed.envelope;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      std::string buffer(plaintext.size(), '\x5a');
      const absl::Status s = OpenUpdateInto(server_.private_key, sealed.ephemeral_public_key, aad_,
                                            bad, buffer.data(), buffer.size());
      if (i < 5) {  // magic and version: refused before decrypting
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "byte " << i << ": " << s;
        EXPECT_EQ(buffer, std::string(plaintext.size(), '\x5a'));
      } else {  // reserved bytes, nonce, ciphertext, tag: authenticated
        EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << "byte " << i << ": " << s;
        EXPECT_THAT(Msg(s), HasSubstr("does not authenticate"));
        EXPECT_EQ(buffer, std::string(plaintext.size(), '\0'))
            << "byte " << i << ": buffer not zeroed";
      }
    }
  }
}

TEST_F(EnvelopeTest, TruncatedEnvelopeFailsToOpen) {
  const SealedUpdate sealed = Seal("some update", aad_);
  const std::string& env = sealed.envelope;
  for (size_t cut : {size_t{1}, size_t{5}, size_t{11}}) {  // the tag shifts; 11 leaves 36 bytes
    auto r = OpenUpdate(server_.private_key, sealed.ephemeral_public_key, aad_,
                        env.substr(0, env.size() - cut));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << cut;
  }
  auto too_short =
      OpenUpdate(server_.private_key, sealed.ephemeral_public_key, aad_, env.substr(0, 35));
  EXPECT_EQ(too_short.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(too_short.status()), HasSubstr("too short"));
  auto extended = OpenUpdate(server_.private_key, sealed.ephemeral_public_key, aad_, env + "x");
  EXPECT_EQ(extended.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(EnvelopeTest, WrongAssociatedDataFailsToOpen) {
  const SealedUpdate sealed = Seal("update", aad_);
  const std::string wrong[] = {
      UpdateAssociatedData("run-8", 3, "client-a", "upload-0123", 40),  // run
      UpdateAssociatedData("run-7", 4, "client-a", "upload-0123", 40),  // round
      UpdateAssociatedData("run-7", 3, "client-b", "upload-0123", 40),  // client
      UpdateAssociatedData("run-7", 3, "client-a", "upload-0124", 40),  // upload
      UpdateAssociatedData("run-7", 3, "client-a", "upload-0123", 41),  // weight
      "",
  };
  for (const std::string& aad : wrong) {
    auto r = OpenUpdate(server_.private_key, sealed.ephemeral_public_key, aad, sealed.envelope);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(Msg(r.status()), HasSubstr("does not authenticate"));
  }
}

TEST_F(EnvelopeTest, WrongKeysFailToOpen) {
  const SealedUpdate sealed = Seal("update", aad_);
  auto other = GenerateX25519KeyPair();
  ASSERT_TRUE(other.ok());
  auto wrong_server =
      OpenUpdate(other->private_key, sealed.ephemeral_public_key, aad_, sealed.envelope);
  EXPECT_EQ(wrong_server.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(Msg(wrong_server.status()), HasSubstr("server key"));
  auto wrong_ephemeral = OpenUpdate(server_.private_key, other->public_key, aad_, sealed.envelope);
  EXPECT_EQ(wrong_ephemeral.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(EnvelopeTest, MalformedEnvelopesAreInvalidArgument) {
  const SealedUpdate sealed = Seal("update", aad_);
  std::string bad_magic = sealed.envelope;
  bad_magic[0] = 'X';
  std::string bad_version = sealed.envelope;
  bad_version[4] = 2;
  struct Case {
    std::string envelope;
    const char* message;
  };
  const Case cases[] = {
      {"", "too short"},
      {sealed.envelope.substr(0, kEnvelopeOverheadBytes - 1), "too short"},
      {bad_magic, "bad magic"},
      {bad_version, "unknown version 2"},
  };
  for (const Case& c : cases) {
    auto size = EnvelopePlaintextSize(c.envelope);
    EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(size.status()), HasSubstr(c.message));
    auto r = OpenUpdate(server_.private_key, sealed.ephemeral_public_key, aad_, c.envelope);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(r.status()), HasSubstr(c.message));
  }
  auto empty_plaintext =
      EnvelopePlaintextSize(sealed.envelope.substr(0, 20) + std::string(16, 't'));
  ASSERT_TRUE(empty_plaintext.ok());
  EXPECT_EQ(*empty_plaintext, 0u);
}

TEST_F(EnvelopeTest, WrongSizesAreInvalidArgument) {
  const SealedUpdate sealed = Seal("update", aad_);
  auto seal = SealUpdate(server_.public_key.substr(1), aad_, "x");
  EXPECT_EQ(seal.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(seal.status()), HasSubstr("server public key must be 32 bytes"));
  auto priv =
      OpenUpdate(server_.private_key + "x", sealed.ephemeral_public_key, aad_, sealed.envelope);
  EXPECT_EQ(priv.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(priv.status()), HasSubstr("server private key must be 32 bytes"));
  auto eph =
      OpenUpdate(server_.private_key, sealed.ephemeral_public_key.substr(2), aad_, sealed.envelope);
  EXPECT_EQ(eph.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(eph.status()), HasSubstr("ephemeral public key must be 32 bytes"));
  std::string buffer(7, '\0');  // the plaintext is 6 bytes
  const absl::Status into = OpenUpdateInto(server_.private_key, sealed.ephemeral_public_key, aad_,
                                           sealed.envelope, buffer.data(), buffer.size());
  EXPECT_EQ(into.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(into), HasSubstr("output buffer holds 7 bytes"));
}

TEST_F(EnvelopeTest, SmallOrderKeysAreRefused) {
  const SealedUpdate sealed = Seal("update", aad_);
  for (const char* point : kSmallOrderPoints) {
    auto seal = SealUpdate(FromHex(point), aad_, "x");
    EXPECT_EQ(seal.status().code(), absl::StatusCode::kInvalidArgument) << point;
    EXPECT_THAT(Msg(seal.status()), HasSubstr("server public key is a point of small order"));
    auto open = OpenUpdate(server_.private_key, FromHex(point), aad_, sealed.envelope);
    EXPECT_EQ(open.status().code(), absl::StatusCode::kInvalidArgument) << point;
    EXPECT_THAT(Msg(open.status()), HasSubstr("ephemeral public key is a point of small order"));
  }
}

}  // namespace
}  // namespace fedlora::crypto
