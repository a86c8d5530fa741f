// Fuzzes the run config reader (config/config_io.h): ParseRunConfigJson, its defaults and its
// validation, on arbitrary text. Operators write run configs by hand, tools generate them, and the
// server and the simulator read them at start.
//
// Checks beyond "no crash, no sanitizer report": every refusal is InvalidArgument (config_io.h);
// a config that parses prints (RunConfigToJson) to JSON that parses back to the same message,
// carries no unimplemented setting, stays valid through a second ApplyRunConfigDefaults, and
// redacts (RedactRunConfigForClients) to a message without the server-only parts.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "config/config_io.h"
#include "fedlora/v1/config.pb.h"
#include "fuzz/fuzz_util.h"

namespace {

// Deterministic wire bytes, to compare two messages (NaN-safe, unlike field-wise equality).
std::string Bytes(const google::protobuf::Message& m) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlora;
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto config = ParseRunConfigJson(json);
  FUZZ_TRACE("%s\n", config.status().ToString().substr(0, 300).c_str());
  if (!config.ok()) {
    FUZZ_CHECK(config.status().code() == absl::StatusCode::kInvalidArgument, config.status());
    return 0;
  }
  FUZZ_CHECK(UnimplementedSettings(*config).empty(),
             "a config with an unimplemented setting was accepted");

  v1::RunConfig twice = *config;
  ApplyRunConfigDefaults(&twice);
  FUZZ_CHECK(Bytes(twice) == Bytes(*config), "ApplyRunConfigDefaults is not idempotent");
  absl::Status valid = ValidateRunConfig(twice);
  FUZZ_CHECK(valid.ok(), valid);

  const std::string printed = RunConfigToJson(*config);
  auto back = ParseRunConfigJson(printed);
  FUZZ_CHECK(back.ok(), back.status());
  FUZZ_CHECK(Bytes(*back) == Bytes(*config),
             "RunConfigToJson does not read back to the same config: " + printed);

  const v1::RunConfig redacted = RedactRunConfigForClients(*config);
  FUZZ_CHECK(redacted.model().path().empty(), "model.path survived the redaction");
  FUZZ_CHECK(!redacted.has_data() && !redacted.has_server() && !redacted.has_simulation(),
             "a server-only part survived the redaction");
  return 0;
}
