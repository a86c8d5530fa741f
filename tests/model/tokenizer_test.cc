#include "model/tokenizer.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A tiny uncased vocabulary; the id of a token is its index here.
const std::vector<std::string> kVocab = {
    "[PAD]",  "[UNK]",    "[CLS]", "[SEP]",     "[MASK]",  // 0-4
    "the",    "quick",    "brown", "fox",       "un",      // 5-9
    "##aff",  "##able",   "cafe",  "naive",     ",",       // 10-14
    "!",      ".",        "hello", "world",     "\u4e2d",  // 15-19 (中)
    "\u6587", "##s",      "a",     "##a",       "$",       // 20-24 (文)
    "[",      "]",        "mask",  "angstrom",  "lodz",    // 25-29
    "\u2014", "a\u20acb", "i",     "\u03b1",    "\u8c48",  // 30-34 (em dash, a€b, i, α, 豈)
    "b",      "##b",      "Hello", "Caf\u00e9", "stra\u00dfe",  // 35-39
};

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fedlora_tokenizer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteFile(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::string WriteVocab(const std::vector<std::string>& tokens) {
    std::string text;
    for (const auto& t : tokens) text += t + "\n";
    return WriteFile("vocab.txt", text);
  }
  std::unique_ptr<WordPieceTokenizer> Uncased() {
    auto tok = WordPieceTokenizer::FromVocabFile(WriteVocab(kVocab));
    EXPECT_TRUE(tok.ok()) << tok.status();
    return std::move(tok).value();
  }

  std::filesystem::path dir_;
};

TEST_F(TokenizerTest, SpecialIdsAndVocabSize) {
  auto tok = Uncased();
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->unk_id(), 1);
  EXPECT_EQ(tok->cls_id(), 2);
  EXPECT_EQ(tok->sep_id(), 3);
  EXPECT_EQ(tok->vocab_size(), static_cast<int64_t>(kVocab.size()));
  EXPECT_EQ(tok->TokenToId("fox"), 8);
  EXPECT_EQ(tok->TokenToId("##aff"), 10);
  EXPECT_EQ(tok->TokenToId("no-such-token"), 1);
  EXPECT_EQ(tok->IdToToken(8), "fox");
  EXPECT_EQ(tok->IdToToken(-1), "");
  EXPECT_EQ(tok->IdToToken(1000), "");
}

TEST_F(TokenizerTest, LowercasesAndSplitsPunctuation) {
  auto tok = Uncased();
  EXPECT_THAT(tok->Tokenize("The Quick, brown FOX!"),
              ElementsAre("the", "quick", ",", "brown", "fox", "!"));
  // ASCII symbols count as punctuation, as in BERT; a Unicode currency sign (Sc) does not.
  EXPECT_THAT(tok->Tokenize("a$b"), ElementsAre("a", "$", "b"));
  EXPECT_THAT(tok->Tokenize("a\u20acb"), ElementsAre("a\u20acb"));
  // Unicode punctuation (Pd) splits.
  EXPECT_THAT(tok->Tokenize("a\u2014b"), ElementsAre("a", "\u2014", "b"));
}

TEST_F(TokenizerTest, WordPiecesGreedyLongestMatchFirst) {
  auto tok = Uncased();
  EXPECT_THAT(tok->Tokenize("unaffable"), ElementsAre("un", "##aff", "##able"));
  EXPECT_THAT(tok->TokenizeToIds("unaffable"), ElementsAre(9, 10, 11));
  // "ab": "a" then "##b"; "aa": "a" then "##a".
  EXPECT_THAT(tok->Tokenize("ab aa"), ElementsAre("a", "##b", "a", "##a"));
}

TEST_F(TokenizerTest, UncoverableWordIsOneUnk) {
  auto tok = Uncased();
  // "un" matches, but nothing covers "known": the partial pieces are discarded.
  EXPECT_THAT(tok->Tokenize("unknown fox"), ElementsAre("[UNK]", "fox"));
  EXPECT_THAT(tok->TokenizeToIds("zzz"), ElementsAre(1));
}

TEST_F(TokenizerTest, WordsLongerThan100CharactersAreUnk) {
  auto tok = Uncased();
  // 100 characters is still tokenized ("a" + 99 x "##a"); 101 is [UNK].
  const std::vector<int32_t> ids100 = tok->TokenizeToIds(std::string(100, 'a'));
  ASSERT_EQ(ids100.size(), 100u);
  EXPECT_EQ(ids100[0], 22);
  EXPECT_EQ(ids100[99], 23);
  EXPECT_THAT(tok->TokenizeToIds(std::string(101, 'a')), ElementsAre(1));
  // The limit counts code points, not bytes: 60 x "α" is 120 bytes but 60 characters.
  std::string alphas;
  for (int i = 0; i < 60; ++i) alphas += "\u03b1";
  EXPECT_THAT(tok->BasicTokenize(alphas), ElementsAre(alphas));
}

TEST_F(TokenizerTest, StripsAccents) {
  auto tok = Uncased();
  EXPECT_THAT(tok->Tokenize("Caf\u00e9 NA\u00cfVE"), ElementsAre("cafe", "naive"));
  // Precomposed (Latin-1) and decomposed (e + U+0301) forms give the same tokens.
  EXPECT_THAT(tok->Tokenize("cafe\u0301"), ElementsAre("cafe"));
  // Å (Latin-1), Ó, Ź (Latin Extended-A); Ł has no decomposition and stays a distinct letter.
  EXPECT_THAT(tok->BasicTokenize("\u00c5ngstr\u00f6m \u0141\u00d3D\u0179"),
              ElementsAre("angstrom", "\u0142odz"));
  // Latin Extended-B: Ǎ (U+01CD) -> a, ǖ (U+01D6: u + diaeresis + macron) -> u.
  EXPECT_THAT(tok->BasicTokenize("\u01cd\u01d6"), ElementsAre("au"));
  // Vietnamese (Latin Extended Additional) and Greek: ệ -> e, Ά -> α.
  EXPECT_THAT(tok->BasicTokenize("\u1ec7 \u0386"), ElementsAre("e", "\u03b1"));
  // İ decomposes to I + dot above before lower-casing, as in Hugging Face.
  EXPECT_THAT(tok->Tokenize("\u0130"), ElementsAre("i"));
  // ß neither decomposes nor has a one-letter lowercase change.
  EXPECT_THAT(tok->BasicTokenize("STRA\u00dfE"), ElementsAre("stra\u00dfe"));
  // Hangul syllables decompose into conjoining jamo: 한 = ᄒ + ᅡ + ᆫ.
  EXPECT_THAT(tok->BasicTokenize("\ud55c"), ElementsAre("\u1112\u1161\u11ab"));
}

TEST_F(TokenizerTest, CasedVocabularyKeepsCaseAndAccents) {
  auto tok = WordPieceTokenizer::FromVocabFile(WriteVocab(kVocab), /*do_lower_case=*/false);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Tokenize("Hello Caf\u00e9 hello"),
              ElementsAre("Hello", "Caf\u00e9", "hello"));
  EXPECT_THAT((*tok)->Tokenize("HELLO"), ElementsAre("[UNK]"));
}

TEST_F(TokenizerTest, SplitsCjkIdeographs) {
  auto tok = Uncased();
  EXPECT_THAT(tok->Tokenize("hello\u4e2d\u6587world"),
              ElementsAre("hello", "\u4e2d", "\u6587", "world"));
  // Kana are not ideographs: they stay in the word.
  EXPECT_THAT(tok->BasicTokenize("a\u30abb"), ElementsAre("a\u30abb"));
  // A CJK compatibility ideograph (U+F900) is split, then canonically decomposed to U+8C48.
  EXPECT_THAT(tok->Tokenize("a\uf900b"), ElementsAre("a", "\u8c48", "b"));
}

TEST_F(TokenizerTest, CleansControlCharactersAndWhitespace) {
  auto tok = Uncased();
  EXPECT_THAT(tok->Tokenize("hel\x01lo\x7f wor\u200bld\ufffd"), ElementsAre("hello", "world"));
  EXPECT_THAT(tok->Tokenize("the\tquick\r\nbrown\u00a0fox\u3000!"),
              ElementsAre("the", "quick", "brown", "fox", "!"));
  EXPECT_THAT(tok->Tokenize(std::string("the\0fox", 7)),
              ElementsAre("[UNK]"));  // NUL dropped: "thefox"
  EXPECT_THAT(tok->Tokenize(" \t\n "), IsEmpty());
  EXPECT_THAT(tok->Tokenize(""), IsEmpty());
}

TEST_F(TokenizerTest, InvalidUtf8BytesAreDropped) {
  auto tok = Uncased();
  // A stray continuation byte, a byte that never occurs in UTF-8, a truncated 3-byte sequence,
  // an overlong "/" and an encoded surrogate: each byte becomes U+FFFD, which cleaning removes.
  EXPECT_THAT(tok->Tokenize("hel\x80lo \xff"
                            "fox"),
              ElementsAre("hello", "fox"));
  EXPECT_THAT(tok->Tokenize("fox\xe4\xb8"), ElementsAre("fox"));
  EXPECT_THAT(tok->Tokenize("a\xc0\xaf"
                            "b"),
              ElementsAre("a", "##b"));
  EXPECT_THAT(tok->Tokenize("a\xed\xa0\x80"
                            "b"),
              ElementsAre("a", "##b"));
  // A valid sequence right after a bad byte survives.
  EXPECT_THAT(tok->Tokenize("\xe4\xe4\xb8\xad"), ElementsAre("\u4e2d"));
}

// Hostile input: random bytes (mostly invalid UTF-8) and random code points never crash, and
// every id is a vocabulary id. Fixed seed, so a failure reproduces.
TEST_F(TokenizerTest, RandomInputNeverCrashes) {
  auto tok = Uncased();
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text(rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 256);
    if (trial % 2 == 1) {  // well-formed UTF-8 of random code points, some in the tables' ranges
      text.clear();
      for (int k = 0; k < 16; ++k) {
        const char32_t c = rng() % 4 == 0 ? rng() % 0x110000 : rng() % 0x3000;
        if (c >= 0xD800 && c <= 0xDFFF) continue;
        if (c < 0x80) {
          text.push_back(static_cast<char>(c));
        } else if (c < 0x800) {
          text += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
        } else if (c < 0x10000) {
          text += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
                   static_cast<char>(0x80 | (c & 0x3F))};
        } else {
          text +=
              {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
               static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
        }
      }
    }
    const auto e = tok->Encode(text, text, 32);
    ASSERT_LE(e.input_ids.size(), 32u);
    for (int32_t id : e.input_ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, tok->vocab_size());
    }
  }
}

TEST_F(TokenizerTest, SpecialTokensInTextAreKept) {
  auto tok = Uncased();
  EXPECT_THAT(tok->TokenizeToIds("the [MASK] fox[SEP]"), ElementsAre(5, 4, 8, 3));
  // Matching is case-sensitive and on the raw text: "[mask]" is punctuation and a word.
  EXPECT_THAT(tok->Tokenize("[mask]"), ElementsAre("[", "mask", "]"));
}

TEST_F(TokenizerTest, EncodeSingleAndPair) {
  auto tok = Uncased();
  auto e = tok->Encode("the fox", std::nullopt, 0);
  EXPECT_THAT(e.input_ids, ElementsAre(2, 5, 8, 3));
  EXPECT_THAT(e.token_type_ids, ElementsAre(0, 0, 0, 0));
  EXPECT_THAT(e.attention_mask, ElementsAre(1, 1, 1, 1));
  e = tok->Encode("the fox", "hello world", 0);
  EXPECT_THAT(e.input_ids, ElementsAre(2, 5, 8, 3, 17, 18, 3));
  EXPECT_THAT(e.token_type_ids, ElementsAre(0, 0, 0, 0, 1, 1, 1));
  EXPECT_THAT(e.attention_mask, ElementsAre(1, 1, 1, 1, 1, 1, 1));
  // An empty text still gets its special tokens.
  EXPECT_THAT(tok->Encode("", "", 0).input_ids, ElementsAre(2, 3, 3));
}

TEST_F(TokenizerTest, TruncatesSingleFromTheEnd) {
  auto tok = Uncased();
  EXPECT_THAT(tok->Encode("the quick brown fox", std::nullopt, 4).input_ids,
              ElementsAre(2, 5, 6, 3));
  EXPECT_THAT(tok->Encode("the quick brown fox", std::nullopt, 6).input_ids,
              ElementsAre(2, 5, 6, 7, 8, 3));
  EXPECT_THAT(tok->Encode("the quick brown fox", std::nullopt, 100).input_ids,
              ElementsAre(2, 5, 6, 7, 8, 3));
  // Room for the special tokens only; less than that still keeps them.
  EXPECT_THAT(tok->Encode("the quick", std::nullopt, 2).input_ids, ElementsAre(2, 3));
  EXPECT_THAT(tok->Encode("the quick", std::nullopt, 1).input_ids, ElementsAre(2, 3));
  EXPECT_THAT(tok->Encode("the quick", "fox", 2).input_ids, ElementsAre(2, 3, 3));
}

TEST_F(TokenizerTest, TruncatesPairsLongestFirst) {
  auto tok = Uncased();
  // 5 + 2 tokens into 8 - 3 = 5: the short pair is kept whole, the first gets the other 3.
  auto e = tok->Encode("the quick brown fox !", "hello world", 8);
  EXPECT_THAT(e.input_ids, ElementsAre(2, 5, 6, 7, 3, 17, 18, 3));
  EXPECT_THAT(e.token_type_ids, ElementsAre(0, 0, 0, 0, 0, 1, 1, 1));
  // Mirror image: the short first text is kept whole.
  EXPECT_THAT(tok->Encode("hello world", "the quick brown fox !", 8).input_ids,
              ElementsAre(2, 17, 18, 3, 5, 6, 7, 3));
  // Equal lengths 4 + 4 into 5: halves, and on a tie the pair gets the odd token (2 + 3).
  EXPECT_THAT(tok->Encode("the quick brown fox", "the quick brown fox", 8).input_ids,
              ElementsAre(2, 5, 6, 3, 5, 6, 7, 3));
  // 6 + 4 into 5: neither fits in the other's leftover room; the longer first gets 3, the pair 2.
  EXPECT_THAT(tok->Encode("the quick brown fox ! .", "the quick brown fox", 8).input_ids,
              ElementsAre(2, 5, 6, 7, 3, 5, 6, 3));
  // Nothing to cut.
  EXPECT_THAT(tok->Encode("the", "fox", 5).input_ids, ElementsAre(2, 5, 3, 8, 3));
}

TEST_F(TokenizerTest, PadBatchToLongestAndFixed) {
  auto tok = Uncased();
  std::vector<WordPieceTokenizer::Encoding> batch = {tok->Encode("the fox", std::nullopt, 0),
                                                     tok->Encode("the", "fox", 0)};
  std::vector<int32_t> ids, types, mask;
  EXPECT_EQ(PadBatch(batch, 0, tok->pad_id(), &ids, &types, &mask), 5);
  EXPECT_THAT(ids, ElementsAre(2, 5, 8, 3, 0, /**/ 2, 5, 3, 8, 3));
  EXPECT_THAT(types, ElementsAre(0, 0, 0, 0, 0, /**/ 0, 0, 0, 1, 1));
  EXPECT_THAT(mask, ElementsAre(1, 1, 1, 1, 0, /**/ 1, 1, 1, 1, 1));
  EXPECT_EQ(PadBatch(batch, 6, /*pad_id=*/0, &ids, &types, &mask), 6);
  EXPECT_THAT(ids, ElementsAre(2, 5, 8, 3, 0, 0, /**/ 2, 5, 3, 8, 3, 0));
  EXPECT_THAT(mask, ElementsAre(1, 1, 1, 1, 0, 0, /**/ 1, 1, 1, 1, 1, 0));
  // A fixed length shorter than an encoding cuts it.
  EXPECT_EQ(PadBatch(batch, 3, 0, &ids, &types, &mask), 3);
  EXPECT_THAT(ids, ElementsAre(2, 5, 8, /**/ 2, 5, 3));
  EXPECT_EQ(PadBatch({}, 0, 0, &ids, &types, &mask), 0);
  EXPECT_THAT(ids, IsEmpty());
}

TEST_F(TokenizerTest, VocabFileTrimsCarriageReturnsAndKeepsLastDuplicate) {
  auto tok = WordPieceTokenizer::FromVocabFile(
      WriteFile("vocab.txt", "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\nfox\r\nfox\r\nthe"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->TokenizeToIds("the fox"), ElementsAre(6, 5));
  EXPECT_EQ((*tok)->vocab_size(), 7);
  EXPECT_EQ((*tok)->IdToToken(4), "");  // the first "fox" line lost its token
}

TEST_F(TokenizerTest, VocabFileErrors) {
  auto missing = WordPieceTokenizer::FromVocabFile((dir_ / "nope.txt").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto empty = WordPieceTokenizer::FromVocabFile(WriteFile("empty.txt", ""));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("empty"));
  for (const std::string dropped : {"[CLS]", "[SEP]", "[PAD]", "[UNK]"}) {
    std::vector<std::string> tokens;
    for (const auto& t : kVocab) {
      if (t != dropped) tokens.push_back(t);
    }
    auto tok = WordPieceTokenizer::FromVocabFile(WriteVocab(tokens));
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << dropped;
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(dropped));
  }
}

TEST_F(TokenizerTest, FromTokenizerJson) {
  const std::string json = R"({
    "added_tokens": [{"id": 4, "content": "[MASK]", "special": true, "normalized": false}],
    "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                   "strip_accents": null, "lowercase": false},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 5,
              "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "Hello": 5,
                        "hello": 6, "a": 7, "##a": 8}}
  })";
  auto tok = WordPieceTokenizer::FromTokenizerJson(WriteFile("tokenizer.json", json));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_FALSE((*tok)->options().lowercase);
  EXPECT_FALSE((*tok)->options().strip_accents);  // null follows lowercase
  EXPECT_THAT((*tok)->TokenizeToIds("Hello hello[MASK]"), ElementsAre(5, 6, 4));
  // max_input_chars_per_word = 5 comes from the file.
  EXPECT_THAT((*tok)->TokenizeToIds("aaaaa aaaaaa"), ElementsAre(7, 8, 8, 8, 8, 1));
}

TEST_F(TokenizerTest, FromTokenizerJsonErrors) {
  auto missing = WordPieceTokenizer::FromTokenizerJson((dir_ / "nope.json").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto not_json = WordPieceTokenizer::FromTokenizerJson(WriteFile("a.json", "{not json"));
  EXPECT_EQ(not_json.status().code(), absl::StatusCode::kInvalidArgument);
  auto bpe = WordPieceTokenizer::FromTokenizerJson(
      WriteFile("b.json", R"({"model": {"type": "BPE", "vocab": {}}})"));
  EXPECT_EQ(bpe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bpe.status().message()), HasSubstr("BPE"));
  auto bad_id = WordPieceTokenizer::FromTokenizerJson(
      WriteFile("c.json", R"({"model": {"type": "WordPiece", "vocab": {"[PAD]": -1}}})"));
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
  auto no_sep = WordPieceTokenizer::FromTokenizerJson(WriteFile(
      "d.json",
      R"({"model": {"type": "WordPiece", "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2}}})"));
  EXPECT_EQ(no_sep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_sep.status().message()), HasSubstr("[SEP]"));
  auto shared_id = WordPieceTokenizer::FromTokenizerJson(WriteFile(
      "e.json",
      R"({"model": {"type": "WordPiece", "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "x": 3}}})"));
  EXPECT_EQ(shared_id.status().code(), absl::StatusCode::kInvalidArgument);
}

// A small file must not make the id table large: found by fuzz_tokenizer (a 68-byte file whose
// [UNK] id 16,777,215 made the loader allocate 512 MiB). Gaps in the ids are allowed up to 65,536.
TEST_F(TokenizerTest, FromTokenizerJsonRefusesSparseHugeIds) {
  auto sparse = WordPieceTokenizer::FromTokenizerJson(WriteFile(
      "sparse.json",
      R"({"model": {"type": "WordPiece", "vocab": {"[CLS]": 0, "[SEP]": 1, "[PAD]": 2, "[UNK]": 16777215}}})"));
  EXPECT_EQ(sparse.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sparse.status().message()),
              HasSubstr("largest id is 16777215 for 4 tokens"));
  auto gaps = WordPieceTokenizer::FromTokenizerJson(WriteFile(
      "gaps.json",
      R"({"model": {"type": "WordPiece", "vocab": {"[CLS]": 0, "[SEP]": 1, "[PAD]": 2, "[UNK]": 65539}}})"));
  ASSERT_TRUE(gaps.ok()) << gaps.status();
  EXPECT_EQ((*gaps)->TokenizeToIds("word"), std::vector<int32_t>{65539});
  auto one_more = WordPieceTokenizer::FromTokenizerJson(WriteFile(
      "gaps2.json",
      R"({"model": {"type": "WordPiece", "vocab": {"[CLS]": 0, "[SEP]": 1, "[PAD]": 2, "[UNK]": 65540}}})"));
  EXPECT_EQ(one_more.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
