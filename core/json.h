// JSON on nlohmann-json with errors as values: no exception ever leaves these functions.
//
//   FEDLORA_ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJsonFile(dir + "/config.json"));
//   FEDLORA_ASSIGN_OR_RETURN(int64_t hidden, GetInt(cfg, "hidden_size", "config.json"));
//   FEDLORA_ASSIGN_OR_RETURN(double eps, GetDoubleOr(cfg, "layer_norm_eps", 1e-12, "config.json"));
//
// Getters return InvalidArgument when the key is missing, or has the wrong type; the message
// names the context, the key, the expected type and the type found. The *Or variants return the
// default when the key is missing or null, and still fail on a present value of the wrong type.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fedlora {

// Parses `text`. `what` names the source for the error message ("config.json", "request body");
// a syntax error gives InvalidArgument with `what`, the byte position and the parser's reason.
// A duplicate key in any object is rejected (legal JSON, but parsers disagree on which wins).
// Nesting deeper than kMaxJsonDepth is rejected (the parser is recursive; a hostile input of
// a million '[' would otherwise overflow the stack).
inline constexpr int kMaxJsonDepth = 512;
absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view what);
// ReadFileToString + ParseJson; I/O errors keep their code (NotFound, PermissionDenied, ...).
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

// Integers must be JSON integers within int64 (3.0 and "3" are rejected).
absl::StatusOr<int64_t> GetInt(const nlohmann::json& obj, std::string_view key,
                               std::string_view context);
absl::StatusOr<std::string> GetString(const nlohmann::json& obj, std::string_view key,
                                      std::string_view context);
// Accepts integers too (a JSON writer may print 1.0 as 1).
absl::StatusOr<double> GetDouble(const nlohmann::json& obj, std::string_view key,
                                 std::string_view context);
absl::StatusOr<bool> GetBool(const nlohmann::json& obj, std::string_view key,
                             std::string_view context);
// Arrays whose every element has the type; the error names the first bad index.
absl::StatusOr<std::vector<int64_t>> GetIntArray(const nlohmann::json& obj, std::string_view key,
                                                 std::string_view context);
absl::StatusOr<std::vector<std::string>> GetStringArray(const nlohmann::json& obj,
                                                        std::string_view key,
                                                        std::string_view context);

absl::StatusOr<int64_t> GetIntOr(const nlohmann::json& obj, std::string_view key,
                                 int64_t default_value, std::string_view context);
absl::StatusOr<std::string> GetStringOr(const nlohmann::json& obj, std::string_view key,
                                        std::string_view default_value, std::string_view context);
absl::StatusOr<double> GetDoubleOr(const nlohmann::json& obj, std::string_view key,
                                   double default_value, std::string_view context);
absl::StatusOr<bool> GetBoolOr(const nlohmann::json& obj, std::string_view key, bool default_value,
                               std::string_view context);

// The JSON type name as used in error messages ("object", "array", "string", "integer", ...).
std::string_view JsonTypeName(const nlohmann::json& value);

}  // namespace fedlora
