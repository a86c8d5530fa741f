// fedlora export: a federation's adapter out of a server's store, as a PEFT adapter directory
// with the run's labels, max_seq_len and prompt settings (model/adapter_dir.h), and a decoder's
// adapter (from a store or an adapter directory) as a GGUF LoRA file for llama.cpp's --lora
// (model/gguf_lora.h).
//
//   fedlora export --store fedlora_store --out runs/fed-adapter [--round N] [--run-id ID] [--model PATH]
//   fedlora export --store fedlora_store --gguf fed-lora.gguf [--out DIR] [--round N] ...
//   fedlora export --adapter runs/sft/adapter --gguf sft-lora.gguf [--model PATH]
//
// The latest committed round by default (the final adapter of a run that finished; the newest
// of one that was stopped), or committed round --round N while the store keeps it
// (server.retain_rounds). Reads the store only and takes no lock: it works beside a running
// server (SQLite readers do not block it; adapters are immutable blobs, checked against their
// SHA-256). The base model recorded is the run config's model.path, or --model where the store
// was moved or the path was relative to the server's working directory.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/config_io.h"
#include "core/json.h"
#include "core/status.h"
#include "model/decoder.h"
#include "server/blob_store.h"
#include "server/store.h"
#include "tools/adapter_export.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/flags.h"

namespace fedlora::tools {
namespace {

struct ExportFlags {
  std::string store, adapter, out, gguf, run_id, model;
  int64_t round = 0;
};

// The run to export: --run-id, or the store's only run.
absl::StatusOr<RunRecord> PickRun(Store& store, const ExportFlags& f) {
  if (!f.run_id.empty()) return store.GetRun(f.run_id);
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RunRecord> runs, store.ListRuns());
  if (runs.empty())
    return absl::NotFoundError(absl::StrCat("the store ", f.store, " holds no run"));
  if (runs.size() > 1) {
    std::vector<std::string> ids;
    for (const RunRecord& r : runs) ids.push_back(r.run_id);
    return absl::InvalidArgumentError(absl::StrCat("the store ", f.store, " holds several runs (",
                                                   absl::StrJoin(ids, ", "),
                                                   "): name one with --run-id"));
  }
  return runs.front();
}

// How to run the GGUF LoRA `gguf` on `base` with llama.cpp.
std::string LlamaCppLine(const std::string& base, const std::string& gguf) {
  const std::string model =
      IsGgufPath(base) ? base : absl::StrCat("BASE.gguf (", base, " converted by llama.cpp)");
  return absl::StrCat("llama-cli -m ", model, " --lora ", gguf);
}

absl::Status Export(const ExportFlags& f) {
  if (!std::filesystem::exists(f.store + "/fedlora.db")) {
    return absl::NotFoundError(
        absl::StrCat("no store in ", f.store, " (", f.store, "/fedlora.db does not exist)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(f.store + "/fedlora.db"));
  FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<BlobStore> blobs, BlobStore::Open(f.store));
  FEDLORA_ASSIGN_OR_RETURN(RunRecord run, PickRun(*store, f));
  const std::string what = absl::StrCat("run '", run.run_id, "' in ", f.store);
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json meta, ParseJson(run.config_json, what));
  if (!meta.is_object() || !meta.contains("run_config") || !meta["run_config"].is_string()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " records no run config (a store written before fedlora recorded it)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(v1::RunConfig config,
                           ParseRunConfigJson(meta["run_config"].get<std::string>()));
  FEDLORA_ASSIGN_OR_RETURN(RunAdapterFormat format, AdapterFormatForRun(config, f.model));
  if (!f.gguf.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(int64_t round,
                             ExportRoundGguf(*store, *blobs, run.run_id, f.round, format, f.gguf));
    std::cout << "round " << round << " of run " << run.run_id << " written to " << f.gguf
              << " (GGUF LoRA: " << LlamaCppLine(format.meta.base_model, f.gguf) << ")"
              << std::endl;
  }
  if (!f.out.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(int64_t round,
                             ExportRound(*store, *blobs, run.run_id, f.round, format, f.out));
    std::cout << "round " << round << " of run " << run.run_id << " written to " << f.out
              << std::endl;
  }
  return absl::OkStatus();
}

// The usage error of a flag combination, or "".
std::string CheckCombination(const FlagSet& flags, const ExportFlags& f) {
  if (f.store.empty() == f.adapter.empty()) return "name one source: --store DIR or --adapter DIR";
  if (f.out.empty() && f.gguf.empty()) return "name what to write: --out DIR and/or --gguf FILE";
  if (!f.adapter.empty()) {
    if (!f.out.empty())
      return "--out writes a store's adapter as a directory; --adapter is one already (use --gguf)";
    for (const char* name : {"round", "run-id"}) {
      if (flags.WasSet(name))
        return absl::StrCat("--", name, " picks from a store: it does not go with --adapter");
    }
  }
  return "";
}

}  // namespace

int RunExport(int argc, char** argv) {
  const std::string command = argv[0];
  ExportFlags f;
  FlagSet flags(
      command,
      "Writes a federation's adapter from a server's store as a PEFT adapter directory with its "
      "labels,\n"
      "max_seq_len and prompt settings: the latest committed round (the final adapter), or --round "
      "N.\n"
      "Reads the store only: it works while the server runs, and after it stopped.\n"
      "--gguf writes a decoder's adapter (from --store, or an adapter directory from train, "
      "simulate or\n"
      "PEFT with --adapter) as a GGUF LoRA file: llama-cli -m BASE.gguf --lora FILE.gguf");
  flags.AddString("store", &f.store, "the server's store directory (server.store_dir)");
  flags.AddString("adapter", &f.adapter,
                  "an adapter directory to convert with --gguf (instead of --store)");
  flags.AddString("out", &f.out,
                  "the adapter directory to write (replaced whole if it holds an adapter)");
  flags.AddString(
      "gguf", &f.gguf,
      "a GGUF LoRA file to write for llama.cpp's --lora (decoder adapters: LLaMA, Qwen2)");
  flags.AddInt("round", &f.round, "a committed round still kept");
  flags.SetDefaultText("round", "the latest committed");
  flags.AddString("run-id", &f.run_id, "the run (default: the store's only run)");
  flags.AddString("model", &f.model,
                  "the base model, where the run config's model.path (or what the adapter records) "
                  "does not name "
                  "it from here (recorded as base_model_name_or_path)");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (!flags.positional().empty())
    return UsageError(command, "unexpected argument '" + flags.positional()[0] + "'");
  if (flags.WasSet("round") && f.round < 1) return UsageError(command, "--round must be >= 1");
  if (std::string e = CheckCombination(flags, f); !e.empty()) return UsageError(command, e);
  if (!f.adapter.empty()) {
    absl::StatusOr<std::string> base = ExportAdapterDirGguf(f.adapter, f.model, f.gguf);
    if (!base.ok()) return Fail(command, base.status());
    std::cout << f.adapter << " written to " << f.gguf
              << " (GGUF LoRA: " << LlamaCppLine(*base, f.gguf) << ")" << std::endl;
    return kExitOk;
  }
  if (absl::Status s = Export(f); !s.ok()) return Fail(command, s);
  return kExitOk;
}

}  // namespace fedlora::tools
