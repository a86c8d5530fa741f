// Text handling under the byte-level BPE tokenizer (model/bpe_tokenizer.h): UTF-8 repair, NFC,
// regular expressions with Hugging Face's (Oniguruma's) semantics on PCRE2, and the
// pre-tokenizer pipeline (Split / Digits / ByteLevel). Internal to fedlora::model.
//
//   std::string repaired;
//   OffsetEdits edits;
//   std::string_view text = RepairUtf8(raw, &repaired, &edits) ? repaired : raw;
//   FEDLORA_ASSIGN_OR_RETURN(auto re, Regex::FromOniguruma(R"(\p{N}{1,3}|\s+)"));
//   PreTokenizer pre;
//   pre.AddSplit(std::move(re), /*remove_matches=*/false);
//   pre.SetByteLevel(/*add_prefix_space=*/false, /*use_regex=*/true);
//   std::vector<Piece> pieces;
//   pre.Run(text, &pieces, &scratch);
//
// Offsets are byte offsets; a Piece is a half-open byte range of the text it was cut from.
// Thread-safety: Regex and PreTokenizer are immutable after construction and their const methods
// are thread-safe (match state is per thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

struct pcre2_real_code_8;

namespace fedlora::bpe {

// Where a rewrite of a text (UTF-8 repair, NFC) changed it: each edit says that bytes
// [old_begin, old_end) of the input became [new_begin, new_end) of the output. Sorted, disjoint;
// text outside every edit was copied unchanged.
struct OffsetEdit {
  uint32_t new_begin, new_end, old_begin, old_end;
};
using OffsetEdits = std::vector<OffsetEdit>;

// Maps an offset of the rewritten text back to the input. An offset strictly inside an edit maps
// to the edit's old_begin (is_end false) or old_end (is_end true).
size_t MapOffsetBack(const OffsetEdits& edits, size_t offset, bool is_end);

// Replaces each maximal ill-formed subsequence of `text` by U+FFFD, the Unicode "best practice"
// that Python's bytes.decode(errors="replace") and Rust's String::from_utf8_lossy follow. Returns
// false, touching nothing, when `text` is valid UTF-8; else writes *out (and *edits when non-null).
bool RepairUtf8(std::string_view text, std::string* out, OffsetEdits* edits);

// Unicode NFC of valid UTF-8 as Hugging Face's NFC normalizer computes it (ICU, restricted to
// Unicode 9.0's characters as HF's tables are: later ones pass through and act as boundaries).
// Returns false, touching nothing, when `text` is already in that form; else writes *out and
// *edits (edits at the granularity of normalization chunks).
bool NfcNormalize(std::string_view text, std::string* out, OffsetEdits* edits);

// A compiled regular expression (PCRE2, UTF + Unicode properties, JIT when available).
class Regex {
 public:
  // Compiles a pattern written for Oniguruma's Ruby syntax (what Hugging Face tokenizers runs),
  // translated where PCRE2 differs: \s becomes Oniguruma's whitespace set (White_Space), \v is
  // the vertical tab, \uHHHH is \x{HHHH}. Constructs whose meaning differs and are not
  // translated (\w, \b, \h, ^, $, {,n}, POSIX brackets, class intersections, inline flags other
  // than i, back references ...) are refused: InvalidArgument naming the construct.
  static absl::StatusOr<std::unique_ptr<Regex>> FromOniguruma(std::string_view pattern);
  // FromOniguruma, compiled once per process per pattern (the first 16 patterns are kept; JIT
  // compiling costs about a millisecond). Shared regexes are immutable and thread-safe.
  static absl::StatusOr<std::shared_ptr<const Regex>> Shared(std::string_view pattern);
  // A pattern matching `literal` exactly.
  static absl::StatusOr<std::unique_ptr<Regex>> Literal(std::string_view literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  enum class Result { kMatch, kNoMatch, kError };
  // Searches valid UTF-8 `subject` from byte `start` (a code point boundary). kError means
  // PCRE2 gave up (a resource limit); the caller decides what to do with the rest.
  Result Find(std::string_view subject, size_t start, size_t* begin, size_t* end) const;
  const std::string& pattern() const { return pattern_; }  // as given

 private:
  Regex() = default;
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string pcre2_pattern,
                                                        std::string original);
  pcre2_real_code_8* code_ = nullptr;
  std::string pattern_;
};

// One pre-token: bytes [begin, end) of the segment, preceded by a space that ByteLevel's
// add_prefix_space inserted when space_prefix is set (that space is in no input byte).
struct Piece {
  uint32_t begin, end;
  bool space_prefix;
};

// Hugging Face's pre-tokenizers as this tokenizer supports them: any number of Split steps
// (a regex whose matches become pieces of their own, the text between them too, or are removed)
// and Digits (Split on \p{N} or \p{N}+), then exactly one ByteLevel, last. Empty pieces are dropped.
class PreTokenizer {
 public:
  void AddSplit(std::shared_ptr<const Regex> regex, bool remove_matches);
  // use_regex: split with GPT-2's pattern (the one ByteLevel carries).
  absl::Status SetByteLevel(bool add_prefix_space, bool use_regex);
  bool has_byte_level() const { return has_byte_level_; }

  // Appends the pieces of `text` (valid UTF-8) to *out, which it clears first. `scratch` holds
  // buffers reused across calls. Where a regex gives up (kError), the rest of that piece stays
  // whole: a documented divergence that needs pathological input.
  struct Scratch {
    std::vector<Piece> a, b;
    std::string buf;
  };
  void Run(std::string_view text, std::vector<Piece>* out, Scratch* scratch) const;

 private:
  struct Step {
    std::shared_ptr<const Regex> regex;
    bool remove_matches = false;
  };
  // Splits each piece of `in` with `re` into `out`.
  static void SplitPieces(std::string_view text, const Regex& re, bool remove_matches,
                          const std::vector<Piece>& in, std::vector<Piece>* out);
  std::vector<Step> steps_;
  bool has_byte_level_ = false;
  bool add_prefix_space_ = false;
  std::shared_ptr<const Regex> byte_level_regex_;  // null when use_regex is false
};

// GPT-2's reversible byte -> code point map: printable Latin-1 bytes map to themselves, the other
// 68 bytes to U+0100.. in order (space -> U+0120 'Ġ', newline -> U+010A 'Ċ').
char32_t ByteToCodePoint(uint8_t byte);
// The inverse, or -1 for a code point no byte maps to.
int ByteFromCodePoint(char32_t c);
// UTF-8 of ByteToCodePoint(b) for every byte of `bytes`, appended to *out.
void AppendByteLevel(std::string_view bytes, std::string* out);

// The patterns of the supported families, in Oniguruma syntax as Hugging Face writes them.
extern const char kGpt2Pattern[];    // GPT-2 (also ByteLevel's own regex)
extern const char kLlama3Pattern[];  // LLaMA-3
extern const char kQwen2Pattern[];   // Qwen2 (LLaMA-3's with single digits)
// One numeric character as HF's Digits pre-tokenizer sees it (Rust's char::is_numeric): \p{N}
// plus the digits Unicode 15 added, which PCRE2 10.42 (Unicode 14) does not know yet.
extern const char kDigitPattern[];

}  // namespace fedlora::bpe
