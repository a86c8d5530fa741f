// A small aggregation server for the crash tests: the same run as federation_test_util.h (tiny
// adapter, fast timings), on a given port and data directory, run as a child process so that a test
// can SIGKILL it (FEDLORA_TEST_CRASH_AT, see server/crash_point.h) and start it again.
//
//   fedlora_test_server <data_dir> <port> <rounds> <clients>
//
// Runs until killed (SIGTERM at the end of a test).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

int main(int argc, char** argv) {
  int port = 0, rounds = 0, clients = 0;
  if (argc != 5 || !absl::SimpleAtoi(argv[2], &port) || !absl::SimpleAtoi(argv[3], &rounds) ||
      !absl::SimpleAtoi(argv[4], &clients)) {
    std::fprintf(stderr, "usage: %s <data_dir> <port> <rounds> <clients>\n", argv[0]);
    return 2;
  }
  // Block the stop signals before any thread exists, so that every thread inherits the mask and
  // main's sigwait receives them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  fedlora::ServerOptions options = fedlora::testing::TestServerOptions(argv[1]);
  options.listen_address = "127.0.0.1:" + std::to_string(port);
  options.metrics_address = "";
  auto server = fedlora::Server::Create(options, fedlora::testing::TestRunConfig(rounds, clients, clients),
                                        fedlora::testing::InitialAdapter());
  if (!server.ok()) {
    std::fprintf(stderr, "fedlora_test_server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  (*server)->Shutdown();
  return 0;
}
