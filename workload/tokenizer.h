// The tokenizer of an encoder checkpoint, for every command, the simulator and the client site.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace fedlora {

// The model directory's tokenizer: tokenizer.json when present, else vocab.txt (lower-cased).
// NotFound naming both paths when neither exists.
absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> LoadTokenizer(const std::string& model_dir);

}  // namespace fedlora
