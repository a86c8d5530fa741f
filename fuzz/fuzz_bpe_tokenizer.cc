// Fuzzes the byte-level BPE tokenizer (model/bpe_tokenizer.h): its loaders (tokenizer.json text
// and Create() from GGUF-style data: model directories and GGUF files are downloaded) and then
// Encode / Decode / PreTokenize on text from the same input (training data is a client's files).
//
// Input: byte 0 picks the mode:
//   0  tokenizer.json: the text to encode, then the rest of the input is the file;
//   1  Create(): a vocabulary built from the input (tokens, types, merges as pairs of tokens,
//      special ids, a pre-tokenizer name), then the text;
//   2  a fixed valid vocabulary (the 256 byte characters, a few merges, special tokens) with a
//      fuzzed pre-tokenizer name: the input goes to the tokenizer itself.
// Then, through FuzzedDataProvider: the text, add_special, parse_special, skip_special and ids
// to decode.
//
// Checks beyond "no crash, no sanitizer report": loaders fail only with InvalidArgument; ids are
// inside the vocabulary; offsets are ordered ranges inside the text; Decode gives valid UTF-8;
// in mode 2, Decode(Encode(text)) is the text with invalid UTF-8 repaired (no NFC there) and the
// pre-tokenizer pieces cover the text.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/bpe_tokenizer.h"
#include "model/pretokenize.h"

namespace {

using fedlora::BpeTokenizer;

const char* const kPres[] = {"gpt2",   "gpt-2",     "llama3", "llama-bpe", "qwen2",
                             "smollm", "starcoder", "falcon", ""};

std::string ByteChar(int b) {
  std::string s;
  const char c = static_cast<char>(b);
  fedlora::bpe::AppendByteLevel(std::string_view(&c, 1), &s);
  return s;
}

BpeTokenizer::Vocabulary FixedVocabulary(const std::string& pre) {
  BpeTokenizer::Vocabulary v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteChar(b));
  for (const char* t : {"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld", "ĠĠ", "12",
                        "<|end|>", "<u>"}) {
    v.tokens.emplace_back(t);
  }
  v.token_types.assign(v.tokens.size(), BpeTokenizer::kNormal);
  v.token_types[v.tokens.size() - 2] = BpeTokenizer::kControl;
  v.token_types[v.tokens.size() - 1] = BpeTokenizer::kUserDefined;
  v.merges = {"h e",   "l l", "he ll",   "hell o", "Ġ w", "o r",
              "Ġw or", "l d", "Ġwor ld", "Ġ Ġ",    "1 2"};
  v.pre = pre;
  v.bos_id = 'B';
  v.eos_id = static_cast<int32_t>(v.tokens.size() - 2);
  v.add_bos = true;
  return v;
}

BpeTokenizer::Vocabulary FuzzedVocabulary(FuzzedDataProvider* in) {
  BpeTokenizer::Vocabulary v;
  v.model = in->ConsumeBool() ? "gpt2" : in->ConsumeRandomLengthString(8);
  v.pre = kPres[in->ConsumeIntegralInRange<size_t>(0, std::size(kPres) - 1)];
  if (in->ConsumeBool()) {
    for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteChar(b));
  }
  const size_t extra = in->ConsumeIntegralInRange<size_t>(0, 64);
  for (size_t i = 0; i < extra; ++i) v.tokens.push_back(in->ConsumeRandomLengthString(12));
  if (in->ConsumeBool()) {
    for (size_t i = 0; i < v.tokens.size(); ++i)
      v.token_types.push_back(in->ConsumeIntegralInRange<int32_t>(0, 7));
  }
  const size_t merges = in->ConsumeIntegralInRange<size_t>(0, 64);
  for (size_t i = 0; i < merges && !v.tokens.empty(); ++i) {
    const std::string a = v.tokens[in->ConsumeIntegralInRange<size_t>(0, v.tokens.size() - 1)];
    const std::string b = v.tokens[in->ConsumeIntegralInRange<size_t>(0, v.tokens.size() - 1)];
    if (in->ConsumeBool()) v.tokens.push_back(a + b);  // make the merge valid
    v.merges.push_back(in->ConsumeIntegralInRange<int>(0, 9) == 0 ? in->ConsumeRandomLengthString(8)
                                                                  : a + " " + b);
  }
  if (!v.token_types.empty()) v.token_types.resize(v.tokens.size(), BpeTokenizer::kNormal);
  const auto n = static_cast<int32_t>(v.tokens.size());
  v.bos_id = in->ConsumeIntegralInRange<int32_t>(-2, n + 1);
  v.eos_id = in->ConsumeIntegralInRange<int32_t>(-2, n + 1);
  v.unk_id = in->ConsumeIntegralInRange<int32_t>(-2, n + 1);
  v.pad_id = in->ConsumeIntegralInRange<int32_t>(-2, n + 1);
  v.add_bos = in->ConsumeBool();
  v.add_eos = in->ConsumeBool();
  return v;
}

// The fixed tokenizers of mode 2, built once per pre-tokenizer name.
const BpeTokenizer* Fixed(size_t pre) {
  static std::unique_ptr<BpeTokenizer> cache[std::size(kPres)];
  if (!cache[pre]) {
    auto tok = BpeTokenizer::Create(FixedVocabulary(kPres[pre]));
    if (!tok.ok()) return nullptr;
    cache[pre] = *std::move(tok);
  }
  return cache[pre].get();
}

bool ValidUtf8(const std::string& s) {
  std::string out;
  return !fedlora::bpe::RepairUtf8(s, &out, nullptr);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  FuzzedDataProvider in(data + 1, size - 1);
  std::unique_ptr<BpeTokenizer> owned;
  const BpeTokenizer* tok = nullptr;
  size_t pre = 0;
  std::string text;
  if (mode == 0) {
    text = in.ConsumeRandomLengthString(2048);
  } else if (mode == 1) {
    BpeTokenizer::Vocabulary v = FuzzedVocabulary(&in);
    auto made = BpeTokenizer::Create(std::move(v));
    FUZZ_TRACE("Create: %s\n", made.status().ToString().c_str());
    if (!made.ok()) {
      FUZZ_CHECK(made.status().code() == absl::StatusCode::kInvalidArgument, made.status());
      return 0;
    }
    owned = *std::move(made);
    tok = owned.get();
    text = in.ConsumeRandomLengthString(2048);
  } else {
    pre = in.ConsumeIntegralInRange<size_t>(0, 6);  // the supported names
    tok = Fixed(pre);
    FUZZ_CHECK(tok != nullptr, "the fixed vocabulary must load");
    text = in.ConsumeRandomLengthString(4096);
  }
  const bool add_special = in.ConsumeBool();
  const bool parse_special = in.ConsumeBool();
  const bool skip_special = in.ConsumeBool();
  std::vector<int32_t> decode_ids;
  const size_t n_decode = in.ConsumeIntegralInRange<size_t>(0, 32);
  for (size_t i = 0; i < n_decode; ++i) decode_ids.push_back(in.ConsumeIntegral<int32_t>());
  if (mode == 0) {
    const std::string file = in.ConsumeRemainingBytesAsString();
    auto made = BpeTokenizer::FromTokenizerJsonText(file, "fuzz.json");
    FUZZ_TRACE("tokenizer.json, %zu bytes: %s\n", file.size(), made.status().ToString().c_str());
    if (!made.ok()) {
      FUZZ_CHECK(made.status().code() == absl::StatusCode::kInvalidArgument, made.status());
      return 0;
    }
    owned = *std::move(made);
    tok = owned.get();
  }

  const int64_t vocab = tok->vocab_size();
  std::vector<int32_t> ids;
  std::vector<BpeTokenizer::Offset> offsets;
  tok->EncodeInto(text, add_special, parse_special, &ids, &offsets);
  FUZZ_TRACE("mode %d, text %zu bytes: %zu ids\n", mode, text.size(), ids.size());
  FUZZ_CHECK(ids.size() == offsets.size(), "one offset per id");
  size_t last_begin = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    FUZZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "id out of the vocabulary");
    FUZZ_CHECK(!tok->IdToToken(ids[i]).empty(), "an id no token has");
    FUZZ_CHECK(offsets[i].begin <= offsets[i].end && offsets[i].end <= text.size(),
               "offset outside the text");
    FUZZ_CHECK(offsets[i].begin >= last_begin, "offsets out of order");
    last_begin = offsets[i].begin;
  }
  FUZZ_CHECK(tok->Encode(text, add_special, parse_special) == ids,
             "Encode and EncodeInto disagree");

  const std::string decoded = tok->Decode(ids, skip_special);
  FUZZ_CHECK(ValidUtf8(decoded), "Decode gave invalid UTF-8");
  FUZZ_CHECK(ValidUtf8(tok->Decode(decode_ids, skip_special)), "Decode gave invalid UTF-8");
  const std::vector<std::string> pieces = tok->PreTokenize(text);

  if (mode == 2 && std::string(kPres[pre]) != "qwen2") {
    std::string repaired = text;
    fedlora::bpe::RepairUtf8(text, &repaired, nullptr);
    // Every byte has a token and the text is not normalized: decoding gives the text back
    // (plus the BOS that add_special puts first).
    const std::string want = (add_special ? "B" : "") + repaired;
    FUZZ_CHECK(tok->Decode(ids, false) == want, "Decode(Encode(text)) is not the text");
    std::string joined;
    for (const std::string& p : pieces) joined += p;
    std::string mapped;
    fedlora::bpe::AppendByteLevel(repaired, &mapped);
    FUZZ_CHECK(joined == mapped, "the pre-tokenizer pieces do not cover the text");
  }
  return 0;
}
