#include "model/decoder_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/gguf.h"
#include "core/json.h"
#include "core/status.h"

namespace fedlora {
namespace {

bool IsGguf(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

absl::StatusOr<int32_t> OptionalId(const GgufFile& f, const char* key) {
  if (!f.Has(key)) return -1;
  FEDLORA_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v < -1 || v > INT32_MAX)
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", key, " = ", v));
  return static_cast<int32_t>(v);
}

absl::StatusOr<bool> OptionalBool(const GgufFile& f, const char* key, bool fallback) {
  if (!f.Has(key)) return fallback;
  return f.GetBool(key);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizerFromGguf(const GgufFile& f) {
  BpeTokenizer::Vocabulary v;
  FEDLORA_ASSIGN_OR_RETURN(std::string_view model, f.GetString("tokenizer.ggml.model"));
  v.model = std::string(model);
  if (f.Has("tokenizer.ggml.pre")) {
    FEDLORA_ASSIGN_OR_RETURN(std::string_view pre, f.GetString("tokenizer.ggml.pre"));
    v.pre = std::string(pre);
  }
  FEDLORA_ASSIGN_OR_RETURN(auto tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  v.tokens.assign(tokens.begin(), tokens.end());
  if (f.Has("tokenizer.ggml.token_type")) {
    FEDLORA_ASSIGN_OR_RETURN(std::vector<int64_t> types,
                             f.GetIntArray("tokenizer.ggml.token_type"));
    v.token_types.reserve(types.size());
    for (int64_t t : types) {
      if (t < INT32_MIN || t > INT32_MAX)
        return absl::InvalidArgumentError(absl::StrCat(f.path(), ": token type ", t));
      v.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  if (f.Has("tokenizer.ggml.merges")) {
    FEDLORA_ASSIGN_OR_RETURN(auto merges, f.GetStringArray("tokenizer.ggml.merges"));
    v.merges.assign(merges.begin(), merges.end());
  }
  FEDLORA_ASSIGN_OR_RETURN(v.bos_id, OptionalId(f, "tokenizer.ggml.bos_token_id"));
  FEDLORA_ASSIGN_OR_RETURN(v.eos_id, OptionalId(f, "tokenizer.ggml.eos_token_id"));
  FEDLORA_ASSIGN_OR_RETURN(v.unk_id, OptionalId(f, "tokenizer.ggml.unknown_token_id"));
  FEDLORA_ASSIGN_OR_RETURN(v.pad_id, OptionalId(f, "tokenizer.ggml.padding_token_id"));
  FEDLORA_ASSIGN_OR_RETURN(v.add_bos, OptionalBool(f, "tokenizer.ggml.add_bos_token", false));
  FEDLORA_ASSIGN_OR_RETURN(v.add_eos, OptionalBool(f, "tokenizer.ggml.add_eos_token", false));
  auto tok = BpeTokenizer::Create(std::move(v));
  if (!tok.ok())
    return absl::Status(tok.status().code(), absl::StrCat(f.path(), ": ", tok.status().message()));
  return tok;
}

absl::StatusOr<DecoderTokenizer> LoadDecoderTokenizer(const std::string& path,
                                                      const std::string& chat_template) {
  DecoderTokenizer out;
  std::string jinja;
  if (IsGguf(path)) {
    FEDLORA_ASSIGN_OR_RETURN(auto f, GgufFile::Open(path));
    FEDLORA_ASSIGN_OR_RETURN(out.tokenizer, BpeTokenizerFromGguf(*f));
    if (f->Has("tokenizer.chat_template")) {
      FEDLORA_ASSIGN_OR_RETURN(std::string_view t, f->GetString("tokenizer.chat_template"));
      jinja = std::string(t);
    }
  } else {
    FEDLORA_ASSIGN_OR_RETURN(out.tokenizer,
                             BpeTokenizer::FromTokenizerJson(path + "/tokenizer.json"));
    const std::string cfg_path = path + "/tokenizer_config.json";
    if (std::filesystem::exists(cfg_path)) {
      FEDLORA_ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJsonFile(cfg_path));
      FEDLORA_ASSIGN_OR_RETURN(jinja, GetStringOr(cfg, "chat_template", "", cfg_path));
    }
  }
  if (!chat_template.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::FromName(chat_template));
    out.chat = t;
  } else if (!jinja.empty()) {
    auto t = ChatTemplate::Detect(jinja);
    if (!t.ok())
      return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
    out.chat = *t;
  }
  return out;
}

std::vector<int32_t> DecoderTokenizer::stop_ids() const {
  std::vector<int32_t> ids;
  if (tokenizer->eos_id() >= 0) ids.push_back(tokenizer->eos_id());
  if (chat.has_value()) {
    const int32_t eot = tokenizer->TokenToId(std::string(chat->end_of_turn()));
    if (eot >= 0 && std::find(ids.begin(), ids.end(), eot) == ids.end()) ids.push_back(eot);
  }
  return ids;
}

absl::StatusOr<DecoderTokenizer> LoadChatTokenizer(const std::string& path,
                                                   const std::string& chat_template) {
  FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer tok, LoadDecoderTokenizer(path, chat_template));
  if (!tok.chat.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " has no chat template: name one (--chat-template, or "
                     "task.chat_template in a run config): chatml, smollm2, qwen2 or llama3"));
  }
  return tok;
}

}  // namespace fedlora
