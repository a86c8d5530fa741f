// A small aggregation server for the crash tests: the same run as federation_test_util.h (tiny
// adapter, fast timings), on a given port and data directory, run as a child process so that a test
// can SIGKILL it (FEDLORA_TEST_CRASH_AT, see server/crash_point.h) and start it again.
//
//   fedlora_test_server <data_dir> <port> <rounds> <clients> [strategy[:tailK|:downlink]]
//
// ":tailK" sets aggregation.average_last_rounds to K; ":downlink" sets downlink_codec to
// [QUANT 8 bit nearest, ZSTD].
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
  // The optional fifth argument is the aggregation strategy, e.g. FEDADAM (server learning rate 0.05).
  fedlora::v1::AggregationConfig::Strategy strategy = fedlora::v1::AggregationConfig::FEDAVG;
  const std::string strategy_arg = argc == 6 ? argv[5] : "FEDAVG";
  const size_t colon = strategy_arg.find(':');
  int tail = 0;
  const bool downlink = colon != std::string::npos && strategy_arg.substr(colon + 1) == "downlink";
  const bool tail_ok = colon == std::string::npos || downlink ||
                       (strategy_arg.compare(colon + 1, 4, "tail") == 0 &&
                        absl::SimpleAtoi(strategy_arg.substr(colon + 5), &tail));
  if ((argc != 5 && argc != 6) || !absl::SimpleAtoi(argv[2], &port) ||
      !absl::SimpleAtoi(argv[3], &rounds) || !absl::SimpleAtoi(argv[4], &clients) || !tail_ok ||
      !fedlora::v1::AggregationConfig::Strategy_Parse(strategy_arg.substr(0, colon), &strategy)) {
    std::fprintf(stderr,
                 "usage: %s <data_dir> <port> <rounds> <clients> [strategy[:tailK|:downlink]]\n",
                 argv[0]);
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
  fedlora::v1::RunConfig config = fedlora::testing::TestRunConfig(rounds, clients, clients);
  if (strategy != fedlora::v1::AggregationConfig::FEDAVG) {
    config.mutable_aggregation()->set_strategy(strategy);
    config.mutable_aggregation()->set_server_learning_rate(fedlora::testing::kTestAdaptiveServerLr);
  }
  config.mutable_aggregation()->set_average_last_rounds(static_cast<uint32_t>(tail));
  if (downlink) {
    fedlora::v1::CodecStage* quant = config.mutable_downlink_codec()->add_stages();
    quant->set_id(fedlora::v1::CodecStage::QUANT);
    quant->set_version(1);
    quant->mutable_quant()->set_bits(8);
    quant->mutable_quant()->set_block_size(256);
    quant->mutable_quant()->set_stochastic(false);
    fedlora::v1::CodecStage* zstd = config.mutable_downlink_codec()->add_stages();
    zstd->set_id(fedlora::v1::CodecStage::ZSTD);
    zstd->set_version(1);
    zstd->mutable_zstd()->set_level(3);
  }
  auto server = fedlora::Server::Create(options, config, fedlora::testing::InitialAdapter());
  if (!server.ok()) {
    std::fprintf(stderr, "fedlora_test_server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  (*server)->Shutdown();
  return 0;
}
