#include "core/sha256.h"

#include <openssl/evp.h>

#include <cstring>
#include <random>
#include <string>

#include "core/file.h"
#include "core/sha256_blocks.h"
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
  EXPECT_EQ(ToHex(d), kAbc);
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
  EXPECT_EQ(ToHex(d), kMillionA);
}

TEST(Sha256, FinalResetsForReuse) {
  Sha256 h;
  h.Update("junk", 4);
  (void)h.Final();
  h.Update("abc", 3);
  const auto d = h.Final();
  EXPECT_EQ(ToHex(d), kAbc);
  h.Update(nullptr, 0);  // an empty update is allowed with a null pointer
  const auto e = h.Final();
  EXPECT_EQ(ToHex(e), kEmpty);
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

// OpenSSL's EVP SHA-256: an implementation independent of ours (its own padding and lengths).
std::string EvpHex(std::string_view bytes) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EXPECT_EQ(EVP_Digest(bytes.data(), bytes.size(), d, &n, EVP_sha256(), nullptr), 1);
  return ToHex(d, n);
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

// Every test below runs once per block engine: the one this CPU picks (SHA-NI where it has it)
// and OpenSSL's block function.
class Sha256Engines : public ::testing::TestWithParam<sha256_internal::Engine> {
 protected:
  void SetUp() override {
    sha256_internal::SetEngineForTesting(GetParam());
    // The switch takes: the OpenSSL case really runs OpenSSL's block function.
    ASSERT_EQ(sha256_internal::UseShaNi(),
              GetParam() == sha256_internal::Engine::kAuto && sha256_internal::CpuHasShaNi());
  }
  void TearDown() override { sha256_internal::SetEngineForTesting(sha256_internal::Engine::kAuto); }
};

TEST_P(Sha256Engines, MatchesOpenSslEvpAtEveryLengthAroundThePaddingEdges) {
  const std::string data = RandomBytes(3 * 64 + 1, 1);
  for (size_t n = 0; n <= data.size(); ++n) {
    EXPECT_EQ(Sha256Hex(std::string_view(data).substr(0, n)),
              EvpHex(std::string_view(data).substr(0, n)))
        << n;
  }
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')), kMillionA);
  const std::string big = RandomBytes((1 << 20) + 37, 2);
  EXPECT_EQ(Sha256Hex(big), EvpHex(big));
}

TEST_P(Sha256Engines, UpdateAndDigestEqualsAChunkDigestPlusAnUpdate) {
  const std::string data = RandomBytes((3 << 20) + 200, 3);
  // Prefixes a whole number of blocks long take the one-pass route; the others (and a prefix
  // that went in as odd pieces) take the one-after-the-other route.
  const size_t prefixes[] = {0, 64, 1 << 20, 1, 63, 65, (1 << 20) + 7};
  const size_t chunks[] = {0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000, 1 << 20, (1 << 20) + 7};
  for (size_t prefix : prefixes) {
    for (size_t chunk : chunks) {
      const std::string_view head = std::string_view(data).substr(0, prefix);
      const std::string_view piece = std::string_view(data).substr(prefix, chunk);
      Sha256 fused;
      fused.Update(head);
      const Sha256DigestBytes own = fused.UpdateAndDigest(piece);
      EXPECT_EQ(ToHex(own), EvpHex(piece)) << prefix << " + " << chunk;
      EXPECT_EQ(fused.size(), prefix + chunk);
      fused.Update("tail");  // the running hash goes on correctly after the fused step
      const Sha256DigestBytes whole = fused.Final();
      EXPECT_EQ(ToHex(whole), EvpHex(std::string(head) + std::string(piece) + "tail"))
          << prefix << " + " << chunk;
    }
  }
}

TEST_P(Sha256Engines, ChunkedTransferHashesEachChunkAndTheWhole) {
  // What an upload does: 1 MiB chunks, the last one short, each checked and the blob at the end.
  const std::string blob = RandomBytes((5 << 20) / 2 + 3, 4);
  constexpr size_t kChunk = 1 << 20;
  Sha256 whole;
  for (size_t off = 0; off < blob.size(); off += kChunk) {
    const std::string_view chunk = std::string_view(blob).substr(off, kChunk);
    const Sha256DigestBytes d = whole.UpdateAndDigest(chunk);
    EXPECT_EQ(ToHex(d), EvpHex(chunk)) << off;
  }
  const Sha256DigestBytes d = whole.Final();
  EXPECT_EQ(ToHex(d), EvpHex(blob));
}

INSTANTIATE_TEST_SUITE_P(
    , Sha256Engines,
    ::testing::Values(sha256_internal::Engine::kAuto, sha256_internal::Engine::kOpenSsl),
    [](const auto& info) {
      return std::string(info.param == sha256_internal::Engine::kAuto ? "CpuDefault" : "OpenSsl");
    });

TEST(Sha256, CopyForksTheHash) {
  Sha256 a;
  a.Update("ab");
  Sha256 b = a;
  a.Update("c");
  b.Update("d");
  const auto da = a.Final(), db = b.Final();
  EXPECT_EQ(ToHex(da), kAbc);
  EXPECT_EQ(ToHex(db), EvpHex("abd"));
}

// The SHA-NI kernels against OpenSSL's block function on arbitrary chaining values: the CPU
// reference check for the hand-written kernel. Needs a CPU with SHA-NI.
TEST(Sha256Blocks, ShaNiKernelsMatchOpenSslOnArbitraryStates) {
  if (!sha256_internal::CpuHasShaNi())
    GTEST_SKIP() << "this CPU has no SHA-NI; the OpenSSL engine is the only one";
  std::mt19937 gen(5);
  const std::string data = RandomBytes(64 * 37, 6);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(data.data());
  for (size_t blocks : {size_t{1}, size_t{2}, size_t{37}}) {
    uint32_t a[8], b[8];
    for (uint32_t& w : a) w = gen();
    for (uint32_t& w : b) w = gen();
    uint32_t ref_a[8], ref_b[8];
    std::memcpy(ref_a, a, sizeof(a));
    std::memcpy(ref_b, b, sizeof(b));
    sha256_internal::CompressOpenSsl(ref_a, p, blocks);
    sha256_internal::CompressOpenSsl(ref_b, p, blocks);
    ASSERT_TRUE(sha256_internal::UseShaNi());
    uint32_t one[8];
    std::memcpy(one, a, sizeof(a));
    sha256_internal::Compress(one, p, blocks);
    EXPECT_EQ(0, std::memcmp(one, ref_a, sizeof(one))) << blocks << " blocks, one lane";
    sha256_internal::Compress2(a, b, p, blocks);
    EXPECT_EQ(0, std::memcmp(a, ref_a, sizeof(a))) << blocks << " blocks, lane 0 of 2";
    EXPECT_EQ(0, std::memcmp(b, ref_b, sizeof(b))) << blocks << " blocks, lane 1 of 2";
  }
}

TEST(Sha256, ToHexFormatsEveryNibble) {
  const uint8_t bytes[] = {0x00, 0x0f, 0xf0, 0xff, 0x5a};
  EXPECT_EQ(ToHex(bytes, 5), "000ff0ff5a");
  EXPECT_EQ(ToHex(nullptr, 0), "");
}

}  // namespace
}  // namespace fedlora
