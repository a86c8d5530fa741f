// The tokenizer and chat template that belong to a decoder checkpoint:
//   a .gguf file: tokenizer.ggml.{model, pre, tokens, token_type, merges, bos/eos/unknown/
//     padding_token_id, add_bos_token, add_eos_token} and tokenizer.chat_template;
//   a directory: tokenizer.json, and the chat_template of tokenizer_config.json.
//
//   FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer t, LoadDecoderTokenizer(model_path, /*chat_template=*/""));
//   std::string prompt = t.chat->Render({{"user", "Define ammonite."}}, /*add_generation_prompt=*/true);
//   std::vector<int32_t> ids = t.tokenizer->Encode(prompt);
//
// `chat_template` names a template ("chatml", "smollm2", "qwen2", "llama3") to use instead of the
// checkpoint's; empty means the checkpoint's, recognised by ChatTemplate::Detect. A checkpoint
// without a template leaves `chat` empty; one whose template is not recognised is an error that
// says to name one.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/bpe_tokenizer.h"
#include "model/chat_template.h"

namespace fedlora {

class GgufFile;

struct DecoderTokenizer {
  std::unique_ptr<BpeTokenizer> tokenizer;
  std::optional<ChatTemplate> chat;

  // The ids that end a generation: the end-of-sequence token and the chat template's end-of-turn
  // token, those the vocabulary has.
  std::vector<int32_t> stop_ids() const;
};

absl::StatusOr<DecoderTokenizer> LoadDecoderTokenizer(const std::string& path,
                                                      const std::string& chat_template);
// The same, for conversations: InvalidArgument when the result has no chat template (the
// checkpoint has none and `chat_template` names none).
absl::StatusOr<DecoderTokenizer> LoadChatTokenizer(const std::string& path,
                                                   const std::string& chat_template);
// The GGUF part, for a file already open.
absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizerFromGguf(const GgufFile& file);

}  // namespace fedlora
