#include "train/dataset.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fedlora_dataset_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  // Expects an InvalidArgument error whose message holds `name:line` and `problem`.
  void ExpectError(const std::string& name, const std::string& content, int line,
                   const std::string& problem, const DatasetOptions& options = {}) {
    const std::string path = Write(name, content);
    auto ds = LoadDataset(path, options);
    ASSERT_FALSE(ds.ok()) << name << " loaded";
    EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument) << ds.status();
    const std::string message(ds.status().message());
    if (line > 0) {
      EXPECT_THAT(message, HasSubstr(path + ":" + std::to_string(line))) << message;
    }
    EXPECT_THAT(message, HasSubstr(problem)) << message;
  }

  std::filesystem::path dir_;
};

std::vector<std::string> Texts(const Dataset& ds) {
  std::vector<std::string> out;
  for (const auto& e : ds.examples) out.push_back(e.text);
  return out;
}
std::vector<int> Labels(const Dataset& ds) {
  std::vector<int> out;
  for (const auto& e : ds.examples) out.push_back(e.label);
  return out;
}

TEST_F(DatasetTest, JsonlWithStringLabelsCollectsSortedNames) {
  auto ds =
      LoadDataset(Write("a.jsonl",
                        "{\"text\": \"first\", \"label\": \"work\"}\n"
                        "\n"
                        "{\"label\": \"computers\", \"text\": \"second \\u00e9\", \"extra\": 1}\r\n"
                        "{\"text\": \"third\", \"label\": \"work\", \"text_pair\": \"a pair\"}\n"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_THAT(ds->label_names, ElementsAre("computers", "work"));
  EXPECT_THAT(Texts(*ds), ElementsAre("first", "second \u00e9", "third"));
  EXPECT_THAT(Labels(*ds), ElementsAre(1, 0, 1));
  EXPECT_FALSE(ds->examples[0].text_pair.has_value());
  ASSERT_TRUE(ds->examples[2].text_pair.has_value());
  EXPECT_EQ(*ds->examples[2].text_pair, "a pair");
}

TEST_F(DatasetTest, JsonlIntegerLabelsAreIndices) {
  auto ds = LoadDataset(
      Write("a.jsonl", "{\"text\": \"x\", \"label\": 2}\n{\"text\": \"y\", \"label\": 0}\n"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_THAT(ds->label_names, ElementsAre("0", "1", "2"));
  EXPECT_THAT(Labels(*ds), ElementsAre(2, 0));
  // With label_names, integers index into them and strings must be among them.
  DatasetOptions options;
  options.label_names = {"neg", "pos", "neutral"};
  ds = LoadDataset(
      Write("b.jsonl",
            "{\"text\": \"x\", \"label\": 1}\n{\"text\": \"y\", \"label\": \"neutral\"}\n"),
      options);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_THAT(ds->label_names, ElementsAre("neg", "pos", "neutral"));
  EXPECT_THAT(Labels(*ds), ElementsAre(1, 2));
}

TEST_F(DatasetTest, CustomFieldNames) {
  DatasetOptions options;
  options.text_field = "sentence1";
  options.pair_field = "sentence2";
  options.label_field = "gold";
  auto ds = LoadDataset(
      Write("a.jsonl", "{\"sentence1\": \"a\", \"sentence2\": null, \"gold\": \"x\"}\n"), options);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_THAT(Texts(*ds), ElementsAre("a"));
  EXPECT_FALSE(ds->examples[0].text_pair.has_value());
}

TEST_F(DatasetTest, JsonlErrorsNameFileAndLine) {
  ExpectError("malformed.jsonl", "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\", \n", 2,
              "");
  ExpectError("array.jsonl", "[1, 2]\n", 1, "expected a JSON object");
  ExpectError("notext.jsonl", "{\"text\": \"a\", \"label\": \"x\"}\n\n{\"label\": \"x\"}\n", 3,
              "missing field \"text\"");
  ExpectError("nolabel.jsonl", "{\"text\": \"a\"}\n", 1, "missing field \"label\"");
  ExpectError("textnum.jsonl", "{\"text\": 5, \"label\": \"x\"}\n", 1, "expected string");
  ExpectError("floatlabel.jsonl", "{\"text\": \"a\", \"label\": 1.5}\n", 1,
              "label name (string) or index");
  ExpectError("neglabel.jsonl", "{\"text\": \"a\", \"label\": -1}\n", 1, "negative label index");
  ExpectError("emptytext.jsonl", "{\"text\": \" \\t\", \"label\": \"x\"}\n", 1, "empty text");
  ExpectError("mixed.jsonl",
              "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\", \"label\": 0}\n", 2,
              "mix integer indices and names");
  DatasetOptions options;
  options.label_names = {"x", "y"};
  ExpectError("unknown.jsonl",
              "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\", \"label\": \"z\"}\n", 2,
              "unknown label \"z\"", options);
  ExpectError("range.jsonl", "{\"text\": \"a\", \"label\": 2}\n", 1, "out of range", options);
  options = {};
  options.max_text_bytes = 8;
  ExpectError(
      "long.jsonl",
      "{\"text\": \"12345678\", \"label\": \"x\"}\n{\"text\": \"123456789\", \"label\": \"x\"}\n",
      2, "more than max_text_bytes", options);
}

TEST_F(DatasetTest, CsvFollowsRfc4180) {
  auto ds = LoadDataset(Write("a.csv",
                              "id,text,label\r\n"
                              "1,plain text,pos\r\n"
                              "2,\"quoted, with comma\",neg\r\n"
                              "3,\"a \"\"quote\"\" and a\nline break\",pos\r\n"
                              "\r\n"
                              "4,5\" literal quote,neg"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_THAT(Texts(*ds), ElementsAre("plain text", "quoted, with comma",
                                      "a \"quote\" and a\nline break", "5\" literal quote"));
  EXPECT_THAT(ds->label_names, ElementsAre("neg", "pos"));
  EXPECT_THAT(Labels(*ds), ElementsAre(1, 0, 1, 0));
}

TEST_F(DatasetTest, CsvPairColumnAndNumericLabelOrder) {
  auto ds = LoadDataset(Write("a.csv",
                              "text,text_pair,label\n"
                              "a,b,10\n"
                              "c,,2\n"
                              "e,f,1\n"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  // Decimal names sort by value: 1 < 2 < 10.
  EXPECT_THAT(ds->label_names, ElementsAre("1", "2", "10"));
  EXPECT_THAT(Labels(*ds), ElementsAre(2, 1, 0));
  EXPECT_EQ(ds->examples[0].text_pair.value_or("-"), "b");
  EXPECT_FALSE(ds->examples[1].text_pair.has_value());  // empty cell: no pair
}

TEST_F(DatasetTest, CsvErrors) {
  // Ragged rows name the line where the row starts, counting line breaks inside quotes.
  ExpectError("ragged.csv", "text,label\n\"two\nlines\",x\nb,x,extra\n", 4,
              "row has 3 fields, the header has 2");
  ExpectError("short.csv", "text,label\nonly\n", 2, "row has 1 fields");
  ExpectError("unclosed.csv", "text,label\n\"never closed,x\n", 2, "never closed");
  ExpectError("after.csv", "text,label\n\"a\"b,x\n", 2, "text after the closing quote");
  ExpectError("nocolumn.csv", "sentence,label\na,x\n", 1, "no column \"text\"");
  ExpectError("twice.csv", "text,text,label\na,b,x\n", 1, "appears twice");
  ExpectError("emptylabel.csv", "text,label\na,\n", 2, "empty label");
  ExpectError("emptytext.csv", "text,label\n,x\n", 2, "empty text");
  ExpectError("headeronly.csv", "text,label\n", 0, "no examples");
}

// A row ending in a separator has one more, empty, field, whether or not a line end follows it
// (found by fuzz/fuzz_dataset.cc: at the very end of the file such a row counted two).
TEST_F(DatasetTest, TrailingSeparatorAtEndOfFileIsOneEmptyField) {
  for (const char* ext : {".csv", ".tsv"}) {
    const std::string sep = std::string(ext) == ".csv" ? "," : "\t";
    const std::string header = "text" + sep + "label" + sep + "note\n";
    for (const char* end : {"", "\n"}) {
      const std::string name = std::string("end") + (*end ? "_newline" : "") + ext;
      auto ds = LoadDataset(Write(name, header + "hello" + sep + "x" + sep + end));
      ASSERT_TRUE(ds.ok()) << name << ": " << ds.status();
      EXPECT_THAT(Texts(*ds), ElementsAre("hello"));
    }
    ExpectError(std::string("ragged") + ext, "text" + sep + "label\nhello" + sep + "x" + sep, 2,
                "row has 3 fields, the header has 2");
  }
}

TEST_F(DatasetTest, TsvHasNoQuoting) {
  DatasetOptions options;
  options.text_field = "sentence";
  auto ds = LoadDataset(Write("a.tsv",
                              "sentence\tlabel\n"
                              "it 's \"quoted\" , literally\t1\r\n"
                              "a, b\t0\n"),
                        options);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_THAT(Texts(*ds), ElementsAre("it 's \"quoted\" , literally", "a, b"));
  EXPECT_THAT(ds->label_names, ElementsAre("0", "1"));
  EXPECT_THAT(Labels(*ds), ElementsAre(1, 0));
  ExpectError("ragged.tsv", "text\tlabel\na\tb\tc\n", 2, "row has 3 fields");
}

TEST_F(DatasetTest, FileLevelErrors) {
  auto missing = LoadDataset((dir_ / "missing.jsonl").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  ExpectError("empty.jsonl", "", 0, "empty file");
  ExpectError("blank.csv", "\n\n  \n", 0, "empty file");
  ExpectError("data.txt", "text,label\n", 0, "unknown dataset format");
  DatasetOptions options;
  options.label_names = {"a", "a"};
  ExpectError("dup.jsonl", "{\"text\": \"t\", \"label\": \"a\"}\n", 0, "twice", options);
}

TEST_F(DatasetTest, Utf8ByteOrderMarkIsSkipped) {
  auto ds = LoadDataset(Write("bom.csv", "\xEF\xBB\xBFtext,label\nhello,x\n"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_THAT(Texts(*ds), ElementsAre("hello"));
}

TEST_F(DatasetTest, LoadLabelNames) {
  auto names = LoadLabelNames(Write("labels.txt", "computers\r\nscience \n\nwork"));
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("computers", "science", "work"));
  auto dup = LoadLabelNames(Write("dup.txt", "a\nb\na\n"));
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr(":3:"));
  EXPECT_EQ(LoadLabelNames(Write("none.txt", "\n\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The fortunes corpus built by scripts/setup.sh, when present: 8 classes, 400 + 100 each.
TEST_F(DatasetTest, FortunesCorpusLoads) {
  const char* source_dir = std::getenv("FEDLORA_SOURCE_DIR");
  if (source_dir == nullptr) GTEST_SKIP() << "FEDLORA_SOURCE_DIR is not set";
  const std::string dir = std::string(source_dir) + "/data/fortunes/";
  if (!std::filesystem::exists(dir + "train.jsonl"))
    GTEST_SKIP() << "run scripts/setup.sh to build " << dir;
  auto labels = LoadLabelNames(dir + "labels.txt");
  ASSERT_TRUE(labels.ok()) << labels.status();
  DatasetOptions options;
  options.label_names = *labels;
  auto train = LoadDataset(dir + "train.jsonl", options);
  auto test = LoadDataset(dir + "test.jsonl", options);
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(train->label_names.size(), 8u);
  std::vector<int> train_counts(8), test_counts(8);
  for (const auto& e : train->examples) ++train_counts[e.label];
  for (const auto& e : test->examples) ++test_counts[e.label];
  EXPECT_THAT(train_counts, ::testing::Each(400));
  EXPECT_THAT(test_counts, ::testing::Each(100));
}

}  // namespace
}  // namespace fedlora
