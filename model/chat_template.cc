#include "model/chat_template.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/did_you_mean.h"
#include "core/strings.h"
#include "core/utf8.h"
#include "model/bpe_tokenizer.h"

namespace fedlora {
namespace {

constexpr std::string_view kSmolLMSystem =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
constexpr std::string_view kQwen2System = "You are a helpful assistant.";
constexpr std::string_view kNames = "chatml, smollm2, qwen2, llama3";

// Python's str.isspace, which Jinja's trim (str.strip) uses.
bool IsPythonSpace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return true;
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point of the well-formed UTF-8 sequence of exactly `len` bytes at s[i, i + len), or -1
// when there is none (so that a space is never read out of part of U+2020 or U+0800).
int64_t CodePointAt(std::string_view s, size_t i, size_t len) {
  if (i + len > s.size()) return -1;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (Utf8SequenceLength(p, len) != static_cast<int>(len)) return -1;
  size_t n = 0;
  return DecodeUtf8At(s, i, &n);
}

// Bytes of the whitespace code point that ends at `end` (0 if none). Spaces are 1 to 3 bytes.
size_t SpaceEndingAt(std::string_view s, size_t end) {
  for (size_t len = 1; len <= 3 && len <= end; ++len) {
    const int64_t c = CodePointAt(s, end - len, len);
    if (c >= 0 && IsPythonSpace(static_cast<char32_t>(c))) return len;
  }
  return 0;
}

size_t SpaceStartingAt(std::string_view s, size_t begin) {
  for (size_t len = 1; len <= 3; ++len) {
    const int64_t c = CodePointAt(s, begin, len);
    if (c >= 0 && IsPythonSpace(static_cast<char32_t>(c))) return len;
  }
  return 0;
}

std::string_view PythonStrip(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e) {
    const size_t n = SpaceStartingAt(s, b);
    if (n == 0 || b + n > e) break;
    b += n;
  }
  while (e > b) {
    const size_t n = SpaceEndingAt(s, e);
    if (n == 0 || e - n < b) break;
    e -= n;
  }
  return s.substr(b, e - b);
}

// The template with real newlines written as "\n" escapes, no whitespace, one quote style and
// message.x written message['x']: the form the structural checks look for.
std::string Canonical(std::string_view jinja) {
  std::string out;
  out.reserve(jinja.size());
  for (char c : jinja) {
    if (c == '\n') {
      out.append("\\n");
    } else if (c == ' ' || c == '\t' || c == '\r') {
      continue;
    } else {
      out.push_back(c == '"' ? '\'' : c);
    }
  }
  for (auto [from, to] :
       {std::pair<std::string_view, std::string_view>{"message.role", "message['role']"},
        {"message.content", "message['content']"}}) {
    for (size_t p = out.find(from); p != std::string::npos; p = out.find(from, p + to.size())) {
      out.replace(p, from.size(), to);
    }
  }
  return out;
}

bool Has(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

absl::Status Unrecognised(std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template not recognised (", ToAbsl(why),
                   "); name one explicitly in the config: ", ToAbsl(kNames)));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromName(std::string_view typed) {
  const std::string name =
      absl::AsciiStrToLower(ToAbsl(typed));  // any case, as the config's enum values
  if (name == "chatml") return ChatTemplate(Kind::kChatML);
  if (name == "smollm2") return ChatTemplate(Kind::kSmolLM2);
  if (name == "qwen2") return ChatTemplate(Kind::kQwen2);
  if (name == "llama3") return ChatTemplate(Kind::kLlama3);
  std::string message = absl::StrCat("chat template '", ToAbsl(typed),
                                     "' is unknown; known: ", ToAbsl(kNames), " (any case)");
  if (auto near = NearestName(name, {"chatml", "smollm2", "qwen2", "llama3"})) {
    absl::StrAppend(&message, "; did you mean ", *near, "?");
  }
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<ChatTemplate> ChatTemplate::Detect(std::string_view jinja) {
  const std::string c = Canonical(jinja);
  if (Has(c, "<|im_start|>")) {
    if (Has(c, "tools") || Has(c, "tool_call"))
      return Unrecognised("a ChatML template with tool calling");
    const bool turn =
        Has(c, "'<|im_start|>'+message['role']+'\\n'+message['content']+'<|im_end|>'+'\\n'") ||
        Has(c, "'<|im_start|>'+message['role']+'\\n'+message['content']+'<|im_end|>\\n'");
    const bool generation =
        Has(c, "{%ifadd_generation_prompt%}{{'<|im_start|>assistant\\n'}}{%endif%}");
    if (!turn || !generation || Has(c, "loop.last"))
      return Unrecognised("ChatML markers with another structure");
    const bool system_first = Has(c, "{%ifloop.firstandmessages[0]['role']!='system'%}");
    auto default_system = [&](std::string_view prompt) {
      std::string squeezed(prompt);
      squeezed.erase(std::remove(squeezed.begin(), squeezed.end(), ' '), squeezed.end());
      return system_first && Has(c, absl::StrCat("{{'<|im_start|>system\\n", squeezed,
                                                 "<|im_end|>\\n'}}{%endif%}"));
    };
    if (default_system(kSmolLMSystem)) return ChatTemplate(Kind::kSmolLM2);
    if (default_system(kQwen2System)) return ChatTemplate(Kind::kQwen2);
    if (system_first || Has(c, "system\\n"))
      return Unrecognised("ChatML with an unknown default system prompt");
    return ChatTemplate(Kind::kChatML);
  }
  if (Has(c, "<|start_header_id|>") && Has(c, "<|eot_id|>")) {
    if (Has(c, "CuttingKnowledgeDate") || Has(c, "tools") || Has(c, "ipython")) {
      return Unrecognised("LLaMA-3.1+ with tools and a dated system prompt");
    }
    const bool turn = Has(
        c,
        "'<|start_header_id|>'+message['role']+'<|end_header_id|>\\n\\n'+message['content']|trim+"
        "'<|eot_id|>'");
    const bool bos = Has(c, "{%ifloop.index0==0%}{%setcontent=bos_token+content%}{%endif%}");
    const bool generation = Has(
        c, "{%ifadd_generation_prompt%}{{'<|start_header_id|>assistant<|end_header_id|>\\n\\n'}}");
    if (!turn || !bos || !generation) return Unrecognised("LLaMA-3 markers with another structure");
    return ChatTemplate(Kind::kLlama3);
  }
  return Unrecognised("no ChatML or LLaMA-3 markers");
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromNameOrJinja(std::string_view s) {
  auto named = FromName(s);
  if (named.ok()) return named;
  return Detect(s);
}

std::string_view ChatTemplate::name() const {
  switch (kind_) {
    case Kind::kChatML:
      return "chatml";
    case Kind::kSmolLM2:
      return "smollm2";
    case Kind::kQwen2:
      return "qwen2";
    case Kind::kLlama3:
      return "llama3";
  }
  return "";
}

std::string_view ChatTemplate::end_of_turn() const {
  return kind_ == Kind::kLlama3 ? "<|eot_id|>" : "<|im_end|>";
}

std::string_view ChatTemplate::default_system_prompt() const {
  if (kind_ == Kind::kSmolLM2) return kSmolLMSystem;
  if (kind_ == Kind::kQwen2) return kQwen2System;
  return "";
}

void ChatTemplate::RenderInto(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                              RenderedChat* out) const {
  std::string& t = out->text;
  const std::string_view eot = end_of_turn();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string_view content = m.content;
    if (kind_ == Kind::kLlama3) {
      if (i == 0) t.append("<|begin_of_text|>");
      absl::StrAppend(&t, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n");
      content = PythonStrip(content);
    } else {
      if (i == 0 && m.role != "system" && !default_system_prompt().empty()) {
        absl::StrAppend(&t, "<|im_start|>system\n", ToAbsl(default_system_prompt()),
                        "<|im_end|>\n");
      }
      absl::StrAppend(&t, "<|im_start|>", m.role, "\n");
    }
    const size_t begin = t.size();
    absl::StrAppend(&t, ToAbsl(content), ToAbsl(eot));
    if (m.role == "assistant") out->response_spans.emplace_back(begin, t.size());
    if (kind_ != Kind::kLlama3) t.push_back('\n');
  }
  if (add_generation_prompt) {
    t.append(kind_ == Kind::kLlama3 ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
                                    : "<|im_start|>assistant\n");
  }
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  RenderedChat out;
  RenderInto(messages, add_generation_prompt, &out);
  return std::move(out.text);
}

RenderedChat ChatTemplate::RenderForTraining(const std::vector<ChatMessage>& messages) const {
  RenderedChat out;
  RenderInto(messages, false, &out);
  return out;
}

TrainingTokens TokenizeForTraining(const BpeTokenizer& tokenizer, const RenderedChat& chat) {
  TrainingTokens out;
  const std::string_view text = chat.text;
  auto encode = [&](size_t begin, size_t end, uint8_t mask) {
    if (begin >= end) return;
    tokenizer.EncodeInto(text.substr(begin, end - begin), /*add_special=*/false,
                         /*parse_special=*/true, &out.ids, nullptr);
    out.loss_mask.resize(out.ids.size(), mask);
  };
  size_t at = 0;
  for (const auto& [begin, end] : chat.response_spans) {
    encode(at, begin, 0);
    encode(begin, end, 1);
    at = end;
  }
  encode(at, text.size(), 0);
  return out;
}

}  // namespace fedlora
