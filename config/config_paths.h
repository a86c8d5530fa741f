// The file and directory paths of a run config: how relative ones resolve, and whether the files a
// run reads exist.
//
// A relative path written in a config file is relative to the file's directory, not to the
// working directory: LoadRunConfigFile (config/config_io.h) makes each absolute. The path fields:
// model.path, data.train_path, data.eval_path, server.store_dir, server.key_dir,
// server.audit_public_key_file, server.tls.cert_file, server.tls.key_file,
// server.tls.client_ca_file and server.tls.crl_file. Paths that come from flags, and defaults
// (server.store_dir "fedlora_store"), stay relative to the working directory.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fedlora/v1/config.pb.h"

namespace fedlora {

// The names of the path fields above, in that order.
const std::vector<std::string>& RunConfigPathFields();

// Makes every non-empty relative path field of `config` absolute against `dir` (itself made
// absolute against the working directory), lexically normalised ("configs/../models/x" ->
// "/repo/models/x"). Unset fields stay unset.
void ResolveRunConfigPaths(v1::RunConfig* config, const std::filesystem::path& dir);

// NotFound naming each input the run would read that does not exist, as
// "model.path: /abs/models/x does not exist" (all of them, separated by "; "): model.path,
// data.eval_path, the server.tls files and server.audit_public_key_file when set, and
// data.train_path when `reads_train_data` (fedlora simulate; the server ignores it).
absl::Status CheckRunConfigInputsExist(const v1::RunConfig& config, bool reads_train_data);

}  // namespace fedlora
