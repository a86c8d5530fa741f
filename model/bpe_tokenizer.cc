// BpeTokenizer: building it from a vocabulary (Build, Create), encoding and decoding. Over 600
// lines, not split yet: one class; the split would move Build / Create and their checks (about 280
// lines) to bpe_tokenizer_build.cc.
#include "model/bpe_tokenizer.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/utf8.h"

namespace fedlora {
namespace {

// Ids above this are refused: 16M tokens is far beyond any LLM vocabulary (32k-256k), and the
// bound keeps a hostile file from making us allocate an id table of gigabytes.
constexpr int64_t kMaxVocabId = (int64_t{1} << 24) - 1;
// Ids may leave gaps (HF's added tokens can), but no more than this many unused ids in all: the
// id tables are dense, and a small file must not make them large.
constexpr int64_t kMaxVocabIdGaps = 65536;

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// The White_Space property (Rust's char::is_whitespace, and regex \s), which lstrip/rstrip use.
bool IsWhiteSpace(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return true;
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Start of the whitespace run that ends at `end`.
size_t WhitespaceStartBefore(std::string_view s, size_t end) {
  size_t i = end;
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && IsUtf8Continuation(static_cast<unsigned char>(s[j]))) --j;
    size_t len = 0;
    if (!IsWhiteSpace(DecodeUtf8At(s, j, &len))) break;
    i = j;
  }
  return i;
}

// End of the whitespace run that starts at `begin`.
size_t WhitespaceEndAfter(std::string_view s, size_t begin) {
  size_t i = begin;
  while (i < s.size()) {
    size_t len = 0;
    if (!IsWhiteSpace(DecodeUtf8At(s, i, &len))) break;
    i += len;
  }
  return i;
}

// The bytes a token decodes to under the ByteLevel decoder: its characters' bytes when every
// character is one of GPT-2's byte characters, else its own bytes.
std::string ByteLevelDecode(const std::string& token) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const auto b = static_cast<unsigned char>(token[i]);
    int byte = -1;
    if (b < 0x80) {
      byte = bpe::ByteFromCodePoint(b);
      ++i;
    } else if (b >= 0xC2 && b <= 0xC5 && i + 1 < token.size() &&
               IsUtf8Continuation(static_cast<unsigned char>(token[i + 1]))) {  // U+0080..U+017F
      byte = bpe::ByteFromCodePoint(((b & 0x1F) << 6) |
                                    (static_cast<unsigned char>(token[i + 1]) & 0x3F));
      i += 2;
    }
    if (byte < 0) return token;
    out.push_back(static_cast<char>(byte));
  }
  return out;
}

}  // namespace

// ---- BPE cache --------------------------------------------------------------------------------

// The BPE result of pieces up to kMaxKey bytes, keyed by their bytes (one map per value of
// space_prefix), in shards with a lock each. Like HF's cache it stops growing when full.
struct BpeTokenizer::Cache {
  static constexpr size_t kShards = 16, kMaxPerShard = 2048, kMaxKey = 48;
  struct Entry {
    std::vector<int32_t> ids;
    std::vector<uint8_t> begin, end;  // piece-relative, < kMaxKey + 2
  };
  struct Shard {
    std::mutex mu;
    absl::flat_hash_map<std::string, Entry> map[2];
  };
  Shard shards[kShards];
  static size_t ShardOf(std::string_view key) {
    return absl::Hash<absl::string_view>{}(ToAbsl(key)) % kShards;
  }
};

BpeTokenizer::BpeTokenizer() : cache_(std::make_unique<Cache>()) {}
BpeTokenizer::~BpeTokenizer() = default;

// ---- added-token trie -------------------------------------------------------------------------

void BpeTokenizer::Trie::Insert(std::string_view s, int32_t token) {
  int32_t node = 0;
  for (char ch : s) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(ch);
    auto [it, inserted] = edges.emplace(key, static_cast<int32_t>(terminal.size()));
    if (inserted) terminal.push_back(-1);
    node = it->second;
  }
  first[static_cast<unsigned char>(s[0])] = true;
  terminal[static_cast<size_t>(node)] = token;
}

bool BpeTokenizer::Trie::Find(std::string_view s, size_t from, size_t* begin, size_t* end,
                              int32_t* token) const {
  for (size_t i = from; i < s.size(); ++i) {
    if (!first[static_cast<unsigned char>(s[i])]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < s.size(); ++j) {
      auto it = edges.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[j]));
      if (it == edges.end()) break;
      node = it->second;
      if (terminal[static_cast<size_t>(node)] >= 0) {
        best = terminal[static_cast<size_t>(node)];
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      *begin = i;
      *end = best_end;
      *token = best;
      return true;
    }
  }
  return false;
}

// ---- construction -----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Build(Spec spec) {
  if (spec.id_to_token.size() != spec.present.size())
    return absl::InternalError("tokenizer: bad spec");
  if (!spec.pre.has_byte_level()) {
    return absl::InvalidArgumentError("tokenizer: the pre-tokenizer has no ByteLevel step");
  }
  auto tok = std::unique_ptr<BpeTokenizer>(new BpeTokenizer());
  int64_t max_id = -1, count = 0;
  for (size_t i = 0; i < spec.id_to_token.size(); ++i) {
    if (spec.present[i]) max_id = static_cast<int64_t>(i), ++count;
  }
  for (const AddedToken& a : spec.added) {
    if (a.content.empty()) return absl::InvalidArgumentError("tokenizer: an added token is empty");
    if (a.id < 0 || a.id > kMaxVocabId) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: added token '", a.content,
                                                     "' has id ", a.id, ", outside [0, ",
                                                     kMaxVocabId, "]"));
    }
    if (static_cast<size_t>(a.id) >= spec.present.size() ||
        !spec.present[static_cast<size_t>(a.id)])
      ++count;
    max_id = std::max<int64_t>(max_id, a.id);
  }
  if (max_id < 0) return absl::InvalidArgumentError("tokenizer: the vocabulary is empty");
  if (max_id > kMaxVocabId) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: more than ", kMaxVocabId + 1, " ids"));
  }
  if (max_id + 1 - count > kMaxVocabIdGaps) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: the largest id is ", max_id, " for ",
                                                   count, " tokens; ids may leave at most ",
                                                   kMaxVocabIdGaps, " unused below the largest"));
  }
  const size_t n = static_cast<size_t>(max_id + 1);
  tok->model_vocab_.reserve(spec.id_to_token.size());
  for (size_t i = 0; i < spec.id_to_token.size(); ++i) {
    if (!spec.present[i]) continue;
    auto [it, inserted] = tok->model_vocab_.emplace(spec.id_to_token[i], static_cast<int32_t>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: ids ", it->second, " and ", i,
                                                     " have the same token '", spec.id_to_token[i],
                                                     "'"));
    }
  }
  spec.id_to_token.resize(n);
  tok->id_to_token_ = std::move(spec.id_to_token);
  for (size_t i = 0; i < n; ++i) {
    if (i >= spec.present.size() || !spec.present[i]) tok->id_to_token_[i].clear();
  }
  tok->special_.assign(n, 0);

  // Merges; a repeated pair keeps its last rank, as HF's map does.
  tok->merges_.reserve(spec.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [a, b] = spec.merges[rank];
    auto ia = tok->model_vocab_.find(a);
    auto ib = tok->model_vocab_.find(b);
    joined.assign(a);
    joined.append(b);
    auto ij = tok->model_vocab_.find(joined);
    const std::string* missing = ia == tok->model_vocab_.end()   ? &a
                                 : ib == tok->model_vocab_.end() ? &b
                                 : ij == tok->model_vocab_.end() ? &joined
                                                                 : nullptr;
    if (missing != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: merge ", rank, " ('", a, "' '", b,
                                                     "'): '", *missing,
                                                     "' is not in the vocabulary"));
    }
    tok->merges_[PairKey(ia->second, ib->second)] = Merge{static_cast<uint32_t>(rank), ij->second};
  }

  // Added tokens: they take their ids over (HF decodes an id as its added token first).
  std::vector<AddedToken> added;
  for (AddedToken& a : spec.added) {
    auto [it, inserted] = tok->added_vocab_.emplace(a.content, a.id);
    if (!inserted) {
      if (it->second != a.id) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer: added token '", a.content,
                                                       "' has ids ", it->second, " and ", a.id));
      }
      continue;
    }
    tok->id_to_token_[static_cast<size_t>(a.id)] = a.content;
    if (a.special) tok->special_[static_cast<size_t>(a.id)] = 1;
    added.push_back(std::move(a));
  }
  tok->added_ = std::move(added);
  tok->nfc_ = spec.nfc;
  std::string normalized;
  for (size_t i = 0; i < tok->added_.size(); ++i) {
    const AddedToken& a = tok->added_[i];
    if (!a.normalized) {
      tok->raw_trie_.Insert(a.content, static_cast<int32_t>(i));
      continue;
    }
    // Matched against the normalized text, in its normalized form.
    const bool changed = tok->nfc_ && bpe::NfcNormalize(a.content, &normalized, nullptr);
    tok->normalized_trie_.Insert(changed ? normalized : a.content, static_cast<int32_t>(i));
    tok->has_normalized_added_ = true;
  }

  tok->decoded_.resize(n);
  for (size_t i = 0; i < n; ++i) tok->decoded_[i] = ByteLevelDecode(tok->id_to_token_[i]);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    const char byte = static_cast<char>(b);
    bpe::AppendByteLevel(std::string_view(&byte, 1), &ch);
    auto it = tok->model_vocab_.find(ch);
    tok->byte_id_[b] = it == tok->model_vocab_.end() ? -1 : it->second;
  }

  auto check_id = [&](int32_t id, std::string_view what) -> absl::Status {
    if (id < -1 || id > max_id || (id >= 0 && tok->id_to_token_[static_cast<size_t>(id)].empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: ", ToAbsl(what), " id ", id, " is no token's id"));
    }
    return absl::OkStatus();
  };
  FEDLORA_RETURN_IF_ERROR(check_id(spec.model_unk, "the model's unk"));
  if (spec.model_unk >= 0 && static_cast<size_t>(spec.model_unk) < spec.present.size() &&
      !spec.present[static_cast<size_t>(spec.model_unk)]) {
    return absl::InvalidArgumentError("tokenizer: the model's unk token is not in its vocabulary");
  }
  FEDLORA_RETURN_IF_ERROR(check_id(spec.bos, "bos"));
  FEDLORA_RETURN_IF_ERROR(check_id(spec.eos, "eos"));
  FEDLORA_RETURN_IF_ERROR(check_id(spec.pad, "pad"));
  FEDLORA_RETURN_IF_ERROR(check_id(spec.unk, "unk"));
  for (int32_t id : spec.prefix)
    FEDLORA_RETURN_IF_ERROR(check_id(id < 0 ? -2 : id, "post-processor"));
  for (int32_t id : spec.suffix)
    FEDLORA_RETURN_IF_ERROR(check_id(id < 0 ? -2 : id, "post-processor"));
  tok->model_unk_ = spec.model_unk;
  tok->fuse_unk_ = spec.fuse_unk;
  tok->ignore_merges_ = spec.ignore_merges;
  tok->pre_ = std::move(spec.pre);
  tok->prefix_ids_ = std::move(spec.prefix);
  tok->suffix_ids_ = std::move(spec.suffix);
  tok->bos_id_ = spec.bos;
  tok->eos_id_ = spec.eos;
  tok->pad_id_ = spec.pad;
  tok->unk_id_ = spec.unk;
  return tok;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(Vocabulary v) {
  if (v.model != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer: model '", v.model, "' is not supported: only 'gpt2' (byte-level BPE)"));
  }
  const size_t n = v.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer: the vocabulary is empty");
  if (n > static_cast<size_t>(kMaxVocabId) + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", n, " tokens, more than ", kMaxVocabId + 1));
  }
  if (!v.token_types.empty() && v.token_types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", v.token_types.size(), " token types for ", n, " tokens"));
  }
  Spec spec;
  spec.present.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const int32_t type = v.token_types.empty() ? kNormal : v.token_types[i];
    const std::string& token = v.tokens[i];
    if (type < kNormal || type > kByte) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: token ", i, " has type ", type, ", not 1..6"));
    }
    if (type == kByte) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: token ", i, " ('", token,
                       "') has type 6 (byte): SentencePiece-style byte fallback "
                       "is not supported"));
    }
    if (token.empty()) continue;
    spec.present[i] = true;
    if (type == kUnknown || type == kControl || type == kUserDefined) {
      AddedToken a;
      a.content = token;
      a.id = static_cast<int32_t>(i);
      a.special = type != kUserDefined;
      spec.added.push_back(std::move(a));
    }
  }
  spec.id_to_token = std::move(v.tokens);
  spec.merges.reserve(v.merges.size());
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const size_t sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == m.size() ||
        m.find(' ', sp + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: merge ", r, " ('", m, "') is not 'left right'"));
    }
    spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  const std::string& pre = v.pre;
  if (pre == "gpt2" || pre == "gpt-2") {
    FEDLORA_RETURN_IF_ERROR(spec.pre.SetByteLevel(false, true));
  } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe") {
    FEDLORA_ASSIGN_OR_RETURN(auto re, bpe::Regex::Shared(bpe::kLlama3Pattern));
    spec.pre.AddSplit(std::move(re), false);
    FEDLORA_RETURN_IF_ERROR(spec.pre.SetByteLevel(false, false));
    spec.ignore_merges = true;
  } else if (pre == "qwen2") {
    FEDLORA_ASSIGN_OR_RETURN(auto re, bpe::Regex::Shared(bpe::kQwen2Pattern));
    spec.pre.AddSplit(std::move(re), false);
    FEDLORA_RETURN_IF_ERROR(spec.pre.SetByteLevel(false, false));
    spec.nfc = true;
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    FEDLORA_ASSIGN_OR_RETURN(auto re, bpe::Regex::Shared(bpe::kDigitPattern));
    spec.pre.AddSplit(std::move(re), false);
    FEDLORA_RETURN_IF_ERROR(spec.pre.SetByteLevel(false, true));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: pre-tokenizer '", pre,
                     "' is not supported (gpt2, gpt-2, llama3, llama-v3, llama-bpe, qwen2, smollm, "
                     "starcoder, refact)"));
  }
  auto check = [&](int32_t id, std::string_view what) -> absl::Status {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: ", ToAbsl(what), " id ", id, " is outside [0, ", n, ")"));
    }
    return absl::OkStatus();
  };
  FEDLORA_RETURN_IF_ERROR(check(v.bos_id, "bos"));
  FEDLORA_RETURN_IF_ERROR(check(v.eos_id, "eos"));
  FEDLORA_RETURN_IF_ERROR(check(v.unk_id, "unk"));
  FEDLORA_RETURN_IF_ERROR(check(v.pad_id, "pad"));
  if (v.add_bos && v.bos_id < 0)
    return absl::InvalidArgumentError("tokenizer: add_bos without a bos id");
  if (v.add_eos && v.eos_id < 0)
    return absl::InvalidArgumentError("tokenizer: add_eos without an eos id");
  if (v.add_bos) spec.prefix.push_back(v.bos_id);
  if (v.add_eos) spec.suffix.push_back(v.eos_id);
  spec.bos = v.bos_id;
  spec.eos = v.eos_id;
  spec.pad = v.pad_id;
  spec.unk = v.unk_id;
  if (v.unknown_bytes_to_unk) {
    if (v.unk_id < 0 || !spec.present[static_cast<size_t>(v.unk_id)]) {
      return absl::InvalidArgumentError("tokenizer: unknown_bytes_to_unk without an unk token");
    }
    spec.model_unk = v.unk_id;
  }
  return Build(std::move(spec));
}

// ---- encoding ---------------------------------------------------------------------------------

struct BpeTokenizer::Scratch {
  size_t base = 0;  // offset of the current window in the input
  std::string repaired, normalized, mapped;
  bpe::OffsetEdits repair_edits, nfc_edits;
  std::vector<bpe::Piece> pieces;
  bpe::PreTokenizer::Scratch pre;
  struct Symbol {
    int32_t id, prev, next;
    uint32_t start, len;  // in bytes of the piece (its inserted space counts one)
  };
  struct HeapEntry {
    uint32_t rank, pos;
    int32_t new_id;
  };
  std::vector<Symbol> symbols;
  std::vector<HeapEntry> heap;
  // BPE output of the current piece: ids and piece-relative byte ranges.
  std::vector<int32_t> out_ids;
  std::vector<uint32_t> out_begin, out_end;
};

template <typename OnText, typename OnToken>
void BpeTokenizer::SplitAdded(std::string_view text, const Trie& trie, bool parse_special,
                              OnText on_text, OnToken on_token) const {
  size_t from = 0, consumed = 0;
  size_t b = 0, e = 0;
  int32_t index = -1;
  while (trie.Find(text, from, &b, &e, &index)) {
    const AddedToken& t = added_[static_cast<size_t>(index)];
    from = e;
    if (t.special && !parse_special) continue;  // stays part of the text
    size_t start = b, stop = e;
    if (t.lstrip) start = std::max(WhitespaceStartBefore(text, b), consumed);
    if (t.rstrip) stop = WhitespaceEndAfter(text, e);
    if (consumed < start) on_text(consumed, start);
    on_token(t.id, start, stop);
    consumed = from = stop;
  }
  if (consumed < text.size()) on_text(consumed, text.size());
}

void BpeTokenizer::BpePiece(std::string_view text, const bpe::Piece& piece, Scratch* s) const {
  s->out_ids.clear();
  s->out_begin.clear();
  s->out_end.clear();
  const bool prefix = piece.space_prefix;
  const std::string_view bytes = text.substr(piece.begin, piece.end - piece.begin);
  if (ignore_merges_ && bytes.size() + (prefix ? 1 : 0) > 1) {
    s->mapped.clear();
    if (prefix) bpe::AppendByteLevel(" ", &s->mapped);
    bpe::AppendByteLevel(bytes, &s->mapped);
    auto it = model_vocab_.find(ToAbsl(s->mapped));
    if (it != model_vocab_.end()) {
      s->out_ids.push_back(it->second);
      s->out_begin.push_back(piece.begin);
      s->out_end.push_back(piece.end);
      return;
    }
  }
  const bool cacheable = bytes.size() <= Cache::kMaxKey;
  Cache::Shard* shard = nullptr;
  if (cacheable) {
    shard = &cache_->shards[Cache::ShardOf(bytes)];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto& map = shard->map[prefix ? 1 : 0];
    auto it = map.find(ToAbsl(bytes));
    if (it != map.end()) {
      for (size_t i = 0; i < it->second.ids.size(); ++i) {
        s->out_ids.push_back(it->second.ids[i]);
        s->out_begin.push_back(piece.begin + it->second.begin[i]);
        s->out_end.push_back(piece.begin + it->second.end[i]);
      }
      return;
    }
  }
  RunBpe(bytes, prefix, s);
  for (size_t i = 0; i < s->out_ids.size(); ++i) {
    s->out_begin[i] += piece.begin;
    s->out_end[i] += piece.begin;
  }
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    auto& map = shard->map[prefix ? 1 : 0];
    if (map.size() < Cache::kMaxPerShard) {
      Cache::Entry e;
      e.ids = s->out_ids;
      for (size_t i = 0; i < s->out_ids.size(); ++i) {
        e.begin.push_back(static_cast<uint8_t>(s->out_begin[i] - piece.begin));
        e.end.push_back(static_cast<uint8_t>(s->out_end[i] - piece.begin));
      }
      map.emplace(std::string(bytes), std::move(e));
    }
  }
}

void BpeTokenizer::RunBpe(std::string_view bytes, bool prefix, Scratch* s) const {
  const size_t n = bytes.size() + (prefix ? 1 : 0);
  auto byte_at = [&](size_t k) -> unsigned char {
    return static_cast<unsigned char>(prefix ? (k == 0 ? ' ' : bytes[k - 1]) : bytes[k]);
  };
  // Offsets relative to the piece's first byte; the inserted space has none.
  auto offset = [&](size_t k) -> uint32_t {
    return static_cast<uint32_t>(prefix ? (k == 0 ? 0 : k - 1) : k);
  };
  auto emit = [&](int32_t id, size_t start, size_t len) {
    s->out_ids.push_back(id);
    s->out_begin.push_back(offset(start));
    s->out_end.push_back(offset(start + len));
  };
  // One symbol per byte; a byte the vocabulary lacks becomes the unk token (fused with an unk
  // just before it when fuse_unk) or, without one, is dropped, as in HF's merge_word.
  auto& sym = s->symbols;
  sym.clear();
  bool last_unk = false;
  for (size_t k = 0; k < n; ++k) {
    const int32_t id = byte_id_[byte_at(k)];
    if (id >= 0) {
      sym.push_back({id, 0, 0, static_cast<uint32_t>(k), 1});
      last_unk = false;
    } else if (model_unk_ >= 0) {
      if (fuse_unk_ && last_unk) {
        sym.back().len = static_cast<uint32_t>(k + 1) - sym.back().start;
      } else {
        sym.push_back({model_unk_, 0, 0, static_cast<uint32_t>(k), 1});
      }
      last_unk = true;
    }
  }
  const size_t m = sym.size();
  if (m == 0) return;
  if (m == 1) return emit(sym[0].id, sym[0].start, sym[0].len);
  for (size_t i = 0; i < m; ++i) {
    sym[i].prev = static_cast<int32_t>(i) - 1;
    sym[i].next = i + 1 < m ? static_cast<int32_t>(i + 1) : -1;
  }
  // HF's Word::merge_all: a min-heap on (rank, position); stale entries are skipped.
  auto& heap = s->heap;
  heap.clear();
  auto lower_priority = [](const Scratch::HeapEntry& a, const Scratch::HeapEntry& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto push = [&](size_t pos, int32_t left, int32_t right, bool sift) {
    auto it = merges_.find(PairKey(left, right));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, static_cast<uint32_t>(pos), it->second.new_id});
    if (sift) std::push_heap(heap.begin(), heap.end(), lower_priority);
  };
  for (size_t i = 0; i + 1 < m; ++i) push(i, sym[i].id, sym[i + 1].id, false);
  std::make_heap(heap.begin(), heap.end(), lower_priority);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority);
    const Scratch::HeapEntry top = heap.back();
    heap.pop_back();
    Scratch::Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const size_t next_pos = static_cast<size_t>(cur.next);
    const Scratch::Symbol right = sym[next_pos];
    auto it = merges_.find(PairKey(cur.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // a stale entry
    cur.id = top.new_id;
    cur.len = right.start + right.len - cur.start;
    cur.next = right.next;
    sym[next_pos].len = 0;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (cur.prev >= 0)
      push(static_cast<size_t>(cur.prev), sym[static_cast<size_t>(cur.prev)].id, cur.id, true);
    if (cur.next >= 0) push(top.pos, cur.id, sym[static_cast<size_t>(cur.next)].id, true);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    emit(sym[static_cast<size_t>(i)].id, sym[static_cast<size_t>(i)].start,
         sym[static_cast<size_t>(i)].len);
  }
}

void BpeTokenizer::EncodeSegment(std::string_view seg, size_t seg_begin, bool parse_special,
                                 Scratch* s, std::vector<int32_t>* ids,
                                 std::vector<Offset>* offsets) const {
  std::string_view x = seg;
  const bool normalized =
      nfc_ && bpe::NfcNormalize(seg, &s->normalized, offsets ? &s->nfc_edits : nullptr);
  if (normalized) x = s->normalized;
  const bool repaired = !s->repair_edits.empty();
  auto original = [&](size_t off, bool is_end) -> size_t {
    size_t o = normalized && offsets ? bpe::MapOffsetBack(s->nfc_edits, off, is_end) : off;
    o += seg_begin;
    if (repaired) o = bpe::MapOffsetBack(s->repair_edits, o, is_end);
    return s->base + o;
  };
  auto on_text = [&](size_t b, size_t e) {
    const std::string_view sub = x.substr(b, e - b);
    pre_.Run(sub, &s->pieces, &s->pre);
    for (const bpe::Piece& piece : s->pieces) {
      BpePiece(sub, piece, s);
      ids->insert(ids->end(), s->out_ids.begin(), s->out_ids.end());
      if (offsets == nullptr) continue;
      for (size_t k = 0; k < s->out_ids.size(); ++k) {
        offsets->push_back(
            {original(b + s->out_begin[k], false), original(b + s->out_end[k], true)});
      }
    }
  };
  auto on_token = [&](int32_t id, size_t b, size_t e) {
    ids->push_back(id);
    if (offsets != nullptr) offsets->push_back({original(b, false), original(e, true)});
  };
  if (has_normalized_added_) {
    SplitAdded(x, normalized_trie_, parse_special, on_text, on_token);
  } else if (!x.empty()) {
    on_text(0, x.size());
  }
}

void BpeTokenizer::EncodeWindow(std::string_view text, Scratch* s, std::vector<int32_t>* ids,
                                std::vector<Offset>* offsets, bool parse_special) const {
  std::string_view t = text;
  s->repair_edits.clear();
  if (bpe::RepairUtf8(text, &s->repaired, &s->repair_edits)) t = s->repaired;
  const bool repaired = !s->repair_edits.empty();
  SplitAdded(
      t, raw_trie_, parse_special,
      [&](size_t b, size_t e) {
        EncodeSegment(t.substr(b, e - b), b, parse_special, s, ids, offsets);
      },
      [&](int32_t id, size_t b, size_t e) {
        ids->push_back(id);
        if (offsets == nullptr) return;
        offsets->push_back(
            {s->base + (repaired ? bpe::MapOffsetBack(s->repair_edits, b, false) : b),
             s->base + (repaired ? bpe::MapOffsetBack(s->repair_edits, e, true) : e)});
      });
}

void BpeTokenizer::EncodeInto(std::string_view text, bool add_special, bool parse_special,
                              std::vector<int32_t>* ids, std::vector<Offset>* offsets) const {
  Scratch s;
  if (add_special) {
    for (int32_t id : prefix_ids_) {
      ids->push_back(id);
      if (offsets != nullptr) offsets->push_back({0, 0});
    }
  }
  // Positions inside the pipeline are 32-bit: a text over kWindow bytes is encoded window by
  // window, each cut at a code point boundary (a documented divergence for gigabyte texts).
  constexpr size_t kWindow = size_t{1} << 30;
  for (size_t base = 0; base < text.size();) {
    size_t len = std::min(kWindow, text.size() - base);
    while (base + len < text.size() && len > 1 &&
           IsUtf8Continuation(static_cast<unsigned char>(text[base + len])))
      --len;
    s.base = base;
    EncodeWindow(text.substr(base, len), &s, ids, offsets, parse_special);
    base += len;
  }
  if (add_special) {
    for (int32_t id : suffix_ids_) {
      ids->push_back(id);
      if (offsets != nullptr) offsets->push_back({text.size(), text.size()});
    }
  }
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool add_special,
                                          bool parse_special) const {
  std::vector<int32_t> ids;
  EncodeInto(text, add_special, parse_special, &ids, nullptr);
  return ids;
}

std::vector<std::string> BpeTokenizer::PreTokenize(std::string_view text) const {
  Scratch s;
  std::string_view t = text;
  if (bpe::RepairUtf8(text, &s.repaired, nullptr)) t = s.repaired;
  pre_.Run(t, &s.pieces, &s.pre);
  std::vector<std::string> out;
  out.reserve(s.pieces.size());
  for (const bpe::Piece& p : s.pieces) {
    std::string piece;
    if (p.space_prefix) bpe::AppendByteLevel(" ", &piece);
    bpe::AppendByteLevel(t.substr(p.begin, p.end - p.begin), &piece);
    out.push_back(std::move(piece));
  }
  return out;
}

// ---- decoding and lookups ---------------------------------------------------------------------

std::string BpeTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= decoded_.size()) continue;
    const size_t i = static_cast<size_t>(id);
    if (id_to_token_[i].empty() || (skip_special && special_[i])) continue;
    bytes.append(decoded_[i]);
  }
  std::string repaired;
  if (bpe::RepairUtf8(bytes, &repaired, nullptr)) return repaired;
  return bytes;
}

int32_t BpeTokenizer::TokenToId(std::string_view token) const {
  auto it = added_vocab_.find(ToAbsl(token));
  if (it != added_vocab_.end()) return it->second;
  auto jt = model_vocab_.find(ToAbsl(token));
  return jt == model_vocab_.end() ? -1 : jt->second;
}

const std::string& BpeTokenizer::IdToToken(int32_t id) const {
  static const std::string* const kEmpty = new std::string();
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return *kEmpty;
  return id_to_token_[static_cast<size_t>(id)];
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < special_.size() &&
         special_[static_cast<size_t>(id)] != 0;
}

}  // namespace fedlora
