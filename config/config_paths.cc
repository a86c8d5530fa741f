#include "config/config_paths.h"

#include <functional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fedlora {
namespace {

using v1::RunConfig;

// One path field: its name, whether it is set, and its value to change. `get` never creates a
// submessage (mutable_server() would make server.tls "given" to checks that look for it).
struct PathField {
  const char* name;
  std::function<const std::string*(const RunConfig&)> get;  // nullptr: unset
  std::function<void(RunConfig*, std::string)> set;
  bool input;  // a file the run reads (not a directory it creates)
};

const std::string* NonEmpty(const std::string& s) { return s.empty() ? nullptr : &s; }

const std::vector<PathField>& Fields() {
  static const std::vector<PathField> fields = {
      {"model.path", [](const RunConfig& c) { return NonEmpty(c.model().path()); },
       [](RunConfig* c, std::string v) { c->mutable_model()->set_path(std::move(v)); }, true},
      {"data.train_path", [](const RunConfig& c) { return NonEmpty(c.data().train_path()); },
       [](RunConfig* c, std::string v) { c->mutable_data()->set_train_path(std::move(v)); }, true},
      {"data.eval_path", [](const RunConfig& c) { return NonEmpty(c.data().eval_path()); },
       [](RunConfig* c, std::string v) { c->mutable_data()->set_eval_path(std::move(v)); }, true},
      {"server.store_dir", [](const RunConfig& c) { return NonEmpty(c.server().store_dir()); },
       [](RunConfig* c, std::string v) { c->mutable_server()->set_store_dir(std::move(v)); },
       false},
      {"server.key_dir", [](const RunConfig& c) { return NonEmpty(c.server().key_dir()); },
       [](RunConfig* c, std::string v) { c->mutable_server()->set_key_dir(std::move(v)); }, false},
      {"server.audit_public_key_file",
       [](const RunConfig& c) { return NonEmpty(c.server().audit_public_key_file()); },
       [](RunConfig* c, std::string v) {
         c->mutable_server()->set_audit_public_key_file(std::move(v));
       },
       true},
      {"server.tls.cert_file",
       [](const RunConfig& c) { return NonEmpty(c.server().tls().cert_file()); },
       [](RunConfig* c, std::string v) {
         c->mutable_server()->mutable_tls()->set_cert_file(std::move(v));
       },
       true},
      {"server.tls.key_file",
       [](const RunConfig& c) { return NonEmpty(c.server().tls().key_file()); },
       [](RunConfig* c, std::string v) {
         c->mutable_server()->mutable_tls()->set_key_file(std::move(v));
       },
       true},
      {"server.tls.client_ca_file",
       [](const RunConfig& c) { return NonEmpty(c.server().tls().client_ca_file()); },
       [](RunConfig* c, std::string v) {
         c->mutable_server()->mutable_tls()->set_client_ca_file(std::move(v));
       },
       true},
      {"server.tls.crl_file",
       [](const RunConfig& c) { return NonEmpty(c.server().tls().crl_file()); },
       [](RunConfig* c, std::string v) {
         c->mutable_server()->mutable_tls()->set_crl_file(std::move(v));
       },
       true},
  };
  return fields;
}

}  // namespace

const std::vector<std::string>& RunConfigPathFields() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const PathField& f : Fields()) out.push_back(f.name);
    return out;
  }();
  return names;
}

void ResolveRunConfigPaths(RunConfig* config, const std::filesystem::path& dir) {
  std::error_code ec;
  // "run.json" has the parent "", which absolute() does not take for the working directory.
  std::filesystem::path base =
      dir.empty() ? std::filesystem::current_path(ec) : std::filesystem::absolute(dir, ec);
  if (ec) base = dir;
  for (const PathField& f : Fields()) {
    const std::string* value = f.get(*config);
    if (value == nullptr) continue;
    const std::filesystem::path p(*value);
    if (p.is_absolute()) continue;
    f.set(config, (base / p).lexically_normal().string());
  }
}

absl::Status CheckRunConfigInputsExist(const RunConfig& config, bool reads_train_data) {
  std::vector<std::string> missing;
  for (const PathField& f : Fields()) {
    if (!f.input) continue;
    const bool required = std::string_view(f.name) == "model.path";
    if (std::string_view(f.name) == "data.train_path" && !reads_train_data) continue;
    const std::string* value = f.get(config);
    if (value == nullptr) {
      if (required) missing.push_back(absl::StrCat(f.name, " is not set"));
      continue;
    }
    std::error_code ec;
    if (!std::filesystem::exists(*value, ec)) {
      missing.push_back(absl::StrCat(f.name, ": ", *value, " does not exist",
                                     ec ? absl::StrCat(" (", ec.message(), ")") : ""));
    }
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::NotFoundError(absl::StrJoin(missing, "; "));
}

}  // namespace fedlora
