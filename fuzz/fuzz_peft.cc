// Fuzzes the PEFT adapter loader (model/peft.h: LoadPeftAdapter, ReadPeftLoraOptions): an adapter
// directory as Hugging Face peft writes it, adapter_config.json and adapter_model.safetensors, both
// from outside (a downloaded adapter, or one a user points the client at).
//
// Input, through FuzzedDataProvider: adapter_config.json (a string of up to 4 KiB), then the rest is
// adapter_model.safetensors. Both are written to a directory of this process and loaded into a tiny
// BERT classifier (2 layers, hidden 32, LoRA r 4 on query and value, 3 labels).
//
// Checks beyond "no crash, no sanitizer report", as peft.h promises:
// - a refusal is InvalidArgument, NotFound or DataLoss (a truncated safetensors) with a message, and leaves every trainable value as
//   it was, bit for bit;
// - ReadPeftLoraOptions's refusals are InvalidArgument or NotFound too.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "fuzz/fuzz_util.h"
#include "model/bert.h"
#include "model/peft.h"

namespace {

const std::string& Dir() { return fedlora::fuzz::ScratchDir("peft"); }

fedlora::BertClassifier& Model() {
  static fedlora::BertClassifier* model = [] {
    fedlora::BertConfig c;
    c.vocab_size = 100;
    c.hidden_size = 32;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.intermediate_size = 64;
    c.max_position_embeddings = 64;
    c.type_vocab_size = 2;
    fedlora::ModelOptions o;
    o.num_labels = 3;
    o.lora.rank = 4;
    o.lora.alpha = 8.0f;
    o.lora.dropout = 0.05f;
    o.lora.target_modules = {"query", "value"};
    o.max_batch = 1;
    o.max_seq = 4;
    o.seed = 1;
    o.base_model_name = "tiny";
    auto m = fedlora::BertClassifier::FromRandom(c, o);
    FUZZ_CHECK(m.ok(), m.status());
    return m->release();
  }();
  return *model;
}

// Every trainable value's bits, in order.
std::string Bits(fedlora::BertClassifier& m) {
  std::string out;
  for (const fedlora::Param& p : m.trainable_params()) {
    out.append(reinterpret_cast<const char*>(p.value.data()), p.value.size() * sizeof(float));
  }
  return out;
}

bool Refusal(const absl::Status& s) {
  return (s.code() == absl::StatusCode::kInvalidArgument ||
          s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kDataLoss) &&
         !s.message().empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlora;
  FuzzedDataProvider in(data, size);
  const std::string config = in.ConsumeRandomLengthString(4096);
  const std::string weights = in.ConsumeRemainingBytesAsString();
  FUZZ_CHECK(fedlora::fuzz::WriteFile(Dir() + "/" + kPeftConfigFile, config),
             "cannot write " + Dir());
  FUZZ_CHECK(fedlora::fuzz::WriteFile(Dir() + "/" + kPeftWeightsFile, weights),
             "cannot write " + Dir());

  BertClassifier& model = Model();
  const std::string before = Bits(model);
  const absl::Status loaded = LoadPeftAdapter(Dir(), &model);
  FUZZ_TRACE("%zu + %zu bytes: %s\n", config.size(), weights.size(), loaded.ToString().c_str());
  if (!loaded.ok()) {
    FUZZ_CHECK(Refusal(loaded), loaded);
    FUZZ_CHECK(Bits(model) == before, "a refused adapter changed the model");
  }
  auto options = ReadPeftLoraOptions(Dir());
  if (!options.ok()) FUZZ_CHECK(Refusal(options.status()), options.status());
  return 0;
}
