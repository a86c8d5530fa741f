// The `fedlora` subcommands. Each lives in its own cmd_<name>.cc and is listed once in the
// dispatch table in main.cc; adding one (server, client, simulate, status) is one new file plus
// one line there.
//
// Contract of every Run*: argv[0] is the subcommand's display name ("fedlora train"), argv[1..]
// its flags. It prints its results to stdout, diagnostics and progress to stderr, and returns an
// exit code: kExitOk, kExitFailure (the work failed: missing file, bad data, diverged training),
// or kExitUsage (bad command line: unknown flag, malformed value).
#pragma once

namespace fedlora::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

int RunTrain(int argc, char** argv);
int RunEval(int argc, char** argv);
int RunEmbed(int argc, char** argv);
int RunGenerate(int argc, char** argv);
int RunSimulate(int argc, char** argv);
int RunServer(int argc, char** argv);
int RunClient(int argc, char** argv);
int RunStatus(int argc, char** argv);
int RunHealth(int argc, char** argv);
int RunCerts(int argc, char** argv);
int RunStore(int argc, char** argv);
int RunExport(int argc, char** argv);
int RunMerge(int argc, char** argv);
int RunAudit(int argc, char** argv);

}  // namespace fedlora::tools
