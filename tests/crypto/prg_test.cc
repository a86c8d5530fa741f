#include "crypto/prg.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace fedlora::crypto {
namespace {

std::string Hex(const std::string& bytes) { return absl::BytesToHexString(bytes); }

TEST(Prg, KnownAnswerZeroKeyIsAes256OfTheZeroBlock) {
  // FIPS-197 / AESAVS: AES-256 with the all-zero key encrypts the zero block to dc95c078...
  auto prg = Prg::Create(std::string(32, '\0'));
  ASSERT_TRUE(prg.ok()) << prg.status();
  std::string out(32, '\0');
  ASSERT_TRUE(prg->Fill(out.data(), out.size()).ok());
  EXPECT_EQ(Hex(out), "dc95c078a2408989ad48a21492842087530f8afbc74536b9a963b4f1c4cb738b");
}

TEST(Prg, KnownAnswerStreamSelectsTheCounterBlock) {
  // AES-256-CTR keystream for the SP 800-38A F.5.5 key with IV f0f1f2f3f4f5f6f7 || 0 (as
  // `openssl enc -aes-256-ctr` prints it).
  std::string key =
      absl::HexStringToBytes("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4");
  auto prg = Prg::Create(key, 0xf0f1f2f3f4f5f6f7ull);
  ASSERT_TRUE(prg.ok());
  std::string out(16, '\0');
  ASSERT_TRUE(prg->Fill(out.data(), out.size()).ok());
  EXPECT_EQ(Hex(out), "b4b0374fbf3694c871e1d290c5ba13a7");
}

TEST(Prg, WordsAreLittleEndianAndAddSubtractCancel) {
  std::string seed(32, '\x5a');
  auto a = Prg::Create(seed, 3);
  auto b = Prg::Create(seed, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  std::string bytes(8 * 70000, '\0');  // crosses the internal chunk boundary
  ASSERT_TRUE(a->Fill(bytes.data(), bytes.size()).ok());
  std::vector<uint64_t> v(70000, 7);
  ASSERT_TRUE(b->AddTo(v).ok());
  for (size_t i : {size_t{0}, size_t{8191}, size_t{8192}, size_t{69999}}) {
    uint64_t w = 0;
    for (int k = 7; k >= 0; --k) w = (w << 8) | static_cast<unsigned char>(bytes[8 * i + k]);
    EXPECT_EQ(v[i], w + 7) << i;
  }
  auto c = Prg::Create(seed, 3);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->SubtractFrom(v).ok());
  EXPECT_EQ(v, std::vector<uint64_t>(70000, 7));
}

TEST(Prg, StreamsAndSeedsDiffer) {
  std::string seed(32, '\x01');
  auto a = Prg::Create(seed, 0);
  auto b = Prg::Create(seed, 1);
  std::string other = seed;
  other[31] = '\x02';
  auto c = Prg::Create(other, 0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::string x(32, '\0'), y(32, '\0'), z(32, '\0');
  ASSERT_TRUE(a->Fill(x.data(), 32).ok());
  ASSERT_TRUE(b->Fill(y.data(), 32).ok());
  ASSERT_TRUE(c->Fill(z.data(), 32).ok());
  EXPECT_NE(x, y);
  EXPECT_NE(x, z);
}

TEST(Prg, UniformIsInTheUnitInterval) {
  auto prg = Prg::Create(std::string(32, '\x09'));
  ASSERT_TRUE(prg.ok());
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    auto u = prg->NextUniform();
    ASSERT_TRUE(u.ok());
    ASSERT_GE(*u, 0.0);
    ASSERT_LT(*u, 1.0);
    sum += *u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(Prg, RefusesAShortSeed) {
  auto prg = Prg::Create(std::string(16, '\0'));
  ASSERT_FALSE(prg.ok());
  EXPECT_EQ(prg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(prg.status().message().find("32 bytes"), std::string::npos);
}

}  // namespace
}  // namespace fedlora::crypto
