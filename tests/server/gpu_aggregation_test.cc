// A federation whose server sums the updates on the GPU (ServerOptions::aggregation_device): the
// global adapter has the bits computed directly on the CPU. Label gpu: skips itself without one
// (federation_e2e_test.cc checks that such a server is refused there).
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::DeterministicTrainer;

TEST(GpuAggregationTest, ThreeRoundsOnTheGpuGiveTheDirectlyComputedAdapter) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device: " << kernels::CudaDeviceDescription();
  testing::TempDir dir;
  constexpr int kClients = 4, kRounds = 3;
  ServerOptions options = testing::TestServerOptions(dir.path());
  options.aggregation_device = Device::kCuda;
  auto server = Server::Create(options, testing::TestRunConfig(kRounds, kClients, kClients), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
  for (int c = 0; c < kClients; ++c) trainers.push_back(std::make_unique<DeterministicTrainer>(c));
  const auto results = testing::RunClientsUntilDone((*server)->address(), trainers);
  for (int c = 0; c < kClients; ++c) ASSERT_TRUE(results[c].ok()) << "client " << c << ": " << results[c].status();
  EXPECT_TRUE(testing::SameBits((*server)->coordinator().global_adapter(),
                                testing::ExpectedAdapter({0, 1, 2, 3}, kRounds)));
  EXPECT_EQ((*server)->metrics().rounds_committed.load(), kRounds);
}

}  // namespace
}  // namespace fedlora
