#include "train/dataset.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <string_view>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file.h"
#include "core/json.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {
namespace {

// A label as written in the file: a name, or (JSONL only) an integer index.
using RawLabel = std::variant<std::string, int64_t>;

struct RawExample {
  int64_t line;  // 1-based line where the record starts, for error messages
  std::string text;
  std::optional<std::string> text_pair;
  RawLabel label;
};

absl::Status LineError(const std::string& path, int64_t line, std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", std::string(problem)));
}

bool IsBlank(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

// Checks the text and pair of a record. An empty pair means "no pair".
absl::Status CheckTexts(const std::string& path, const DatasetOptions& options, RawExample* ex) {
  if (IsBlank(ex->text))
    return LineError(path, ex->line, absl::StrCat("empty text in \"", options.text_field, "\""));
  if (static_cast<int64_t>(ex->text.size()) > options.max_text_bytes) {
    return LineError(path, ex->line,
                     absl::StrCat("text is ", ex->text.size(),
                                  " bytes, more than max_text_bytes = ", options.max_text_bytes));
  }
  if (ex->text_pair.has_value()) {
    if (ex->text_pair->empty()) {
      ex->text_pair.reset();
    } else if (static_cast<int64_t>(ex->text_pair->size()) > options.max_text_bytes) {
      return LineError(path, ex->line,
                       absl::StrCat("text pair is ", ex->text_pair->size(),
                                    " bytes, more than max_text_bytes = ", options.max_text_bytes));
    }
  }
  return absl::OkStatus();
}

// ---- JSONL ------------------------------------------------------------------------------------

absl::StatusOr<std::vector<RawExample>> ParseJsonl(const std::string& path, std::string_view data,
                                                   const DatasetOptions& options) {
  std::vector<RawExample> out;
  int64_t line_number = 0;
  size_t pos = 0;
  while (pos < data.size()) {
    size_t eol = data.find('\n', pos);
    if (eol == std::string_view::npos) eol = data.size();
    std::string_view line = data.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_number;
    if (IsBlank(line)) continue;
    auto parsed = ParseJson(line, absl::StrCat(path, ":", line_number));
    if (!parsed.ok()) return parsed.status();  // the message already names path:line
    const nlohmann::json& obj = *parsed;
    if (!obj.is_object()) {
      return LineError(path, line_number,
                       absl::StrCat("expected a JSON object, got ", ToAbsl(JsonTypeName(obj))));
    }
    RawExample ex;
    ex.line = line_number;
    auto text_it = obj.find(options.text_field);
    if (text_it == obj.end())
      return LineError(path, line_number,
                       absl::StrCat("missing field \"", options.text_field, "\""));
    if (!text_it->is_string()) {
      return LineError(path, line_number,
                       absl::StrCat("field \"", options.text_field, "\" is ",
                                    ToAbsl(JsonTypeName(*text_it)), ", expected string"));
    }
    ex.text = text_it->get<std::string>();
    auto pair_it = obj.find(options.pair_field);
    if (pair_it != obj.end() && !pair_it->is_null()) {
      if (!pair_it->is_string()) {
        return LineError(path, line_number,
                         absl::StrCat("field \"", options.pair_field, "\" is ",
                                      ToAbsl(JsonTypeName(*pair_it)), ", expected string or null"));
      }
      ex.text_pair = pair_it->get<std::string>();
    }
    auto label_it = obj.find(options.label_field);
    if (label_it == obj.end()) {
      return LineError(path, line_number,
                       absl::StrCat("missing field \"", options.label_field, "\""));
    }
    if (label_it->is_string()) {
      ex.label = label_it->get<std::string>();
      if (std::get<std::string>(ex.label).empty()) {
        return LineError(path, line_number,
                         absl::StrCat("empty label in \"", options.label_field, "\""));
      }
    } else if (label_it->is_number_integer()) {
      // get<int64_t> of a uint64 above INT64_MAX wraps negative, which the check below rejects.
      const int64_t index = label_it->get<int64_t>();
      if (index < 0)
        return LineError(path, line_number, absl::StrCat("negative label index ", index));
      ex.label = index;
    } else {
      return LineError(
          path, line_number,
          absl::StrCat("field \"", options.label_field, "\" is ", ToAbsl(JsonTypeName(*label_it)),
                       ", expected a label name (string) or index (integer)"));
    }
    FEDLORA_RETURN_IF_ERROR(CheckTexts(path, options, &ex));
    out.push_back(std::move(ex));
  }
  return out;
}

// ---- CSV / TSV --------------------------------------------------------------------------------

struct Row {
  int64_t line;  // where the row starts
  std::vector<std::string> fields;
};

// Splits delimited text into rows. With `quoting` (CSV) a field that starts with '"' runs to the
// matching '"', "" inside it is a literal quote, and it may span lines; a quote inside an
// unquoted field is literal (as in Python's csv module). Without quoting (TSV) every character
// but the separator and line ends is literal. Empty lines are skipped.
absl::StatusOr<std::vector<Row>> SplitRows(const std::string& path, std::string_view data, char sep,
                                           bool quoting) {
  std::vector<Row> rows;
  const size_t n = data.size();
  size_t i = 0;
  int64_t line = 1;
  auto at_line_end = [&](size_t k) {
    return k == n || data[k] == '\n' || (data[k] == '\r' && (k + 1 == n || data[k + 1] == '\n'));
  };
  while (i < n) {
    Row row;
    row.line = line;
    bool any_quoted = false;
    while (true) {
      std::string field;
      if (quoting && i < n && data[i] == '"') {
        any_quoted = true;
        const int64_t quote_line = line;
        ++i;
        while (true) {
          if (i >= n) return LineError(path, quote_line, "quoted field is never closed");
          const char c = data[i];
          if (c == '"') {
            if (i + 1 < n && data[i + 1] == '"') {
              field.push_back('"');
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (c == '\n') ++line;
          field.push_back(c);
          ++i;
        }
        if (i < n && data[i] != sep && !at_line_end(i)) {
          return LineError(path, line, "text after the closing quote of a quoted field");
        }
      } else {
        const size_t start = i;
        while (i < n && data[i] != sep && !at_line_end(i)) ++i;
        field.assign(data.substr(start, i - start));
      }
      row.fields.push_back(std::move(field));
      if (i < n && data[i] == sep) {
        ++i;
        continue;  // the next field: empty when a line end or the end of the data follows
      }
      // End of the row: skip "\r\n" or "\n" (or nothing at end of data).
      if (i < n && data[i] == '\r') ++i;
      if (i < n && data[i] == '\n') ++i;
      ++line;
      break;
    }
    if (row.fields.size() == 1 && row.fields[0].empty() && !any_quoted) continue;  // empty line
    rows.push_back(std::move(row));
  }
  return rows;
}

absl::StatusOr<std::vector<RawExample>> ParseDelimited(const std::string& path,
                                                       std::string_view data, char sep,
                                                       bool quoting,
                                                       const DatasetOptions& options) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<Row> rows, SplitRows(path, data, sep, quoting));
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty file"));
  const Row& header = rows[0];
  std::map<std::string, size_t, std::less<>> columns;
  for (size_t c = 0; c < header.fields.size(); ++c) {
    const std::string& name = header.fields[c];
    if (!columns.emplace(name, c).second &&
        (name == options.text_field || name == options.pair_field || name == options.label_field)) {
      return LineError(path, header.line,
                       absl::StrCat("column \"", name, "\" appears twice in the header"));
    }
  }
  auto column = [&](const std::string& name) -> std::optional<size_t> {
    auto it = columns.find(name);
    return it == columns.end() ? std::nullopt : std::optional<size_t>(it->second);
  };
  const std::optional<size_t> text_col = column(options.text_field);
  const std::optional<size_t> label_col = column(options.label_field);
  const std::optional<size_t> pair_col = column(options.pair_field);
  for (const auto& [name, col] :
       {std::pair{options.text_field, text_col}, std::pair{options.label_field, label_col}}) {
    if (!col.has_value()) {
      return LineError(path, header.line,
                       absl::StrCat("no column \"", name, "\" in the header (columns: ",
                                    absl::StrJoin(header.fields, ", "), ")"));
    }
  }
  std::vector<RawExample> out;
  out.reserve(rows.size() - 1);
  for (size_t r = 1; r < rows.size(); ++r) {
    Row& row = rows[r];
    if (row.fields.size() != header.fields.size()) {
      return LineError(path, row.line,
                       absl::StrCat("row has ", row.fields.size(), " fields, the header has ",
                                    header.fields.size()));
    }
    RawExample ex;
    ex.line = row.line;
    ex.text = std::move(row.fields[*text_col]);
    if (pair_col.has_value()) ex.text_pair = std::move(row.fields[*pair_col]);
    ex.label = std::move(row.fields[*label_col]);
    if (std::get<std::string>(ex.label).empty()) {
      return LineError(path, row.line,
                       absl::StrCat("empty label in \"", options.label_field, "\""));
    }
    FEDLORA_RETURN_IF_ERROR(CheckTexts(path, options, &ex));
    out.push_back(std::move(ex));
  }
  return out;
}

// ---- labels -----------------------------------------------------------------------------------

std::optional<int64_t> ParseDecimal(std::string_view s) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

// Fills label_names (when not given) and resolves every raw label to its index.
absl::Status ResolveLabels(const std::string& path, const DatasetOptions& options,
                           std::vector<RawExample>& raw, Dataset* dataset) {
  std::vector<std::string> names = options.label_names;
  if (names.empty()) {
    const RawExample* first_index = nullptr;
    const RawExample* first_name = nullptr;
    int64_t max_index = -1;
    std::set<std::string> distinct;
    for (const RawExample& ex : raw) {
      if (const int64_t* index = std::get_if<int64_t>(&ex.label)) {
        if (first_index == nullptr) first_index = &ex;
        max_index = std::max(max_index, *index);
      } else {
        if (first_name == nullptr) first_name = &ex;
        distinct.insert(std::get<std::string>(ex.label));
      }
    }
    if (first_index != nullptr && first_name != nullptr) {
      const RawExample* later = first_index->line > first_name->line ? first_index : first_name;
      return LineError(
          path, later->line,
          "labels mix integer indices and names; give DatasetOptions::label_names to map them");
    }
    // An integer index k without names means class k; a huge index would make a huge label set.
    constexpr int64_t kMaxClasses = int64_t{1} << 20;
    if (max_index >= kMaxClasses) {
      return LineError(path, first_index->line,
                       absl::StrCat("label index ", max_index, " is above the limit of ",
                                    kMaxClasses, " classes without label_names"));
    }
    for (int64_t k = 0; k <= max_index; ++k) names.push_back(std::to_string(k));
    names.insert(names.end(), distinct.begin(), distinct.end());  // std::set: sorted
    const bool all_decimal = !distinct.empty() && std::all_of(distinct.begin(), distinct.end(),
                                                              [](const std::string& s) {
                                                                return ParseDecimal(s).has_value();
                                                              });
    if (all_decimal) {
      std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
        return *ParseDecimal(a) < *ParseDecimal(b);
      });
    }
  }
  std::map<std::string, int, std::less<>> index_of;
  for (size_t k = 0; k < names.size(); ++k) {
    if (!index_of.emplace(names[k], static_cast<int>(k)).second) {
      return absl::InvalidArgumentError(absl::StrCat("label_names holds \"", names[k], "\" twice"));
    }
  }
  dataset->examples.reserve(raw.size());
  for (RawExample& ex : raw) {
    Example out;
    out.text = std::move(ex.text);
    out.text_pair = std::move(ex.text_pair);
    if (const int64_t* index = std::get_if<int64_t>(&ex.label)) {
      if (*index >= static_cast<int64_t>(names.size())) {
        return LineError(
            path, ex.line,
            absl::StrCat("label index ", *index, " is out of range for ", names.size(), " labels"));
      }
      out.label = static_cast<int>(*index);
    } else {
      const std::string& name = std::get<std::string>(ex.label);
      auto it = index_of.find(name);
      if (it == index_of.end()) {
        return LineError(path, ex.line,
                         absl::StrCat("unknown label \"", name,
                                      "\" (labels: ", absl::StrJoin(names, ", "), ")"));
      }
      out.label = it->second;
    }
    dataset->examples.push_back(std::move(out));
  }
  dataset->label_names = std::move(names);
  return absl::OkStatus();
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  for (size_t k = 0; k < suffix.size(); ++k) {
    char c = s[s.size() - suffix.size() + k];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != suffix[k]) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<Dataset> LoadDataset(const std::string& path, const DatasetOptions& options) {
  enum class Format { kJsonl, kCsv, kTsv };
  Format format;
  if (EndsWith(path, ".jsonl")) {
    format = Format::kJsonl;
  } else if (EndsWith(path, ".csv")) {
    format = Format::kCsv;
  } else if (EndsWith(path, ".tsv")) {
    format = Format::kTsv;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": unknown dataset format; expected .jsonl, .csv or .tsv"));
  }
  if (options.max_text_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_text_bytes must be positive, got ", options.max_text_bytes));
  }
  // The whole file in memory: datasets for local fine-tuning are megabytes, and the examples
  // are kept in memory anyway.
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  std::string_view data = bytes;
  if (data.substr(0, 3) == "\xEF\xBB\xBF") data.remove_prefix(3);  // a UTF-8 byte order mark
  if (IsBlank(data)) return absl::InvalidArgumentError(absl::StrCat(path, ": empty file"));

  std::vector<RawExample> raw;
  switch (format) {
    case Format::kJsonl: {
      FEDLORA_ASSIGN_OR_RETURN(raw, ParseJsonl(path, data, options));
      break;
    }
    case Format::kCsv: {
      FEDLORA_ASSIGN_OR_RETURN(raw, ParseDelimited(path, data, ',', /*quoting=*/true, options));
      break;
    }
    case Format::kTsv: {
      FEDLORA_ASSIGN_OR_RETURN(raw, ParseDelimited(path, data, '\t', /*quoting=*/false, options));
      break;
    }
  }
  if (raw.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  Dataset dataset;
  FEDLORA_RETURN_IF_ERROR(ResolveLabels(path, options, raw, &dataset));
  return dataset;
}

absl::StatusOr<std::vector<std::string>> LoadLabelNames(const std::string& path) {
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  std::vector<std::string> names;
  std::set<std::string> seen;
  int64_t line_number = 0;
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t eol = bytes.find('\n', pos);
    if (eol == std::string::npos) eol = bytes.size();
    std::string_view name(bytes.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_number;
    while (!name.empty() && (name.back() == '\r' || name.back() == ' ' || name.back() == '\t'))
      name.remove_suffix(1);
    if (name.empty()) continue;
    if (!seen.insert(std::string(name)).second) {
      return LineError(path, line_number,
                       absl::StrCat("label \"", std::string(name), "\" appears twice"));
    }
    names.emplace_back(name);
  }
  if (names.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no labels"));
  return names;
}

}  // namespace fedlora
