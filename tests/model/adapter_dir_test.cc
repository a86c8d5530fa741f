// model/adapter_dir.h: every adapter directory carries its labels, max_seq_len and prompt
// settings, reads back, replaces an earlier adapter whole and never a directory of other files;
// and the PEFT config built from LoRA settings alone equals the one of a model built with them.
#include "model/adapter_dir.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/file.h"
#include "core/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf_writer.h"
#include "model/peft.h"
#include "tests/model/tiny_checkpoint.h"
#include "tests/model/tiny_decoder.h"

namespace fedlora {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_util::MakeTempDir;

std::unique_ptr<BertClassifier> Classifier(std::vector<std::string> targets, int labels = 3) {
  ModelOptions o;
  o.num_labels = labels;
  o.lora.rank = 4;
  o.lora.target_modules = std::move(targets);
  o.max_batch = 1;
  o.max_seq = 4;
  auto m = BertClassifier::FromRandom(testing_util::TinyConfig(), o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

AdapterMetadata Meta(const std::string& base) {
  return {.task = AdapterTask::kSequenceClassification,
          .base_model = base,
          .label_names = {"red", "green", "blue"},
          .max_seq_len = 24,
          .run_id = "r",
          .round = 7};
}

nlohmann::json Json(const std::string& path) {
  auto j = ReadJsonFile(path);
  EXPECT_TRUE(j.ok()) << j.status();
  return j.value_or(nlohmann::json());
}

TEST(AdapterDir, WritesEverythingNeededAndReadsItBack) {
  const std::string tmp = MakeTempDir("adapter_dir"), base = tmp + "/base",
                    dir = tmp + "/out/adapter";
  fs::create_directories(base);
  auto m = Classifier({"query", "value"});
  ASSERT_TRUE(SaveAdapterDirectory(*m, Meta(base), dir).ok());
  EXPECT_EQ(Json(dir + "/labels.json"),
            nlohmann::json({{"label_names", {"red", "green", "blue"}},
                            {"id2label", {{"0", "red"}, {"1", "green"}, {"2", "blue"}}},
                            {"label2id", {{"red", 0}, {"green", 1}, {"blue", 2}}}}));
  const nlohmann::json meta = Json(dir + "/fedlora_adapter.json");
  EXPECT_EQ(meta["max_seq_len"], 24);
  EXPECT_EQ(meta["task"], "sequence_classification");
  EXPECT_EQ(meta["base_model"], base);
  EXPECT_EQ(meta["run_id"], "r");
  EXPECT_EQ(meta["round"], 7);
  EXPECT_EQ(Json(dir + "/adapter_config.json")["base_model_name_or_path"], base);
  EXPECT_NE(fs::status(dir).permissions() & fs::perms::others_read,
            fs::perms::none);  // not mkdtemp's 0700
  auto info = ReadAdapterMetadata(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->label_names, (std::vector<std::string>{"red", "green", "blue"}));
  EXPECT_EQ(info->max_seq_len, 24);
  EXPECT_FALSE(info->system_prompt.has_value());
  // The PEFT reader loads it; a relative base is recorded absolute.
  auto other = Classifier({"query", "value"});
  EXPECT_TRUE(LoadPeftAdapter(dir, other.get()).ok());
  const fs::path cwd = fs::current_path();
  fs::current_path(tmp);
  const absl::Status relative = SaveAdapterDirectory(*m, Meta("base"), "rel");
  fs::current_path(cwd);
  ASSERT_TRUE(relative.ok()) << relative;
  EXPECT_EQ(Json(tmp + "/rel/adapter_config.json")["base_model_name_or_path"], base);
  fs::remove_all(tmp);
}

// A GGUF base: PEFT cannot load a .gguf, so adapter_config.json names the Hugging Face repo the
// GGUF was converted from when it records one (a model URL), else the directory holding it;
// fedlora_adapter.json keeps the exact file.
TEST(AdapterDir, NamesAGgufBaseAsPeftCanUseIt) {
  const std::string tmp = MakeTempDir("adapter_dir");
  auto gguf = [&](const std::string& name, const std::string& key, const std::string& url) {
    GgufWriter w;
    w.AddString("general.architecture", "llama");
    if (!key.empty()) w.AddString(key, url);
    EXPECT_TRUE(w.WriteFile(tmp + "/" + name).ok());
    return tmp + "/" + name;
  };
  const float value = 0.5f;
  const std::vector<SafetensorsTensorToWrite> tensors = {
      {"x", DType::kF32, {1}, &value, sizeof(float)}};
  auto peft_base = [&](const std::string& base) {
    const AdapterMetadata meta{.task = AdapterTask::kCausalLm,
                               .base_model = base,
                               .max_seq_len = 8,
                               .chat_template = "chatml"};
    const absl::Status s =
        WriteAdapterDirectory(tmp + "/adapter", tensors, {{"peft_type", "LORA"}}, meta);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(Json(tmp + "/adapter/fedlora_adapter.json")["base_model"], base);
    return Json(tmp + "/adapter/adapter_config.json")["base_model_name_or_path"].get<std::string>();
  };
  EXPECT_EQ(peft_base(gguf("a.gguf", "general.source.repo_url",
                           "https://huggingface.co/HuggingFaceTB/SmolLM2-135M")),
            "HuggingFaceTB/SmolLM2-135M");
  EXPECT_EQ(
      peft_base(gguf("b.gguf", "general.source.url", "https://huggingface.co/Qwen/Qwen2-0.5B/")),
      "Qwen/Qwen2-0.5B");
  EXPECT_EQ(peft_base(gguf("c.gguf", "", "")), tmp);
  EXPECT_EQ(peft_base(gguf("d.gguf", "general.source.url", "https://example.com/Qwen/Qwen2-0.5B")),
            tmp);
  EXPECT_EQ(peft_base(gguf("e.gguf", "general.source.url",
                           "https://huggingface.co/Qwen/Qwen2-0.5B/tree/main")),
            tmp);
  // general.base_model.* names the model this one was fine-tuned from: not this base.
  EXPECT_EQ(peft_base(gguf("f.gguf", "general.base_model.0.repo_url",
                           "https://huggingface.co/org/parent")),
            tmp);
  fs::remove_all(tmp);
}

TEST(AdapterDir, ReplacesAnAdapterWholeAndNothingElse) {
  const std::string tmp = MakeTempDir("adapter_dir"), dir = tmp + "/adapter";
  auto m = Classifier({"query", "value"});
  AdapterMetadata meta = Meta(tmp);
  ASSERT_TRUE(SaveAdapterDirectory(*m, meta, dir).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/stale.txt", "from before").ok());
  meta.max_seq_len = 32;
  ASSERT_TRUE(SaveAdapterDirectory(*m, meta, dir).ok());
  EXPECT_EQ(Json(dir + "/fedlora_adapter.json")["max_seq_len"], 32);
  EXPECT_FALSE(fs::exists(dir + "/stale.txt"));  // the old directory went as a whole
  int entries = 0;
  for (const auto& e : fs::directory_iterator(tmp))
    entries += e.path().filename() == "adapter" ? 0 : 1;
  EXPECT_EQ(entries, 0);  // no temporary directory left beside it

  const std::string notes = tmp + "/notes";
  fs::create_directories(notes);
  ASSERT_TRUE(WriteFileAtomically(notes + "/keep.txt", "mine").ok());
  const absl::Status refused = SaveAdapterDirectory(*m, meta, notes);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("not an adapter directory"));
  EXPECT_TRUE(fs::exists(notes + "/keep.txt"));
  fs::remove_all(tmp);
}

TEST(AdapterDir, RefusesMetadataThatDoesNotFit) {
  const std::string tmp = MakeTempDir("adapter_dir");
  auto m = Classifier({"query", "value"});
  auto expect_refused = [&](AdapterMetadata meta, const std::string& words) {
    const absl::Status s = SaveAdapterDirectory(*m, meta, tmp + "/a");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << words;
    EXPECT_THAT(std::string(s.message()), HasSubstr(words));
  };
  AdapterMetadata meta = Meta(tmp);
  meta.label_names = {"red", "green"};
  expect_refused(meta, "2 label names for a classifier of 3 rows");
  meta.label_names = {"red", "red", "blue"};
  expect_refused(meta, "distinct");
  meta = Meta(tmp);
  meta.max_seq_len = 0;
  expect_refused(meta, "max_seq_len 0");
  meta = Meta(tmp + "/missing");
  expect_refused(meta, "does not exist");
  EXPECT_FALSE(fs::exists(tmp + "/a"));
  fs::remove_all(tmp);
}

// `fedlora export` builds the PEFT config without a model: the same object as a model's.
TEST(AdapterDir, PeftConfigFromSettingsEqualsTheModels) {
  for (const std::vector<std::string>& targets : {std::vector<std::string>{"value", "query"},
                                                  {"output", "query"},
                                                  {"intermediate", "attn_out", "output"}}) {
    auto m = Classifier(targets);
    auto from_settings = PeftEncoderAdapterConfig(m->options().lora, m->options().base_model_name);
    ASSERT_TRUE(from_settings.ok()) << from_settings.status();
    EXPECT_EQ(*from_settings, PeftAdapterConfig(*m));
  }
  DecoderOptions o;
  o.lora.rank = 4;
  o.lora.target_modules = {"down_proj", "q_proj", "v_proj"};
  o.max_batch = 1;
  o.max_seq = 8;
  auto base = DecoderBase::FromRandom(testing_util::TinyDecoderConfig(), o);
  ASSERT_TRUE(base.ok());
  auto lm = CausalLm::Create(*base, o);
  ASSERT_TRUE(lm.ok());
  auto from_settings = PeftDecoderAdapterConfig(o.lora, o.base_model_name);
  ASSERT_TRUE(from_settings.ok());
  EXPECT_EQ(*from_settings, PeftAdapterConfig(**lm));
  LoraOptions bad;
  bad.target_modules = {"qeury"};
  EXPECT_EQ(PeftEncoderAdapterConfig(bad, "").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
