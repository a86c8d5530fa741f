#include "core/json.h"

#include <exception>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {
namespace {

absl::string_view AV(std::string_view s) { return ToAbsl(s); }

// Deepest array/object nesting in `text`, ignoring brackets inside strings. Stops counting once
// the limit is passed. Malformed text is left to the parser to report.
int NestingDepthExceeding(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // skip the escaped character (it may be a quote)
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > limit) return depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return 0;
}

// Thrown from the parser callback to abort the parse; caught in ParseJson.
struct DuplicateKey {
  std::string key;
};

absl::Status Missing(std::string_view key, std::string_view type, std::string_view context) {
  return absl::InvalidArgumentError(
      absl::StrCat(AV(context), ": missing required key '", AV(key), "' (", AV(type), ")"));
}

absl::Status WrongType(std::string_view key, std::string_view type, const nlohmann::json& found,
                       std::string_view context) {
  // The only integers any getter refuses are those past INT64_MAX; say so rather than
  // "must be an integer, found integer".
  const bool too_big =
      found.is_number_unsigned() && found.get_ref<const nlohmann::json::number_unsigned_t&>() >
                                        static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  return absl::InvalidArgumentError(
      absl::StrCat(AV(context), ": key '", AV(key), "' must be ", AV(type), ", found ",
                   too_big ? "an integer beyond the int64 range" : AV(JsonTypeName(found))));
}

// Looks `key` up in `obj`. Returns nullptr when absent (or `obj` is not an object: then sets
// *status). Never throws: find() on an object does not.
const nlohmann::json* Find(const nlohmann::json& obj, std::string_view key,
                           std::string_view context, absl::Status* status) {
  if (!obj.is_object()) {
    *status =
        absl::InvalidArgumentError(absl::StrCat(AV(context), ": expected an object to look up '",
                                                AV(key), "' in, found ", AV(JsonTypeName(obj))));
    return nullptr;
  }
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

bool AsInt(const nlohmann::json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get_ref<const nlohmann::json::number_unsigned_t&>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get_ref<const nlohmann::json::number_integer_t&>();
    return true;
  }
  return false;
}

constexpr std::string_view kIntType = "an integer (int64)";
constexpr std::string_view kStringType = "a string";
constexpr std::string_view kNumberType = "a number";
constexpr std::string_view kBoolType = "a boolean";

// Shared body of the required and defaulted getters: `found` is the looked-up value.
template <class T, class Convert>
absl::StatusOr<T> Typed(const nlohmann::json& v, std::string_view key, std::string_view type,
                        std::string_view context, Convert convert) {
  T out;
  if (!convert(v, &out)) return WrongType(key, type, v, context);
  return out;
}

bool AsString(const nlohmann::json& v, std::string* out) {
  if (!v.is_string()) return false;
  *out = v.get_ref<const std::string&>();
  return true;
}
bool AsDouble(const nlohmann::json& v, double* out) {
  if (v.is_number_float())
    *out = v.get_ref<const nlohmann::json::number_float_t&>();
  else if (v.is_number_unsigned())
    *out = static_cast<double>(v.get_ref<const nlohmann::json::number_unsigned_t&>());
  else if (v.is_number_integer())
    *out = static_cast<double>(v.get_ref<const nlohmann::json::number_integer_t&>());
  else
    return false;
  return true;
}
bool AsBool(const nlohmann::json& v, bool* out) {
  if (!v.is_boolean()) return false;
  *out = v.get_ref<const bool&>();
  return true;
}

template <class T, class Convert>
absl::StatusOr<T> Required(const nlohmann::json& obj, std::string_view key, std::string_view type,
                           std::string_view context, Convert convert) {
  absl::Status status;
  const nlohmann::json* v = Find(obj, key, context, &status);
  if (!status.ok()) return status;
  if (v == nullptr) return Missing(key, type, context);
  return Typed<T>(*v, key, type, context, convert);
}

template <class T, class Convert>
absl::StatusOr<T> Optional(const nlohmann::json& obj, std::string_view key, T default_value,
                           std::string_view type, std::string_view context, Convert convert) {
  absl::Status status;
  const nlohmann::json* v = Find(obj, key, context, &status);
  if (!status.ok()) return status;
  if (v == nullptr || v->is_null()) return default_value;
  return Typed<T>(*v, key, type, context, convert);
}

template <class T, class Convert>
absl::StatusOr<std::vector<T>> RequiredArray(const nlohmann::json& obj, std::string_view key,
                                             std::string_view type, std::string_view elem_type,
                                             std::string_view context, Convert convert) {
  absl::Status status;
  const nlohmann::json* v = Find(obj, key, context, &status);
  if (!status.ok()) return status;
  if (v == nullptr) return Missing(key, type, context);
  if (!v->is_array()) return WrongType(key, type, *v, context);
  std::vector<T> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    T elem;
    if (!convert((*v)[i], &elem)) {
      return absl::InvalidArgumentError(absl::StrCat(AV(context), ": key '", AV(key), "' element ",
                                                     i, " must be ", AV(elem_type), ", found ",
                                                     AV(JsonTypeName((*v)[i]))));
    }
    out.push_back(std::move(elem));
  }
  return out;
}

}  // namespace

std::string_view JsonTypeName(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "object";
    case nlohmann::json::value_t::array:
      return "array";
    case nlohmann::json::value_t::string:
      return "string";
    case nlohmann::json::value_t::boolean:
      return "boolean";
    case nlohmann::json::value_t::number_integer:
      return "integer";
    case nlohmann::json::value_t::number_unsigned:
      return "integer";
    case nlohmann::json::value_t::number_float:
      return "floating-point number";
    case nlohmann::json::value_t::binary:
      return "binary";
    case nlohmann::json::value_t::discarded:
      return "discarded";
  }
  return "unknown";
}

absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view what) {
  if (const int depth = NestingDepthExceeding(text, kMaxJsonDepth); depth > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(what), ": JSON nesting deeper than ", kMaxJsonDepth, " levels"));
  }
  // Duplicate keys are legal JSON but ambiguous (which one wins differs between parsers), and a
  // hostile peer can use that to make two readers see different values; reject them. One key set
  // per open object.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&open_objects](int depth, nlohmann::json::parse_event_t event,
                                  nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      open_objects.emplace_back();
    } else if (event == Event::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Event::key && !open_objects.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second) throw DuplicateKey{key};
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const DuplicateKey& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(what), ": duplicate key '", e.key, "' in a JSON object"));
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(what), ": invalid JSON at byte ", e.byte, ": ", e.what()));
  } catch (const std::exception& e) {
    // Anything else the library throws (e.g. bad_alloc on a huge document) is still an error value.
    return absl::InvalidArgumentError(absl::StrCat(AV(what), ": cannot parse JSON: ", e.what()));
  }
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  FEDLORA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseJson(text, path);
}

absl::StatusOr<int64_t> GetInt(const nlohmann::json& obj, std::string_view key,
                               std::string_view context) {
  return Required<int64_t>(obj, key, kIntType, context, AsInt);
}
absl::StatusOr<std::string> GetString(const nlohmann::json& obj, std::string_view key,
                                      std::string_view context) {
  return Required<std::string>(obj, key, kStringType, context, AsString);
}
absl::StatusOr<double> GetDouble(const nlohmann::json& obj, std::string_view key,
                                 std::string_view context) {
  return Required<double>(obj, key, kNumberType, context, AsDouble);
}
absl::StatusOr<bool> GetBool(const nlohmann::json& obj, std::string_view key,
                             std::string_view context) {
  return Required<bool>(obj, key, kBoolType, context, AsBool);
}
absl::StatusOr<std::vector<int64_t>> GetIntArray(const nlohmann::json& obj, std::string_view key,
                                                 std::string_view context) {
  return RequiredArray<int64_t>(obj, key, "an array of integers", kIntType, context, AsInt);
}
absl::StatusOr<std::vector<std::string>> GetStringArray(const nlohmann::json& obj,
                                                        std::string_view key,
                                                        std::string_view context) {
  return RequiredArray<std::string>(obj, key, "an array of strings", kStringType, context,
                                    AsString);
}

absl::StatusOr<int64_t> GetIntOr(const nlohmann::json& obj, std::string_view key,
                                 int64_t default_value, std::string_view context) {
  return Optional<int64_t>(obj, key, default_value, kIntType, context, AsInt);
}
absl::StatusOr<std::string> GetStringOr(const nlohmann::json& obj, std::string_view key,
                                        std::string_view default_value, std::string_view context) {
  return Optional<std::string>(obj, key, std::string(default_value), kStringType, context,
                               AsString);
}
absl::StatusOr<double> GetDoubleOr(const nlohmann::json& obj, std::string_view key,
                                   double default_value, std::string_view context) {
  return Optional<double>(obj, key, default_value, kNumberType, context, AsDouble);
}
absl::StatusOr<bool> GetBoolOr(const nlohmann::json& obj, std::string_view key, bool default_value,
                               std::string_view context) {
  return Optional<bool>(obj, key, default_value, kBoolType, context, AsBool);
}

}  // namespace fedlora
