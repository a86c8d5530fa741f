// fedlora_tokenize: a test helper that runs WordPieceTokenizer over stdin, one input per line,
// for tests/model/tokenizer_hf_check.py.
//
//   fedlora_tokenize (--tokenizer_json PATH | --vocab PATH [--cased]) [--json] [--words]
//                    [--max_length N]
//
// Plain mode: each line is a text; prints its Encode() input_ids, space-separated.
// --json: each line is a JSON object {"text": str, "pair": str|null, "max_length": int} (pair and
//   max_length optional; max_length overrides --max_length), so that texts can hold newlines and
//   control characters; prints {"input_ids": [...], "token_type_ids": [...], "attention_mask": [...]}.
// --words: prints the JSON array of BasicTokenize(text) (normalized words) instead.
// Exit status: 0, or 2 for bad flags, an unreadable tokenizer or a malformed input line.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/json.h"
#include "model/tokenizer.h"

namespace {

int Usage() {
  std::fprintf(
      stderr,
      "usage: fedlora_tokenize (--tokenizer_json PATH | --vocab PATH [--cased]) [--json] [--words] "
      "[--max_length N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_json, vocab;
  bool cased = false, json_mode = false, words_mode = false;
  int max_length = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--tokenizer_json" || arg == "--vocab" || arg == "--max_length") {
      const char* v = value();
      if (v == nullptr) return Usage();
      if (arg == "--tokenizer_json") tokenizer_json = v;
      if (arg == "--vocab") vocab = v;
      if (arg == "--max_length") max_length = std::atoi(v);
    } else if (arg == "--cased") {
      cased = true;
    } else if (arg == "--json") {
      json_mode = true;
    } else if (arg == "--words") {
      words_mode = true;
    } else {
      return Usage();
    }
  }
  if (tokenizer_json.empty() == vocab.empty()) return Usage();
  auto tok = tokenizer_json.empty()
                 ? fedlora::WordPieceTokenizer::FromVocabFile(vocab, !cased)
                 : fedlora::WordPieceTokenizer::FromTokenizerJson(tokenizer_json);
  if (!tok.ok()) {
    std::fprintf(stderr, "fedlora_tokenize: %s\n", tok.status().ToString().c_str());
    return 2;
  }
  std::ios::sync_with_stdio(false);
  std::string line;
  int64_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    std::string text = line;
    std::optional<std::string> pair;
    int line_max_length = max_length;
    if (json_mode) {
      auto parsed = fedlora::ParseJson(line, "stdin line " + std::to_string(line_number));
      if (!parsed.ok() || !parsed->is_object() || !parsed->contains("text") ||
          !(*parsed)["text"].is_string()) {
        std::fprintf(stderr, "fedlora_tokenize: line %lld: expected {\"text\": string, ...}\n",
                     static_cast<long long>(line_number));
        return 2;
      }
      text = (*parsed)["text"].get<std::string>();
      if (parsed->contains("pair") && (*parsed)["pair"].is_string())
        pair = (*parsed)["pair"].get<std::string>();
      if (parsed->contains("max_length") && (*parsed)["max_length"].is_number_integer()) {
        line_max_length = (*parsed)["max_length"].get<int>();
      }
    }
    if (words_mode) {
      std::cout << nlohmann::json((*tok)->BasicTokenize(text)).dump() << '\n';
      continue;
    }
    const auto e = (*tok)->Encode(
        text, pair ? std::optional<std::string_view>(*pair) : std::nullopt, line_max_length);
    if (json_mode) {
      nlohmann::json out = {{"input_ids", e.input_ids},
                            {"token_type_ids", e.token_type_ids},
                            {"attention_mask", e.attention_mask}};
      std::cout << out.dump() << '\n';
    } else {
      for (size_t i = 0; i < e.input_ids.size(); ++i) std::cout << (i ? " " : "") << e.input_ids[i];
      std::cout << '\n';
    }
  }
  return 0;
}
