// Unit tests for the byte-level BPE tokenizer (model/bpe_tokenizer.h) on a tiny hand-made
// vocabulary: the 256 byte characters (id = byte), a few merges and added tokens. Expected ids are
// worked out by hand (HF's algorithm: lowest rank first, leftmost on ties); the agreement with
// Hugging Face on a real vocabulary is tests/model/bpe_tokenizer_hf_check.py's job.
#include "model/bpe_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model/pretokenize.h"

namespace fedlora {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ByteChar(int b) {
  std::string s;
  const char c = static_cast<char>(b);
  bpe::AppendByteLevel(std::string_view(&c, 1), &s);
  return s;
}

// Ids: bytes 0-255, then the merges' results 256-264, then "<|end|>" (control, 265) and "<u>"
// (user-defined, 266).
constexpr int32_t kHello = 259, kSpaceWorld = 264, kEnd = 265, kUser = 266;
const std::vector<std::string> kMerges = {"h e", "l l",   "he ll", "hell o", "Ġ w",
                                          "o r", "Ġw or", "l d",   "Ġwor ld"};

BpeTokenizer::Vocabulary TinyVocabulary(const std::string& pre = "gpt2") {
  BpeTokenizer::Vocabulary v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteChar(b));
  for (const char* t :
       {"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld", "<|end|>", "<u>"}) {
    v.tokens.emplace_back(t);
  }
  v.token_types.assign(v.tokens.size(), BpeTokenizer::kNormal);
  v.token_types[kEnd] = BpeTokenizer::kControl;
  v.token_types[kUser] = BpeTokenizer::kUserDefined;
  v.merges = kMerges;
  v.pre = pre;
  v.eos_id = kEnd;
  return v;
}

std::unique_ptr<BpeTokenizer> Tiny(const std::string& pre = "gpt2") {
  auto tok = BpeTokenizer::Create(TinyVocabulary(pre));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

// The same vocabulary as a tokenizer.json.
json TinyJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  int id = 256;
  for (const char* t :
       {"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld", "<|end|>", "<u>"}) {
    vocab[t] = id++;
  }
  json added = json::array();
  added.push_back({{"id", kEnd},
                   {"content", "<|end|>"},
                   {"single_word", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"special", true}});
  added.push_back({{"id", kUser},
                   {"content", "<u>"},
                   {"single_word", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"special", false}});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", false},
            {"use_regex", true}}},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", kMerges}}}};
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(const json& j) {
  return BpeTokenizer::FromTokenizerJsonText(j.dump(), "test.json");
}

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// ---- BPE ---------------------------------------------------------------------------------------

TEST(BpeTokenizerTest, MergesByRank) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  // "hello": he (rank 0), ll (1), hell (2), hello (3). " world": Ġw, or, Ġwor, ld, Ġworld.
  EXPECT_THAT(tok->Encode("hello world"), ElementsAre(kHello, kSpaceWorld));
  EXPECT_THAT(tok->Encode("hell"), ElementsAre(258));
  EXPECT_THAT(tok->Encode("helo"), ElementsAre(256, 'l', 'o'));
  EXPECT_THAT(tok->Encode("world"), ElementsAre('w', 261, 263));  // no Ġ: Ġw never applies
  EXPECT_THAT(tok->Encode(" worldly"), ElementsAre(kSpaceWorld, 'l', 'y'));
  EXPECT_EQ(tok->vocab_size(), 267);
  EXPECT_EQ(tok->TokenToId("Ġworld"), kSpaceWorld);
  EXPECT_EQ(tok->TokenToId("nope"), -1);
  EXPECT_EQ(tok->IdToToken(kHello), "hello");
  EXPECT_EQ(tok->IdToToken(9999), "");
}

TEST(BpeTokenizerTest, LowestRankFirstThenLeftmost) {
  auto make = [](std::vector<std::string> merges, std::vector<std::string> extra) {
    BpeTokenizer::Vocabulary v;
    for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteChar(b));
    for (auto& t : extra) v.tokens.push_back(t);
    v.merges = std::move(merges);
    auto tok = BpeTokenizer::Create(std::move(v));
    EXPECT_TRUE(tok.ok()) << tok.status();
    return *std::move(tok);
  };
  // "abc" with bc ranked first: a + bc; with ab first: ab + c.
  EXPECT_THAT(make({"b c", "a b"}, {"bc", "ab"})->Encode("abc"), ElementsAre('a', 256));
  EXPECT_THAT(make({"a b", "b c"}, {"ab", "bc"})->Encode("abc"), ElementsAre(256, 'c'));
  // Equal ranks: the leftmost pair merges first ("aaa" -> aa a, "aaaa" -> aa aa -> aaaa).
  auto aa = make({"a a", "aa aa"}, {"aa", "aaaa"});
  EXPECT_THAT(aa->Encode("aaa"), ElementsAre(256, 'a'));
  EXPECT_THAT(aa->Encode("aaaa"), ElementsAre(257));
  EXPECT_THAT(aa->Encode("aaaaa"), ElementsAre(257, 'a'));
  // A repeated merge keeps its last rank (HF's map): ab at rank 2 loses to bc at rank 1.
  EXPECT_THAT(make({"a b", "b c", "a b"}, {"ab", "bc"})->Encode("abc"), ElementsAre('a', 257));
}

TEST(BpeTokenizerTest, Gpt2PreTokenizer) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->PreTokenize("Hello world's  12 ab\n\n x"),
              ElementsAre("Hello", "Ġworld", "'s", "Ġ", "Ġ12", "Ġab", "ĊĊ", "Ġx"));
  EXPECT_THAT(tok->PreTokenize("a  \t b"), ElementsAre("a", "ĠĠĉ", "Ġb"));
  EXPECT_THAT(tok->PreTokenize(""), ElementsAre());
}

TEST(BpeTokenizerTest, SmolLMSplitsDigits) {
  auto tok = Tiny("smollm");
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->PreTokenize("a123 x4"), ElementsAre("a", "1", "2", "3", "Ġx", "4"));
  EXPECT_THAT(tok->PreTokenize("١٢"), ElementsAre("Ù¡", "Ù¢"));  // Arabic-Indic digits are \p{N}
}

TEST(BpeTokenizerTest, Llama3AndQwen2PreTokenizers) {
  auto llama = Tiny("llama-bpe");
  auto qwen = Tiny("qwen2");
  ASSERT_NE(llama, nullptr);
  ASSERT_NE(qwen, nullptr);
  EXPECT_THAT(llama->PreTokenize("I'LL pay 12345!\n\n  ok"),
              ElementsAre("I", "'LL", "Ġpay", "Ġ", "123", "45", "!ĊĊ", "Ġ", "Ġok"));
  EXPECT_THAT(qwen->PreTokenize("x 123"), ElementsAre("x", "Ġ", "1", "2", "3"));
}

TEST(BpeTokenizerTest, IgnoreMerges) {
  // A piece that is a whole vocabulary token stays one with ignore_merges (LLaMA-3), even with
  // no merge path to it.
  json j = TinyJson();
  j["model"]["vocab"]["xyz"] = 267;
  auto merged = FromJson(j);
  j["model"]["ignore_merges"] = true;
  auto whole = FromJson(j);
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_THAT((*merged)->Encode("xyz hello"), ElementsAre('x', 'y', 'z', 32, kHello));
  EXPECT_THAT((*whole)->Encode("xyz hello"), ElementsAre(267, 32, kHello));
}

// ---- special tokens ----------------------------------------------------------------------------

TEST(BpeTokenizerTest, SpecialTokensInText) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("hello<|end|> world<u>x"),
              ElementsAre(kHello, kEnd, kSpaceWorld, kUser, 'x'));
  EXPECT_THAT(tok->Encode("<|end|><|end|>"), ElementsAre(kEnd, kEnd));
  EXPECT_THAT(tok->Encode("<|end|"), ElementsAre('<', '|', 'e', 'n', 'd', '|'));
  // parse_special false: special tokens are text, user-defined ones still match.
  std::vector<int32_t> want = Bytes("<|end|>");
  want.push_back(kUser);
  EXPECT_EQ(tok->Encode("<|end|><u>", false, false), want);
  EXPECT_TRUE(tok->IsSpecial(kEnd));
  EXPECT_FALSE(tok->IsSpecial(kUser));
  EXPECT_FALSE(tok->IsSpecial(kHello));
}

TEST(BpeTokenizerTest, LeftmostLongestAddedTokens) {
  json j = TinyJson();
  j["model"]["vocab"]["<a>"] = 267;
  j["model"]["vocab"]["<a><b>"] = 268;
  j["model"]["vocab"]["a><b"] = 269;
  for (auto [content, id] :
       {std::pair<const char*, int>{"<a>", 267}, {"<a><b>", 268}, {"a><b", 269}}) {
    j["added_tokens"].push_back(
        {{"id", id}, {"content", content}, {"special", true}, {"normalized", false}});
  }
  auto tok = FromJson(j);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("<a><b>"), ElementsAre(268));  // longest at the leftmost start
  EXPECT_THAT((*tok)->Encode("<a><c>"), ElementsAre(267, '<', 'c', '>'));
  EXPECT_THAT((*tok)->Encode("x<a><b"),
              ElementsAre('x', 267, '<', 'b'));  // leftmost wins over longer later
}

TEST(BpeTokenizerTest, LstripRstrip) {
  json j = TinyJson();
  j["added_tokens"].push_back({{"id", 267},
                               {"content", "<m>"},
                               {"lstrip", true},
                               {"rstrip", true},
                               {"normalized", false},
                               {"special", false}});
  auto tok = FromJson(j);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("a <m> b"), ElementsAre('a', 267, 'b'));
  EXPECT_THAT((*tok)->Encode("a\u3000 <m>\t\nb"),
              ElementsAre('a', 267, 'b'));  // Unicode whitespace too
  auto plain = Tiny();
  EXPECT_THAT(plain->Encode("a <u> b"), ElementsAre('a', 32, kUser, 32, 'b'));
}

TEST(BpeTokenizerTest, AddBosEos) {
  BpeTokenizer::Vocabulary v = TinyVocabulary();
  v.bos_id = 'B';
  v.add_bos = true;
  v.add_eos = true;
  auto tok = BpeTokenizer::Create(std::move(v));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("hello", true), ElementsAre('B', kHello, kEnd));
  EXPECT_THAT((*tok)->Encode("hello", false), ElementsAre(kHello));
  EXPECT_THAT((*tok)->Encode("", true), ElementsAre('B', kEnd));
  EXPECT_EQ((*tok)->bos_id(), 'B');
  EXPECT_EQ((*tok)->eos_id(), kEnd);
}

TEST(BpeTokenizerTest, TemplateProcessingFromJson) {
  json j = TinyJson();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "<u>"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens",
       {{"<|end|>", {{"id", "<|end|>"}, {"ids", {kEnd}}, {"tokens", {"<|end|>"}}}},
        {"<u>", {{"id", "<u>"}, {"ids", {kUser}}, {"tokens", {"<u>"}}}}}}};
  auto tok = FromJson(j);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("hello", true), ElementsAre(kEnd, kHello, kUser));
  EXPECT_EQ((*tok)->bos_id(), kEnd);
  EXPECT_EQ((*tok)->eos_id(), kUser);
}

// ---- decoding, offsets, Unicode ------------------------------------------------------------------

TEST(BpeTokenizerTest, DecodeRoundTrip) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  for (std::string s :
       {"hello world", "Héllo wörld 中文 😀\n\t x", "a  b   c", "<|end|>hi<u>", ""}) {
    EXPECT_EQ(tok->Decode(tok->Encode(s)), s) << s;
  }
  const std::vector<int32_t> ids = {kHello, kEnd, kSpaceWorld, kUser};
  EXPECT_EQ(tok->Decode(ids), "hello<|end|> world<u>");
  EXPECT_EQ(tok->Decode(ids, /*skip_special=*/true), "hello world<u>");
  // Bytes that are not UTF-8 decode to U+FFFD; ids no token has are skipped.
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{0xC3, 'a'}),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{-1, 'h', 9999, 'i'}), "hi");
}

TEST(BpeTokenizerTest, InvalidUtf8IsReplaced) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  // Each maximal ill-formed subsequence becomes U+FFFD (EF BF BD), as Python's errors="replace".
  const std::vector<int32_t> fffd = {0xEF, 0xBF, 0xBD};
  EXPECT_EQ(tok->Encode("\xff"), fffd);
  EXPECT_EQ(tok->Encode("\xe2\x82"), fffd);  // a truncated sequence is one replacement
  std::vector<int32_t> two = fffd;
  two.insert(two.end(), fffd.begin(), fffd.end());
  EXPECT_EQ(tok->Encode("\xc0\xaf"), two);  // overlong: two
  EXPECT_EQ(tok->Decode(tok->Encode("a\xff")), "a\xEF\xBF\xBD");
}

TEST(BpeTokenizerTest, Offsets) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids;
  std::vector<BpeTokenizer::Offset> offs;
  tok->EncodeInto("hello<|end|> world", true, true, &ids, &offs);
  ASSERT_THAT(ids, ElementsAre(kHello, kEnd, kSpaceWorld));
  ASSERT_EQ(offs.size(), 3u);
  EXPECT_EQ(offs[0].begin, 0u);
  EXPECT_EQ(offs[0].end, 5u);
  EXPECT_EQ(offs[1].begin, 5u);
  EXPECT_EQ(offs[1].end, 12u);
  EXPECT_EQ(offs[2].begin, 12u);
  EXPECT_EQ(offs[2].end, 18u);
  // The replacement for an invalid byte spans that byte.
  ids.clear();
  offs.clear();
  tok->EncodeInto("a\xffz", false, true, &ids, &offs);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(offs[1].begin, 1u);
  EXPECT_EQ(offs[3].end, 2u);
  EXPECT_EQ(offs[4].begin, 2u);
  EXPECT_EQ(offs[4].end, 3u);
}

TEST(BpeTokenizerTest, NfcNormalizer) {
  json j = TinyJson();
  j["model"]["vocab"]["Ã©"] = 267;  // é = C3 A9
  j["model"]["merges"].push_back("Ã ©");
  auto plain = FromJson(j);
  j["normalizer"] = {{"type", "NFC"}};
  auto nfc = FromJson(j);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(nfc.ok()) << nfc.status();
  EXPECT_THAT((*plain)->Encode("e\u0301"), ElementsAre('e', 0xCC, 0x81));
  EXPECT_THAT((*nfc)->Encode("e\u0301"), ElementsAre(267));
  EXPECT_THAT((*nfc)->Encode("\u00e9"), ElementsAre(267));
  std::vector<int32_t> ids;
  std::vector<BpeTokenizer::Offset> offs;
  (*nfc)->EncodeInto("ae\u0301", false, true, &ids, &offs);
  ASSERT_THAT(ids, ElementsAre('a', 267));
  EXPECT_EQ(offs[1].begin, 1u);
  EXPECT_EQ(offs[1].end, 4u);  // the rewritten é spans e + U+0301 in the input
}

TEST(BpeTokenizerTest, NormalizedAddedTokens) {
  // Added tokens marked normalized match the NFC text in their NFC form (checked against HF).
  json j = TinyJson();
  j["normalizer"] = {{"type", "NFC"}};
  j["added_tokens"].push_back(
      {{"id", 267}, {"content", "\u00e9t\u00e9"}, {"normalized", true}, {"special", false}});
  j["added_tokens"].push_back(
      {{"id", 268}, {"content", "e\u0301"}, {"normalized", true}, {"special", false}});
  auto tok = FromJson(j);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("e\u0301te\u0301 <|end|>\u00e9t\u00e9"),
              ElementsAre(267, 32, kEnd, 267));
  EXPECT_THAT((*tok)->Encode("ae\u0301b"), ElementsAre('a', 268, 'b'));
}

TEST(BpeTokenizerTest, UnknownBytes) {
  // 'z' missing: without an unk token it is dropped; with one it is unk, fused when fuse_unk.
  json j = TinyJson();
  j["model"]["vocab"].erase("z");
  j["model"]["vocab"]["<unk>"] = 'z';
  auto none = FromJson(j);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_THAT((*none)->Encode("azzb zz"), ElementsAre('a', 'b', 32));
  j["model"]["unk_token"] = "<unk>";
  auto unk = FromJson(j);
  ASSERT_TRUE(unk.ok()) << unk.status();
  EXPECT_THAT((*unk)->Encode("azzb zz"), ElementsAre('a', 'z', 'z', 'b', 32, 'z', 'z'));
  j["model"]["fuse_unk"] = true;
  auto fused = FromJson(j);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_THAT((*fused)->Encode("azzb zz"), ElementsAre('a', 'z', 'b', 32, 'z'));
}

TEST(BpeTokenizerTest, LongInputs) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  // Long runs stay linear-ish and correct: one piece of 200k letters, 200k spaces.
  EXPECT_EQ(tok->Encode(std::string(200000, 'l')).size(), 100000u);
  EXPECT_EQ(tok->Encode(std::string(200000, ' ')).size(), 200000u);
  const std::string mixed = std::string(100000, ' ') + "x";
  EXPECT_EQ(tok->Decode(tok->Encode(mixed)), mixed);
}

TEST(BpeTokenizerTest, ConcurrentEncodesAgree) {
  // The BPE cache is shared: threads encoding at once get what a lone thread gets.
  auto reference = Tiny("smollm");
  auto shared = Tiny("smollm");
  ASSERT_NE(reference, nullptr);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i)
    texts.push_back("hello world " + std::to_string(i * 7919) + " héllo<|end|> wörld " +
                    std::string(i, 'l'));
  std::vector<std::vector<int32_t>> want;
  for (const std::string& t : texts) want.push_back(reference->Encode(t));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i + static_cast<size_t>(t) * 17) % texts.size();
          if (shared->Encode(texts[k]) != want[k]) ++wrong;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(BpeTokenizerTest, JsonEqualsCreate) {
  auto a = Tiny();
  auto b = FromJson(TinyJson());
  ASSERT_TRUE(b.ok()) << b.status();
  for (std::string s : {"hello world<|end|>", "héllo  wörld\n\n<u>12", " world's"}) {
    EXPECT_EQ(a->Encode(s), (*b)->Encode(s)) << s;
  }
  // Merges may also be ["left", "right"] pairs.
  json j = TinyJson();
  json pairs = json::array();
  for (const std::string& m : kMerges)
    pairs.push_back({m.substr(0, m.find(' ')), m.substr(m.find(' ') + 1)});
  j["model"]["merges"] = pairs;
  auto c = FromJson(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT((*c)->Encode("hello world"), ElementsAre(kHello, kSpaceWorld));
}

// ---- refusals ----------------------------------------------------------------------------------

void ExpectRefused(const json& j, const std::string& what) {
  auto tok = FromJson(j);
  ASSERT_FALSE(tok.ok()) << "accepted; expected an error naming " << what;
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr(what));
}

TEST(BpeTokenizerJsonTest, RefusesWhatItDoesNotImplement) {
  struct Case {
    const char* pointer;  // JSON pointer into TinyJson()
    json value;
    const char* expected;  // in the message
  };
  const std::vector<Case> cases = {
      {"/normalizer", {{"type", "Lowercase"}}, "normalizer"},
      {"/normalizer", {{"type", "NFKC"}}, "NFKC"},
      {"/normalizer",
       {{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}}}},
       "normalizers[0]"},
      {"/model/dropout", 0.1, "model.dropout"},
      {"/model/continuing_subword_prefix", "##", "continuing_subword_prefix"},
      {"/model/end_of_word_suffix", "</w>", "end_of_word_suffix"},
      {"/model/byte_fallback", true, "byte_fallback"},
      {"/model/type", "WordPiece", "model.type"},
      {"/model/foo", 1, "model.foo"},
      {"/model/unk_token", "<nope>", "model.unk_token"},
      {"/model/merges/0", 7, "model.merges[0]"},
      {"/model/merges/0", "h e x", "model.merges[0]"},
      {"/model/merges/0", "q q", "'qq' is not in the vocabulary"},
      {"/model/merges/0", "h zz", "'zz' is not in the vocabulary"},
      {"/model/vocab/e", 104, "share id"},
      {"/model/vocab/e", -3, "model.vocab"},
      {"/model/vocab/e", 16777215, "largest id"},
      {"/pre_tokenizer", nullptr, "pre_tokenizer"},
      {"/pre_tokenizer", {{"type", "Whitespace"}}, "Whitespace"},
      {"/pre_tokenizer", {{"type", "Metaspace"}}, "Metaspace"},
      {"/pre_tokenizer/foo", true, "pre_tokenizer.foo"},
      {"/pre_tokenizer",
       {{"type", "Sequence"}, {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}},
       "ByteLevel must be the last"},
      {"/pre_tokenizer",
       {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}}}}},
       "no ByteLevel"},
      {"/pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", "a"}}},
           {"behavior", "MergedWithPrevious"},
           {"invert", false}},
          {{"type", "ByteLevel"}}}}},
       "behavior"},
      {"/pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", "a"}}},
           {"behavior", "Isolated"},
           {"invert", true}},
          {{"type", "ByteLevel"}}}}},
       "invert"},
      {"/pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"(\w+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}}}}},
       "\\w"},
      {"/pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", "^a"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}}}}},
       "anchor"},
      {"/pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", "(a"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}}}}},
       "regex"},
      {"/decoder", nullptr, "decoder"},
      {"/decoder", {{"type", "WordPiece"}}, "WordPiece"},
      {"/post_processor", {{"type", "RobertaProcessing"}}, "RobertaProcessing"},
      {"/added_tokens/0/single_word", true, "single_word"},
      {"/added_tokens/1/id", 300, "would give it id 266"},
      {"/added_tokens/1/content", "", "empty content"},
      {"/truncation", {{"max_length", 8}}, "truncation"},
      {"/padding", {{"strategy", "BatchLongest"}}, "padding"},
      {"/version", "2.0", "version"},
      {"/extra", 1, "tokenizer.json.extra"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pointer);
    json j = TinyJson();
    j[json::json_pointer(c.pointer)] = c.value;
    ExpectRefused(j, c.expected);
  }
  // Not JSON at all.
  auto tok = BpeTokenizer::FromTokenizerJsonText("{not json", "x.json");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BpeTokenizer::FromTokenizerJson("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(BpeTokenizerCreateTest, RefusesMalformedVocabularies) {
  struct Case {
    std::function<void(BpeTokenizer::Vocabulary*)> mutate;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {[](auto* v) { v->model = "llama"; }, "model 'llama'"},
      {[](auto* v) { v->pre = "falcon"; }, "pre-tokenizer 'falcon'"},
      {[](auto* v) { v->tokens.clear(), v->token_types.clear(), v->merges.clear(); }, "empty"},
      {[](auto* v) { v->token_types.pop_back(); }, "token types"},
      {[](auto* v) { v->token_types[5] = 6; }, "type 6"},
      {[](auto* v) { v->token_types[5] = 9; }, "type 9"},
      {[](auto* v) { v->tokens[100] = "he"; }, "same token"},
      {[](auto* v) { v->merges.push_back("hex"); }, "not 'left right'"},
      {[](auto* v) { v->merges.push_back("h e l"); }, "not 'left right'"},
      {[](auto* v) { v->merges.push_back(" e"); }, "not 'left right'"},
      {[](auto* v) { v->merges.push_back("x zz"); }, "'zz' is not in the vocabulary"},
      {[](auto* v) { v->merges.push_back("q q"); }, "'qq' is not in the vocabulary"},
      {[](auto* v) { v->bos_id = 267; }, "bos id 267"},
      {[](auto* v) { v->eos_id = -2; }, "eos id -2"},
      {[](auto* v) { v->add_bos = true; }, "add_bos without a bos id"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    BpeTokenizer::Vocabulary v = TinyVocabulary();
    cases[i].mutate(&v);
    auto tok = BpeTokenizer::Create(std::move(v));
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(cases[i].expected));
  }
}

// ---- the Oniguruma -> PCRE2 translation ---------------------------------------------------------

TEST(RegexTest, OnigurumaSemantics) {
  auto re = bpe::Regex::FromOniguruma(R"(\s+)");
  ASSERT_TRUE(re.ok()) << re.status();
  size_t b = 0, e = 0;
  // U+0085 and U+00A0 are \s in Oniguruma (White_Space); U+180E and U+200B are not.
  const std::string s = "a\u0085\u00a0b\u180e\u200bc";
  ASSERT_EQ((*re)->Find(s, 0, &b, &e), bpe::Regex::Result::kMatch);
  EXPECT_EQ(b, 1u);
  EXPECT_EQ(e, 5u);
  EXPECT_EQ((*re)->Find(s, e, &b, &e), bpe::Regex::Result::kNoMatch);
  for (const char* bad : {R"(\w)", R"(\b)", R"(\h)", "^x", "x$", "a{,2}", "[[:alpha:]]", "[a&&b]",
                          "(?m:x)", R"(\1)", "[]a]", R"(\K)", R"(\R)"}) {
    EXPECT_FALSE(bpe::Regex::FromOniguruma(bad).ok()) << bad;
  }
  for (const char* good : {R"(\p{L}+|\P{N})", R"([^\s\p{L}]+)", R"((?i:'s|'t))",
                           R"(\u00e9|\x{41}|\v)", "a{1,3}", R"((?=x)|(?!y)|(?<=z))"}) {
    EXPECT_TRUE(bpe::Regex::FromOniguruma(good).ok()) << good;
  }
  auto lit = bpe::Regex::Literal("a.b*");
  ASSERT_TRUE(lit.ok());
  EXPECT_EQ((*lit)->Find("xxa.b*", 0, &b, &e), bpe::Regex::Result::kMatch);
  EXPECT_EQ(b, 2u);
  EXPECT_EQ((*lit)->Find("a.bbb", 0, &b, &e), bpe::Regex::Result::kNoMatch);
}

TEST(Utf8Test, RepairAndOffsets) {
  std::string out;
  bpe::OffsetEdits edits;
  EXPECT_FALSE(bpe::RepairUtf8("valid é 😀", &out, &edits));
  ASSERT_TRUE(bpe::RepairUtf8("a\xf0\x9f\x98z\xff", &out, &edits));
  EXPECT_EQ(out, "a\xEF\xBF\xBDz\xEF\xBF\xBD");
  ASSERT_EQ(edits.size(), 2u);
  EXPECT_EQ(bpe::MapOffsetBack(edits, 1, false), 1u);
  EXPECT_EQ(bpe::MapOffsetBack(edits, 4, true),
            4u);  // end of the first replacement: after the 3 bad bytes
  EXPECT_EQ(bpe::MapOffsetBack(edits, 5, false), 5u);
  EXPECT_EQ(bpe::MapOffsetBack(edits, 8, true), 6u);
  EXPECT_FALSE(bpe::NfcNormalize("already é", &out, &edits));
  ASSERT_TRUE(bpe::NfcNormalize("Ame\u0301lie \u212b", &out, &edits));
  EXPECT_EQ(out, "Am\u00e9lie \u00c5");
}

}  // namespace
}  // namespace fedlora
