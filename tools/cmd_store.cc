// fedlora store: offline integrity check and repair of a server's store (server/store_check.h).
//
//   fedlora store verify --store /var/lib/fedlora [--run-id run-1]
//   fedlora store repair --store /var/lib/fedlora [--run-id run-1] [--rewind]
//
// verify re-hashes every blob the store references and prints, per round, what is intact, corrupt
// or missing and what that costs; exit 0 only when everything is intact. repair rebuilds what the
// data allows (a broadcast adapter from its predecessor and delta); when the run still cannot
// resume, --rewind rolls it back to its newest intact round (the later rounds are marked lost; a
// differentially private run keeps counting their epsilon). Both refuse a store a server holds.
#include <filesystem>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/blob_store.h"
#include "server/data_dir_lock.h"
#include "server/store.h"
#include "server/store_check.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/flags.h"

namespace fedlora::tools {
namespace {

void Print(const RunCheck& check) {
  std::cout << "run " << check.run_id << " (latest committed round " << check.latest_committed
            << ")\n";
  for (const BlobCheck& b : check.blobs) {
    std::cout << "  round " << b.round << " " << b.kind;
    if (!b.upload_id.empty()) std::cout << " " << b.upload_id << " (client " << b.client_id << ")";
    std::cout << " " << b.hash << ": " << BlobHealthName(b.health);
    if (b.health != BlobHealth::kIntact) std::cout << " (" << b.detail << "); costs: " << b.cost;
    std::cout << "\n";
  }
  std::cout << "run " << check.run_id << ": " << (check.intact() ? "intact" : "DAMAGED")
            << std::endl;
}

// Returns whether everything checked (verify) or the run can resume (repair).
absl::StatusOr<bool> StoreCommand(const std::string& verb, const std::string& dir,
                                  const std::string& run_id, bool rewind) {
  if (!std::filesystem::exists(dir + "/fedlora.db")) {
    return absl::NotFoundError(
        absl::StrCat("no store in ", dir, " (", dir, "/fedlora.db does not exist)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<DataDirLock> lock, DataDirLock::Acquire(dir));
  FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(dir + "/fedlora.db"));
  FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<BlobStore> blobs, BlobStore::Open(dir));
  std::vector<std::string> runs;
  if (!run_id.empty()) {
    FEDLORA_RETURN_IF_ERROR(store->GetRun(run_id).status());
    runs.push_back(run_id);
  } else {
    FEDLORA_ASSIGN_OR_RETURN(std::vector<RunRecord> all, store->ListRuns());
    for (const RunRecord& r : all) runs.push_back(r.run_id);
  }
  bool good = true;
  for (const std::string& id : runs) {
    if (verb == "repair") {
      FEDLORA_ASSIGN_OR_RETURN(RepairOutcome o, RepairRun(*store, *blobs, id, rewind));
      for (const std::string& line : o.rebuilt) std::cout << "run " << id << ": " << line << "\n";
      if (o.rewound_to >= 0) {
        std::cout << "run " << id << ": rewound to round " << o.rewound_to << "; " << o.rounds_lost
                  << " committed rounds after it are marked lost (their epsilon still counts)\n";
      }
      if (o.rewind_needed_to >= 0) {
        std::cout << "run " << id
                  << ": cannot resume: its latest adapter or optimizer state cannot be rebuilt. "
                  << "`fedlora store repair --rewind` rolls it back to round " << o.rewind_needed_to
                  << ", losing the rounds after it\n";
        good = false;
      }
    }
    FEDLORA_ASSIGN_OR_RETURN(RunCheck check, CheckRun(*store, *blobs, id));
    Print(check);
    if (verb == "verify") good = good && check.intact();
  }
  return good;
}

}  // namespace

int RunStore(int argc, char** argv) {
  const std::string verb = argc >= 2 ? argv[1] : "";
  if (verb != "verify" && verb != "repair") {
    std::cerr << "usage: fedlora store verify|repair --store DIR [--run-id ID] [--rewind]\n"
              << "Checks (verify) or repairs (repair) a stopped server's store; '" << argv[0]
              << " <verb> --help' lists the flags.\n";
    return verb == "--help" || verb == "-h" ? kExitOk : kExitUsage;
  }
  const std::string name = absl::StrCat(argv[0], " ", verb);
  argv[1] = const_cast<char*>(name.c_str());
  FlagSet flags(name, verb == "verify"
                          ? "Re-hashes every blob a stopped server's store references; exit 0 if "
                            "all are intact."
                          : "Rebuilds what the store's data allows; --rewind rolls a run that "
                            "cannot resume back to its newest intact round.");
  std::string dir, run_id;
  bool rewind = false;
  flags.AddString("store", &dir, "the server's store directory (server.store_dir)",
                  /*required=*/true);
  flags.AddRenamed("data-dir", "store", "the name server and export use");
  flags.AddString("run-id", &run_id, "only this run (default: every run in the store)");
  if (verb == "repair")
    flags.AddBool("rewind", &rewind, "roll back a run that cannot resume (loses rounds)");
  if (auto code = ParseFlagsOrExit(flags, argc - 1, argv + 1)) return *code;
  absl::StatusOr<bool> good = StoreCommand(verb, dir, run_id, rewind);
  if (!good.ok()) return Fail(name.c_str(), good.status());
  return *good ? kExitOk : kExitFailure;
}

}  // namespace fedlora::tools
