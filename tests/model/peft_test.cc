#include "model/peft.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/file.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/adapter_dir.h"
#include "tests/model/tiny_checkpoint.h"
#include "tests/model/tiny_decoder.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::MakeTempDir;
using testing_util::TinyConfig;

std::unique_ptr<BertClassifier> Model(std::vector<std::string> targets, int rank = 4,
                                      uint64_t seed = 1) {
  ModelOptions o;
  o.num_labels = 3;
  o.lora.rank = rank;
  o.lora.alpha = 8.0f;
  o.lora.dropout = 0.05f;
  o.lora.target_modules = std::move(targets);
  o.max_batch = 1;
  o.max_seq = 4;
  o.seed = seed;
  o.base_model_name = "sentence-transformers/all-MiniLM-L6-v2";
  auto m = BertClassifier::FromRandom(TinyConfig(), o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// What SaveAdapterDirectory records for the tiny models here: Model()'s 3 labels, and a base model
// directory that exists (an adapter records its absolute path).
AdapterMetadata ClassifierMeta() {
  return {.task = AdapterTask::kSequenceClassification,
          .base_model = MakeTempDir("peft_base"),
          .label_names = {"a", "b", "c"},
          .max_seq_len = 4};
}
AdapterMetadata DecoderMeta() {
  return {.task = AdapterTask::kCausalLm,
          .base_model = MakeTempDir("peft_base"),
          .max_seq_len = 8,
          .chat_template = "chatml"};
}

// Gives every param distinct values so that a round trip that mixes tensors up is caught.
void Scribble(BertClassifier* m, float offset) {
  int t = 0;
  for (Param& p : m->trainable_params()) {
    ++t;
    for (size_t i = 0; i < p.value.size(); ++i) p.value[i] = offset + 0.001f * t + 1e-6f * i;
  }
}

// The same LoRA settings on a base of another width: the error says what the user got wrong
// (another base model, the one the adapter names), not only which tensor is missing.
TEST(PeftTest, AnAdapterForAnotherBaseModelSaysSo) {
  const AdapterMetadata meta = ClassifierMeta();
  auto small = Model({"query", "value"});
  const std::string dir = MakeTempDir("peft") + "/adapter";
  ASSERT_TRUE(SaveAdapterDirectory(*small, meta, dir).ok());
  ModelOptions o;
  o.num_labels = 3;
  o.lora.rank = 4;
  o.lora.alpha = 8.0f;
  o.lora.dropout = 0.05f;
  o.lora.target_modules = {"query", "value"};
  o.max_batch = 1;
  o.max_seq = 4;
  BertConfig wide = TinyConfig();
  wide.hidden_size = 48;
  auto other = BertClassifier::FromRandom(wide, o);
  ASSERT_TRUE(other.ok()) << other.status();
  absl::Status s = LoadPeftAdapter(dir, other->get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(s.message()),
      HasSubstr(dir + " is an adapter for another base model (its adapter_config.json names " +
                meta.base_model + ")"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("has shape [4, 32], expected [4, 48]"));
}

TEST(PeftTest, RoundTripRestoresEveryValue) {
  auto a = Model({"query", "value"});
  Scribble(a.get(), 0.5f);
  const std::string dir = MakeTempDir("peft") + "/adapter";  // created by Save
  ASSERT_TRUE(SaveAdapterDirectory(*a, ClassifierMeta(), dir).ok());
  auto b = Model({"query", "value"}, 4, /*seed=*/2);
  ASSERT_TRUE(LoadPeftAdapter(dir, b.get()).ok());
  ASSERT_EQ(a->trainable_params().size(), b->trainable_params().size());
  for (size_t i = 0; i < a->trainable_params().size(); ++i) {
    EXPECT_EQ(a->trainable_params()[i].value, b->trainable_params()[i].value)
        << a->trainable_params()[i].name;
  }
}

TEST(PeftTest, FilesUsePeftNamesAndConfig) {
  auto m = Model({"query", "value"});
  const std::string dir = MakeTempDir("peft_names");
  const AdapterMetadata meta = ClassifierMeta();
  ASSERT_TRUE(SaveAdapterDirectory(*m, meta, dir).ok());
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  // PEFT's get_peft_model_state_dict drops the adapter name ("default") and, for
  // modules_to_save, the "modules_to_save." part, so the head is saved as classifier.weight/bias.
  EXPECT_THAT(
      (*file)->names(),
      ElementsAre("base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight",
                  "base_model.model.bert.encoder.layer.0.attention.self.query.lora_B.weight",
                  "base_model.model.bert.encoder.layer.0.attention.self.value.lora_A.weight",
                  "base_model.model.bert.encoder.layer.0.attention.self.value.lora_B.weight",
                  "base_model.model.bert.encoder.layer.1.attention.self.query.lora_A.weight",
                  "base_model.model.bert.encoder.layer.1.attention.self.query.lora_B.weight",
                  "base_model.model.bert.encoder.layer.1.attention.self.value.lora_A.weight",
                  "base_model.model.bert.encoder.layer.1.attention.self.value.lora_B.weight",
                  "base_model.model.classifier.bias", "base_model.model.classifier.weight"));
  auto a = (*file)->Get("base_model.model.bert.encoder.layer.1.attention.self.value.lora_A.weight");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 32}));  // [r, in]
  EXPECT_EQ(a->dtype, DType::kF32);
  auto b = (*file)->Get("base_model.model.bert.encoder.layer.1.attention.self.value.lora_B.weight");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->shape, (std::vector<int64_t>{32, 4}));  // [out, r]
  EXPECT_EQ((*file)->Get("base_model.model.classifier.weight")->shape,
            (std::vector<int64_t>{3, 32}));

  auto cfg = ReadJsonFile(dir + "/adapter_config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ((*cfg)["peft_type"], "LORA");
  EXPECT_EQ((*cfg)["task_type"], "SEQ_CLS");
  EXPECT_EQ((*cfg)["r"], 4);
  EXPECT_EQ((*cfg)["lora_alpha"], 8.0);
  EXPECT_NEAR((*cfg)["lora_dropout"].get<double>(), 0.05, 1e-7);
  EXPECT_EQ((*cfg)["target_modules"], nlohmann::json({"query", "value"}));
  EXPECT_EQ((*cfg)["modules_to_save"], nlohmann::json({"classifier"}));
  EXPECT_EQ((*cfg)["base_model_name_or_path"], meta.base_model);
  EXPECT_EQ((*cfg)["bias"], "none");
  EXPECT_EQ((*cfg)["fan_in_fan_out"], false);
  EXPECT_EQ((*cfg)["inference_mode"], true);
}

TEST(PeftTest, FfnOutputAloneNeedsARegex) {
  // PEFT matches target_modules by suffix, and "output.dense" is also a suffix of
  // "attention.output.dense"; a full-match regex selects the FFN output alone.
  auto m = Model({"query", "output"});
  const nlohmann::json cfg = PeftAdapterConfig(*m);
  EXPECT_EQ(cfg["target_modules"],
            ".*encoder\\.layer\\.\\d+\\.(attention\\.self\\.query|output\\.dense)");
  auto both = Model({"attn_out", "output", "intermediate"});
  EXPECT_EQ(PeftAdapterConfig(*both)["target_modules"],
            nlohmann::json({"attention.output.dense", "intermediate.dense", "output.dense"}));
}

TEST(PeftTest, MismatchesAreRejectedAndLeaveTheModelUnchanged) {
  auto saved = Model({"query", "value"});
  const std::string dir = MakeTempDir("peft_mismatch");
  ASSERT_TRUE(SaveAdapterDirectory(*saved, ClassifierMeta(), dir).ok());

  auto other_rank = Model({"query", "value"}, /*rank=*/8);
  const std::vector<float> before = other_rank->trainable_params()[0].value;
  absl::Status s = LoadPeftAdapter(dir, other_rank.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank"));
  EXPECT_EQ(other_rank->trainable_params()[0].value, before);

  // PEFT stores target_modules as a set: any order of the same names loads.
  const std::string reordered = MakeTempDir("peft_reordered");
  ASSERT_TRUE(SaveAdapterDirectory(*saved, ClassifierMeta(), reordered).ok());
  nlohmann::json cfg = PeftAdapterConfig(*saved);
  cfg["target_modules"] = {"value", "query"};
  ASSERT_TRUE(WriteFileAtomically(reordered + "/adapter_config.json", cfg.dump()).ok());
  auto same = Model({"query", "value"});
  EXPECT_TRUE(LoadPeftAdapter(reordered, same.get()).ok());

  auto other_targets = Model({"query", "key"});
  s = LoadPeftAdapter(dir, other_targets.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("target_modules"));

  // Tensor-level damage with a matching config: drop one tensor, add another.
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok());
  std::vector<SafetensorsTensorToWrite> tensors;
  std::vector<float> extra(4, 1.0f);
  for (const std::string& name : (*file)->names()) {
    if (name == "base_model.model.classifier.bias") continue;
    auto t = (*file)->Get(name);
    tensors.push_back({name, t->dtype, t->shape, t->data, t->size});
  }
  tensors.push_back({"base_model.model.bert.encoder.layer.0.attention.self.key.lora_A.weight",
                     DType::kF32,
                     {4},
                     extra.data(),
                     16});
  const std::string damaged = MakeTempDir("peft_damaged");
  ASSERT_TRUE(WriteSafetensors(damaged + "/adapter_model.safetensors", tensors, {}).ok());
  ASSERT_TRUE(
      WriteFileAtomically(damaged + "/adapter_config.json", PeftAdapterConfig(*saved).dump()).ok());
  auto target = Model({"query", "value"});
  s = LoadPeftAdapter(damaged, target.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("missing tensors: base_model.model.classifier.bias"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("unexpected tensors: "
                        "base_model.model.bert.encoder.layer.0.attention.self.key.lora_A.weight"));

  EXPECT_EQ(LoadPeftAdapter(MakeTempDir("peft_empty"), target.get()).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace fedlora

namespace fedlora {
namespace {

// PEFT settings that would change the adapter's scale or shape are refused, not ignored.
TEST(PeftTest, RefusesSettingsFedloraDoesNotImplement) {
  const std::string dir = testing_util::MakeTempDir("peft");
  auto m = Model({"query", "value"});
  ASSERT_TRUE(SaveAdapterDirectory(*m, ClassifierMeta(), dir).ok());
  const std::string cfg_path = dir + "/" + kPeftConfigFile;
  auto original = ReadJsonFile(cfg_path);
  ASSERT_TRUE(original.ok());
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"use_rslora", true},
      {"use_dora", true},
      {"alpha_pattern", {{"query", 32}}},
      {"rank_pattern", {{"value", 2}}},
      {"layers_to_transform", {0}},
      {"fan_in_fan_out", true},
      {"bias", "lora_only"}};
  for (const auto& [key, value] : cases) {
    nlohmann::json cfg = *original;
    cfg[key] = value;
    ASSERT_TRUE(WriteFileAtomically(cfg_path, cfg.dump()).ok());
    const absl::Status st = LoadPeftAdapter(dir, m.get());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(std::string(st.message()), HasSubstr(key)) << st;
  }
  // Explicitly off is fine.
  nlohmann::json cfg = *original;
  cfg["use_rslora"] = false;
  cfg["alpha_pattern"] = nlohmann::json::object();
  ASSERT_TRUE(WriteFileAtomically(cfg_path, cfg.dump()).ok());
  EXPECT_TRUE(LoadPeftAdapter(dir, m.get()).ok());
}

TEST(PeftTest, DecoderAdapterRoundTripsWithCausalLmConfig) {
  const DecoderConfig c = testing_util::TinyDecoderConfig();
  DecoderOptions o;
  o.lora.rank = 4;
  o.lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  o.max_batch = 1;
  o.max_seq = 8;
  o.base_model_name = "HuggingFaceTB/SmolLM2-135M-Instruct";
  auto base = DecoderBase::FromRandom(c, o);
  ASSERT_TRUE(base.ok());
  auto a = CausalLm::Create(*base, o);
  o.seed = 99;
  auto b = CausalLm::Create(*base, o);
  ASSERT_TRUE(a.ok() && b.ok());
  for (Param& p : (*a)->trainable_params()) {
    for (size_t i = 0; i < p.value.size(); ++i)
      p.value[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  }
  const std::string dir = testing_util::MakeTempDir("peft");
  ASSERT_TRUE(SaveAdapterDirectory(**a, DecoderMeta(), dir).ok());
  auto cfg = ReadJsonFile(dir + "/" + kPeftConfigFile);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ((*cfg)["task_type"], "CAUSAL_LM");
  EXPECT_EQ((*cfg)["target_modules"], nlohmann::json({"q_proj", "v_proj", "down_proj"}));
  EXPECT_TRUE((*cfg)["modules_to_save"].is_null());
  ASSERT_TRUE(LoadPeftAdapter(dir, b->get()).ok());
  for (size_t i = 0; i < (*a)->trainable_params().size(); ++i) {
    EXPECT_EQ((*a)->trainable_params()[i].value, (*b)->trainable_params()[i].value);
  }
  // An encoder adapter is not a decoder's.
  auto enc = Model({"query", "value"});
  const std::string enc_dir = testing_util::MakeTempDir("peft");
  ASSERT_TRUE(SaveAdapterDirectory(*enc, ClassifierMeta(), enc_dir).ok());
  EXPECT_THAT(std::string(LoadPeftAdapter(enc_dir, b->get()).message()), HasSubstr("CAUSAL_LM"));
}

}  // namespace
}  // namespace fedlora
