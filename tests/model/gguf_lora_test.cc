// model/gguf_writer.h read back by core/gguf.h, and model/gguf_lora.h's refusals (the layout
// against llama.cpp's own reader: tests/tools/export_gguf_test.py).
#include "model/gguf_lora.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/gguf.h"
#include "model/gguf_writer.h"
#include "tests/model/tiny_decoder.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

TEST(GgufWriterTest, CoreReaderReadsWhatItWrites) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("general.file_type", 0);
  w.AddFloat32("adapter.lora.alpha", 16.0f);
  ASSERT_TRUE(w.AddTensorF32("a", {2, 3}, {1, 2, 3, 4, 5, 6}).ok());
  ASSERT_TRUE(w.AddTensorF32("b", {5}, {7, 8, 9, 10, 11}).ok());
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto f = GgufFile::FromBytes(*bytes, "w.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ((*(*f)->Find("general.file_type"))->type(), GgufType::kUint32);
  EXPECT_EQ((*(*f)->Find("adapter.lora.alpha"))->type(), GgufType::kFloat32);
  EXPECT_EQ(*(*f)->GetFloat("adapter.lora.alpha"), 16.0);
  auto a = (*f)->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ne, (std::vector<int64_t>{3, 2}));  // innermost first
  EXPECT_EQ(a->type, GgmlType::kF32);
  std::vector<float> rows(6);
  ASSERT_TRUE(a->DequantizeRows(0, 2, rows.data()).ok());
  EXPECT_EQ(rows, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  auto b = (*f)->Get("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->offset % 32, 0u);
  std::vector<float> v(5);
  ASSERT_TRUE(b->DequantizeRows(0, 1, v.data()).ok());
  EXPECT_EQ(v, (std::vector<float>{7, 8, 9, 10, 11}));
}

TEST(GgufWriterTest, RefusesBadTensorsAndKeys) {
  GgufWriter w;
  EXPECT_THAT(std::string(w.AddTensorF32(std::string(64, 'x'), {1}, {0}).message()),
              HasSubstr("64 bytes"));
  EXPECT_THAT(std::string(w.AddTensorF32("t", {2, 2}, {0, 1, 2}).message()),
              HasSubstr("3 values for a shape of 4"));
  EXPECT_THAT(std::string(w.AddTensorF32("t", {}, {}).message()), HasSubstr("0 dimensions"));
  ASSERT_TRUE(w.AddTensorF32("t", {1}, {0}).ok());
  EXPECT_THAT(std::string(w.AddTensorF32("t", {1}, {0}).message()), HasSubstr("written twice"));
  w.AddString("k", "a");
  w.AddUint32("k", 1);
  EXPECT_THAT(std::string(w.Serialize().status().message()), HasSubstr("'k' is empty or repeated"));
}

// The tiny decoder: hidden 32, 4 query heads and 2 KV heads of 8, MLP 64, 2 layers.
std::vector<AdapterTensor> QProjPair(int64_t layer) {
  const std::string p =
      "base_model.model.model.layers." + std::to_string(layer) + ".self_attn.q_proj.";
  return {{p + "lora_A.weight", {2, 32}, std::vector<float>(64, 0.5f)},
          {p + "lora_B.weight", {32, 2}, std::vector<float>(64, 0.25f)}};
}

absl::Status Convert(const std::vector<AdapterTensor>& tensors) {
  return GgufLoraFromPeft(tensors, {.rank = 2, .alpha = 4.0f}, testing_util::TinyDecoderConfig())
      .status();
}

TEST(GgufLoraTest, WritesLlamaCppNamesAndKeys) {
  auto w =
      GgufLoraFromPeft(QProjPair(1), {.rank = 2, .alpha = 4.0f}, testing_util::TinyDecoderConfig());
  ASSERT_TRUE(w.ok()) << w.status();
  auto f = GgufFile::FromBytes(*w->Serialize(), "lora.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetString("general.type"), "adapter");
  EXPECT_EQ(*(*f)->GetString("adapter.type"), "lora");
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ((*f)->names(), (std::vector<std::string_view>{"blk.1.attn_q.weight.lora_a",
                                                          "blk.1.attn_q.weight.lora_b"}));
  EXPECT_EQ((*(*f)->Get("blk.1.attn_q.weight.lora_a")).ne, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ((*(*f)->Get("blk.1.attn_q.weight.lora_b")).ne, (std::vector<int64_t>{2, 32}));
}

TEST(GgufLoraTest, RefusesWhatLlamaCppCannotApply) {
  // An encoder's LoRA and a classifier head: no llama.cpp name.
  absl::Status s =
      Convert({{"base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight",
                {2, 32},
                std::vector<float>(64)}});
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("'base_model.model.bert.encoder.layer.0.attention.self.query"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("no name for it"));
  s = Convert({{"base_model.model.classifier.weight", {2, 32}, std::vector<float>(64)}});
  EXPECT_THAT(std::string(s.message()), HasSubstr("'base_model.model.classifier.weight'"));
  // A layer the base does not have; an A without its B; another rank; a NaN; nothing at all.
  s = Convert(QProjPair(2));
  EXPECT_THAT(std::string(s.message()), HasSubstr("layer 2, the base model has 2 layers"));
  s = Convert({QProjPair(0)[0]});
  EXPECT_THAT(std::string(s.message()), HasSubstr("has no lora_B beside it"));
  s = GgufLoraFromPeft(QProjPair(0), {.rank = 4, .alpha = 4.0f}, testing_util::TinyDecoderConfig())
          .status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("has shape [2, 32], expected [4, 32]"));
  auto nan = QProjPair(0);
  nan[1].values[3] = std::nanf("");
  EXPECT_THAT(std::string(Convert(nan).message()), HasSubstr("non-finite"));
  EXPECT_THAT(std::string(Convert({}).message()), HasSubstr("no LoRA tensor"));
}

}  // namespace
}  // namespace fedlora
