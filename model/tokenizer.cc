#include "model/tokenizer.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/json.h"
#include "core/status.h"
#include "core/utf8.h"

namespace fedlora {
namespace {

// ---- Unicode tables ---------------------------------------------------------------------------

struct CodePointRange {
  char32_t first, last;  // inclusive
};
struct StrippedDecomposition {
  char32_t code_point;
  char32_t out[3];  // unused slots are 0
};
struct LowercaseRun {
  char32_t first, last;
  int32_t delta;   // lower(c) = c + delta
  int32_t stride;  // 1: every code point of the run; 2: every other one (Ā ā Ă ă ...)
};

#include "model/tokenizer_unicode_tables.inc"

template <size_t N>
bool InRanges(const CodePointRange (&ranges)[N], char32_t c) {
  const CodePointRange* end = ranges + N;
  // First range whose last >= c; c is in it when first <= c.
  const CodePointRange* it = std::lower_bound(
      ranges, end, c, [](const CodePointRange& r, char32_t v) { return r.last < v; });
  return it != end && it->first <= c;
}

// Rust's char::is_whitespace (the White_Space property), which Hugging Face uses both to map
// whitespace to spaces and to split words.
bool IsWhitespace(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return true;
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The CJK ideograph blocks BERT splits around (its _is_chinese_char): Unified Ideographs and
// extensions A-E, and the compatibility ideographs. Hangul, kana and CJK punctuation are not here.
bool IsCjkIdeograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool IsPunctuation(char32_t c) { return InRanges(kPunctuationRanges, c); }

// Appends NFD(c) without nonspacing marks.
void AppendStripped(char32_t c, std::u32string* out) {
  if (c < 0xC0) {  // nothing below U+00C0 decomposes or is a mark
    out->push_back(c);
    return;
  }
  // Hangul syllables decompose arithmetically into 2 or 3 conjoining jamo (Unicode 3.12).
  constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
  constexpr char32_t kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                     kSCount = 19 * kNCount;
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const auto* begin = std::begin(kStrippedDecompositions);
  const auto* end = std::end(kStrippedDecompositions);
  const auto* it = std::lower_bound(
      begin, end, c, [](const StrippedDecomposition& d, char32_t v) { return d.code_point < v; });
  if (it != end && it->code_point == c) {
    for (char32_t o : it->out) {
      if (o != 0) out->push_back(o);
    }
    return;
  }
  if (InRanges(kNonspacingMarkRanges, c)) return;
  out->push_back(c);
}

// Appends the full lowercase mapping of c (one code point, except U+0130).
void AppendLower(char32_t c, std::u32string* out) {
  if (c < 0x80) {
    out->push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE -> i + COMBINING DOT ABOVE
    out->push_back('i');
    out->push_back(0x307);
    return;
  }
  const auto* begin = std::begin(kLowercaseRuns);
  const auto* end = std::end(kLowercaseRuns);
  // Last run with first <= c.
  const auto* it = std::upper_bound(begin, end, c,
                                    [](char32_t v, const LowercaseRun& r) { return v < r.first; });
  if (it != begin) {
    --it;
    if (c <= it->last && (c - it->first) % static_cast<char32_t>(it->stride) == 0) {
      out->push_back(static_cast<char32_t>(static_cast<int64_t>(c) + it->delta));
      return;
    }
  }
  out->push_back(c);
}

// Largest id we accept: a vocabulary of 16M tokens is far beyond any BERT-family model (30-250k),
// and the bound keeps a hostile file from making us allocate an id table of gigabytes.
constexpr int64_t kMaxVocabId = (int64_t{1} << 24) - 1;
// Ids may leave gaps (HF's added tokens can), but no more than this many unused ids in all: the
// id table is dense, and a small file must not make it large.
constexpr int64_t kMaxVocabIdGaps = 65536;

// HF's longest_first truncation of a pair to `budget` tokens in all (the special tokens excluded).
void TruncatePair(size_t budget, std::vector<int32_t>* a, std::vector<int32_t>* b) {
  size_t n1 = a->size(), n2 = b->size();
  if (n1 + n2 <= budget) return;
  const bool swap = n1 > n2;  // make n1 the shorter one
  if (swap) std::swap(n1, n2);
  n2 = n1 > budget ? n1 : std::max(n1, budget - n1);
  if (n1 + n2 > budget) {  // the shorter one does not fit in half: both get half
    n1 = budget / 2;
    n2 = n1 + budget % 2;
  }
  if (swap) std::swap(n1, n2);
  if (a->size() > n1) a->resize(n1);
  if (b->size() > n2) b->resize(n2);
}

}  // namespace

// ---- construction -----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> WordPieceTokenizer::Create(
    std::unordered_map<std::string, int32_t> vocab, std::vector<std::string> special_tokens,
    Options options) {
  if (vocab.empty()) return absl::InvalidArgumentError("tokenizer: the vocabulary is empty");
  if (options.max_input_chars_per_word <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: max_input_chars_per_word must be positive, got ",
                     options.max_input_chars_per_word));
  }
  auto tok = std::unique_ptr<WordPieceTokenizer>(new WordPieceTokenizer());
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id > kMaxVocabId) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: token '", token, "' has id ", id,
                                                     ", outside [0, ", kMaxVocabId, "]"));
    }
    max_id = std::max<int64_t>(max_id, id);
    tok->max_token_bytes_ = std::max(tok->max_token_bytes_, token.size());
  }
  const int64_t entries = static_cast<int64_t>(vocab.size());
  if (max_id + 1 - entries > kMaxVocabIdGaps) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: the largest id is ", max_id, " for ",
                                                   entries, " tokens; ids may leave at most ",
                                                   kMaxVocabIdGaps, " unused below the largest"));
  }
  tok->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : vocab) {
    std::string& slot = tok->id_to_token_[static_cast<size_t>(id)];
    if (!slot.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: tokens '", slot, "' and '", token, "' share id ", id));
    }
    slot = token;
  }
  auto require = [&](const std::string& token, int32_t* id) -> absl::Status {
    auto it = vocab.find(token);
    if (it == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: the vocabulary has no ", token, " token"));
    }
    *id = it->second;
    return absl::OkStatus();
  };
  FEDLORA_RETURN_IF_ERROR(require("[CLS]", &tok->cls_id_));
  FEDLORA_RETURN_IF_ERROR(require("[SEP]", &tok->sep_id_));
  FEDLORA_RETURN_IF_ERROR(require("[PAD]", &tok->pad_id_));
  FEDLORA_RETURN_IF_ERROR(require(options.unk_token, &tok->unk_id_));
  for (const std::string& special : special_tokens) {
    if (special.empty()) return absl::InvalidArgumentError("tokenizer: empty special token");
    if (!vocab.contains(special)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: special token ", special, " is not in the vocabulary"));
    }
  }
  // Longest first, so that the first match at a position is the longest (leftmost-longest).
  std::stable_sort(special_tokens.begin(), special_tokens.end(),
                   [](const std::string& x, const std::string& y) { return x.size() > y.size(); });
  special_tokens.erase(std::unique(special_tokens.begin(), special_tokens.end()),
                       special_tokens.end());
  for (const std::string& special : special_tokens) {
    tok->special_first_bytes_.set(static_cast<unsigned char>(special[0]));
  }
  tok->special_tokens_ = std::move(special_tokens);
  tok->vocab_ = std::move(vocab);
  tok->options_ = std::move(options);
  return tok;
}

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> WordPieceTokenizer::FromVocabFile(
    const std::string& vocab_txt, bool do_lower_case) {
  FEDLORA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(vocab_txt));
  std::unordered_map<std::string, int32_t> vocab;
  int64_t line = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view token(text.data() + pos, eol - pos);
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t' ||
                              token.back() == '\v' || token.back() == '\f')) {
      token.remove_suffix(1);
    }
    if (line > kMaxVocabId) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_txt, ": more than ", kMaxVocabId + 1, " lines"));
    }
    vocab[std::string(token)] = static_cast<int32_t>(line);  // a repeated token keeps its last line
    ++line;
    pos = eol + 1;
  }
  if (vocab.empty())
    return absl::InvalidArgumentError(absl::StrCat(vocab_txt, ": the vocabulary is empty"));
  std::vector<std::string> specials;
  for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    if (vocab.contains(s)) specials.emplace_back(s);
  }
  Options options;
  options.lowercase = do_lower_case;
  options.strip_accents = do_lower_case;
  auto tok = Create(std::move(vocab), std::move(specials), std::move(options));
  if (!tok.ok()) return Annotate(tok.status(), vocab_txt);
  return tok;
}

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> WordPieceTokenizer::FromTokenizerJson(
    const std::string& path) {
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json root, ReadJsonFile(path));
  if (!root.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  auto model_it = root.find("model");
  if (model_it == root.end() || !model_it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no \"model\" object"));
  }
  const nlohmann::json& model = *model_it;
  const std::string ctx = path + " model";
  FEDLORA_ASSIGN_OR_RETURN(std::string type, GetStringOr(model, "type", "WordPiece", ctx));
  if (type != "WordPiece") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": model type is ", type, ", not WordPiece"));
  }
  Options options;
  FEDLORA_ASSIGN_OR_RETURN(options.unk_token, GetStringOr(model, "unk_token", "[UNK]", ctx));
  FEDLORA_ASSIGN_OR_RETURN(options.continuing_subword_prefix,
                           GetStringOr(model, "continuing_subword_prefix", "##", ctx));
  FEDLORA_ASSIGN_OR_RETURN(int64_t max_chars,
                           GetIntOr(model, "max_input_chars_per_word", 100, ctx));
  if (max_chars <= 0 || max_chars > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": max_input_chars_per_word ", max_chars, " out of range"));
  }
  options.max_input_chars_per_word = static_cast<int>(max_chars);

  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": model.vocab is missing or not an object"));
  }
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(vocab_it->size());
  for (const auto& [token, id] : vocab_it->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxVocabId) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": model.vocab[\"", token,
                                                     "\"] is not an id in [0, ", kMaxVocabId, "]"));
    }
    vocab[token] = static_cast<int32_t>(id.get<int64_t>());
  }

  // normalizer: null means no normalization at all.
  options.lowercase = options.strip_accents = options.clean_text = options.handle_chinese_chars =
      false;
  auto norm_it = root.find("normalizer");
  if (norm_it != root.end() && !norm_it->is_null()) {
    const std::string nctx = path + " normalizer";
    FEDLORA_ASSIGN_OR_RETURN(std::string ntype, GetString(*norm_it, "type", nctx));
    if (ntype != "BertNormalizer") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": normalizer type ", ntype,
                                                     " is not supported (only BertNormalizer)"));
    }
    FEDLORA_ASSIGN_OR_RETURN(options.lowercase, GetBoolOr(*norm_it, "lowercase", true, nctx));
    FEDLORA_ASSIGN_OR_RETURN(options.clean_text, GetBoolOr(*norm_it, "clean_text", true, nctx));
    FEDLORA_ASSIGN_OR_RETURN(options.handle_chinese_chars,
                             GetBoolOr(*norm_it, "handle_chinese_chars", true, nctx));
    // strip_accents: null (the usual value) follows lowercase.
    FEDLORA_ASSIGN_OR_RETURN(options.strip_accents,
                             GetBoolOr(*norm_it, "strip_accents", options.lowercase, nctx));
  }
  auto pre_it = root.find("pre_tokenizer");
  if (pre_it != root.end() && !pre_it->is_null()) {
    FEDLORA_ASSIGN_OR_RETURN(std::string ptype,
                             GetString(*pre_it, "type", path + " pre_tokenizer"));
    if (ptype != "BertPreTokenizer") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": pre_tokenizer type ", ptype,
                                                     " is not supported (only BertPreTokenizer)"));
    }
  }

  // Added tokens are matched literally in the raw text. Hugging Face matches those marked
  // "normalized" after normalization instead; BERT's are all unnormalized, so we do not.
  std::vector<std::string> specials;
  auto added_it = root.find("added_tokens");
  if (added_it != root.end() && !added_it->is_null()) {
    if (!added_it->is_array())
      return absl::InvalidArgumentError(absl::StrCat(path, ": added_tokens is not an array"));
    for (size_t i = 0; i < added_it->size(); ++i) {
      const std::string actx = absl::StrCat(path, " added_tokens[", i, "]");
      FEDLORA_ASSIGN_OR_RETURN(std::string content, GetString((*added_it)[i], "content", actx));
      FEDLORA_ASSIGN_OR_RETURN(int64_t id, GetInt((*added_it)[i], "id", actx));
      if (id < 0 || id > kMaxVocabId)
        return absl::InvalidArgumentError(absl::StrCat(actx, ": id ", id, " out of range"));
      auto [it, inserted] = vocab.emplace(content, static_cast<int32_t>(id));
      if (!inserted && it->second != id) {
        return absl::InvalidArgumentError(absl::StrCat(actx, ": ", content, " has id ", id,
                                                       " but the vocabulary says ", it->second));
      }
      if (!content.empty()) specials.push_back(std::move(content));
    }
  }
  auto tok = Create(std::move(vocab), std::move(specials), std::move(options));
  if (!tok.ok()) return Annotate(tok.status(), path);
  return tok;
}

// ---- tokenization -----------------------------------------------------------------------------

int32_t WordPieceTokenizer::TokenToId(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? unk_id_ : it->second;
}

const std::string& WordPieceTokenizer::IdToToken(int32_t id) const {
  static const std::string* const kEmpty = new std::string();
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return *kEmpty;
  return id_to_token_[static_cast<size_t>(id)];
}

void WordPieceTokenizer::WordPiece(std::string_view word, std::vector<int32_t>* ids,
                                   std::vector<std::string>* tokens) const {
  // Byte offset of every code point boundary; the word is valid UTF-8 (we encoded it).
  std::vector<size_t> bounds;
  bounds.reserve(word.size() + 1);
  for (size_t i = 0; i < word.size(); ++i) {
    if (!IsUtf8Continuation(static_cast<unsigned char>(word[i]))) bounds.push_back(i);
  }
  bounds.push_back(word.size());
  const size_t n_chars = bounds.size() - 1;
  auto push_unk = [&] {
    ids->push_back(unk_id_);
    if (tokens) tokens->push_back(options_.unk_token);
  };
  if (n_chars > static_cast<size_t>(options_.max_input_chars_per_word)) return push_unk();

  const size_t first_id = ids->size();
  const size_t first_token = tokens ? tokens->size() : 0;
  std::string key;
  size_t start = 0;
  while (start < n_chars) {
    const std::string_view prefix =
        start > 0 ? std::string_view(options_.continuing_subword_prefix) : std::string_view();
    size_t end = n_chars;
    int32_t found = -1;
    for (; end > start; --end) {
      const size_t bytes = bounds[end] - bounds[start];
      if (prefix.size() + bytes > max_token_bytes_) continue;  // longer than any vocabulary entry
      key.assign(prefix);
      key.append(word.substr(bounds[start], bytes));
      auto it = vocab_.find(key);
      if (it != vocab_.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {  // no piece covers this position: the whole word is unknown
      ids->resize(first_id);
      if (tokens) tokens->resize(first_token);
      return push_unk();
    }
    ids->push_back(found);
    if (tokens) tokens->push_back(key);
    start = end;
  }
}

void WordPieceTokenizer::TokenizeInto(std::string_view text, std::vector<int32_t>* ids,
                                      std::vector<std::string>* tokens,
                                      std::vector<std::string>* words) const {
  // Normalizes one span of raw text (between special tokens), splits it into words and runs
  // WordPiece on each.
  auto process = [&](std::string_view raw) {
    if (raw.empty()) return;
    const std::u32string decoded = DecodeUtf8(raw, Utf8Repair::kEachByte);
    std::u32string text32;
    text32.reserve(decoded.size());
    for (char32_t c : decoded) {
      if (options_.clean_text) {
        if (InRanges(kCleanDropRanges, c)) continue;
        if (IsWhitespace(c)) c = ' ';
      }
      if (options_.handle_chinese_chars && IsCjkIdeograph(c)) {
        text32.push_back(' ');
        text32.push_back(c);
        text32.push_back(' ');
      } else {
        text32.push_back(c);
      }
    }
    if (options_.strip_accents) {
      std::u32string stripped;
      stripped.reserve(text32.size());
      for (char32_t c : text32) AppendStripped(c, &stripped);
      text32.swap(stripped);
    }
    if (options_.lowercase) {
      std::u32string lowered;
      lowered.reserve(text32.size());
      for (char32_t c : text32) AppendLower(c, &lowered);
      text32.swap(lowered);
    }
    // Split at whitespace (dropped) and around punctuation (kept, one character a word).
    std::string word;
    auto flush = [&] {
      if (word.empty()) return;
      if (words) words->push_back(word);
      if (ids) WordPiece(word, ids, tokens);
      word.clear();
    };
    for (char32_t c : text32) {
      if (IsWhitespace(c)) {
        flush();
      } else if (IsPunctuation(c)) {
        flush();
        AppendUtf8(c, &word);
        flush();
      } else {
        AppendUtf8(c, &word);
      }
    }
    flush();
  };

  // Split out special tokens, leftmost-longest.
  size_t segment_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const std::string* match = nullptr;
    if (special_first_bytes_[static_cast<unsigned char>(text[i])]) {
      for (const std::string& special : special_tokens_) {
        if (text.compare(i, special.size(), special) == 0) {
          match = &special;
          break;
        }
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    process(text.substr(segment_start, i - segment_start));
    if (words) words->push_back(*match);
    if (ids) ids->push_back(vocab_.find(*match)->second);
    if (tokens) tokens->push_back(*match);
    i += match->size();
    segment_start = i;
  }
  process(text.substr(segment_start));
}

std::vector<std::string> WordPieceTokenizer::Tokenize(std::string_view text) const {
  std::vector<int32_t> ids;
  std::vector<std::string> tokens;
  TokenizeInto(text, &ids, &tokens, nullptr);
  return tokens;
}

std::vector<int32_t> WordPieceTokenizer::TokenizeToIds(std::string_view text) const {
  std::vector<int32_t> ids;
  TokenizeInto(text, &ids, nullptr, nullptr);
  return ids;
}

std::vector<std::string> WordPieceTokenizer::BasicTokenize(std::string_view text) const {
  std::vector<std::string> words;
  TokenizeInto(text, nullptr, nullptr, &words);
  return words;
}

WordPieceTokenizer::Encoding WordPieceTokenizer::Encode(std::string_view text,
                                                        std::optional<std::string_view> pair,
                                                        int max_length) const {
  std::vector<int32_t> a = TokenizeToIds(text);
  std::vector<int32_t> b;
  if (pair.has_value()) b = TokenizeToIds(*pair);
  if (max_length > 0) {
    const int n_special = pair.has_value() ? 3 : 2;
    const size_t budget = static_cast<size_t>(std::max(0, max_length - n_special));
    if (pair.has_value()) {
      TruncatePair(budget, &a, &b);
    } else if (a.size() > budget) {
      a.resize(budget);
    }
  }
  Encoding e;
  const size_t n = a.size() + b.size() + (pair.has_value() ? 3 : 2);
  e.input_ids.reserve(n);
  e.token_type_ids.reserve(n);
  e.input_ids.push_back(cls_id_);
  e.input_ids.insert(e.input_ids.end(), a.begin(), a.end());
  e.input_ids.push_back(sep_id_);
  e.token_type_ids.assign(e.input_ids.size(), 0);
  if (pair.has_value()) {
    e.input_ids.insert(e.input_ids.end(), b.begin(), b.end());
    e.input_ids.push_back(sep_id_);
    e.token_type_ids.resize(e.input_ids.size(), 1);
  }
  e.attention_mask.assign(e.input_ids.size(), 1);
  return e;
}

int PadBatch(const std::vector<WordPieceTokenizer::Encoding>& batch, int seq_len, int32_t pad_id,
             std::vector<int32_t>* ids, std::vector<int32_t>* type_ids,
             std::vector<int32_t>* mask) {
  if (seq_len <= 0) {
    seq_len = 0;
    for (const auto& e : batch) seq_len = std::max(seq_len, static_cast<int>(e.input_ids.size()));
  }
  const size_t len = static_cast<size_t>(seq_len);
  ids->assign(batch.size() * len, pad_id);
  type_ids->assign(batch.size() * len, 0);
  mask->assign(batch.size() * len, 0);
  for (size_t row = 0; row < batch.size(); ++row) {
    const auto& e = batch[row];
    const size_t n = std::min(len, e.input_ids.size());
    std::copy_n(e.input_ids.begin(), n, ids->begin() + row * len);
    std::copy_n(e.token_type_ids.begin(), std::min(n, e.token_type_ids.size()),
                type_ids->begin() + row * len);
    std::copy_n(e.attention_mask.begin(), std::min(n, e.attention_mask.size()),
                mask->begin() + row * len);
  }
  return seq_len;
}

}  // namespace fedlora
