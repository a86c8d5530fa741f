// Strict reading of a run config's JSON text, before protobuf's JSON parser sees it: errors a
// person can act on, each at its line and column.
//
//   absl::StatusOr<std::string> text = CheckRunConfigJson(json, "run.json");
//   // "run.json:3:5: JSON syntax: a trailing comma before '}' (JSON allows none)"
//   // "run.json:7:5: unknown field selection.clients_per_rund; did you mean clients_per_round?"
//   // "run.json:9:17: unknown value 'FEDAVGG' for aggregation.strategy; valid: FEDAVG, ...; did
//   you mean FEDAVG?"
//
// Protobuf's parser accepts trailing commas, unquoted keys and duplicate keys, and names types as
// protobuf does (TYPE_UINT32); this check refuses the first three (nlohmann::json parses the text,
// strictly) and words the rest for the person who wrote the file. Thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fedlora {

// Checks `json` as a fedlora.v1.RunConfig document and returns it as protobuf's JSON parser should
// read it: the same document with each enum value in its declared case (enum values are accepted in
// any case). InvalidArgument otherwise: a syntax error (the first one), or every unknown field
// (with the nearest known name), duplicate key, value of the wrong type (the expected type in
// words) and unknown enum value (with the valid ones), each with its field path. Each message
// starts with
// "<source>:<line>:<column>: " ("line L, column C: " when `source` is empty); columns count
// characters from 1.
absl::StatusOr<std::string> CheckRunConfigJson(std::string_view json, std::string_view source);

}  // namespace fedlora
