// BERT WordPiece tokenizer, id-for-id compatible with Hugging Face `tokenizers` (BertNormalizer +
// BertPreTokenizer + WordPiece + the [CLS] A [SEP] B [SEP] template) for bert-base-uncased style
// vocabularies such as the one of all-MiniLM-L6-v2.
//
//   FEDLORA_ASSIGN_OR_RETURN(auto tok, WordPieceTokenizer::FromTokenizerJson(dir + "/tokenizer.json"));
//   WordPieceTokenizer::Encoding e = tok->Encode("How old are you?", "I am six.", /*max_length=*/128);
//   std::vector<int32_t> ids, types, mask;
//   PadBatch({e}, /*seq_len=*/0, tok->pad_id(), &ids, &types, &mask);
//
// The pipeline, in Hugging Face's order:
//  1. Special tokens ([CLS], [SEP], [PAD], [UNK], [MASK] and any other added token of a
//     tokenizer.json) that occur literally in the raw text become their own token, unnormalized.
//  2. Text cleaning: NUL, U+FFFD and control/format/private-use characters (Cc, Cf, Co; not tab,
//     LF, CR) are removed; every whitespace character becomes a space.
//  3. CJK ideographs (the CJK Unified Ideographs blocks and extensions, and the compatibility
//     ideographs) get a space on each side, so each is a word of its own.
//  4. When lower-casing (uncased models): accents are stripped (canonical decomposition, NFD, then
//     nonspacing marks Mn are dropped), then the text is lower-cased (full Unicode mapping).
//  5. Words are split at whitespace, and every punctuation character (ASCII punctuation and
//     symbols, and the Unicode P* categories) becomes a word of its own.
//  6. WordPiece: greedy longest-match-first against the vocabulary, continuation pieces carrying
//     the "##" prefix; a word longer than 100 characters, or one that cannot be covered by
//     pieces, becomes a single [UNK].
//
// Unicode coverage: the whole code space. The character tables (model/tokenizer_unicode_tables.inc)
// are generated from Hugging Face tokenizers' own behaviour and verified code point by code point
// by tests/model/tokenizer_hf_check.py. Decomposition covers every canonical decomposition
// (Latin-1 Supplement, Latin Extended-A/B and Additional, Greek, Cyrillic, ..., the CJK
// compatibility ideographs) and Hangul syllables arithmetically. Known gap: the canonical
// reordering of NFD is not applied; it only matters for sequences of several combining characters
// of which some are spacing marks (Mc), which are then kept in input order.
//
// Invalid UTF-8: each byte that does not start a well-formed sequence (stray continuation bytes,
// truncated sequences, overlong forms, surrogates, values above U+10FFFF) is decoded as U+FFFD,
// which text cleaning then removes; invalid bytes therefore vanish and never crash.
//
// Thread-safety: a tokenizer is immutable after construction; every const method is thread-safe.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace fedlora {

class WordPieceTokenizer {
 public:
  struct Options {
    bool lowercase = true;      // lower-case the text (uncased models)
    bool strip_accents = true;  // NFD + drop nonspacing marks; HF's default follows lowercase
    bool clean_text = true;     // drop control characters, map whitespace to spaces
    bool handle_chinese_chars = true;  // split around CJK ideographs
    std::string unk_token = "[UNK]";
    std::string continuing_subword_prefix = "##";
    int max_input_chars_per_word = 100;  // longer words become [UNK]; counted in code points
  };

  struct Encoding {
    std::vector<int32_t> input_ids;
    std::vector<int32_t> token_type_ids;  // 0 for [CLS] A [SEP], 1 for B [SEP]
    std::vector<int32_t> attention_mask;  // all 1: Encode never pads (see PadBatch)
  };

  // Reads a vocab.txt: one token per line, the id is the 0-based line number (trailing
  // whitespace, e.g. "\r", is trimmed; a repeated token keeps its last line, as in HF). The
  // vocabulary's [PAD], [UNK], [CLS], [SEP] and [MASK] are matched literally in input text.
  // Errors: NotFound / PermissionDenied (file), InvalidArgument (empty vocabulary, or one
  // missing [CLS], [SEP], [PAD] or [UNK]).
  static absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> FromVocabFile(
      const std::string& vocab_txt, bool do_lower_case = true);

  // Reads a Hugging Face tokenizer.json whose model is WordPiece: model.vocab, model.unk_token,
  // model.continuing_subword_prefix, model.max_input_chars_per_word, the BertNormalizer flags
  // (lowercase, strip_accents (null: follows lowercase), clean_text, handle_chinese_chars) and
  // added_tokens. Errors: NotFound (file), InvalidArgument (not JSON, not a WordPiece model,
  // a field of the wrong type, negative or duplicate ids, missing special tokens).
  static absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> FromTokenizerJson(
      const std::string& path);

  // Builds a tokenizer from a token -> id map (ids need not be dense). `special_tokens` are
  // matched literally in raw text (step 1 above); each must be in `vocab`. Same errors as above.
  static absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> Create(
      std::unordered_map<std::string, int32_t> vocab, std::vector<std::string> special_tokens,
      Options options);

  // [CLS] text [SEP] or, with a pair, [CLS] text [SEP] pair [SEP]. When max_length > 0 and the
  // result would be longer, tokens are removed from the end of the sequences the way HF's
  // "longest_first" truncation does: the shorter sequence is kept whole when the longer one can
  // absorb the whole cut, else both get half of the room (an odd token goes to the longer one, to
  // the pair on a tie). The special tokens always stay; if max_length is smaller
  // than their count (2 or 3) the result holds only them. max_length <= 0: no truncation.
  Encoding Encode(std::string_view text, std::optional<std::string_view> pair,
                  int max_length) const;

  // The WordPiece tokens of `text`, without [CLS]/[SEP] (e.g. "unaffable" -> "un", "##aff", "##able").
  std::vector<std::string> Tokenize(std::string_view text) const;
  // Steps 1-5 only: the normalized words that WordPiece then splits. For tests and debugging.
  std::vector<std::string> BasicTokenize(std::string_view text) const;
  // The ids of Tokenize(text).
  std::vector<int32_t> TokenizeToIds(std::string_view text) const;

  // Id of a token, or unk_id() when the vocabulary lacks it.
  int32_t TokenToId(std::string_view token) const;
  // The token with id `id`, or "" when no token has it.
  const std::string& IdToToken(int32_t id) const;

  int32_t pad_id() const { return pad_id_; }
  int32_t cls_id() const { return cls_id_; }
  int32_t sep_id() const { return sep_id_; }
  int32_t unk_id() const { return unk_id_; }
  // One more than the largest id: the number of rows the embedding table needs.
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  const Options& options() const { return options_; }

 private:
  WordPieceTokenizer() = default;
  // Appends the ids of `text` (no [CLS]/[SEP]) to `ids` and, when non-null, the tokens to `tokens`.
  void TokenizeInto(std::string_view text, std::vector<int32_t>* ids,
                    std::vector<std::string>* tokens, std::vector<std::string>* words) const;
  void WordPiece(std::string_view word, std::vector<int32_t>* ids,
                 std::vector<std::string>* tokens) const;

  Options options_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<std::string> special_tokens_;  // longest first, for leftmost-longest matching
  std::bitset<256> special_first_bytes_;     // first bytes of the special tokens: a cheap pre-check
  size_t max_token_bytes_ = 0;  // longest vocabulary entry, bounds the WordPiece search
  int32_t pad_id_ = 0, cls_id_ = 0, sep_id_ = 0, unk_id_ = 0;
};

// Pads encodings into row-major [batch, seq_len] arrays: ids with `pad_id`, token types and the
// attention mask with 0. seq_len <= 0 means the longest encoding in the batch; a fixed seq_len
// shorter than an encoding cuts it (encode with max_length = seq_len to keep the final [SEP]).
// Returns the seq_len used. The output vectors are overwritten.
int PadBatch(const std::vector<WordPieceTokenizer::Encoding>& batch, int seq_len, int32_t pad_id,
             std::vector<int32_t>* ids, std::vector<int32_t>* type_ids, std::vector<int32_t>* mask);

}  // namespace fedlora
