// Labelled text-classification datasets from JSONL, CSV or TSV files.
//
//   DatasetOptions options;                       // fields "text", "text_pair", "label"
//   options.label_names = {"negative", "positive"};  // or leave empty to collect them
//   FEDLORA_ASSIGN_OR_RETURN(Dataset train, LoadDataset("data/sst2/train.tsv", options));
//   for (const Example& e : train.examples) { ... e.text, e.text_pair, e.label ... }
//
// The format comes from the file extension:
//   .jsonl  one JSON object per line; blank lines are skipped. The label is a string (a label
//           name) or a non-negative integer (an index into the label set). The pair field may be
//           absent or null.
//   .csv    RFC 4180: a header row, comma-separated fields, fields optionally in double quotes
//           (which may then hold commas, line breaks and "" for a quote); LF or CRLF line ends.
//   .tsv    a header row, tab-separated fields, no quoting (quotes are literal text, as in the
//           GLUE files); LF or CRLF line ends.
//   In CSV and TSV the label cell is a label name; the pair column is optional, an empty pair
//   cell means no pair.
//
// Label set: when options.label_names is non-empty it is the label set, in that order, and a
// label outside it is an error. Otherwise the set is the distinct label names found, sorted
// (numerically when every name is a decimal integer, so "2" < "10"); integer JSON labels then
// need no names and the set is "0" .. "max", so that index k stays class k.
//
// Errors (InvalidArgument unless said otherwise; the message names file:line): unknown
// extension, missing file (NotFound), empty file or no examples, malformed JSON or a line that
// is not an object, missing text or label field, a field of the wrong type, empty text (only
// whitespace counts as empty), text or pair longer than max_text_bytes, unknown label, negative
// or out-of-range label index, a JSONL file mixing integer and string labels without label_names,
// a CSV/TSV header lacking the text or label column or holding a column twice, a row whose field
// count differs from the header's, a CSV quote that is never closed or is followed by text.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fedlora {

struct Example {
  std::string text;
  std::optional<std::string> text_pair;
  int label = 0;  // index into Dataset::label_names
};

struct Dataset {
  std::vector<Example> examples;  // in file order
  std::vector<std::string> label_names;
};

struct DatasetOptions {
  std::string text_field = "text";
  std::string pair_field = "text_pair";  // optional column/field; absent -> no pairs
  std::string label_field = "label";
  // The label set, in index order. Empty: collect the labels found (see above).
  std::vector<std::string> label_names;
  // Longest accepted text (and pair), in bytes of UTF-8. 1 MiB is far more than any encoder's
  // context (512 tokens is a few KiB); the bound catches a wrong field or a binary file early.
  int64_t max_text_bytes = int64_t{1} << 20;
};

absl::StatusOr<Dataset> LoadDataset(const std::string& path, const DatasetOptions& options = {});

// Reads a label set written one name per line (e.g. data/fortunes/labels.txt); blank lines and
// trailing whitespace are ignored. Errors: NotFound, InvalidArgument (no labels, a duplicate).
absl::StatusOr<std::vector<std::string>> LoadLabelNames(const std::string& path);

}  // namespace fedlora
