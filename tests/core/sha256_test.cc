#include "core/sha256.h"

#include <string>

#include "core/file.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace fedlora {
namespace {

// Known answers from FIPS 180-2 appendix B / NIST CAVP examples.
constexpr char kEmpty[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr char kAbc[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr char kTwoBlock[] = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
constexpr char kMillionA[] = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";

TEST(Sha256, KnownAnswers) {
  EXPECT_EQ(Sha256Hex(""), kEmpty);
  EXPECT_EQ(Sha256Hex("abc"), kAbc);
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"), kTwoBlock);
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')), kMillionA);
}

TEST(Sha256, DigestBytesMatchHex) {
  const auto d = Sha256Digest("abc");
  EXPECT_EQ(d[0], 0xba);
  EXPECT_EQ(d[31], 0xad);
  EXPECT_EQ(ToHex(d.data(), d.size()), kAbc);
}

TEST(Sha256, MultiChunkUpdateEqualsOneShot) {
  const std::string msg(1000000, 'a');
  Sha256 h;
  // Uneven chunk sizes straddle the 64-byte block boundary in every way.
  size_t pos = 0, step = 1;
  while (pos < msg.size()) {
    const size_t n = std::min(step, msg.size() - pos);
    h.Update(msg.data() + pos, n);
    pos += n;
    step = step * 3 % 1031 + 1;
  }
  const auto d = h.Final();
  EXPECT_EQ(ToHex(d.data(), d.size()), kMillionA);
}

TEST(Sha256, FinalResetsForReuse) {
  Sha256 h;
  h.Update("junk", 4);
  (void)h.Final();
  h.Update("abc", 3);
  const auto d = h.Final();
  EXPECT_EQ(ToHex(d.data(), d.size()), kAbc);
  h.Update(nullptr, 0);  // an empty update is allowed with a null pointer
  const auto e = h.Final();
  EXPECT_EQ(ToHex(e.data(), e.size()), kEmpty);
}

TEST(Sha256, FileHashMatchesInMemoryAcrossChunkBoundary) {
  coretest::TempDir dir;
  // 2.5 MiB + 3: more than two of the 1 MiB read chunks, with a ragged tail.
  std::string data((5u << 19) + 3, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 24);
  ASSERT_TRUE(WriteFileAtomically(dir.File("blob"), data).ok());
  auto hex = Sha256FileHex(dir.File("blob"));
  ASSERT_TRUE(hex.ok()) << hex.status();
  EXPECT_EQ(*hex, Sha256Hex(data));

  ASSERT_TRUE(WriteFileAtomically(dir.File("million_a"), std::string(1000000, 'a')).ok());
  EXPECT_EQ(*Sha256FileHex(dir.File("million_a")), kMillionA);
}

TEST(Sha256, FileErrors) {
  coretest::TempDir dir;
  EXPECT_EQ(Sha256FileHex(dir.File("missing")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Sha256FileHex(dir.path()).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Sha256, ToHexFormatsEveryNibble) {
  const uint8_t bytes[] = {0x00, 0x0f, 0xf0, 0xff, 0x5a};
  EXPECT_EQ(ToHex(bytes, 5), "000ff0ff5a");
  EXPECT_EQ(ToHex(nullptr, 0), "");
}

}  // namespace
}  // namespace fedlora
