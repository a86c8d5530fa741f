// Fuzzes the tokenizer loaders (model/tokenizer.h: vocab.txt and tokenizer.json) and then the
// tokenizer itself on text from the same input: model directories are downloaded, and the text is
// training data from a client's own files.
//
// The loaders take only paths, so each input's file is written to a private temporary file first.
//
// Input: byte 0 picks the file kind (vocab.txt lower-cased, vocab.txt cased, tokenizer.json);
// then, through FuzzedDataProvider, the text, an optional pair text and max_length; the rest is
// the file.
//
// Checks beyond "no crash, no sanitizer report": an encoding is [CLS] ... [SEP] (... [SEP]) with
// ids inside the vocabulary, token types and mask of the same length, and no longer than
// max_length allows; Tokenize and TokenizeToIds agree.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "fuzz/fuzz_util.h"
#include "model/tokenizer.h"

namespace {

// One file per process (libFuzzer -jobs/-workers run several) in its scratch directory.
const std::string& TempPath() {
  static const std::string* path =
      new std::string(fedlora::fuzz::ScratchDir("tokenizer") + "/tokenizer.json");
  return *path;
}

using fedlora::fuzz::WriteFile;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlora;
  if (size == 0) return 0;
  const int kind = data[0] % 3;
  FuzzedDataProvider in(data + 1, size - 1);
  const std::string text = in.ConsumeRandomLengthString(1024);
  std::optional<std::string> pair;
  if (in.ConsumeBool()) pair = in.ConsumeRandomLengthString(1024);
  const int max_length = in.ConsumeIntegralInRange<int>(-1, 64);
  const std::string file = in.ConsumeRemainingBytesAsString();

  const std::string& path = TempPath();
  FUZZ_CHECK(WriteFile(path, file), "cannot write " + path);
  auto tok = kind == 2 ? WordPieceTokenizer::FromTokenizerJson(path)
                       : WordPieceTokenizer::FromVocabFile(path, /*do_lower_case=*/kind == 0);
  FUZZ_TRACE("kind %d, %zu file bytes: %s\n", kind, file.size(), tok.status().ToString().c_str());
  if (!tok.ok()) {
    FUZZ_CHECK(tok.status().code() == absl::StatusCode::kInvalidArgument, tok.status());
    return 0;
  }
  const WordPieceTokenizer& t = **tok;
  const int64_t vocab = t.vocab_size();
  auto in_vocab = [&](int32_t id) { return id >= 0 && id < vocab; };
  FUZZ_CHECK(
      in_vocab(t.cls_id()) && in_vocab(t.sep_id()) && in_vocab(t.pad_id()) && in_vocab(t.unk_id()),
      "");

  std::optional<std::string_view> pair_view;
  if (pair) pair_view = *pair;
  const WordPieceTokenizer::Encoding e = t.Encode(text, pair_view, max_length);
  const size_t n = e.input_ids.size();
  FUZZ_TRACE("text %zu bytes, pair %d, max_length %d: %zu ids\n", text.size(), pair ? 1 : 0,
             max_length, n);
  const size_t specials = pair ? 3 : 2;
  FUZZ_CHECK(n >= specials && e.token_type_ids.size() == n && e.attention_mask.size() == n, "");
  FUZZ_CHECK(e.input_ids.front() == t.cls_id() && e.input_ids.back() == t.sep_id(), "");
  if (max_length > 0)
    FUZZ_CHECK(n <= std::max<size_t>(static_cast<size_t>(max_length), specials), "");
  for (size_t i = 0; i < n; ++i) {
    FUZZ_CHECK(in_vocab(e.input_ids[i]), "id out of the vocabulary");
    FUZZ_CHECK(e.attention_mask[i] == 1, "");
    FUZZ_CHECK(e.token_type_ids[i] == 0 || (pair && e.token_type_ids[i] == 1), "");
  }

  const std::vector<std::string> tokens = t.Tokenize(text);
  const std::vector<int32_t> ids = t.TokenizeToIds(text);
  FUZZ_CHECK(tokens.size() == ids.size(), "Tokenize and TokenizeToIds disagree on the count");
  for (size_t i = 0; i < ids.size(); ++i) {
    FUZZ_CHECK(in_vocab(ids[i]), "id out of the vocabulary");
    FUZZ_CHECK(t.TokenToId(tokens[i]) == ids[i] || ids[i] == t.unk_id(), "token " + tokens[i]);
  }
  (void)t.BasicTokenize(text);
  return 0;
}
