// Helpers shared by the `fedlora` subcommands: flag handling with the standard exit codes, error
// reporting, tokenizer and dataset loading, and small output writers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fedlora/v1/config.pb.h"
#include "model/tokenizer.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/trainer.h"

namespace fedlora::tools {

// Parses argv into `flags`. Returns nullopt when the command should go on, else the exit code to
// return at once: kExitOk after printing the help (--help), kExitUsage after printing the error
// and a pointer to --help.
std::optional<int> ParseFlagsOrExit(FlagSet& flags, int argc, char** argv);

// Prints "<command>: error: <message>" to stderr and returns kExitFailure.
int Fail(const std::string& command, const absl::Status& status);
// Prints "<command>: <message>" to stderr and returns kExitUsage (bad flag values).
int UsageError(const std::string& command, const std::string& message);

// The model directory's tokenizer: tokenizer.json when present, else vocab.txt (lower-cased).
// NotFound naming both paths when neither exists.
absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> LoadTokenizer(const std::string& model_dir);

// min(requested, the model's max_position_embeddings from model_dir/config.json): a model with
// 512 positions takes --max-seq-len 128, a tiny test model with 64 positions cuts at 64.
absl::StatusOr<int> EffectiveMaxSeqLen(const std::string& model_dir, int requested);

// Reads a labelled dataset (train/dataset.h formats) and tokenizes it. `label_names`, when not
// empty, fixes the label order (an eval set must use the training set's); a label not in it is
// an error. On return `label_names` holds the order used.
// As above, reading the fields the run config's task names (train_config.h DatasetOptionsFromConfig).
absl::StatusOr<TokenizedDataset> LoadTokenizedDataset(const std::string& path, const WordPieceTokenizer& tokenizer,
                                                      int max_seq_len, const v1::TaskConfig& task);
absl::StatusOr<TokenizedDataset> LoadTokenizedDataset(const std::string& path,
                                                      const WordPieceTokenizer& tokenizer,
                                                      int max_seq_len,
                                                      std::vector<std::string>& label_names);

// Writes a little-endian .npy (format version 1.0) holding a C-order array of `shape`.
absl::Status WriteNpyFloat(const std::string& path, const std::vector<float>& data,
                           const std::vector<int64_t>& shape);
absl::Status WriteNpyInt32(const std::string& path, const std::vector<int32_t>& data,
                           const std::vector<int64_t>& shape);

// Whether `path` names an existing directory / regular file.
bool IsDirectory(const std::string& path);
bool IsRegularFile(const std::string& path);

}  // namespace fedlora::tools
