// fedlora audit: reads the audit trail a server keeps with server.audit_public_key_file
// (server/audit_trail.h), with the offline private key made by `fedlora certs audit-key`.
//
//   fedlora audit open --store /var/lib/fedlora --key audit.key [--run-id run-1] [--round 3] --out trail/
//
// Writes each copy it opens as <out>/<run>.round-<N>.<client>.<upload>.update (the client's encoded
// update, compression/codec.h) and, with --safetensors, the decoded tensors beside it; prints one
// line per copy and appends its run, round, client, upload id, example count and file to
// <out>/manifest.jsonl. A copy that does not open (wrong key, tampered or missing blob) is reported
// and the rest are still opened; exit 1 then. Reads the store only: a running server may hold it.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/update_io.h"
#include "core/file.h"
#include "core/status.h"
#include "server/audit_trail.h"
#include "server/blob_store.h"
#include "server/store.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/flags.h"

namespace fedlora::tools {
namespace {

// A file-name-safe form of an id: [A-Za-z0-9._@-] kept, anything else '_'.
std::string SafeName(const std::string& id) {
  std::string out = id;
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '@' || c == '-';
    if (!ok) c = '_';
  }
  return out.empty() || out[0] == '.' ? "_" + out : out;
}

struct OpenOptions {
  std::string dir, key_file, run_id, out;
  int64_t round = 0;
  bool safetensors = false;
};

// Writes one opened copy; returns its manifest line.
absl::StatusOr<nlohmann::json> WriteCopy(const OpenOptions& o, const AuditCopyRecord& c,
                                         const std::string& update) {
  const std::string base = absl::StrCat(SafeName(c.run_id), ".round-", c.round, ".",
                                        SafeName(c.client_id), ".", SafeName(c.upload_id));
  const std::string path = (std::filesystem::path(o.out) / (base + ".update")).string();
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(path, update, 0600));
  nlohmann::json line = {{"run_id", c.run_id},
                         {"round", c.round},
                         {"client_id", c.client_id},
                         {"upload_id", c.upload_id},
                         {"num_examples", c.num_examples},
                         {"update_file", path}};
  if (o.safetensors) {
    FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> tensors,
                             DecodeUpdate(update, DecodeLimits{}));
    FEDLORA_ASSIGN_OR_RETURN(std::string st, AdapterToSafetensors(tensors));
    const std::string st_path = (std::filesystem::path(o.out) / (base + ".safetensors")).string();
    FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(st_path, st, 0600));
    line["safetensors_file"] = st_path;
  }
  return line;
}

// Opens every copy the flags select; returns how many failed to open.
absl::StatusOr<int> OpenTrail(const OpenOptions& o) {
  if (!std::filesystem::exists(o.dir + "/fedlora.db")) {
    return absl::NotFoundError(
        absl::StrCat("no store in ", o.dir, " (", o.dir, "/fedlora.db does not exist)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string key, LoadAuditPrivateKey(o.key_file));
  FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(o.dir + "/fedlora.db"));
  FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<BlobStore> blobs, BlobStore::Open(o.dir));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<AuditCopyRecord> copies,
                           store->ListAuditCopies(o.run_id, o.round));
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", o.out, ": ", ec.message()));
  std::ofstream manifest(std::filesystem::path(o.out) / "manifest.jsonl", std::ios::app);
  if (!manifest)
    return absl::PermissionDeniedError(absl::StrCat("cannot write ", o.out, "/manifest.jsonl"));
  int failed = 0;
  for (const AuditCopyRecord& c : copies) {
    absl::StatusOr<std::string> update = OpenAuditCopy(key, c, *blobs);
    absl::StatusOr<nlohmann::json> line = update.ok() ? WriteCopy(o, c, *update) : update.status();
    if (!line.ok()) {
      ++failed;
      std::cerr << "audit open: " << line.status() << "\n";
      continue;
    }
    manifest << line->dump() << "\n";
    std::cout << "opened run " << c.run_id << " round " << c.round << " client " << c.client_id
              << " upload " << c.upload_id << " (" << c.num_examples
              << " examples): " << (*line)["update_file"].get<std::string>() << "\n";
  }
  manifest.flush();
  if (!manifest)
    return absl::DataLossError(absl::StrCat("writing ", o.out, "/manifest.jsonl failed"));
  std::cout << copies.size() - static_cast<size_t>(failed) << " of " << copies.size()
            << " audit copies opened" << std::endl;
  return failed;
}

}  // namespace

int RunAudit(int argc, char** argv) {
  const std::string verb = argc >= 2 ? argv[1] : "";
  if (verb != "open") {
    std::cerr << "usage: fedlora audit open --store DIR --key audit.key [--run-id ID] [--round N] "
                 "--out DIR "
                 "[--safetensors]\nOpens the audit trail (server.audit_public_key_file) with the "
                 "offline key; '"
              << argv[0] << " open --help' lists the flags.\n";
    return verb == "--help" || verb == "-h" ? kExitOk : kExitUsage;
  }
  const std::string name = absl::StrCat(argv[0], " ", verb);
  argv[1] = const_cast<char*>(name.c_str());
  FlagSet flags(
      name, "Opens the updates a server sealed to the offline audit key and writes them to --out.");
  OpenOptions o;
  flags.AddString("store", &o.dir, "the server's store directory (server.store_dir)",
                  /*required=*/true);
  flags.AddRenamed("data-dir", "store", "the name server and export use");
  flags.AddString("key", &o.key_file, "the audit private key (PEM, from `fedlora certs audit-key`)",
                  true);
  flags.AddString("out", &o.out, "directory to write the opened updates and manifest.jsonl to",
                  true);
  flags.AddString("run-id", &o.run_id, "only this run (default: every run)");
  flags.AddInt("round", &o.round, "only this round");
  flags.SetDefaultText("round", "every round");
  flags.AddBool("safetensors", &o.safetensors, "also write each update decoded, as safetensors");
  if (auto code = ParseFlagsOrExit(flags, argc - 1, argv + 1)) return *code;
  if (o.round < 0) return UsageError(name, absl::StrCat("--round ", o.round, " is negative"));
  absl::StatusOr<int> failed = OpenTrail(o);
  if (!failed.ok()) return Fail(name, failed.status());
  return *failed == 0 ? kExitOk : kExitFailure;
}

}  // namespace fedlora::tools
