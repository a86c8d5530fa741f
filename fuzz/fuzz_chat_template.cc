// Fuzzes the decoders' chat templates (model/chat_template.h): ChatTemplate::Detect on a model's
// Jinja text (GGUF tokenizer.chat_template or tokenizer_config.json, both downloaded), and
// Render / RenderForTraining / TokenizeForTraining on conversations a client's data holds
// (any role, any content, any bytes).
//
// Input, through FuzzedDataProvider: a template choice (0-3: FromName chatml, smollm2, qwen2,
// llama3; 4: Detect on a Jinja string of up to 4 KiB, then FromNameOrJinja on it too), then up to
// 8 messages (a role, one of system/user/assistant/tool or a string of up to 16 bytes; content of
// up to 256 bytes).
//
// Checks beyond "no crash, no sanitizer report", as chat_template.h promises:
// - Detect's and FromNameOrJinja's refusals are InvalidArgument with a message;
// - Render(m, false) is RenderForTraining(m).text, and Render(m, true) is that and the
//   template's generation prompt; rendering a conversation's first k messages gives a prefix of
//   rendering all of them;
// - the response spans are one per assistant message, ordered, inside the text, and each holds
//   that message's content (Python-stripped for llama3: a substring of the content, what it drops
//   only whitespace) followed by the end-of-turn token;
// - TokenizeForTraining's ids equal encoding the whole text (with a vocabulary without merges no
//   token can straddle a span boundary), its loss mask is as long and, decoded, the masked ids
//   are the spans' text (for valid UTF-8, which decoding does not rewrite).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/bpe_tokenizer.h"
#include "model/chat_template.h"
#include "model/pretokenize.h"

namespace {

using namespace fedlora;

constexpr const char* kNames[] = {"chatml", "smollm2", "qwen2", "llama3"};
constexpr const char* kRoles[] = {"system", "user", "assistant", "tool"};

// The 256 byte characters and the special tokens of both template families, no merges.
const BpeTokenizer& Tokenizer() {
  static const BpeTokenizer* tok = [] {
    BpeTokenizer::Vocabulary v;
    for (int b = 0; b < 256; ++b) {
      const char c = static_cast<char>(b);
      std::string s;
      bpe::AppendByteLevel(std::string_view(&c, 1), &s);
      v.tokens.push_back(s);
    }
    for (const char* t : {"<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
                          "<|end_header_id|>", "<|eot_id|>"}) {
      v.tokens.emplace_back(t);
    }
    v.token_types.assign(v.tokens.size(), BpeTokenizer::kNormal);
    for (size_t i = 256; i < v.tokens.size(); ++i) v.token_types[i] = BpeTokenizer::kControl;
    auto made = BpeTokenizer::Create(v);
    FUZZ_CHECK(made.ok(), made.status());
    return made->release();
  }();
  return *tok;
}

bool ValidUtf8(const std::string& s) {
  std::string out;
  return !bpe::RepairUtf8(s, &out, nullptr);
}

// Python's str.isspace on the code points the harness decodes itself (valid UTF-8 only).
bool IsSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::u32string Decode32(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    if (i + n > s.size()) {  // cut inside a code point: no string a strip of valid UTF-8 gives
      out.push_back(0xFFFFFFFF);
      break;
    }
    char32_t c = n == 1 ? b : b & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(c);
    i += n;
  }
  return out;
}

// `kept` is `content` Python-stripped: checked on valid UTF-8 with the harness's own decoder.
void CheckStripped(const std::string& content, std::string_view kept) {
  const size_t at = content.find(kept);
  FUZZ_CHECK(at != std::string::npos, "a llama3 span is not a substring of its content");
  if (!ValidUtf8(content)) return;
  const std::u32string all = Decode32(content);
  size_t b = 0, e = all.size();
  while (b < e && IsSpace(all[b])) ++b;
  while (e > b && IsSpace(all[e - 1])) --e;
  FUZZ_CHECK(Decode32(std::string(kept)) == all.substr(b, e - b),
             "llama3 strip differs from Python's: \"" + content + "\"");
}

void CheckSpans(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                const RenderedChat& r) {
  size_t assistant = 0, at = 0;
  const std::string_view eot = t.end_of_turn();
  for (const ChatMessage& m : messages) {
    if (m.role != "assistant") continue;
    FUZZ_CHECK(assistant < r.response_spans.size(), "an assistant message without a span");
    const auto [begin, end] = r.response_spans[assistant++];
    FUZZ_CHECK(at <= begin && begin <= end && end <= r.text.size(),
               "spans out of order or outside the text");
    at = end;
    const std::string_view span = std::string_view(r.text).substr(begin, end - begin);
    FUZZ_CHECK(span.size() >= eot.size() && span.substr(span.size() - eot.size()) == eot,
               "a span does not end with the end-of-turn token");
    const std::string_view content = span.substr(0, span.size() - eot.size());
    if (t.kind() == ChatTemplate::Kind::kLlama3) {
      CheckStripped(m.content, content);
    } else {
      FUZZ_CHECK(content == m.content, "a span is not its message's content");
    }
  }
  FUZZ_CHECK(assistant == r.response_spans.size(), "more spans than assistant messages");
}

void CheckTokens(const RenderedChat& r) {
  const BpeTokenizer& tok = Tokenizer();
  const TrainingTokens tt = TokenizeForTraining(tok, r);
  FUZZ_CHECK(tt.ids.size() == tt.loss_mask.size(), "ids and loss mask differ in length");
  FUZZ_CHECK(tt.ids == tok.Encode(r.text, /*add_special=*/false, /*parse_special=*/true),
             "TokenizeForTraining differs from encoding the whole text");
  std::vector<int32_t> masked;
  for (size_t i = 0; i < tt.ids.size(); ++i) {
    if (tt.loss_mask[i] == 1) masked.push_back(tt.ids[i]);
  }
  std::string spans;
  for (const auto& [b, e] : r.response_spans) spans += r.text.substr(b, e - b);
  if (ValidUtf8(spans))
    FUZZ_CHECK(tok.Decode(masked) == spans, "the masked tokens are not the responses");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int choice = in.ConsumeIntegralInRange<int>(0, 4);
  absl::StatusOr<ChatTemplate> t = absl::UnknownError("unset");
  if (choice < 4) {
    t = ChatTemplate::FromName(kNames[choice]);
    FUZZ_CHECK(t.ok(), t.status());
  } else {
    const std::string jinja = in.ConsumeRandomLengthString(4096);
    t = ChatTemplate::Detect(jinja);
    auto either = ChatTemplate::FromNameOrJinja(jinja);
    FUZZ_TRACE("Detect: %s\n",
               t.ok() ? std::string(t->name()).c_str() : t.status().ToString().c_str());
    for (const auto* s : {&t, &either}) {
      if (!s->ok())
        FUZZ_CHECK(s->status().code() == absl::StatusCode::kInvalidArgument &&
                       !s->status().message().empty(),
                   s->status());
    }
    if (!t.ok()) return 0;
  }
  std::vector<ChatMessage> messages(in.ConsumeIntegralInRange<size_t>(0, 8));
  for (ChatMessage& m : messages) {
    const size_t r = in.ConsumeIntegralInRange<size_t>(0, std::size(kRoles));
    m.role = r < std::size(kRoles) ? kRoles[r] : in.ConsumeRandomLengthString(16);
    m.content = in.ConsumeRandomLengthString(256);
  }

  const std::string plain = t->Render(messages, false);
  const std::string prompted = t->Render(messages, true);
  const RenderedChat training = t->RenderForTraining(messages);
  FUZZ_CHECK(training.text == plain, "RenderForTraining's text differs from Render");
  const std::string gen = t->kind() == ChatTemplate::Kind::kLlama3
                              ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
                              : "<|im_start|>assistant\n";
  FUZZ_CHECK(prompted == plain + gen, "the generation prompt is not appended as documented");
  for (size_t k = 0; k < messages.size(); ++k) {
    const std::vector<ChatMessage> head(messages.begin(), messages.begin() + k);
    FUZZ_CHECK(plain.starts_with(t->Render(head, false)), "rendering a prefix is not a prefix");
  }
  FUZZ_TRACE("%s: %zu messages, %zu spans, %zu bytes\n", std::string(t->name()).c_str(),
             messages.size(), training.response_spans.size(), plain.size());
  CheckSpans(*t, messages, training);
  CheckTokens(training);
  return 0;
}
