// Test helper: a tiny classification run on disk, for the tests that load a run's model and data
// through the workload factory (tests/workload, tests/sim). Header-only.
//
//   absl::StatusOr<std::string> dir = testing_util::WriteTinyClassifierRun("sim", {});
//   // <dir>/model, <dir>/train.jsonl, <dir>/eval.jsonl
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/status.h"
#include "tests/model/tiny_checkpoint.h"

namespace fedlora::testing_util {

// The size of the data files.
struct TinyClassifierData {
  int train = 120;     // training examples
  int eval = 45;       // held-out examples
  int min_words = 6;   // words per text: min_words + i % word_cycle for the i-th example
  int word_cycle = 1;  // 1: every text has min_words words
};

// Writes into a new temp dir (MakeTempDir(tag)): model/ (the tiny BERT checkpoint of TinyConfig
// with a vocab.txt of its 100 entries: the specials, then w0 .. w94) and train.jsonl / eval.jsonl
// with three labels (red, green, blue), each label using its own 30 words so that the task is
// learnable. Returns the dir.
inline absl::StatusOr<std::string> WriteTinyClassifierRun(const std::string& tag,
                                                          const TinyClassifierData& data) {
  const std::string dir = MakeTempDir(tag);
  if (dir.empty()) return absl::InternalError(absl::StrCat("cannot make a temp dir for ", tag));
  const std::string model = dir + "/model";
  std::filesystem::create_directories(model);
  FEDLORA_RETURN_IF_ERROR(WriteTinyCheckpoint(model, TinyConfig()));
  std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (int i = 0; i < 95; ++i) absl::StrAppend(&vocab, "w", i, "\n");
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(model + "/vocab.txt", vocab));
  const char* labels[3] = {"red", "green", "blue"};
  auto write_split = [&](const std::string& path, int n, int salt) {
    std::string out;
    for (int i = 0; i < n; ++i) {
      const int y = (i * 7 + salt) % 3;
      std::string text;
      for (int k = 0; k < data.min_words + i % data.word_cycle; ++k)
        absl::StrAppend(&text, k ? " " : "", "w", y * 30 + (i * 13 + k * 5 + salt) % 30);
      absl::StrAppend(&out, "{\"text\": \"", text, "\", \"label\": \"", labels[y], "\"}\n");
    }
    return WriteFileAtomically(path, out);
  };
  FEDLORA_RETURN_IF_ERROR(write_split(dir + "/train.jsonl", data.train, 1));
  FEDLORA_RETURN_IF_ERROR(write_split(dir + "/eval.jsonl", data.eval, 2));
  return dir;
}

}  // namespace fedlora::testing_util
