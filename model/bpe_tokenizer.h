// Byte-level BPE tokenizer for decoder LLMs (GPT-2, SmolLM2, LLaMA-3 and Qwen2 families),
// id-for-id compatible with Hugging Face `tokenizers` (a BPE model behind the ByteLevel
// pre-tokenizer and decoder).
//
//   FEDLORA_ASSIGN_OR_RETURN(auto tok, BpeTokenizer::FromTokenizerJson(dir + "/tokenizer.json"));
//   std::vector<int32_t> ids = tok->Encode("Hello, world!", /*add_special=*/true);
//   std::string text = tok->Decode(ids, /*skip_special=*/true);
//
//   BpeTokenizer::Vocabulary v;  // what a GGUF file's tokenizer.ggml.* metadata holds
//   v.tokens = ...; v.token_types = ...; v.merges = ...; v.pre = "smollm"; v.eos_id = 2;
//   FEDLORA_ASSIGN_OR_RETURN(auto tok, BpeTokenizer::Create(std::move(v)));
//
// Encoding, in Hugging Face's order:
//  1. Invalid UTF-8 is repaired first: each maximal ill-formed subsequence becomes U+FFFD, as
//     Python's bytes.decode(errors="replace") would before the text reached HF.
//  2. Added tokens whose "normalized" flag is false (all special tokens of the supported
//     families; GGUF control, unknown and user-defined tokens) are cut out of the raw text,
//     leftmost-longest; lstrip/rstrip swallow the whitespace beside them. With parse_special
//     false, special ones stay plain text (HF's encode_special_tokens).
//  3. The normalizer (none, or NFC for Qwen2, with HF's Unicode 9.0 tables) runs on the text
//     between them, then the added tokens marked "normalized" are cut out of that.
//  4. The pre-tokenizer splits the rest: Split regexes, Digits, then ByteLevel (optionally with
//     GPT-2's regex and a prefix space); each piece's bytes map to GPT-2's printable characters.
//  5. BPE on each piece: merges by rank, lowest first, leftmost on ties (HF's exact algorithm);
//     a piece that is a whole vocabulary token stays one with ignore_merges (LLaMA-3). A byte
//     missing from the vocabulary becomes the model's unk token, or is dropped when it has none.
//  6. add_special adds the post-processor's tokens (TemplateProcessing, GGUF add_bos/add_eos).
// Decoding concatenates the tokens' bytes (a token made of GPT-2 byte characters decodes to its
// bytes, any other token to its own UTF-8), skipping special tokens when asked and ids no token
// has, and repairs the result as in step 1, as HF does.
//
// Regexes run on PCRE2 with Oniguruma's meaning of \s; other constructs whose meaning differs
// are refused when loading (model/pretokenize.h). Digits uses Rust's (Unicode 15) numeric
// set. Character classes were checked against HF over every code point; PCRE2 10.42 knows
// Unicode 14, like HF's Oniguruma. Pre-tokenizer pieces where PCRE2 hits a resource limit stay
// whole (never seen on real text; input is not rejected).
//
// Texts over 1 GiB are encoded in 1 GiB windows cut at code point boundaries (positions inside
// are 32-bit), which may differ from HF at the cuts.
//
// Thread-safety: immutable after construction (but for an internal, locked cache of the BPE
// results of short pieces, as HF keeps); every const method is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "model/pretokenize.h"

namespace fedlora {

class BpeTokenizer {
 public:
  // GGUF's tokenizer.ggml.token_type values.
  enum TokenType : int32_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6
  };

  // A vocabulary as GGUF stores it (tokenizer.ggml.*). Control and unknown tokens become special
  // added tokens, user-defined ones non-special added tokens; unused ones are plain entries.
  struct Vocabulary {
    std::string model = "gpt2";  // tokenizer.ggml.model; only "gpt2" (byte-level BPE)
    // tokenizer.ggml.pre: "gpt2"/"gpt-2"; "llama3"/"llama-v3"/"llama-bpe" (with ignore_merges);
    // "qwen2" (with NFC, as Qwen2's tokenizer.json); "smollm"/"starcoder"/"refact" (each digit
    // split off, then GPT-2's regex).
    std::string pre = "gpt2";
    std::vector<std::string> tokens;   // the token of each id; "" for an id no token has
    std::vector<int32_t> token_types;  // empty (all normal) or one per token
    std::vector<std::string> merges;   // "left right", rank = index
    int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;  // -1: none
    bool add_bos = false, add_eos = false;
    // Bytes whose character the vocabulary lacks (SmolLM2's has no token for 0xF1, 0xFF, ...)
    // are dropped, as HF's BPE does when tokenizer.json has "unk_token": null, the usual case
    // (GPT-2, LLaMA-3, Qwen2). True: they become unk_id instead (a tokenizer.json naming it).
    bool unknown_bytes_to_unk = false;
  };
  // Errors (InvalidArgument, naming the problem): unknown model or pre, wrong token_types size or
  // value (type 6, byte tokens, belongs to SentencePiece vocabularies), a token string twice,
  // a merge that is not "a b" or names a token the vocabulary lacks, or whose concatenation it
  // lacks, special ids out of range.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(Vocabulary vocabulary);

  // Token names overriding what tokenizer.json implies: bos/eos default to the
  // post-processor's first/last token when TemplateProcessing adds exactly one there.
  struct JsonOptions {
    std::string bos_token, eos_token, pad_token;  // "": inferred or none
  };
  // A Hugging Face tokenizer.json with model.type "BPE". Supported: normalizer null or NFC (or
  // a Sequence of those); pre_tokenizer ByteLevel or a Sequence of Split (Regex or String
  // pattern, behavior Isolated or Removed, invert false), Digits and a final ByteLevel;
  // post_processor null, ByteLevel, TemplateProcessing or a Sequence of them; decoder
  // ByteLevel; model vocab, merges ("a b" or ["a", "b"]), unk_token, fuse_unk, ignore_merges;
  // added_tokens with special/lstrip/rstrip/normalized. Anything else (another normalizer, BPE
  // dropout, continuing_subword_prefix, end_of_word_suffix, byte_fallback, single_word added
  // tokens, an unknown pre-tokenizer or decoder, ...) is InvalidArgument naming the field.
  // Errors: NotFound / PermissionDenied (file), InvalidArgument (everything else).
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromTokenizerJson(
      const std::string& path, const JsonOptions& options = {});
  // The same from the file's text; `origin` names it in error messages.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromTokenizerJsonText(
      std::string_view json, std::string_view origin, const JsonOptions& options = {});

  // Byte range of a token in the input text. Special tokens from add_special are empty ranges at
  // the start or the end; inside a region that UTF-8 repair or NFC rewrote, ranges widen to the
  // rewritten region's bounds.
  struct Offset {
    size_t begin, end;
  };
  std::vector<int32_t> Encode(std::string_view text, bool add_special = false,
                              bool parse_special = true) const;
  // Appends the ids of `text` to *ids and, when offsets is non-null, their byte ranges to *offsets.
  void EncodeInto(std::string_view text, bool add_special, bool parse_special,
                  std::vector<int32_t>* ids, std::vector<Offset>* offsets) const;
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // HF's pre_tokenize_str: the pieces of `text` after UTF-8 repair and the pre-tokenizer (no
  // added tokens, no normalizer), as byte-level strings. For tests.
  std::vector<std::string> PreTokenize(std::string_view text) const;

  // Id of a token (added tokens first, as in HF), or -1.
  int32_t TokenToId(std::string_view token) const;
  // The token of `id`, or "" when no token has it.
  const std::string& IdToToken(int32_t id) const;
  // Special added tokens (skipped by Decode(..., true)).
  bool IsSpecial(int32_t id) const;
  // One more than the largest id: the number of rows the embedding table needs.
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t bos_id() const { return bos_id_; }  // -1: none
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  // The ids add_special puts before / after the text.
  const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int32_t>& suffix_ids() const { return suffix_ids_; }

  // Private, for the loaders (model/bpe_tokenizer.cc, model/bpe_tokenizer_json.cc).
  struct AddedToken {
    std::string content;
    int32_t id = -1;
    bool special = false, lstrip = false, rstrip = false, normalized = false;
  };
  struct Spec {
    std::vector<std::string> id_to_token;  // model vocabulary by id
    std::vector<bool> present;             // id_to_token[i] is a model token
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<AddedToken> added;  // ids already assigned
    bpe::PreTokenizer pre;
    bool nfc = false;
    int32_t model_unk = -1;  // the BPE model's unk token (for bytes missing from the vocabulary)
    bool fuse_unk = false, ignore_merges = false;
    std::vector<int32_t> prefix, suffix;
    int32_t bos = -1, eos = -1, pad = -1, unk = -1;
  };
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Build(Spec spec);
  ~BpeTokenizer();

 private:
  BpeTokenizer();
  struct Scratch;
  struct Cache;
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  // Added-token matcher: a byte trie, leftmost-longest.
  struct Trie {
    absl::flat_hash_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child node
    std::vector<int32_t> terminal{-1};             // node -> index in added_, or -1
    bool first[256] = {};
    void Insert(std::string_view s, int32_t token);
    // Leftmost-longest match at or after `from`: false when none.
    bool Find(std::string_view s, size_t from, size_t* begin, size_t* end, int32_t* token) const;
  };

  // Encodes up to 1 GiB of text starting at byte s->base of the input.
  void EncodeWindow(std::string_view text, Scratch* s, std::vector<int32_t>* ids,
                    std::vector<Offset>* offsets, bool parse_special) const;
  // Encodes the text between two raw added tokens, which starts at byte seg_begin of the
  // repaired text: normalizer, normalized added tokens, pre-tokenizer, BPE.
  void EncodeSegment(std::string_view seg, size_t seg_begin, bool parse_special, Scratch* s,
                     std::vector<int32_t>* ids, std::vector<Offset>* offsets) const;
  // Splits `text` at matches of `trie`: on_text(begin, end) for text, on_token(id, begin, end).
  template <typename OnText, typename OnToken>
  void SplitAdded(std::string_view text, const Trie& trie, bool parse_special, OnText on_text,
                  OnToken on_token) const;
  // BPE of one piece of `text` into s->out_ids, s->out_begin, s->out_end (offsets in `text`),
  // through the cache.
  void BpePiece(std::string_view text, const bpe::Piece& piece, Scratch* s) const;
  // HF's BPE of `bytes` (after an inserted space when `prefix`), offsets relative to bytes[0].
  void RunBpe(std::string_view bytes, bool prefix, Scratch* s) const;

  std::vector<std::string> id_to_token_;  // added tokens override model tokens, as in HF
  std::vector<std::string> decoded_;      // the bytes each id decodes to
  std::vector<uint8_t> special_;          // 1 for special added tokens
  absl::flat_hash_map<std::string, int32_t> model_vocab_;
  absl::flat_hash_map<std::string, int32_t> added_vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> rank, result
  int32_t byte_id_[256];                         // id of each byte's character, or -1
  std::vector<AddedToken> added_;
  Trie raw_trie_, normalized_trie_;
  bool has_normalized_added_ = false;
  bpe::PreTokenizer pre_;
  bool nfc_ = false;
  int32_t model_unk_ = -1;
  bool fuse_unk_ = false, ignore_merges_ = false;
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
  std::unique_ptr<Cache> cache_;  // BPE results of short pieces; internally locked
};

}  // namespace fedlora
