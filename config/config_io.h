// Reading, defaulting, validating and printing the run config (fedlora.v1.RunConfig, see
// proto/fedlora/v1/config.proto for every field, its unit and its default). config/resolved.h
// builds the value consumers take from it.
//
//   FEDLORA_ASSIGN_OR_RETURN(fedlora::v1::RunConfig config,
//                            fedlora::LoadRunConfigFile("proto/examples/minimal.json"));
//   std::cout << fedlora::RunConfigToJson(config);  // the effective config, defaults filled in
//
// Every error is InvalidArgument (except a missing or unreadable file, which keeps its errno code)
// and names the field path, e.g. "selection.min_clients (12) exceeds selection.clients_per_round
// (10)"; all problems of a config are reported in one message, separated by "; ". Errors in the
// JSON text also give its line and column (config/config_json.h): "run.json:7:5: unknown field
// selection.clients_per_rund; did you mean clients_per_round?". Enum values are read in any case.
// All functions are thread-safe (they touch no shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/config_paths.h"  // CheckRunConfigInputsExist, for LoadRunConfigFile's callers
#include "config/defaults.h"      // the defaults, for code that takes a config built by hand
#include "fedlora/v1/config.pb.h"
#include "train/training_defaults.h"

namespace fedlora {

// Changes a parsed config before its defaults and validation: command-line flags that override
// config fields, so that a flag's value is validated like the config's own.
using ConfigOverrides = std::function<void(v1::RunConfig*)>;

// Parses a JSON run config strictly (syntax errors, unknown fields and duplicate keys are errors),
// applies `overrides` (when set), the defaults, and validates it. Paths stay as written.
absl::StatusOr<v1::RunConfig> ParseRunConfigJson(std::string_view json,
                                                 const ConfigOverrides& overrides = nullptr);

// Reads `path` and does what ParseRunConfigJson does, except that relative paths in the file are
// made absolute against the file's directory before `overrides` apply (config/config_paths.h);
// error messages start with the path ("<path>:<line>:<column>: " for errors in the text). Checks
// no file but the config: CheckRunConfigInputsExist does, for the commands that read them.
absl::StatusOr<v1::RunConfig> LoadRunConfigFile(const std::string& path,
                                                const ConfigOverrides& overrides = nullptr);

// config.rounds, or its default where it is unset (a config that has not been through
// ApplyRunConfigDefaults, as tests and embedders may build).
inline uint32_t ConfiguredRounds(const v1::RunConfig& config) {
  return config.has_rounds() ? config.rounds() : kDefaultRounds;
}

// Fills every unset field that has a documented default. Idempotent; never fails.
void ApplyRunConfigDefaults(v1::RunConfig* config);

// Checks a config that has been through ApplyRunConfigDefaults. OK, or InvalidArgument listing
// every problem with its field path.
absl::Status ValidateRunConfig(const v1::RunConfig& config);

// ValidateRunConfig's checks of the privacy section alone (and of what it needs elsewhere: the
// codec, weights, bounds, min_clients): for a server whose config was built in code.
absl::Status ValidatePrivacySettings(const v1::RunConfig& config);

// ValidateRunConfig's checks of the aggregation section (and of what it needs elsewhere: a robust
// rule's bound on selection.min_clients, its refusal of secure aggregation and DP): for a server
// whose config was built in code.
absl::Status ValidateAggregationSettings(const v1::RunConfig& config);

// One message per setting of `config` that fedlora does not carry out yet ("privacy.dp.enabled is
// not implemented yet"); empty when there is none. ValidateRunConfig refuses them too; the server
// and the simulator check them before they touch the store, for configs built in code.
std::vector<std::string> UnimplementedSettings(const v1::RunConfig& config);

// Pretty-printed JSON with snake_case field names and every field written out, readable back by
// ParseRunConfigJson to an equal message.
std::string RunConfigToJson(const v1::RunConfig& config);

// The config as clients may see it (JoinResponse.run_config): without model.path, data, server and
// simulation, which describe the server's machine.
// Whether the run keeps each site's training statistics from the server: under secure aggregation
// or differential privacy a site sends no metrics report and claims 1 example (its update weighs
// the same as any other), so that neither its loss nor the size of its data is disclosed.
inline bool HidesPerClientStatistics(const v1::RunConfig& config) {
  return config.privacy().secure_aggregation() || config.privacy().dp().enabled();
}

v1::RunConfig RedactRunConfigForClients(const v1::RunConfig& config);

}  // namespace fedlora
