#include "train/lm_data.h"

#include <algorithm>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/status.h"
#include "model/bpe_tokenizer.h"

namespace fedlora {
namespace {

constexpr int32_t kIgnore = -100;
// Prompt tokens kept at the end of a prompt whose middle is cut.
constexpr size_t kPromptTail = 16;

absl::StatusOr<std::string> ResponseText(const nlohmann::json& line, const std::string& field,
                                         const std::string& what) {
  if (!line.contains(field)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no \"", field, "\" field"));
  }
  const nlohmann::json& v = line[field];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": \"", field, "\" is ", std::string(JsonTypeName(v)), ", not a string"));
}

absl::StatusOr<std::vector<ChatMessage>> ConversationOf(const nlohmann::json& line,
                                                        const LmDataOptions& options,
                                                        const std::string& what) {
  if (!line.is_object()) return absl::InvalidArgumentError(what + ": not a JSON object");
  std::vector<ChatMessage> out;
  if (line.contains("messages")) {
    const nlohmann::json& m = line["messages"];
    if (!m.is_array()) return absl::InvalidArgumentError(what + ": \"messages\" is not a list");
    for (const nlohmann::json& item : m) {
      if (!item.is_object()) {
        return absl::InvalidArgumentError(what + ": a message is not an object");
      }
      FEDLORA_ASSIGN_OR_RETURN(std::string role, GetString(item, "role", what));
      FEDLORA_ASSIGN_OR_RETURN(std::string content, GetString(item, "content", what));
      out.push_back({std::move(role), std::move(content)});
    }
    return out;
  }
  if (!line.contains(options.prompt_field)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": neither \"messages\" nor \"", options.prompt_field, "\""));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string prompt, GetString(line, options.prompt_field, what));
  FEDLORA_ASSIGN_OR_RETURN(std::string response, ResponseText(line, options.response_field, what));
  if (!options.system.empty()) out.push_back({"system", options.system});
  out.push_back({"user", std::move(prompt)});
  out.push_back({"assistant", std::move(response)});
  return out;
}

}  // namespace

int64_t LmExample::targets() const {
  return std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l != kIgnore; });
}

absl::StatusOr<LmExample> TokenizeConversation(const std::vector<ChatMessage>& messages,
                                               const DecoderTokenizer& tokenizer, int max_seq_len,
                                               const std::string& what) {
  if (!tokenizer.chat.has_value()) {
    return absl::InvalidArgumentError(
        "the model has no chat template: name one (chatml, smollm2, qwen2 or llama3)");
  }
  if (messages.empty() || messages.back().role != "assistant") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the conversation must end with an assistant message"));
  }
  const ChatTemplate& chat = *tokenizer.chat;
  TrainingTokens tokens =
      TokenizeForTraining(*tokenizer.tokenizer, chat.RenderForTraining(messages));
  const std::vector<ChatMessage> prefix(messages.begin(), messages.end() - 1);
  std::vector<int32_t> prompt = tokenizer.tokenizer->Encode(
      chat.Render(prefix, /*add_generation_prompt=*/true), /*add_special=*/false);
  const size_t limit = static_cast<size_t>(std::max(max_seq_len, 0));
  const size_t total = tokens.ids.size();
  if (total > limit) {
    // Cut the middle of the prompt, keeping its last kPromptTail tokens (the end of the user
    // message and the generation prompt), so that the response stays whole.
    const size_t over = total - limit;
    if (prompt.size() >= kPromptTail + over && prompt.size() <= total) {
      const size_t end = prompt.size() - kPromptTail, begin = end - over;
      tokens.ids.erase(tokens.ids.begin() + begin, tokens.ids.begin() + end);
      tokens.loss_mask.erase(tokens.loss_mask.begin() + begin, tokens.loss_mask.begin() + end);
      prompt.erase(prompt.begin() + begin, prompt.begin() + end);
    }
  }
  LmExample ex;
  const size_t n = std::min(tokens.ids.size(), limit);
  ex.input_ids.assign(tokens.ids.begin(), tokens.ids.begin() + n);
  ex.labels.resize(n);
  for (size_t i = 0; i < n; ++i) ex.labels[i] = tokens.loss_mask[i] ? tokens.ids[i] : kIgnore;
  // The first target cannot be predicted (nothing precedes it); the loss shifts labels by one.
  if (n > 0) ex.labels[0] = kIgnore;
  if (ex.targets() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no response token within max_seq_len ",
                                                   max_seq_len, " (the conversation has ", total,
                                                   " tokens); raise max_seq_len"));
  }
  ex.prompt_ids = std::move(prompt);
  ex.response = messages.back().content;
  return ex;
}

absl::StatusOr<LmDataset> LoadLmDataset(const std::string& path, const DecoderTokenizer& tokenizer,
                                        const LmDataOptions& options) {
  if (!tokenizer.chat.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot read ", path,
        ": the model has no chat template: name one (chatml, smollm2, qwen2 or llama3)"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  LmDataset data;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string what = absl::StrCat(path, ":", n);
    FEDLORA_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(line, what));
    FEDLORA_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, ConversationOf(j, options, what));
    FEDLORA_ASSIGN_OR_RETURN(LmExample ex,
                             TokenizeConversation(messages, tokenizer, options.max_seq_len, what));
    data.examples.push_back(std::move(ex));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  if (data.examples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds no examples"));
  }
  return data;
}

CausalLm::Batch MakeLmBatch(const LmDataset& data, std::span<const int64_t> indices,
                            int32_t pad_id) {
  CausalLm::Batch batch;
  batch.batch_size = static_cast<int>(indices.size());
  size_t longest = 0;
  for (int64_t i : indices) longest = std::max(longest, data.examples[i].input_ids.size());
  batch.seq_len = static_cast<int>(longest);
  const size_t cells = indices.size() * longest;
  batch.input_ids.assign(cells, std::max(pad_id, 0));
  batch.attention_mask.assign(cells, 0);
  batch.labels.assign(cells, kIgnore);
  for (size_t row = 0; row < indices.size(); ++row) {
    const LmExample& ex = data.examples[indices[row]];
    const size_t off = row * longest;
    std::copy(ex.input_ids.begin(), ex.input_ids.end(), batch.input_ids.begin() + off);
    std::copy(ex.labels.begin(), ex.labels.end(), batch.labels.begin() + off);
    std::fill_n(batch.attention_mask.begin() + off, ex.input_ids.size(), 1);
  }
  return batch;
}

}  // namespace fedlora
