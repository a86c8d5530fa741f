// Fuzzes the reader of a model's config.json (model/bert_config.h: ParseJson + ParseBertConfig):
// model directories are downloaded, and the config decides every size the model allocates.
//
// Checks beyond "no crash, no sanitizer report": every refusal is InvalidArgument, and a config
// that parses passes Validate() and has sizes the model code can use (positive, hidden_size a
// multiple of the head count, a non-negative sequence length).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/json.h"
#include "fuzz/fuzz_util.h"
#include "model/bert_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlora;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto json = ParseJson(text, "config.json");
  if (!json.ok()) {
    FUZZ_CHECK(json.status().code() == absl::StatusCode::kInvalidArgument, json.status());
    return 0;
  }
  auto config = ParseBertConfig(*json, "config.json");
  FUZZ_TRACE("%s\n", config.status().ToString().c_str());
  if (!config.ok()) {
    FUZZ_CHECK(config.status().code() == absl::StatusCode::kInvalidArgument, config.status());
    return 0;
  }
  absl::Status valid = config->Validate();
  FUZZ_CHECK(valid.ok(), valid);
  FUZZ_CHECK(config->vocab_size > 0 && config->hidden_size > 0 && config->num_hidden_layers > 0 &&
                 config->num_attention_heads > 0 && config->intermediate_size > 0,
             "a size is not positive");
  FUZZ_CHECK(config->hidden_size % config->num_attention_heads == 0,
             "hidden_size is not a multiple of the heads");
  FUZZ_CHECK(config->max_sequence_length() >= 0, "negative sequence length");
  (void)config->head_dim();
  return 0;
}
