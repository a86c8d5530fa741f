// Unit tests for the chat templates (model/chat_template.h). The expected strings are what
// Jinja2 renders for the models' real templates (checked against Jinja2 itself by
// tests/model/bpe_tokenizer_hf_check.py).
#include "model/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "model/bpe_tokenizer.h"
#include "model/pretokenize.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// SmolLM2-135M-Instruct's template as its GGUF file holds it (real newlines inside the strings).
constexpr char kSmolLM2Jinja[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
    "' + message['content'] + '<|im_end|>' + '\n"
    "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
    "' }}{% endif %}";
// Qwen2-Instruct's (tokenizer_config.json: escapes, not newlines).
constexpr char kQwen2Jinja[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
constexpr char kLlama3Jinja[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% "
    "endif %}";
constexpr char kChatMLJinja[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' "
    "+ '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif "
    "%}";

const std::vector<ChatMessage> kConversation = {{"user", "Hi!"}, {"assistant", "Hello."}};

TEST(ChatTemplateTest, DetectsTheFamilies) {
  for (auto [jinja, name] : {std::pair<const char*, const char*>{kSmolLM2Jinja, "smollm2"},
                             {kQwen2Jinja, "qwen2"},
                             {kLlama3Jinja, "llama3"},
                             {kChatMLJinja, "chatml"}}) {
    auto t = ChatTemplate::Detect(jinja);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_EQ(t->name(), name);
    auto by_name = ChatTemplate::FromNameOrJinja(name);
    ASSERT_TRUE(by_name.ok());
    EXPECT_EQ(by_name->kind(), t->kind());
  }
}

TEST(ChatTemplateTest, RefusesUnknownTemplates) {
  for (const char* jinja :
       {"{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + ' "
        "[/INST]' }}{% endfor %}",
        "{%- if tools %}<|im_start|>system{%- endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] "
        "+ '<|im_end|>' + '\\n'}}",
        "<|start_header_id|><|eot_id|>Cutting Knowledge Date: December 2023", ""}) {
    auto t = ChatTemplate::Detect(jinja);
    ASSERT_FALSE(t.ok()) << jinja;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("explicitly"));
  }
  auto t = ChatTemplate::FromName("mistral");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("chatml, smollm2, qwen2, llama3"));
}

// Names in any case, as the run config's enum values (task.chat_template, --chat-template).
TEST(ChatTemplateTest, NamesAreReadInAnyCaseAndATypoGetsTheNearest) {
  for (const char* name : {"ChatML", "SMOLLM2", "Qwen2", "LLaMA3"}) {
    auto t = ChatTemplate::FromName(name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_EQ(absl::AsciiStrToLower(name), std::string(t->name()));
  }
  auto t = ChatTemplate::FromName("chatlm");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("(any case); did you mean chatml?"));
}

TEST(ChatTemplateTest, SmolLM2) {
  auto t = ChatTemplate::FromName("smollm2");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render(kConversation, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>"
            "assistant\n");
  // A system message replaces the default one.
  EXPECT_EQ(t->Render({{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(t->Render({}, false), "");
}

TEST(ChatTemplateTest, Qwen2AndChatML) {
  auto qwen = ChatTemplate::FromName("qwen2");
  auto chatml = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(qwen.ok() && chatml.ok());
  EXPECT_EQ(
      qwen->Render({{"user", "Hi"}}, true),
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\n");
  EXPECT_EQ(chatml->Render({{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama3TrimsContent) {
  auto t = ChatTemplate::FromName("llama3");
  ASSERT_TRUE(t.ok());
  // Jinja's trim is Python's str.strip: U+3000 and U+001C are whitespace, U+200B is not.
  EXPECT_EQ(
      t->Render(
          {{"system", " Be brief.\n"}, {"user", "\x1c\u3000Hi\t"}, {"assistant", "\u200bOk "}},
          true),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n\u200bOk<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t->Render({{"user", "   "}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>");
}

// Code points whose UTF-8 bytes, read from the wrong offset or with the wrong length, decode to
// a space: U+2160 (E2 85 A0: E2 85 as two bytes gives U+0085), U+10A0 (E1 82 A0: 82 A0 gives
// U+00A0), U+0800 (E0 A0 80: E0 A0 gives U+0020), U+1085. Python's strip keeps them whole (found
// by fuzz/fuzz_chat_template.cc: the trim cut them in half, leaving invalid UTF-8).
TEST(ChatTemplateTest, Llama3TrimKeepsCodePointsWhole) {
  auto t = ChatTemplate::FromName("llama3");
  ASSERT_TRUE(t.ok());
  auto rendered = [&](const std::string& content) { return t->Render({{"user", content}}, false); };
  const std::string head = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n";
  EXPECT_EQ(rendered("\u2160 x \u10a0"), head + "\u2160 x \u10a0<|eot_id|>");
  EXPECT_EQ(rendered("\u0800"), head + "\u0800<|eot_id|>");
  EXPECT_EQ(rendered(" \u2800\u1085 "), head + "\u2800\u1085<|eot_id|>");
}

TEST(ChatTemplateTest, ResponseSpans) {
  auto t = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(t.ok());
  const RenderedChat r = t->RenderForTraining(
      {{"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}, {"assistant", "A2"}});
  ASSERT_EQ(r.response_spans.size(), 2u);
  auto span = [&](size_t i) {
    return r.text.substr(r.response_spans[i].first,
                         r.response_spans[i].second - r.response_spans[i].first);
  };
  EXPECT_EQ(span(0), "A1<|im_end|>");
  EXPECT_EQ(span(1), "A2<|im_end|>");
  EXPECT_EQ(
      r.text,
      t->Render({{"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}, {"assistant", "A2"}}, false));
  auto llama = ChatTemplate::FromName("llama3");
  const RenderedChat l = llama->RenderForTraining({{"user", "Q"}, {"assistant", "  A  "}});
  ASSERT_EQ(l.response_spans.size(), 1u);
  EXPECT_EQ(l.text.substr(l.response_spans[0].first), "A<|eot_id|>");
}

TEST(ChatTemplateTest, TrainingMask) {
  // A byte-level vocabulary (ids = bytes) with ChatML's two special tokens.
  BpeTokenizer::Vocabulary v;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    const char c = static_cast<char>(b);
    bpe::AppendByteLevel(std::string_view(&c, 1), &s);
    v.tokens.push_back(s);
  }
  v.tokens.push_back("<|im_start|>");
  v.tokens.push_back("<|im_end|>");
  v.token_types.assign(v.tokens.size(), BpeTokenizer::kNormal);
  v.token_types[256] = v.token_types[257] = BpeTokenizer::kControl;
  auto tok = BpeTokenizer::Create(std::move(v));
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto t = ChatTemplate::FromName("chatml");
  const RenderedChat r = t->RenderForTraining({{"user", "Hi"}, {"assistant", "Yo"}});
  const TrainingTokens tt = TokenizeForTraining(**tok, r);
  ASSERT_EQ(tt.ids.size(), tt.loss_mask.size());
  std::vector<int32_t> masked;
  for (size_t i = 0; i < tt.ids.size(); ++i) {
    if (tt.loss_mask[i]) masked.push_back(tt.ids[i]);
  }
  EXPECT_THAT(masked, ElementsAre('Y', 'o', 257));
  EXPECT_EQ((*tok)->Decode(tt.ids), r.text);
}

}  // namespace
}  // namespace fedlora
