// The run config's reading, printing and redaction, and the order in which its sections' defaults
// and checks run (each section's are in config/*_section.cc).
#include "config/config_io.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "config/config_json.h"
#include "config/config_paths.h"
#include "config/sections.h"
#include "core/status.h"
#include "google/protobuf/util/json_util.h"

namespace fedlora {

using config_internal::Problems;
using v1::AggregationConfig;
using v1::DifferentialPrivacyConfig;
using v1::RunConfig;
using v1::TaskConfig;

void ApplyRunConfigDefaults(RunConfig* c) {
  // The task kind decides the training defaults; the privacy defaults read the selection's, and
  // the codec's read privacy's switches.
  config_internal::ApplyTrainingDefaults(c);
  config_internal::ApplyFederationDefaults(c);
  config_internal::ApplyPrivacyDefaults(c);
  config_internal::ApplyCodecDefaults(c);
  config_internal::ApplyServerDefaults(c);
}

absl::Status ValidatePrivacySettings(const RunConfig& c) {
  Problems p;
  config_internal::ValidatePrivacy(p, c);
  return p.ToStatus();
}

absl::Status ValidateAggregationSettings(const RunConfig& c) {
  Problems p;
  config_internal::ValidateAggregation(p, c);
  return p.ToStatus();
}

absl::Status ValidateRunConfig(const RunConfig& c) {
  namespace ci = config_internal;  // the sections' checks, in the order they report
  Problems p;
  ci::ValidateRun(p, c);
  ci::ValidateModel(p, c.model());
  ci::ValidateLora(p, c.lora());
  ci::ValidateTask(p, c.task());
  ci::ValidatePrecisionForTask(p, c);
  ci::ValidateTraining(p, c.training());
  ci::ValidateSelection(p, c.selection());
  ci::ValidateAggregation(p, c);
  ci::ValidateCodec(p, c.codec(), "codec", c.privacy().secure_aggregation());
  ci::ValidateCodec(p, c.downlink_codec(), "downlink_codec");
  ci::ValidateData(p, c.data());
  ci::ValidatePrivacy(p, c);
  ci::ValidateServer(p, c.server());
  ci::ValidateSimulation(p, c.simulation());
  ci::ValidatePartitionForTask(p, c);
  for (std::string& refused : UnimplementedSettings(c)) p.Add(std::move(refused));
  return p.ToStatus();
}

std::vector<std::string> UnimplementedSettings(const RunConfig& c) {
  std::vector<std::string> out;
  auto refuse = [&out](const std::string& what, const std::string& why) {
    out.push_back(absl::StrCat(what, " is not implemented yet",
                               why.empty() ? "" : absl::StrCat(" (", why, ")")));
  };
  const std::string& arch = c.model().architecture();
  if (c.task().kind() == TaskConfig::CAUSAL_LM) {
    if (!arch.empty() && arch != "llama" && arch != "qwen2") {
      refuse(absl::StrCat("model.architecture \"", absl::CEscape(arch), "\" for CAUSAL_LM"),
             "supported: \"llama\", \"qwen2\"");
    }
    if (c.training().logit_adjustment() != 0) {
      refuse("training.logit_adjustment for CAUSAL_LM", "it adjusts a classifier's label logits");
    }
  } else if (!arch.empty() && arch != "bert" && arch != "roberta" && arch != "xlm-roberta") {
    refuse(absl::StrCat("model.architecture \"", absl::CEscape(arch), "\""),
           "supported: \"bert\", \"roberta\", \"xlm-roberta\"");
  }
  const v1::DifferentialPrivacyConfig& dp = c.privacy().dp();
  if (dp.mode() == DifferentialPrivacyConfig::LOCAL)
    refuse("privacy.dp.mode LOCAL", "CENTRAL and DISTRIBUTED are");
  if (c.privacy().secure_aggregation() && dp.enabled() && dp.adaptive_clipping().enabled()) {
    refuse("privacy.dp.adaptive_clipping with privacy.secure_aggregation",
           "the server would need each update's norm; fixed clipping is");
  }
  return out;
}

namespace {

// Parses, resolves relative paths against `base_dir` (when set), overrides, defaults and validates.
// Errors of the text are located ("<source>:<line>:<column>: "); the others start with "<source>:
// ".
absl::StatusOr<RunConfig> ParseRunConfigText(std::string_view json, const std::string& source,
                                             const std::filesystem::path* base_dir,
                                             const ConfigOverrides& overrides) {
  const std::string prefix = source.empty() ? "" : absl::StrCat(source, ": ");
  FEDLORA_ASSIGN_OR_RETURN(const std::string checked, CheckRunConfigJson(json, source));
  RunConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // a misspelt field must not silently take its default
  auto parsed = google::protobuf::util::JsonStringToMessage(checked, &config, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "run config: ", std::string(parsed.message().data(), parsed.message().size())));
  }
  if (base_dir != nullptr) ResolveRunConfigPaths(&config, *base_dir);
  if (overrides) overrides(&config);
  ApplyRunConfigDefaults(&config);
  absl::Status valid = ValidateRunConfig(config);
  if (!valid.ok())
    return absl::Status(valid.code(), absl::StrCat(prefix, std::string(valid.message())));
  return config;
}

}  // namespace

absl::StatusOr<RunConfig> ParseRunConfigJson(std::string_view json,
                                             const ConfigOverrides& overrides) {
  return ParseRunConfigText(json, "", nullptr, overrides);
}

absl::StatusOr<RunConfig> LoadRunConfigFile(const std::string& path,
                                            const ConfigOverrides& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    return absl::NotFoundError(absl::StrCat(path, ": run config not found",
                                            ec ? absl::StrCat(" (", ec.message(), ")") : ""));
  }
  if (!fs::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": run config is not a regular file"));
  }
  uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    return absl::Status(absl::ErrnoToStatusCode(ec.value()),
                        absl::StrCat(path, ": cannot stat run config: ", ec.message()));
  }
  if (size > kMaxRunConfigFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": run config is ", size, " bytes, more than the limit of ", kMaxRunConfigFileBytes));
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    return absl::Status(err != 0 ? absl::ErrnoToStatusCode(err) : absl::StatusCode::kUnknown,
                        absl::StrCat(path, ": cannot open run config: ",
                                     err != 0 ? std::strerror(err) : "unknown error"));
  }
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size))) {
    return absl::DataLossError(absl::StrCat(path, ": short read of run config"));
  }
  const fs::path dir = fs::path(path).parent_path();
  return ParseRunConfigText(text, path, &dir, overrides);
}

std::string RunConfigToJson(const RunConfig& config) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto printed = google::protobuf::util::MessageToJsonString(config, &out, options);
  // Printing fails only for google.protobuf.Any fields whose type cannot be resolved; RunConfig has
  // none, so a failure is a bug in this file.
  if (!printed.ok()) {
    std::fprintf(stderr, "RunConfigToJson: %s\n", printed.ToString().c_str());
    std::abort();
  }
  return out;
}

RunConfig RedactRunConfigForClients(const RunConfig& config) {
  RunConfig redacted = config;
  redacted.mutable_model()->clear_path();
  redacted.clear_data();
  redacted.clear_server();
  redacted.clear_simulation();
  return redacted;
}

}  // namespace fedlora
