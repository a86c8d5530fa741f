// fedlora: one binary, one subcommand per job. See tools/commands.h for the subcommand contract.
#include <cstdio>
#include <cstring>
#include <string>

#include "core/version.h"
#include "kernels/base/context.h"
#include "kernels/base/device.h"
#include "kernels/threads.h"
#include "tools/commands.h"

namespace fedlora::tools {

// tools/cmd_server.cc: installs the server's SIGINT/SIGTERM/SIGHUP handlers and blocks those signals
// in the calling thread, before that thread starts any other. Idempotent.
void PrepareServerSignals();

namespace {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
  // Called first thing in main, before the command's flags are parsed; may be null.
  void (*prepare)() = nullptr;
};

// The dispatch table: one line per subcommand.
constexpr Subcommand kSubcommands[] = {
    {"train", "fine-tune LoRA adapters of a model centrally on one dataset", RunTrain},
    {"eval", "evaluate a model with an adapter on a labelled dataset", RunEval},
    {"embed", "write the frozen model's pooled sentence embeddings of a dataset", RunEmbed},
    {"generate", "completions of a decoder LLM (and a LoRA adapter): greedy or sampled, streamed",
     RunGenerate},
    {"simulate", "run a whole federation (server + virtual clients) on this machine", RunSimulate},
    {"server", "run the aggregation server for a run config", RunServer, PrepareServerSignals},
    {"client", "join a federation and train LoRA adapters on local data", RunClient},
    {"status", "print a running server's status (--json: as one JSON document)", RunStatus},
    {"health", "ask a server's gRPC health service whether it serves (exit 0 if so)", RunHealth},
    {"store", "verify or repair a stopped server's store (blob hashes, rewind)", RunStore},
    {"export",
     "a federation's adapter from a store as a PEFT directory; a decoder's as a GGUF LoRA",
     RunExport},
    {"merge", "fold an adapter into its base: a Hugging Face model directory without PEFT",
     RunMerge},
    {"certs", "make a development CA, server and client certificates, and CRLs", RunCerts},
    {"audit", "open the audit trail (server.audit_public_key_file) with the offline key", RunAudit},
};

void PrintUsage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: fedlora <command> [flags]\n"
      "       fedlora --version\n"
      "Federated LoRA fine-tuning of BERT-family encoders and decoder LLMs.\n\ncommands:\n");
  for (const Subcommand& c : kSubcommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\n'fedlora <command> --help' lists the flags of a command.\n");
}

}  // namespace
}  // namespace fedlora::tools

int main(int argc, char** argv) {
  using namespace fedlora::tools;
  fedlora::kernels::RestartForFasterOpenBlas(argv);
  // The server's signal handling, before anything else runs: threads that already exist (OpenBLAS
  // starts its pool when the library loads) must find the handlers in place.
  if (argc >= 2) {
    for (const Subcommand& c : kSubcommands) {
      if (c.prepare != nullptr && std::strcmp(argv[1], c.name) == 0) c.prepare();
    }
  }
  if (argc < 2) {
    PrintUsage(stderr);
    return kExitUsage;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    PrintUsage(stdout);
    return kExitOk;
  }
  if (command == "--version" || command == "version") {
    std::printf("fedlora %s (GPU: %s)\n", FEDLORA_VERSION,
                fedlora::kernels::CudaDeviceDescription().c_str());
    return kExitOk;
  }
  for (const Subcommand& c : kSubcommands) {
    if (command == c.name) {
      // The subcommand sees itself as argv[0], shown in its messages as "fedlora <name>".
      std::string display = "fedlora " + command;
      argv[1] = display.data();
      return c.run(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "fedlora: unknown command '%s'\n\n", command.c_str());
  PrintUsage(stderr);
  return kExitUsage;
}
