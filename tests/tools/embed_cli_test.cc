// `fedlora embed` end to end on a tiny random BERT checkpoint: its .npy files hold the frozen
// model's pooled embeddings of the data, as the model computes them one example at a time (no
// padding), and the label indices in the data's order or in --label-names' order; data of one
// label is embedded too.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/bert.h"
#include "tests/model/tiny_classifier_run.h"
#include "tests/tools/cli_test_util.h"
#include "train/dataset.h"
#include "train/trainer.h"
#include "workload/tokenizer.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

class EmbedCli : public testing::CliTest {};

// The array of a little-endian .npy file `fedlora embed` wrote, as `T`s.
template <class T>
std::vector<T> ReadNpy(const std::string& path) {
  auto bytes = ReadFileToString(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok() || bytes->size() < 10) return {};
  const size_t header = static_cast<uint8_t>((*bytes)[8]) |
                        (static_cast<size_t>(static_cast<uint8_t>((*bytes)[9])) << 8);
  std::vector<T> out((bytes->size() - 10 - header) / sizeof(T));
  std::memcpy(out.data(), bytes->data() + 10 + header, out.size() * sizeof(T));
  return out;
}

TEST_F(EmbedCli, WritesTheFrozenModelsPooledEmbeddings) {
  // Texts of 3 to 7 words: batches of 4 pad the shorter ones.
  auto run = testing_util::WriteTinyClassifierRun(
      "embed_cli", {.train = 3, .eval = 11, .min_words = 3, .word_cycle = 5});
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string model_dir = *run + "/model", data_path = *run + "/eval.jsonl";

  // The reference: the checkpoint, its tokenizer and the data loaded here, one example a pass.
  auto tokenizer = LoadTokenizer(model_dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto raw = LoadDataset(data_path);
  ASSERT_TRUE(raw.ok()) << raw.status();
  auto data = TokenizeDataset(*raw, **tokenizer, 64);
  ASSERT_TRUE(data.ok()) << data.status();
  ModelOptions options;
  options.max_batch = 1;
  options.max_seq = 64;
  auto model = BertClassifier::Load(model_dir, options);
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t hidden = (*model)->config().hidden_size, n = data->size();
  const int32_t pad_id = static_cast<int32_t>((*model)->config().pad_token_id);

  std::vector<float> mean;
  for (Pooling pooling : {Pooling::kMean, Pooling::kCls}) {
    const std::string name = pooling == Pooling::kMean ? "mean" : "cls";
    const std::string out = dir_ + "/" + name + ".npy", labels = dir_ + "/" + name + "_labels.npy";
    testing::CliResult r =
        Run({"embed", "--model", model_dir, "--data", data_path, "--out", out, "--labels-out",
             labels, "--pooling", name, "--batch-size", "4", "--threads", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("fedlora embed: 11 x 32 embeddings written to " + out));
    EXPECT_EQ(r.out, "");
    const std::vector<float> got = ReadNpy<float>(out);
    ASSERT_EQ(got.size(), static_cast<size_t>(n * hidden));
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<int64_t> one = {i};
      auto want = (*model)->PooledEmbeddings(MakeBatch(*data, one, pad_id), pooling);
      ASSERT_TRUE(want.ok()) << want.status();
      for (int64_t h = 0; h < hidden; ++h) {
        ASSERT_TRUE(std::isfinite(got[i * hidden + h]));
        ASSERT_NEAR(got[i * hidden + h], (*want)[h], 1e-5)
            << name << " example " << i << " [" << h << "]";
      }
    }
    // The data's labels in their sorted order: blue 0, green 1, red 2.
    const std::vector<int32_t> got_labels = ReadNpy<int32_t>(labels);
    ASSERT_EQ(got_labels.size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got_labels[i], raw->examples[i].label) << i;
    if (pooling == Pooling::kMean) mean = got;
    if (pooling == Pooling::kCls) {
      EXPECT_NE(got, mean);
    }
  }

  // --label-names fixes the order of the label indices; the embeddings stay the same.
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/labels.txt", "red\ngreen\nblue\n").ok());
  testing::CliResult r =
      Run({"embed", "--model", model_dir, "--data", data_path, "--out", dir_ + "/named.npy",
           "--labels-out", dir_ + "/named_labels.npy", "--label-names", dir_ + "/labels.txt",
           "--batch-size", "4", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadNpy<float>(dir_ + "/named.npy"), mean);
  const std::vector<int32_t> named = ReadNpy<int32_t>(dir_ + "/named_labels.npy");
  ASSERT_EQ(named.size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(named[i], 2 - raw->examples[i].label) << i;

  // Data of one label has embeddings too (no classifier is trained on it).
  ASSERT_TRUE(
      WriteFileAtomically(dir_ + "/one.jsonl", "{\"text\": \"w1 w2\", \"label\": \"red\"}\n").ok());
  r = Run({"embed", "--model", model_dir, "--data", dir_ + "/one.jsonl", "--out", dir_ + "/one.npy",
           "--labels-out", dir_ + "/one_labels.npy", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadNpy<float>(dir_ + "/one.npy").size(), static_cast<size_t>(hidden));
  EXPECT_EQ(ReadNpy<int32_t>(dir_ + "/one_labels.npy"), std::vector<int32_t>{0});
  std::filesystem::remove_all(*run);
}

}  // namespace
}  // namespace fedlora
