#include "core/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace fedlora {
namespace {

constexpr char32_t R = kUnicodeReplacement;

TEST(Utf8, WellFormedTextDecodesToItsCodePoints) {
  for (Utf8Repair repair : {Utf8Repair::kEachByte, Utf8Repair::kMaximalSubpart}) {
    EXPECT_EQ(DecodeUtf8("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", repair),
              (std::u32string{U'a', 0xE9, 0x20AC, 0x1F600}));
  }
}

TEST(Utf8, TruncatedSequenceIsOneReplacementOrOnePerByte) {
  // F0 9F 98 is the start of U+1F600 without its last byte: one maximal ill-formed subpart.
  const std::string text = "a\xF0\x9F\x98z\xFF";
  EXPECT_EQ(DecodeUtf8(text, Utf8Repair::kMaximalSubpart), (std::u32string{U'a', R, U'z', R}));
  EXPECT_EQ(DecodeUtf8(text, Utf8Repair::kEachByte), (std::u32string{U'a', R, R, R, U'z', R}));
}

TEST(Utf8, OverlongSurrogateAndOutOfRangeFormsAreIllFormedUnderBothRules) {
  // C0 AF: overlong '/'; E0 80 80: overlong NUL; ED A0 80: U+D800; F4 90 80 80: U+110000. None
  // has a well-formed prefix longer than its lead byte, so both rules replace byte by byte.
  for (const std::string& bad : {std::string("\xC0\xAF"), std::string("\xE0\x80\x80"),
                                 std::string("\xED\xA0\x80"), std::string("\xF4\x90\x80\x80")}) {
    const std::u32string each(bad.size(), R);
    EXPECT_EQ(DecodeUtf8(bad, Utf8Repair::kEachByte), each);
    EXPECT_EQ(DecodeUtf8(bad, Utf8Repair::kMaximalSubpart), each);
  }
}

TEST(Utf8, SequenceLengthGivesTheMaximalIllFormedSubpart) {
  const auto len = [](std::string_view s) {
    return Utf8SequenceLength(reinterpret_cast<const unsigned char*>(s.data()), s.size());
  };
  EXPECT_EQ(len("A"), 1);
  EXPECT_EQ(len("\xE2\x82\xAC"), 3);
  EXPECT_EQ(len("\xE2\x82"), -2);
  EXPECT_EQ(len("\xE2\x82z"), -2);
  EXPECT_EQ(len("\x80"), -1);
  EXPECT_EQ(len("\xF0\x80"), -1);  // F0 needs 90..BF next
}

TEST(Utf8, AppendEncodesEachLength) {
  std::string out;
  for (char32_t c : {char32_t{'a'}, char32_t{0xE9}, char32_t{0x20AC}, char32_t{0x1F600}})
    AppendUtf8(c, &out);
  EXPECT_EQ(out, "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
}

TEST(Utf8, ContinuationBytesAreExactly80ToBF) {
  for (int b = 0; b < 256; ++b)
    EXPECT_EQ(IsUtf8Continuation(static_cast<unsigned char>(b)), b >= 0x80 && b <= 0xBF) << b;
}

}  // namespace
}  // namespace fedlora
