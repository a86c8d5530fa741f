// Instruction-tuning data for causal LMs: JSONL conversations tokenized with the model's chat
// template, the loss on the response tokens only.
//
//   FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer tok, LoadDecoderTokenizer(model_path, ""));
//   LmDataOptions o;  o.max_seq_len = 256;
//   FEDLORA_ASSIGN_OR_RETURN(LmDataset train, LoadLmDataset("data/x/train.jsonl", tok, o));
//   CausalLm::Batch batch = MakeLmBatch(train, indices, tok.tokenizer->pad_id());
//
// Each non-blank line is one JSON object, either
//   {"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...]}
//     every assistant turn is a response; the last message must be the assistant's; or
//   {"prompt": "...", "response": "..."}   (field names from LmDataOptions; a non-negative integer
//     or a string, e.g. a label, is taken as the response text), rendered as one user turn (after
//     the optional system message) and one assistant turn.
// The response tokens are each assistant content and the end-of-turn token after it (what the
// model must learn to emit so that generation stops). A conversation longer than max_seq_len
// tokens loses the middle of its prompt (the start and the last 16 prompt tokens stay) so that the
// last response stays whole; when that is not enough it is cut at max_seq_len, and one that then
// keeps no response token is an error naming the line.
//
// Errors (InvalidArgument naming file:line unless said otherwise): NotFound for a missing file;
// a checkpoint without a chat template (name one); malformed JSON; a line without messages or
// without the prompt and response fields; a message without string role and content; a
// conversation not ending with an assistant message; an empty file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/chat_template.h"
#include "model/decoder.h"
#include "model/decoder_tokenizer.h"
#include "train/training_defaults.h"

namespace fedlora {

struct LmExample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;      // input_ids on response tokens, -100 elsewhere
  std::vector<int32_t> prompt_ids;  // the conversation before the last response, with the
                                    // generation prompt: what generation starts from
  std::string response;             // the last assistant message, for exact-match scoring
  int64_t targets() const;          // labels that are not -100
};

struct LmDataset {
  std::vector<LmExample> examples;
  int64_t size() const { return static_cast<int64_t>(examples.size()); }
};

struct LmDataOptions {
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  std::string system;  // a system message put before each prompt/response pair ("": none)
  int max_seq_len = kDecoderDefaultMaxSeqLen;
};

absl::StatusOr<LmDataset> LoadLmDataset(const std::string& path, const DecoderTokenizer& tokenizer,
                                        const LmDataOptions& options);

// Tokenizes one conversation (as a line of the file would be). InvalidArgument, prefixed by
// `what`, when it does not end with an assistant message or keeps no response token.
absl::StatusOr<LmExample> TokenizeConversation(const std::vector<ChatMessage>& messages,
                                               const DecoderTokenizer& tokenizer, int max_seq_len,
                                               const std::string& what);

// Right-pads examples[indices] to the longest of them (ids with pad_id, labels with -100, mask 0).
CausalLm::Batch MakeLmBatch(const LmDataset& data, std::span<const int64_t> indices,
                            int32_t pad_id);

}  // namespace fedlora
