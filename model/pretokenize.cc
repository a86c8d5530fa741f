// Over 600 lines, not split yet: its three parts (UTF-8 repair and NFC, the Oniguruma-to-PCRE2
// regex translation, the pre-tokenizer pipeline) share the offset edits and the thread-local match
// state; the regex part (about 250 lines) would move to its own file first.
#include "model/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/unorm2.h>
#include <unicode/uset.h>
#include <unicode/ustring.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/strings.h"
#include "core/utf8.h"

namespace fedlora::bpe {

const char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char kDigitPattern[] = R"([\p{N}\x{11F50}-\x{11F59}\x{1D2C0}-\x{1D2D3}\x{1E4F0}-\x{1E4F9}])";

// ---- offsets ----------------------------------------------------------------------------------

size_t MapOffsetBack(const OffsetEdits& edits, size_t offset, bool is_end) {
  // Last edit starting at or before `offset`.
  auto it = std::upper_bound(edits.begin(), edits.end(), offset,
                             [](size_t v, const OffsetEdit& e) { return v < e.new_begin; });
  if (it == edits.begin()) return offset;
  --it;
  if (offset == it->new_begin) return it->old_begin;
  if (offset < it->new_end) return is_end ? it->old_end : it->old_begin;
  return offset - it->new_end + it->old_end;
}

// ---- UTF-8 ------------------------------------------------------------------------------------

namespace {

constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";

}  // namespace

bool RepairUtf8(std::string_view text, std::string* out, OffsetEdits* edits) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  // Fast scan to the first ill-formed byte.
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const int len = Utf8SequenceLength(p + i, n - i);
    if (len < 0) break;
    i += static_cast<size_t>(len);
  }
  if (i == n) return false;
  out->assign(text.data(), i);
  if (edits != nullptr) edits->clear();
  while (i < n) {
    const int len = Utf8SequenceLength(p + i, n - i);
    if (len > 0) {
      out->append(text.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
      continue;
    }
    const size_t bad = static_cast<size_t>(-len);
    if (edits != nullptr) {
      const auto nb = static_cast<uint32_t>(out->size());
      edits->push_back({nb, nb + 3, static_cast<uint32_t>(i), static_cast<uint32_t>(i + bad)});
    }
    out->append(kReplacementUtf8, 3);
    i += bad;
  }
  return true;
}

// ---- NFC --------------------------------------------------------------------------------------

namespace {

// NFC as Hugging Face computes it: its normalization tables are Unicode 9.0's, so characters
// assigned later are left alone and break normalization around them, which ICU's filtered
// normalizer over [:age=9.0:] reproduces (checked code point by code point against HF).
const UNormalizer2* Nfc() {
  static const UNormalizer2* nfc = []() -> const UNormalizer2* {
    UErrorCode err = U_ZERO_ERROR;
    const UNormalizer2* base = unorm2_getNFCInstance(&err);
    if (U_FAILURE(err)) return nullptr;
    USet* unicode9 = uset_openPattern(u"[:age=9.0:]", -1, &err);
    if (U_FAILURE(err)) return nullptr;
    uset_freeze(unicode9);
    UNormalizer2* filtered =
        unorm2_openFiltered(base, unicode9, &err);  // both kept for the process
    return U_SUCCESS(err) ? filtered : nullptr;
  }();
  return nfc;
}

// NFC of one span of valid UTF-8 into *out (replacing it). False on an ICU failure.
bool NfcSpan(const UNormalizer2* nfc, std::string_view in, std::string* out, std::u16string* a,
             std::u16string* b) {
  UErrorCode err = U_ZERO_ERROR;
  int32_t len16 = 0;
  a->resize(in.size() + 1);
  u_strFromUTF8(a->data(), static_cast<int32_t>(a->size()), &len16, in.data(),
                static_cast<int32_t>(in.size()), &err);
  if (U_FAILURE(err)) return false;
  if (unorm2_quickCheck(nfc, a->data(), len16, &err) == UNORM_YES && U_SUCCESS(err)) {
    out->assign(in);
    return true;
  }
  // NFC may grow a string (up to 3x in code points); retry once with the size ICU asks for.
  b->resize(static_cast<size_t>(len16) + 16);
  err = U_ZERO_ERROR;
  int32_t n16 =
      unorm2_normalize(nfc, a->data(), len16, b->data(), static_cast<int32_t>(b->size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    b->resize(static_cast<size_t>(n16) + 1);
    err = U_ZERO_ERROR;
    n16 = unorm2_normalize(nfc, a->data(), len16, b->data(), static_cast<int32_t>(b->size()), &err);
  }
  if (U_FAILURE(err)) return false;
  int32_t len8 = 0;
  out->resize(static_cast<size_t>(n16) * 3 + 1);
  err = U_ZERO_ERROR;
  u_strToUTF8(out->data(), static_cast<int32_t>(out->size()), &len8, b->data(), n16, &err);
  if (U_FAILURE(err)) return false;
  out->resize(static_cast<size_t>(len8));
  return true;
}

}  // namespace

bool NfcNormalize(std::string_view text, std::string* out, OffsetEdits* edits) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // Code points below U+0300 (lead bytes below 0xCC) are in NFC and never combine with what
  // precedes them; text made of them only is already normalized.
  size_t first = 0;
  while (first < n && p[first] < 0xCC) ++first;
  if (first == n) return false;
  const UNormalizer2* nfc = Nfc();
  if (nfc == nullptr) return false;

  bool changed = false;
  size_t copied = 0;    // text[0, copied) is accounted for in *out (once changed)
  size_t prev_end = 0;  // end of the previous unit
  std::string unit_out, chunk_out;
  std::u16string a, b;
  // A unit: the code point below U+0300 just before a run of higher ones (a base letter), and
  // that run; units are independent for NFC, as code points below U+0300 are boundaries.
  size_t i = first;
  while (i < n) {
    size_t begin = i;
    if (begin > prev_end) {
      size_t q = begin - 1;
      while (q > prev_end && IsUtf8Continuation(p[q])) --q;
      begin = q;
    }
    size_t end = i;
    while (end < n && !(p[end] < 0xCC && !IsUtf8Continuation(p[end]))) ++end;
    const std::string_view unit = text.substr(begin, end - begin);
    if (NfcSpan(nfc, unit, &unit_out, &a, &b) && unit_out != unit) {
      if (!changed) {
        out->clear();
        if (edits != nullptr) edits->clear();
        changed = true;
      }
      out->append(text.data() + copied, begin - copied);
      // Localize the edits: cut the unit where ICU says normalization cannot interact.
      size_t c0 = 0;
      while (c0 < unit.size()) {
        size_t c1 = c0;
        UChar32 cp;
        U8_NEXT(unit.data(), c1, static_cast<int32_t>(unit.size()), cp);
        size_t next = c1;
        while (next < unit.size()) {
          size_t probe = next;
          U8_NEXT(unit.data(), probe, static_cast<int32_t>(unit.size()), cp);
          if (unorm2_hasBoundaryBefore(nfc, cp)) break;
          next = probe;
        }
        const std::string_view chunk = unit.substr(c0, next - c0);
        if (!NfcSpan(nfc, chunk, &chunk_out, &a, &b)) chunk_out.assign(chunk);
        if (chunk_out != chunk && edits != nullptr) {
          const auto nb = static_cast<uint32_t>(out->size());
          edits->push_back({nb, nb + static_cast<uint32_t>(chunk_out.size()),
                            static_cast<uint32_t>(begin + c0),
                            static_cast<uint32_t>(begin + next)});
        }
        out->append(chunk_out);
        c0 = next;
      }
      copied = end;
    }
    prev_end = end;
    // Next code point of U+0300 or above.
    i = end;
    while (i < n && p[i] < 0xCC) ++i;
  }
  if (!changed) return false;
  out->append(text.data() + copied, n - copied);
  return true;
}

// ---- regular expressions ----------------------------------------------------------------------

namespace {

// Oniguruma's \s in Unicode mode: the White_Space property.
constexpr char kWhitespaceItems[] =
    R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool IsAlnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

absl::Status Unsupported(std::string_view pattern, size_t at, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("regex \"", ToAbsl(pattern), "\": ", ToAbsl(what), " at offset ", at,
                   " is not supported (its Oniguruma and PCRE2 meanings differ)"));
}

absl::StatusOr<std::string> TranslateOniguruma(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t i = 0;
  const size_t n = p.size();
  while (i < n) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= n)
        return absl::InvalidArgumentError(
            absl::StrCat("regex \"", ToAbsl(p), "\": trailing backslash"));
      const char e = p[i + 1];
      switch (e) {
        case 's':
          if (in_class && i + 2 < n && p[i + 2] == '-')
            return Unsupported(p, i, "\\s before '-' in a class");
          absl::StrAppend(&out, in_class ? "" : "[", kWhitespaceItems, in_class ? "" : "]");
          i += 2;
          continue;
        case 'S':
          if (in_class) return Unsupported(p, i, "\\S inside a class");
          absl::StrAppend(&out, "[^", kWhitespaceItems, "]");
          i += 2;
          continue;
        case 'p':
        case 'P': {
          if (i + 2 >= n || p[i + 2] != '{') return Unsupported(p, i, "\\p without braces");
          const size_t close = p.find('}', i + 3);
          if (close == std::string_view::npos) return Unsupported(p, i, "unterminated \\p{");
          for (size_t k = i + 3; k < close; ++k) {
            if (!IsAlnum(p[k]) && p[k] != '_' && p[k] != '^')
              return Unsupported(p, i, "this \\p{} name");
          }
          out.append(p.substr(i, close + 1 - i));
          i = close + 1;
          continue;
        }
        case 'r':
        case 'n':
        case 't':
        case 'f':
        case 'd':
        case 'D':
        case 'x':  // \xHH and \x{H...} read the same in both
          out.push_back('\\');
          out.push_back(e);
          i += 2;
          continue;
        case 'v':
          out.append("\\x0B");
          i += 2;
          continue;
        case 'a':
          out.append("\\x07");
          i += 2;
          continue;
        case 'e':
          out.append("\\x1B");
          i += 2;
          continue;
        case 'u':
          if (i + 6 > n || !IsHex(p[i + 2]) || !IsHex(p[i + 3]) || !IsHex(p[i + 4]) ||
              !IsHex(p[i + 5])) {
            return Unsupported(p, i, "\\u without 4 hex digits");
          }
          absl::StrAppend(&out, "\\x{", ToAbsl(p.substr(i + 2, 4)), "}");
          i += 6;
          continue;
        default:
          if (IsAlnum(e))
            return Unsupported(p, i, absl::StrCat("the escape \\", std::string(1, e)));
          if (static_cast<unsigned char>(e) >= 0x80)
            return Unsupported(p, i, "a backslash before a non-ASCII byte");
          out.push_back('\\');
          out.push_back(e);
          i += 2;
          continue;
      }
    }
    if (in_class) {
      if (c == '[')
        return Unsupported(p, i,
                           i + 1 < n && p[i + 1] == ':' ? "a POSIX bracket" : "a nested class");
      if (c == '&' && i + 1 < n && p[i + 1] == '&')
        return Unsupported(p, i, "class intersection &&");
      if (c == ']') in_class = false;
      out.push_back(c);
      ++i;
      continue;
    }
    switch (c) {
      case '[':
        in_class = true;
        out.push_back('[');
        ++i;
        if (i < n && p[i] == '^') {
          out.push_back('^');
          ++i;
        }
        if (i < n && p[i] == ']') return Unsupported(p, i, "']' first in a class");
        continue;
      case '^':
      case '$':
        return Unsupported(p, i, std::string("the anchor ") + c);
      case '{':
        if (i + 1 < n && p[i + 1] == ',') return Unsupported(p, i, "the quantifier {,n}");
        break;
      case '(':
        if (i + 1 < n && p[i + 1] == '?') {
          static constexpr std::string_view kAllowed[] = {"(?:", "(?=",  "(?!",  "(?<=",  "(?<!",
                                                          "(?>", "(?i:", "(?i)", "(?-i:", "(?-i)"};
          bool ok = false;
          for (std::string_view a : kAllowed) {
            if (p.substr(i, a.size()) == a) {
              out.append(a);
              i += a.size();
              ok = true;
              break;
            }
          }
          if (!ok) return Unsupported(p, i, "this group construct");
          continue;
        }
        break;
      default:
        break;
    }
    out.push_back(c);
    ++i;
  }
  if (in_class)
    return absl::InvalidArgumentError(
        absl::StrCat("regex \"", ToAbsl(p), "\": unterminated class"));
  return out;
}

// Per-thread match state: match data, a JIT stack and the match context that carries it.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* context = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (context != nullptr && jit_stack != nullptr)
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

MatchState& ThreadMatchState() {
  thread_local MatchState state;
  return state;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string pcre2_pattern,
                                                      std::string original) {
  pcre2_compile_context* cctx = pcre2_compile_context_create(nullptr);
  if (cctx == nullptr) return absl::ResourceExhaustedError("regex: out of memory");
  pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre2_pattern.data()), pcre2_pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C, &error, &error_offset, cctx);
  pcre2_compile_context_free(cctx);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrCat("regex \"", original, "\": ", reinterpret_cast<const char*>(message),
                     " (offset ", error_offset, " of the translated pattern)"));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // when the JIT is unavailable, the interpreter runs
  auto re = std::unique_ptr<Regex>(new Regex());
  re->code_ = code;
  re->pattern_ = std::move(original);
  return re;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::FromOniguruma(std::string_view pattern) {
  auto translated = TranslateOniguruma(pattern);
  if (!translated.ok()) return translated.status();
  return Compile(*std::move(translated), std::string(pattern));
}

absl::StatusOr<std::shared_ptr<const Regex>> Regex::Shared(std::string_view pattern) {
  static std::mutex mu;
  static auto* cache = new std::vector<std::shared_ptr<const Regex>>();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& re : *cache) {
      if (re->pattern() == pattern) return re;
    }
  }
  auto compiled = FromOniguruma(pattern);
  if (!compiled.ok()) return compiled.status();
  std::shared_ptr<const Regex> re = *std::move(compiled);
  std::lock_guard<std::mutex> lock(mu);
  if (cache->size() < 16) cache->push_back(re);
  return re;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(std::string_view literal) {
  if (literal.empty()) return absl::InvalidArgumentError("regex: empty literal pattern");
  std::string out;
  for (char c : literal) {
    if (IsAlnum(c) || static_cast<unsigned char>(c) >= 0x80) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "\\x{", absl::Hex(static_cast<unsigned char>(c)), "}");
    }
  }
  return Compile(std::move(out), std::string(literal));
}

Regex::~Regex() { pcre2_code_free(code_); }

Regex::Result Regex::Find(std::string_view subject, size_t start, size_t* begin,
                          size_t* end) const {
  MatchState& state = ThreadMatchState();
  if (state.data == nullptr) return Result::kError;
  const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                             start, PCRE2_NO_UTF_CHECK, state.data, state.context);
  if (rc == PCRE2_ERROR_NOMATCH) return Result::kNoMatch;
  if (rc < 0) return Result::kError;
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
  *begin = ov[0];
  *end = ov[1];
  if (*end < *begin || *end > subject.size()) return Result::kError;
  return Result::kMatch;
}

// ---- pre-tokenizer ----------------------------------------------------------------------------

void PreTokenizer::AddSplit(std::shared_ptr<const Regex> regex, bool remove_matches) {
  steps_.push_back(Step{std::move(regex), remove_matches});
}

absl::Status PreTokenizer::SetByteLevel(bool add_prefix_space, bool use_regex) {
  has_byte_level_ = true;
  add_prefix_space_ = add_prefix_space;
  byte_level_regex_.reset();
  if (use_regex) {
    auto re = Regex::Shared(kGpt2Pattern);
    if (!re.ok()) return re.status();
    byte_level_regex_ = *std::move(re);
  }
  return absl::OkStatus();
}

namespace {

// Splits `s` with `re` the way Hugging Face's Split (Oniguruma's find_iter, behavior Isolated or
// Removed) does, calling emit(begin, end) for each non-empty piece in order.
template <typename Emit>
void SplitOne(std::string_view s, const Regex& re, bool remove_matches, Emit emit) {
  const size_t len = s.size();
  size_t pos = 0, prev = 0, last_match_end = std::string_view::npos;
  while (pos <= len) {
    size_t b = 0, e = 0;
    if (re.Find(s, pos, &b, &e) != Regex::Result::kMatch) break;  // kError: the rest stays whole
    if (b == e && last_match_end == e) {  // no empty match right after a match
      // One code point on (the text is repaired, so the sequence at e is well formed).
      pos = e + (e < len ? static_cast<size_t>(std::abs(Utf8SequenceLength(
                               reinterpret_cast<const unsigned char*>(s.data()) + e, len - e)))
                         : 1);
      continue;
    }
    pos = last_match_end = e;
    if (prev < b) emit(prev, b);
    if (!remove_matches && b < e) emit(b, e);
    prev = e;
  }
  if (prev < len) emit(prev, len);
}

}  // namespace

void PreTokenizer::SplitPieces(std::string_view text, const Regex& re, bool remove_matches,
                               const std::vector<Piece>& in, std::vector<Piece>* out) {
  for (const Piece& piece : in) {
    SplitOne(text.substr(piece.begin, piece.end - piece.begin), re, remove_matches,
             [&](size_t b, size_t e) {
               out->push_back({piece.begin + static_cast<uint32_t>(b),
                               piece.begin + static_cast<uint32_t>(e), false});
             });
  }
}

void PreTokenizer::Run(std::string_view text, std::vector<Piece>* out, Scratch* scratch) const {
  out->clear();
  if (text.empty()) return;
  std::vector<Piece>* cur = &scratch->a;
  std::vector<Piece>* next = &scratch->b;
  cur->clear();
  cur->push_back({0, static_cast<uint32_t>(text.size()), false});
  for (const Step& step : steps_) {
    next->clear();
    SplitPieces(text, *step.regex, step.remove_matches, *cur, next);
    std::swap(cur, next);
  }
  for (const Piece& piece : *cur) {
    const bool prefix = add_prefix_space_ && text[piece.begin] != ' ';
    if (byte_level_regex_ == nullptr) {
      out->push_back({piece.begin, piece.end, prefix});
      continue;
    }
    const std::string_view s = text.substr(piece.begin, piece.end - piece.begin);
    if (!prefix) {
      SplitOne(s, *byte_level_regex_, false, [&](size_t b, size_t e) {
        out->push_back({piece.begin + static_cast<uint32_t>(b),
                        piece.begin + static_cast<uint32_t>(e), false});
      });
      continue;
    }
    // Split " " + piece; the inserted space is offset 0 of the buffer.
    std::string& buf = scratch->buf;
    buf.assign(1, ' ');
    buf.append(s);
    SplitOne(buf, *byte_level_regex_, false, [&](size_t b, size_t e) {
      const uint32_t begin = piece.begin + static_cast<uint32_t>(b == 0 ? 0 : b - 1);
      out->push_back({begin, piece.begin + static_cast<uint32_t>(e - 1), b == 0});
    });
  }
}

// ---- byte level -------------------------------------------------------------------------------

namespace {

struct ByteTables {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code points 0..323 cover every image
  std::array<std::array<char, 2>, 256> utf8{};
  std::array<uint8_t, 256> utf8_len{};
  ByteTables() {
    from_cp.fill(-1);
    char32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<char32_t>(b) : extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
      const char32_t c = to_cp[b];
      if (c < 0x80) {
        utf8[b] = {static_cast<char>(c), 0};
        utf8_len[b] = 1;
      } else {
        utf8[b] = {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
        utf8_len[b] = 2;
      }
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables* t = new ByteTables();
  return *t;
}

}  // namespace

char32_t ByteToCodePoint(uint8_t byte) { return Tables().to_cp[byte]; }

int ByteFromCodePoint(char32_t c) { return c < 324 ? Tables().from_cp[c] : -1; }

void AppendByteLevel(std::string_view bytes, std::string* out) {
  const ByteTables& t = Tables();
  for (char ch : bytes) {
    const auto b = static_cast<uint8_t>(ch);
    out->append(t.utf8[b].data(), t.utf8_len[b]);
  }
}

}  // namespace fedlora::bpe
