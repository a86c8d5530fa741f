// The causal-LM data path and trainer: JSONL conversations to response-only labels, batches,
// training that learns, perplexity against a hand computation, exact match, the refusals.
#include "train/lm_trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/bpe_tokenizer.h"
#include "model/chat_template.h"
#include "model/decoder.h"
#include "model/decoder_tokenizer.h"
#include "train/lm_data.h"

namespace fedlora {
namespace {

// A byte-level vocabulary without merges: one token per printable ASCII character, 'Ġ' (space)
// and 'Ċ' (newline) as GPT-2's byte map writes them, and the two ChatML control tokens.
DecoderTokenizer TinyTokenizer() {
  BpeTokenizer::Vocabulary v;
  for (char c = 33; c < 127; ++c) v.tokens.push_back(std::string(1, c));
  v.tokens.push_back("\xC4\xA0");  // U+0120
  v.tokens.push_back("\xC4\x8A");  // U+010A
  v.tokens.push_back("<|im_start|>");
  v.tokens.push_back("<|im_end|>");
  v.token_types.assign(v.tokens.size(), BpeTokenizer::kNormal);
  v.token_types[v.tokens.size() - 2] = BpeTokenizer::kControl;
  v.token_types[v.tokens.size() - 1] = BpeTokenizer::kControl;
  v.eos_id = static_cast<int32_t>(v.tokens.size() - 1);
  auto tok = BpeTokenizer::Create(v);
  EXPECT_TRUE(tok.ok()) << tok.status();
  DecoderTokenizer out;
  out.tokenizer = std::move(*tok);
  out.chat = *ChatTemplate::FromName("chatml");
  return out;
}

// Wide enough that tied N(0, 0.02) embeddings behind an RMSNorm can reach a confident logit.
DecoderConfig TinyConfig(int vocab) {
  DecoderConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 128;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  return c;
}

std::unique_ptr<CausalLm> TinyLm(int vocab, uint64_t seed = 1) {
  DecoderOptions o;
  o.lora.rank = 4;
  o.max_batch = 4;
  o.max_seq = 64;
  o.seed = seed;
  auto base = DecoderBase::FromRandom(TinyConfig(vocab), o);
  EXPECT_TRUE(base.ok()) << base.status();
  auto lm = CausalLm::Create(*base, o);
  EXPECT_TRUE(lm.ok()) << lm.status();
  return std::move(*lm);
}

class LmDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fedlora_lm_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
  DecoderTokenizer tok_ = TinyTokenizer();
};

// The labels' non-ignored tokens, decoded.
std::string Targets(const LmExample& ex, const BpeTokenizer& tok) {
  std::vector<int32_t> ids;
  for (int32_t l : ex.labels)
    if (l != -100) ids.push_back(l);
  return tok.Decode(ids);
}

TEST_F(LmDataTest, LossFallsOnTheResponsesAndTheirEndOfTurnOnly) {
  const std::string path =
      Write("d.jsonl",
            "{\"prompt\": \"2+2?\", \"response\": \"4\"}\n\n"
            "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
            "\"content\": \"yo\"}, {\"role\": \"user\", \"content\": \"bye\"}, {\"role\": "
            "\"assistant\", \"content\": \"ok\"}]}\n");
  auto data = LoadLmDataset(path, tok_, {});
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size(), 2);
  const BpeTokenizer& t = *tok_.tokenizer;
  const LmExample& a = data->examples[0];
  EXPECT_EQ(t.Decode(a.input_ids),
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n");
  EXPECT_EQ(Targets(a, t), "4<|im_end|>");
  EXPECT_EQ(t.Decode(a.prompt_ids), "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  // The prompt is the start of the conversation, token for token.
  ASSERT_LT(a.prompt_ids.size(), a.input_ids.size());
  EXPECT_TRUE(std::equal(a.prompt_ids.begin(), a.prompt_ids.end(), a.input_ids.begin()));
  EXPECT_EQ(a.response, "4");
  EXPECT_EQ(a.targets(), 2);
  const LmExample& b = data->examples[1];
  EXPECT_EQ(Targets(b, t), "yo<|im_end|>ok<|im_end|>");
  EXPECT_EQ(b.response, "ok");
}

TEST_F(LmDataTest, ALabelFieldServesAsTheResponseWithASystemMessage) {
  const std::string path = Write("d.jsonl", "{\"text\": \"abc\", \"label\": \"dog\"}\n");
  LmDataOptions o;
  o.prompt_field = "text";
  o.response_field = "label";
  o.system = "Sort.";
  auto data = LoadLmDataset(path, tok_, o);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(tok_.tokenizer->Decode(data->examples[0].input_ids),
            "<|im_start|>system\nSort.<|im_end|>\n<|im_start|>user\nabc<|im_end|>\n"
            "<|im_start|>assistant\ndog<|im_end|>\n");
  EXPECT_EQ(Targets(data->examples[0], *tok_.tokenizer), "dog<|im_end|>");
}

TEST_F(LmDataTest, CutsLongConversationsAndRefusesOnesWithoutAResponseToken) {
  const std::string path = Write("d.jsonl", "{\"prompt\": \"q\", \"response\": \"abcdefgh\"}\n");
  LmDataOptions o;
  o.max_seq_len = 22;  // the prompt takes 20 tokens (a token a character, one a control token)
  auto data = LoadLmDataset(path, tok_, o);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->examples[0].input_ids.size(), 22u);
  EXPECT_EQ(Targets(data->examples[0], *tok_.tokenizer), "ab");
  o.max_seq_len = 20;
  auto none = LoadLmDataset(path, tok_, o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("d.jsonl:1: no response token within max_seq_len 20"),
            std::string::npos)
      << none.status();
}

TEST_F(LmDataTest, ALongPromptLosesItsMiddleAndKeepsTheResponseWhole) {
  const std::string path =
      Write("d.jsonl", "{\"prompt\": \"" + std::string(40, 'q') + "xyz\", \"response\": \"ab\"}\n");
  LmDataOptions o;
  o.max_seq_len = 40;  // the conversation takes 66 tokens, 62 of them the prompt
  auto data = LoadLmDataset(path, tok_, o);
  ASSERT_TRUE(data.ok()) << data.status();
  const LmExample& ex = data->examples[0];
  const BpeTokenizer& t = *tok_.tokenizer;
  EXPECT_EQ(ex.input_ids.size(), 40u);
  EXPECT_EQ(Targets(ex, t), "ab<|im_end|>");
  // The start and the prompt's last 16 tokens stay.
  EXPECT_EQ(t.Decode(ex.input_ids), "<|im_start|>user\n" + std::string(14, 'q') +
                                        "xyz<|im_end|>\n<|im_start|>assistant\nab<|im_end|>\n");
  ASSERT_EQ(ex.prompt_ids.size(), 36u);
  EXPECT_TRUE(std::equal(ex.prompt_ids.begin(), ex.prompt_ids.end(), ex.input_ids.begin()));
}

TEST_F(LmDataTest, RefusesBadLinesNamingThem) {
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"a\"}\n",
       "b.jsonl:2: no \"response\""},
      {"{\"question\": \"a\"}\n", "neither \"messages\" nor \"prompt\""},
      {"{\"prompt\": \"a\", \"response\": [1]}\n", "\"response\" is array"},
      {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}, {\"role\": \"user\", "
       "\"content\": \"y\"}]}\n",
       "must end with an assistant message"},
      {"{\"messages\": {\"role\": \"user\"}}\n", "\"messages\" is not a list"},
      {"[1, 2]\n", "not a JSON object"},
      {"{\"prompt\": \n", "b.jsonl:1"},
      {"\n  \n", "holds no examples"},
  };
  for (const Case& c : cases) {
    auto data = LoadLmDataset(Write("b.jsonl", c.text), tok_, {});
    ASSERT_FALSE(data.ok()) << c.text;
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(data.status().message().find(c.message), std::string::npos)
        << c.text << " -> " << data.status();
  }
  EXPECT_EQ(LoadLmDataset((dir_ / "missing.jsonl").string(), tok_, {}).status().code(),
            absl::StatusCode::kNotFound);
  DecoderTokenizer no_template;
  no_template.tokenizer = std::move(tok_.tokenizer);
  EXPECT_NE(LoadLmDataset(Write("c.jsonl", "{}\n"), no_template, {})
                .status()
                .message()
                .find("no chat template"),
            std::string::npos);
}

LmExample MakeExample(std::vector<int32_t> ids, std::vector<int32_t> labels) {
  LmExample ex;
  ex.input_ids = std::move(ids);
  ex.labels = std::move(labels);
  return ex;
}

LmEvalOptions EvalOptions(int batch_size) {
  LmEvalOptions o;
  o.batch_size = batch_size;
  return o;
}

TEST(MakeLmBatch, RightPadsWithIgnoredLabels) {
  LmDataset data;
  data.examples.push_back(MakeExample({1, 2, 3}, {-100, 2, 3}));
  data.examples.push_back(MakeExample({4}, {-100}));
  const std::vector<int64_t> idx = {1, 0};
  CausalLm::Batch b = MakeLmBatch(data, idx, /*pad_id=*/9);
  EXPECT_EQ(b.batch_size, 2);
  EXPECT_EQ(b.seq_len, 3);
  EXPECT_EQ(b.input_ids, (std::vector<int32_t>{4, 9, 9, 1, 2, 3}));
  EXPECT_EQ(b.attention_mask, (std::vector<int32_t>{1, 0, 0, 1, 1, 1}));
  EXPECT_EQ(b.labels, (std::vector<int32_t>{-100, -100, -100, -100, 2, 3}));
}

// Eight prompts, each answered by one letter, or all by `same` when it is not empty. (A random
// base this small cannot carry much of the prompt to the answer: the tests that need learning to
// finish use one answer.)
LmDataset Memorize(const DecoderTokenizer& tok, const std::string& same = "") {
  LmDataset data;
  const std::string prompts[] = {"red", "blue", "green", "gray", "pink", "teal", "gold", "navy"};
  const std::string answers[] = {"r", "b", "g", "y", "p", "t", "o", "n"};
  for (int i = 0; i < 8; ++i) {
    const std::string answer = same.empty() ? answers[i] : same;
    auto ex = TokenizeConversation({{"user", prompts[i]}, {"assistant", answer}}, tok, 64, "test");
    EXPECT_TRUE(ex.ok()) << ex.status();
    data.examples.push_back(std::move(*ex));
  }
  return data;
}

TEST(EvaluateLm, PerplexityIsTheMeanResponseNllFromTheLogits) {
  DecoderTokenizer tok = TinyTokenizer();
  const int vocab = static_cast<int>(tok.tokenizer->vocab_size());
  auto lm = TinyLm(static_cast<int>(vocab));
  LmDataset data = Memorize(tok);
  auto r = EvaluateLm(*lm, data, EvalOptions(3));
  ASSERT_TRUE(r.ok()) << r.status();
  // By hand: log-softmax of the logits one row at a time.
  double nll = 0.0;
  int64_t tokens = 0;
  for (const LmExample& ex : data.examples) {
    CausalLm::Batch b;
    b.batch_size = 1;
    b.seq_len = static_cast<int>(ex.input_ids.size());
    b.input_ids = ex.input_ids;
    auto logits = lm->Logits(b);
    ASSERT_TRUE(logits.ok()) << logits.status();
    for (size_t t = 1; t < ex.labels.size(); ++t) {
      if (ex.labels[t] == -100) continue;
      const float* row = logits->data() + (t - 1) * vocab;
      double mx = row[0], sum = 0.0;
      for (int v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
      nll += -(row[ex.labels[t]] - mx - std::log(sum));
      ++tokens;
    }
  }
  EXPECT_EQ(r->count, 8);
  EXPECT_EQ(r->tokens, tokens);
  EXPECT_NEAR(r->loss, nll / tokens, 1e-4);
  EXPECT_NEAR(r->perplexity, std::exp(nll / tokens), 1e-3);
  EXPECT_FALSE(r->has_exact_match);
  LmEvalOptions no_tokenizer;
  no_tokenizer.exact_match = true;
  EXPECT_EQ(EvaluateLm(*lm, data, no_tokenizer).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EvaluateLm(*lm, LmDataset{}, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LmTrainer, LearnsTheResponsesUntilGreedyDecodingGivesThemExactly) {
  DecoderTokenizer tok = TinyTokenizer();
  auto lm = TinyLm(static_cast<int>(tok.tokenizer->vocab_size()));
  LmDataset data = Memorize(tok, "ok");
  const LmEvalOptions eval{.batch_size = 4,
                           .exact_match = true,
                           .tokenizer = tok.tokenizer.get(),
                           .stop_ids = {tok.tokenizer->eos_id()}};
  auto before = EvaluateLm(*lm, data, eval);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->exact_match, 0.0);
  TrainOptions o;
  o.epochs = 50;
  o.batch_size = 4;
  o.lr = 1e-2f;
  o.schedule = "constant";
  o.progress = false;
  o.seed = 5;
  LmTrainer trainer(*lm, o);
  int epochs = 0;
  trainer.on_epoch = [&](const LmEpochReport&) { ++epochs; };
  ASSERT_TRUE(trainer.Train(data, nullptr, eval).ok());
  EXPECT_EQ(epochs, 50);
  auto after = EvaluateLm(*lm, data, eval);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(after->loss, 0.7 * before->loss) << before->ToJson() << " -> " << after->ToJson();
  EXPECT_EQ(after->exact_match, 1.0) << after->ToJson();
  EXPECT_EQ(trainer.history().back().steps, 100);
}

TEST(LmTrainer, TheSameSeedGivesTheSameAdapterAndEvaluatesEachEpoch) {
  DecoderTokenizer tok = TinyTokenizer();
  LmDataset data = Memorize(tok);
  TrainOptions o;
  o.epochs = 2;
  o.batch_size = 3;
  o.grad_accumulation = 2;
  o.progress = false;
  o.seed = 11;
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 2; ++run) {
    auto lm = TinyLm(static_cast<int>(tok.tokenizer->vocab_size()));
    LmTrainer trainer(*lm, o);
    ASSERT_TRUE(trainer.Train(data, &data, EvalOptions(4)).ok());
    ASSERT_EQ(trainer.history().size(), 2u);
    EXPECT_TRUE(trainer.history()[1].has_eval);
    EXPECT_EQ(trainer.history()[1].eval.count, 8);
    EXPECT_NE(trainer.history()[1].ToJson().find("\"perplexity\":"), std::string::npos);
    std::vector<std::vector<float>> values;
    for (const Param& p : lm->trainable_params()) values.push_back(p.value);
    if (run == 0)
      first = values;
    else
      EXPECT_EQ(values, first);
  }
}

TEST(LmTrainer, RefusesWhatItCannotTrain) {
  DecoderTokenizer tok = TinyTokenizer();
  auto lm = TinyLm(static_cast<int>(tok.tokenizer->vocab_size()));
  LmDataset data = Memorize(tok);
  TrainOptions o;
  o.progress = false;
  o.logit_adjustment = 1.0f;
  EXPECT_NE(LmTrainer(*lm, o).Train(data, nullptr, {}).message().find("classification option"),
            std::string::npos);
  o.logit_adjustment = 0.0f;
  o.batch_size = 5;  // the model was planned for 4
  EXPECT_NE(LmTrainer(*lm, o).Train(data, nullptr, {}).message().find("max_batch"),
            std::string::npos);
  o.batch_size = 4;
  EXPECT_EQ(LmTrainer(*lm, o).Train(LmDataset{}, nullptr, {}).code(),
            absl::StatusCode::kInvalidArgument);
  LmDataset too_long;
  too_long.examples.push_back(
      MakeExample(std::vector<int32_t>(65, 1), std::vector<int32_t>(65, 1)));
  EXPECT_NE(
      LmTrainer(*lm, o).Train(too_long, nullptr, {}).message().find("the model takes 1 to 64"),
      std::string::npos);
  LmDataset mismatched;
  mismatched.examples.push_back(MakeExample({1, 2, 3}, {-100, 2}));
  EXPECT_NE(
      LmTrainer(*lm, o).Train(mismatched, nullptr, {}).message().find("2 labels for 3 tokens"),
      std::string::npos);
}

}  // namespace
}  // namespace fedlora
