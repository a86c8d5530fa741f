// fedlora_bpe_tokenize: a test helper that runs BpeTokenizer (model/bpe_tokenizer.h) and the chat
// templates (model/chat_template.h) over JSON lines on stdin, for tests/model/bpe_tokenizer_hf_check.py.
//
//   fedlora_bpe_tokenize (--tokenizer_json PATH | --vocab_json PATH) [--mode MODE]
//   fedlora_bpe_tokenize (--tokenizer_json PATH | --vocab_json PATH) --bench TEXT_FILE
//
// --vocab_json: a JSON object with BpeTokenizer::Vocabulary's fields (model, pre, tokens,
//   token_types, merges, bos_id, eos_id, unk_id, pad_id, add_bos, add_eos, unknown_bytes_to_unk),
//   passed to Create().
// Modes, one JSON object per input line and per output line:
//   encode (default): {"text": str | "hex": bytes as hex, "add_special": bool, "parse_special": bool}
//                     -> {"ids": [...], "offsets": [[begin, end], ...]}
//   decode:           {"ids": [...], "skip_special": bool} -> {"text": str}
//   pretokenize:      {"text": str | "hex": ...} -> {"pieces": [str, ...]}
//   chat:             {"template": name or Jinja source, "messages": [{"role", "content"}...],
//                      "add_generation_prompt": bool}
//                     -> {"text": str, "spans": [[begin, end], ...], "ids": [...], "mask": [0|1...]}
//                     or {"error": str} when the template is refused.
// --bench: encodes the file's lines and prints bytes, tokens and throughput.
// Exit status: 0, or 2 for bad flags, an unreadable tokenizer or a malformed input line.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/file.h"
#include "core/json.h"
#include "model/bpe_tokenizer.h"
#include "model/chat_template.h"

namespace {

using nlohmann::json;

int Usage() {
  std::fprintf(stderr,
               "usage: fedlora_bpe_tokenize (--tokenizer_json PATH | --vocab_json PATH) "
               "[--mode encode|decode|pretokenize|chat] [--bench FILE]\n");
  return 2;
}

absl::StatusOr<std::unique_ptr<fedlora::BpeTokenizer>> LoadVocabJson(const std::string& path) {
  auto root = fedlora::ReadJsonFile(path);
  if (!root.ok()) return root.status();
  const json& j = *root;
  fedlora::BpeTokenizer::Vocabulary v;
  try {
    if (j.contains("model")) v.model = j["model"].get<std::string>();
    if (j.contains("pre")) v.pre = j["pre"].get<std::string>();
    v.tokens = j.at("tokens").get<std::vector<std::string>>();
    if (j.contains("token_types")) v.token_types = j["token_types"].get<std::vector<int32_t>>();
    if (j.contains("merges")) v.merges = j["merges"].get<std::vector<std::string>>();
    if (j.contains("bos_id")) v.bos_id = j["bos_id"].get<int32_t>();
    if (j.contains("eos_id")) v.eos_id = j["eos_id"].get<int32_t>();
    if (j.contains("unk_id")) v.unk_id = j["unk_id"].get<int32_t>();
    if (j.contains("pad_id")) v.pad_id = j["pad_id"].get<int32_t>();
    if (j.contains("add_bos")) v.add_bos = j["add_bos"].get<bool>();
    if (j.contains("add_eos")) v.add_eos = j["add_eos"].get<bool>();
    if (j.contains("unknown_bytes_to_unk"))
      v.unknown_bytes_to_unk = j["unknown_bytes_to_unk"].get<bool>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(std::string(path) + ": " + e.what());
  }
  return fedlora::BpeTokenizer::Create(std::move(v));
}

bool FromHex(const std::string& hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    out->push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return true;
}

bool InputText(const json& in, std::string* text) {
  if (in.contains("hex") && in["hex"].is_string())
    return FromHex(in["hex"].get<std::string>(), text);
  if (in.contains("text") && in["text"].is_string()) {
    *text = in["text"].get<std::string>();
    return true;
  }
  return false;
}

int Bench(const fedlora::BpeTokenizer& tok, const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(line);
  size_t bytes = 0, tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> ids;
  for (const std::string& line : lines) {
    ids.clear();
    tok.EncodeInto(line, false, true, &ids, nullptr);
    bytes += line.size();
    tokens += ids.size();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu lines, %zu bytes, %zu tokens in %.3f s: %.1f MB/s, %.0f tokens/s\n",
              lines.size(), bytes, tokens, s, bytes / s / 1e6, tokens / s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_json, vocab_json, mode = "encode", bench;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return Usage();
    const std::string value = argv[++i];
    if (arg == "--tokenizer_json") {
      tokenizer_json = value;
    } else if (arg == "--vocab_json") {
      vocab_json = value;
    } else if (arg == "--mode") {
      mode = value;
    } else if (arg == "--bench") {
      bench = value;
    } else {
      return Usage();
    }
  }
  if (tokenizer_json.empty() == vocab_json.empty()) return Usage();
  auto tok = tokenizer_json.empty() ? LoadVocabJson(vocab_json)
                                    : fedlora::BpeTokenizer::FromTokenizerJson(tokenizer_json);
  if (!tok.ok()) {
    std::fprintf(stderr, "fedlora_bpe_tokenize: %s\n", tok.status().ToString().c_str());
    return 2;
  }
  const fedlora::BpeTokenizer& t = **tok;
  if (!bench.empty()) return Bench(t, bench);
  std::ios::sync_with_stdio(false);
  std::string line;
  int64_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    auto parsed = fedlora::ParseJson(line, "stdin line " + std::to_string(line_number));
    if (!parsed.ok() || !parsed->is_object()) {
      std::fprintf(stderr, "fedlora_bpe_tokenize: line %lld: expected a JSON object\n",
                   static_cast<long long>(line_number));
      return 2;
    }
    const json& in = *parsed;
    json out;
    std::string text;
    if (mode == "encode") {
      if (!InputText(in, &text)) return Usage();
      std::vector<int32_t> ids;
      std::vector<fedlora::BpeTokenizer::Offset> offsets;
      t.EncodeInto(text, in.value("add_special", false), in.value("parse_special", true), &ids,
                   &offsets);
      json offs = json::array();
      for (const auto& o : offsets) offs.push_back({o.begin, o.end});
      out = {{"ids", ids}, {"offsets", offs}};
    } else if (mode == "decode") {
      const std::vector<int32_t> ids = in.at("ids").get<std::vector<int32_t>>();
      out = {{"text", t.Decode(ids, in.value("skip_special", false))}};
    } else if (mode == "pretokenize") {
      if (!InputText(in, &text)) return Usage();
      out = {{"pieces", t.PreTokenize(text)}};
    } else if (mode == "chat") {
      std::vector<fedlora::ChatMessage> messages;
      for (const json& m : in.at("messages")) {
        messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
      }
      auto tmpl = fedlora::ChatTemplate::FromNameOrJinja(in.at("template").get<std::string>());
      if (!tmpl.ok()) {
        out = {{"error", std::string(tmpl.status().message())}};
      } else {
        const bool gen = in.value("add_generation_prompt", false);
        const fedlora::RenderedChat r =
            gen ? fedlora::RenderedChat{tmpl->Render(messages, true), {}}
                : tmpl->RenderForTraining(messages);
        json spans = json::array();
        for (const auto& s : r.response_spans) spans.push_back({s.first, s.second});
        const fedlora::TrainingTokens tt = fedlora::TokenizeForTraining(t, r);
        out = {{"text", r.text}, {"spans", spans}, {"ids", tt.ids}, {"mask", tt.loss_mask}};
      }
    } else {
      return Usage();
    }
    // The decoded text is valid UTF-8 (Decode repairs it); replace anything else defensively.
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  }
  return 0;
}
