// Chat templates of the supported decoder families, rendered natively (no Jinja): ChatML as
// SmolLM2 and Qwen2 use it (each with its default system prompt), plain ChatML, and LLaMA-3's.
// Renders equal what Hugging Face's apply_chat_template gives with the models' real Jinja
// templates (checked by tests/model/bpe_tokenizer_hf_check.py).
//
//   FEDLORA_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Detect(gguf_chat_template));  // or FromName("smollm2")
//   std::string prompt = t.Render({{"user", "Hi!"}}, /*add_generation_prompt=*/true);
//   RenderedChat chat = t.RenderForTraining({{"user", "Hi!"}, {"assistant", "Hello."}});
//   TrainingTokens tt = TokenizeForTraining(*tokenizer, chat);  // loss on the assistant tokens only
//
// What each renders, per message (role and content are inserted verbatim, any role is allowed):
//   chatml, smollm2, qwen2: "<|im_start|>" role "\n" content "<|im_end|>\n"; smollm2 and qwen2
//     first add "<|im_start|>system\n" default-prompt "<|im_end|>\n" when the first message is
//     not a system message. Generation prompt: "<|im_start|>assistant\n".
//   llama3: "<|start_header_id|>" role "<|end_header_id|>\n\n" trim(content) "<|eot_id|>", the
//     first one preceded by "<|begin_of_text|>" (so encode it without add_special); trim is
//     Jinja's (Python's str.strip). Generation prompt: "<|start_header_id|>assistant<|end_header_id|>\n\n".
// Thread-safety: a ChatTemplate is an immutable value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace fedlora {

class BpeTokenizer;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

// A rendered conversation and the byte ranges [begin, end) of its assistant turns: each
// assistant message's (rendered) content and the end-of-turn token after it.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> response_spans;
};

class ChatTemplate {
 public:
  enum class Kind { kChatML, kSmolLM2, kQwen2, kLlama3 };

  // "chatml", "smollm2", "qwen2" or "llama3"; anything else is InvalidArgument listing them.
  static absl::StatusOr<ChatTemplate> FromName(std::string_view name);
  // Recognises a model's Jinja template (GGUF tokenizer.chat_template, tokenizer_config.json's
  // chat_template) by its markers and structure. An unrecognised one (tool-calling templates
  // such as Qwen2.5's, LLaMA-3.1's with its dated system prompt, other families) is
  // InvalidArgument saying that the config can name a template explicitly.
  static absl::StatusOr<ChatTemplate> Detect(std::string_view jinja);
  // FromName when `s` is a template name, else Detect.
  static absl::StatusOr<ChatTemplate> FromNameOrJinja(std::string_view s);

  Kind kind() const { return kind_; }
  std::string_view name() const;
  // The token that closes a turn ("<|im_end|>" or "<|eot_id|>").
  std::string_view end_of_turn() const;
  // The system prompt added when a conversation starts without one ("" for none).
  std::string_view default_system_prompt() const;

  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // Render(messages, false) with the assistant spans.
  RenderedChat RenderForTraining(const std::vector<ChatMessage>& messages) const;

 private:
  explicit ChatTemplate(Kind kind) : kind_(kind) {}
  void RenderInto(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                  RenderedChat* out) const;
  Kind kind_;
};

// A rendered conversation encoded (without add_special: templates write their own BOS) and a
// loss mask, 1 on the response tokens. The prompt and response parts are encoded separately
// and concatenated, so that no token straddles a boundary and each prompt part is tokenized as
// generation sees it (a prompt ending in "<|im_start|>assistant\n"). This equals encoding the
// whole text except where a token would cross a boundary (a response starting with whitespace
// that merges with the "\n" before it).
struct TrainingTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;
};
TrainingTokens TokenizeForTraining(const BpeTokenizer& tokenizer, const RenderedChat& chat);

}  // namespace fedlora
