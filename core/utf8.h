// UTF-8: well-formedness (Unicode Table 3-7), decoding, encoding, and the two rules fedlora uses to
// repair ill-formed text, named so that each caller says which it follows:
//
//   Utf8Repair::kEachByte        every byte that does not begin a well-formed sequence becomes
//                                U+FFFD (the WordPiece tokenizer, whose text cleaning then drops
//                                it)
//   Utf8Repair::kMaximalSubpart  every maximal ill-formed subpart becomes one U+FFFD, as Python's
//                                bytes.decode(errors="replace") and Rust's String::from_utf8_lossy
//                                do (the byte-level BPE tokenizer, as Hugging Face's)
//
// Both refuse the same sequences: stray continuation bytes, truncated sequences, overlong forms,
// surrogates and values above U+10FFFF.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fedlora {

inline constexpr char32_t kUnicodeReplacement = 0xFFFD;

enum class Utf8Repair { kEachByte, kMaximalSubpart };

// A continuation byte (10xxxxxx): not where a code point starts.
constexpr bool IsUtf8Continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Length of the well-formed sequence at p[0, n) (> 0), or minus the length of its maximal
// ill-formed subpart (< 0). n must be at least 1.
int Utf8SequenceLength(const unsigned char* p, size_t n);

// The code points of `s`, ill-formed bytes replaced by U+FFFD under `repair`.
std::u32string DecodeUtf8(std::string_view s, Utf8Repair repair);

// The code point of the well-formed sequence at s[i] (text already checked or repaired); sets
// *len to its length in bytes.
char32_t DecodeUtf8At(std::string_view s, size_t i, size_t* len);

// Appends the UTF-8 encoding of c (a Unicode scalar value).
void AppendUtf8(char32_t c, std::string* out);

}  // namespace fedlora
