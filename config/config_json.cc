#include "config/config_json.h"

#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/config_io.h"
#include "core/did_you_mean.h"
#include "core/utf8.h"
#include "fedlora/v1/config.pb.h"
#include "google/protobuf/descriptor.h"

namespace fedlora {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using nlohmann::json;

// ------------------------------------------------------------------------------------------------
// Positions

// An input iterator over the text that records the last character nlohmann's lexer read, so that
// the parser's callback knows where it is (nlohmann reports positions only in its exceptions).
class TrackingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackingIterator(const char* p, const char** last_read) : p_(p), last_read_(last_read) {}
  reference operator*() const {
    *last_read_ = p_;
    return *p_;
  }
  TrackingIterator& operator++() {
    ++p_;
    return *this;
  }
  TrackingIterator operator++(int) {
    TrackingIterator before = *this;
    ++p_;
    return before;
  }
  bool operator==(const TrackingIterator& other) const { return p_ == other.p_; }
  bool operator!=(const TrackingIterator& other) const { return p_ != other.p_; }

 private:
  const char* p_;
  const char** last_read_;
};

// "<source>:<line>:<column>: " for the byte at `offset`; columns count UTF-8 characters from 1.
std::string Location(std::string_view text, size_t offset, std::string_view source) {
  offset = std::min(offset, text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else if (!IsUtf8Continuation(static_cast<unsigned char>(text[i]))) {
      ++column;
    }
  }
  if (source.empty()) return absl::StrCat("line ", line, ", column ", column, ": ");
  return absl::StrCat(std::string(source), ":", line, ":", column, ": ");
}

// The offset of the opening quote of the string whose closing quote is at `close`.
size_t OpeningQuote(std::string_view text, size_t close) {
  for (size_t i = close; i-- > 0;) {
    if (text[i] != '"') continue;
    size_t backslashes = 0;
    while (backslashes < i && text[i - 1 - backslashes] == '\\') ++backslashes;
    if (backslashes % 2 == 0) return i;
  }
  return close;
}

// ------------------------------------------------------------------------------------------------
// Syntax

// nlohmann's "syntax error while parsing <context> - <detail>; expected <what>" in a reader's
// words.
std::string DescribeSyntaxError(const std::string& what) {
  std::string message = what;
  if (size_t colon = message.find(": syntax error while parsing "); colon != std::string::npos) {
    message = message.substr(colon + 29);
  } else if (size_t at = message.find("] "); at != std::string::npos) {
    message = message.substr(at + 2);
  }
  const size_t dash = message.find(" - ");
  const std::string context = dash == std::string::npos ? "" : message.substr(0, dash);
  std::string detail = dash == std::string::npos ? message : message.substr(dash + 3);
  if (size_t expected = detail.find("; expected "); expected != std::string::npos)
    detail.resize(expected);
  const bool at_end = absl::StrContains(detail, "unexpected end of input");
  const std::string found = at_end ? "the end of the text" : detail;
  if (context == "object key") {
    if (absl::StrContains(detail, "unexpected '}'"))
      return "a trailing comma before '}' (JSON allows none)";
    if (absl::StrContains(detail, "invalid literal"))
      return "expected a field name in double quotes";
    return absl::StrCat("expected a field name in double quotes, found ", found);
  }
  if (context == "object separator")
    return absl::StrCat("expected ':' after the field name, found ", found);
  if (context == "object")
    return absl::StrCat("expected ',' or '}' after an object member, found ", found);
  if (context == "array")
    return absl::StrCat("expected ',' or ']' after a list item, found ", found);
  if (absl::StrContains(detail, "unexpected ']'"))
    return "a trailing comma before ']' (JSON allows none)";
  if (at_end) return "expected a value, found the end of the text";
  if (absl::StrContains(message, "expected end of input")) {
    return absl::StrCat("text after the end of the config's object (", detail, ")");
  }
  return absl::StrCat("expected a value (", detail, ")");
}

// ------------------------------------------------------------------------------------------------
// Reading the document

struct Frame {
  bool array = false;
  std::string path;  // of this object or list
  std::string key;   // the member being read (objects)
  long index = -1;   // the item being read (lists)
  std::set<std::string> keys;
};

std::string ChildPath(const Frame& f) {
  if (f.array) return absl::StrCat(f.path, "[", f.index, "]");
  return f.path.empty() ? f.key : absl::StrCat(f.path, ".", f.key);
}

struct Document {
  json root;
  std::map<std::string, size_t> key_offsets;  // field path -> offset of its key's opening quote
  std::vector<std::string> problems;          // duplicate keys, located
};

// Parses `text` strictly. A syntax error is returned; duplicate keys are collected in problems.
absl::StatusOr<Document> Parse(std::string_view text, std::string_view source) {
  Document doc;
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), source.empty() ? "" : ": ",
                     "the run config is empty (expected a JSON object {...})"));
  }
  const char* last_read = text.data();
  std::vector<Frame> stack;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    auto begin_child = [&]() -> std::string {
      if (stack.empty()) return "";
      if (stack.back().array) ++stack.back().index;
      return ChildPath(stack.back());
    };
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        Frame f;
        f.array = event == json::parse_event_t::array_start;
        f.path = begin_child();
        stack.push_back(std::move(f));
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key: {
        if (stack.empty()) break;
        Frame& f = stack.back();
        f.key = parsed.get<std::string>();
        const size_t offset = OpeningQuote(text, static_cast<size_t>(last_read - text.data()));
        const std::string path = ChildPath(f);
        if (!f.keys.insert(f.key).second) {
          doc.problems.push_back(absl::StrCat(Location(text, offset, source), path,
                                              " is given twice (JSON keys must be unique)"));
        } else {
          doc.key_offsets.emplace(path, offset);
        }
        break;
      }
      case json::parse_event_t::value:
        if (!stack.empty() && stack.back().array) ++stack.back().index;
        break;
    }
    return true;
  };
  try {
    doc.root = json::parse(TrackingIterator(text.data(), &last_read),
                           TrackingIterator(text.data() + text.size(), &last_read), callback);
  } catch (const json::parse_error& e) {
    size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    // A string token is reported at its closing quote: point at its start.
    if (absl::StrContains(e.what(), "unexpected string literal") && offset < text.size() &&
        text[offset] == '"') {
      offset = OpeningQuote(text, offset);
    }
    return absl::InvalidArgumentError(absl::StrCat(Location(text, offset, source),
                                                   "JSON syntax: ", DescribeSyntaxError(e.what())));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), source.empty() ? "" : ": ",
                                                   "the run config cannot be read: ", e.what()));
  }
  return doc;
}

// ------------------------------------------------------------------------------------------------
// Checking it against RunConfig

// How a value is described in "must be X, not Y".
std::string Describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    case json::value_t::string: {
      std::string s = v.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 37) + "...";
      return absl::StrCat("the string ",
                          json(s).dump(-1, ' ', false, json::error_handler_t::replace));
    }
    case json::value_t::object:
      return "an object {...}";
    case json::value_t::array:
      return "a list [...]";
    default:
      return absl::StrCat("the number ", v.dump());
  }
}

// The enum's values as a person writes them: every name but the zero "*_UNSPECIFIED" one.
std::vector<std::string> EnumNames(const EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    const auto* v = e->value(i);
    if (v->number() == 0 && absl::EndsWith(v->name(), "_UNSPECIFIED")) continue;
    names.push_back(v->name());
  }
  return names;
}

// Integer fields: the range, and whether `v` is a whole number in it (protobuf also reads one
// written as a string, as RunConfigToJson writes 64-bit fields).
bool WholeNumberIn(const json& v, double lo, double hi, bool is_signed) {
  if (v.is_number_integer() || v.is_number_unsigned()) {
    if (v.is_number_unsigned()) return static_cast<double>(v.get<uint64_t>()) <= hi;
    const int64_t x = v.get<int64_t>();
    return static_cast<double>(x) >= lo && static_cast<double>(x) <= hi;
  }
  if (v.is_number_float()) {
    const double x = v.get<double>();
    return std::isfinite(x) && x == std::floor(x) && x >= lo && x <= hi;
  }
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (is_signed) {
      int64_t x;
      return absl::SimpleAtoi(s, &x) && static_cast<double>(x) >= lo &&
             static_cast<double>(x) <= hi;
    }
    uint64_t x;
    return !s.empty() && s[0] != '-' && absl::SimpleAtoi(s, &x) && static_cast<double>(x) <= hi;
  }
  return false;
}

class Checker {
 public:
  Checker(std::string_view text, std::string_view source, const Document& doc)
      : text_(text), source_(source), doc_(doc) {
    IndexFields(v1::RunConfig::descriptor(), "", 0);
  }

  void Message(const Descriptor* d, json& obj, const std::string& path) {
    if (!obj.is_object()) {
      Problem(path,
              path.empty()
                  ? absl::StrCat("the run config must be a JSON object {...}, not ", Describe(obj))
                  : absl::StrCat(path, " must be an object {...}, not ", Describe(obj)));
      return;
    }
    std::map<const google::protobuf::OneofDescriptor*, std::vector<std::string>> oneofs;
    std::map<const FieldDescriptor*, std::string>
        seen;  // a field by both its names ("local_steps", "localSteps")
    for (auto& [key, value] : obj.items()) {
      const std::string child = path.empty() ? key : absl::StrCat(path, ".", key);
      const FieldDescriptor* f = FindField(d, key);
      if (f == nullptr) {
        Problem(child, UnknownField(d, key, path));
        continue;
      }
      if (auto [it, added] = seen.emplace(f, key); !added) {
        Problem(child, absl::StrCat(child, " is given twice (as ", it->second, " and ", key, ")"));
        continue;
      }
      const auto* oneof = f->real_containing_oneof();
      if (oneof != nullptr && !value.is_null()) oneofs[oneof].push_back(child);
      Field(f, value, child);
    }
    for (const auto& [oneof, set] : oneofs) {
      if (set.size() < 2) continue;
      Problem(set[1], absl::StrCat(absl::StrJoin(set, " and "), " exclude each other (",
                                   path.empty() ? "" : absl::StrCat(path, "."), oneof->name(),
                                   "): set one"));
    }
  }

  std::vector<std::string>& problems() { return problems_; }

 private:
  void Field(const FieldDescriptor* f, json& value, const std::string& path) {
    if (value.is_null()) return;  // protobuf reads null as "unset"
    if (f->is_map()) {
      if (!value.is_object())
        Problem(path, absl::StrCat(path, " must be an object {...}, not ", Describe(value)));
      return;  // RunConfig has no maps; protobuf checks their entries
    }
    if (f->is_repeated()) {
      if (!value.is_array()) {
        Problem(path, absl::StrCat(path, " must be a list [...] (each item ", Expected(f),
                                   "), not ", Describe(value)));
        return;
      }
      for (size_t i = 0; i < value.size(); ++i)
        Single(f, value[i], absl::StrCat(path, "[", i, "]"));
      return;
    }
    Single(f, value, path);
  }

  // One value of `f` (an item, for a list).
  void Single(const FieldDescriptor* f, json& v, const std::string& path) {
    bool ok = true;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (absl::StartsWith(f->message_type()->full_name(), "google.protobuf."))
          return;  // protobuf's own JSON forms
        Message(f->message_type(), v, path);
        return;
      case FieldDescriptor::CPPTYPE_ENUM:
        Enum(f->enum_type(), v, path);
        return;
      case FieldDescriptor::CPPTYPE_INT32:
        ok = WholeNumberIn(v, std::numeric_limits<int32_t>::min(),
                           std::numeric_limits<int32_t>::max(), true);
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        ok = WholeNumberIn(v, -9.223372036854775808e18, 9.223372036854775807e18, true);
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        ok = WholeNumberIn(v, 0, std::numeric_limits<uint32_t>::max(), false);
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        ok = WholeNumberIn(v, 0, 1.8446744073709551615e19, false);
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        double x;
        ok =
            v.is_number() || (v.is_string() && (v == "NaN" || v == "Infinity" || v == "-Infinity" ||
                                                absl::SimpleAtod(v.get<std::string>(), &x)));
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL:
        ok = v.is_boolean();
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        ok = v.is_string();
        break;
    }
    if (!ok) Problem(path, absl::StrCat(path, " must be ", Expected(f), ", not ", Describe(v)));
  }

  void Enum(const EnumDescriptor* e, json& v, const std::string& path) {
    std::vector<std::string> names, refused;
    for (const std::string& name : EnumNames(e)) {
      (Unimplemented(path, e->FindValueByName(name)) ? refused : names).push_back(name);
    }
    std::string valid = absl::StrCat("valid: ", absl::StrJoin(names, ", "), " (any case");
    if (!refused.empty())
      absl::StrAppend(&valid, "; not implemented yet: ", absl::StrJoin(refused, ", "));
    valid += ")";
    if (v.is_number_integer()) {  // protobuf reads an enum's number too
      const bool fits = v.is_number_unsigned()
                            ? v.get<uint64_t>() <= uint64_t{INT32_MAX}
                            : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
      if (fits && e->FindValueByNumber(static_cast<int>(v.get<int64_t>())) != nullptr) return;
      Problem(path,
              absl::StrCat(path, " (", v.dump(), ") is not a value of ", e->name(), "; ", valid));
      return;
    }
    if (!v.is_string()) {
      Problem(path, absl::StrCat(path, " must be one of ", absl::StrJoin(names, ", "), ", not ",
                                 Describe(v)));
      return;
    }
    const std::string typed = v.get<std::string>();
    for (int i = 0; i < e->value_count(); ++i) {
      if (absl::EqualsIgnoreCase(e->value(i)->name(), typed)) {
        v = e->value(i)->name();
        return;
      }
    }
    std::string message = absl::StrCat("unknown value '", typed, "' for ", path, "; ", valid);
    if (auto near = NearestName(typed, names))
      absl::StrAppend(&message, "; did you mean ", *near, "?");
    Problem(path, message);
  }

  // Whether UnimplementedSettings refuses `value` at `path` (a field outside any list), as it
  // refuses aggregation.strategy MEDIAN: such values are listed apart, and never suggested.
  static bool Unimplemented(const std::string& path,
                            const google::protobuf::EnumValueDescriptor* value) {
    if (value == nullptr || path.find('[') != std::string::npos) return false;
    v1::RunConfig probe;
    google::protobuf::Message* m = &probe;
    const std::vector<std::string> parts = absl::StrSplit(path, '.');
    for (size_t i = 0; i < parts.size(); ++i) {
      const FieldDescriptor* f = FindField(m->GetDescriptor(), parts[i]);
      if (f == nullptr || f->is_repeated()) return false;
      if (i + 1 < parts.size()) {
        if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) return false;
        m = m->GetReflection()->MutableMessage(m, f);
        continue;
      }
      if (f->cpp_type() != FieldDescriptor::CPPTYPE_ENUM) return false;
      const size_t before = UnimplementedSettings(probe).size();
      m->GetReflection()->SetEnum(m, f, value);
      return UnimplementedSettings(probe).size() > before;
    }
    return false;
  }

  // The expected type in words.
  static std::string Expected(const FieldDescriptor* f) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
        return "a whole number";
      case FieldDescriptor::CPPTYPE_UINT32:
        return "a whole number from 0 to 4294967295";
      case FieldDescriptor::CPPTYPE_UINT64:
        return "a whole number >= 0";
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT:
        return "a number";
      case FieldDescriptor::CPPTYPE_BOOL:
        return "true or false";
      case FieldDescriptor::CPPTYPE_STRING:
        return "a string in double quotes";
      case FieldDescriptor::CPPTYPE_ENUM:
        return absl::StrCat("one of ", absl::StrJoin(EnumNames(f->enum_type()), ", "));
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return "an object {...}";
    }
    return "a value";
  }

  static const FieldDescriptor* FindField(const Descriptor* d, const std::string& key) {
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (f->name() == key || f->json_name() == key) return f;
    }
    return nullptr;
  }

  std::string UnknownField(const Descriptor* d, const std::string& key, const std::string& path) {
    const std::string where = path.empty() ? "the top level" : path;
    std::string message =
        absl::StrCat("unknown field ", path.empty() ? key : absl::StrCat(path, ".", key));
    std::vector<std::string> names;
    for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
    if (auto near = NearestName(key, names))
      return absl::StrCat(message, "; did you mean ", *near, "?");
    if (auto it = fields_by_name_.find(absl::AsciiStrToLower(key)); it != fields_by_name_.end()) {
      return absl::StrCat(message, "; ", key,
                          " belongs elsewhere: ", absl::StrJoin(it->second, " or "));
    }
    return absl::StrCat(message, " (the fields of ", where, ": ", absl::StrJoin(names, ", "), ")");
  }

  // Every field's full path by its lowercase name, for "belongs elsewhere".
  void IndexFields(const Descriptor* d, const std::string& path, int depth) {
    if (depth > 8) return;
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      const std::string child = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
      fields_by_name_[absl::AsciiStrToLower(f->name())].push_back(child);
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map()) {
        IndexFields(f->message_type(), child, depth + 1);
      }
    }
  }

  // A problem at `path`'s key (or at its list's key, for an item).
  void Problem(const std::string& path, const std::string& message) {
    std::string at = path;
    for (;;) {
      if (auto it = doc_.key_offsets.find(at); it != doc_.key_offsets.end()) {
        problems_.push_back(Location(text_, it->second, source_) + message);
        return;
      }
      const size_t bracket = at.rfind('[');
      if (bracket == std::string::npos || bracket == 0) break;
      at.resize(bracket);
    }
    problems_.push_back(absl::StrCat(std::string(source_), source_.empty() ? "" : ": ", message));
  }

  std::string_view text_;
  std::string_view source_;
  const Document& doc_;
  std::map<std::string, std::vector<std::string>> fields_by_name_;
  std::vector<std::string> problems_;
};

}  // namespace

absl::StatusOr<std::string> CheckRunConfigJson(std::string_view json_text,
                                               std::string_view source) {
  absl::StatusOr<Document> doc = Parse(json_text, source);
  if (!doc.ok()) return doc.status();
  Checker checker(json_text, source, *doc);
  checker.Message(v1::RunConfig::descriptor(), doc->root, "");
  std::vector<std::string> problems = doc->problems;
  problems.insert(problems.end(), checker.problems().begin(), checker.problems().end());
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
  return doc->root.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace fedlora
