#include "workload/tokenizer.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"

namespace fedlora {
namespace {

bool IsRegularFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> LoadTokenizer(const std::string& model_dir) {
  const std::string json = model_dir + "/tokenizer.json", vocab = model_dir + "/vocab.txt";
  if (IsRegularFile(json)) return WordPieceTokenizer::FromTokenizerJson(json);
  if (IsRegularFile(vocab)) return WordPieceTokenizer::FromVocabFile(vocab);
  return absl::NotFoundError(
      absl::StrCat("no tokenizer in ", model_dir, ": neither ", json, " nor ", vocab, " exists"));
}

}  // namespace fedlora
