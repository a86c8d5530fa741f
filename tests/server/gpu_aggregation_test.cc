// A federation whose server sums the updates on the GPU (ServerOptions::aggregation_device): the
// global adapter has the bits computed directly on the CPU. Label gpu: skips itself without one
// (federation_e2e_test.cc checks that such a server is refused there).
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::DeterministicTrainer;

TEST(GpuAggregationTest, ThreeRoundsOnTheGpuGiveTheDirectlyComputedAdapter) {
  if (!kernels::CudaAvailable())
    GTEST_SKIP() << "no CUDA device: " << kernels::CudaDeviceDescription();
  testing::TempDir dir;
  constexpr int kClients = 4, kRounds = 3;
  ServerOptions options = testing::TestServerOptions(dir.path());
  options.aggregation_device = Device::kCuda;
  auto server = Server::Create(options, testing::TestRunConfig(kRounds, kClients, kClients),
                               testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
  for (int c = 0; c < kClients; ++c) trainers.push_back(std::make_unique<DeterministicTrainer>(c));
  const auto results = testing::RunClientsUntilDone((*server)->address(), trainers);
  for (int c = 0; c < kClients; ++c)
    ASSERT_TRUE(results[c].ok()) << "client " << c << ": " << results[c].status();
  EXPECT_TRUE(testing::SameBits((*server)->coordinator().global_adapter(),
                                testing::ExpectedAdapter({0, 1, 2, 3}, kRounds)));
  EXPECT_EQ((*server)->metrics().rounds_committed.load(), kRounds);
}

// Top-k 25% with 8-bit quantization and clipping: the GPU server adds only the kept entries, and
// its adapter has the bits of the same federation aggregated on the CPU.
TEST(GpuAggregationTest, SparseClippedUpdatesGiveTheCpuServersAdapter) {
  if (!kernels::CudaAvailable())
    GTEST_SKIP() << "no CUDA device: " << kernels::CudaDeviceDescription();
  constexpr int kClients = 3, kRounds = 2;
  v1::RunConfig config = testing::TestRunConfig(kRounds, kClients, kClients);
  v1::CodecStage* topk = config.mutable_codec()->add_stages();
  topk->set_id(v1::CodecStage::TOPK);
  topk->mutable_top_k()->set_fraction(0.25);
  v1::CodecStage* quant = config.mutable_codec()->add_stages();
  quant->set_id(v1::CodecStage::QUANT);
  quant->mutable_quant()->set_bits(8);
  config.mutable_aggregation()->set_max_update_norm(0.05);
  std::vector<std::vector<UpdateTensor>> adapters;
  for (Device device : {Device::kCpu, Device::kCuda}) {
    testing::TempDir dir;
    ServerOptions options = testing::TestServerOptions(dir.path());
    options.aggregation_device = device;
    auto server = Server::Create(options, config, testing::InitialAdapter());
    ASSERT_TRUE(server.ok()) << server.status();
    std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
    for (int c = 0; c < kClients; ++c)
      trainers.push_back(std::make_unique<DeterministicTrainer>(c));
    const auto results = testing::RunClientsUntilDone((*server)->address(), trainers);
    for (int c = 0; c < kClients; ++c)
      ASSERT_TRUE(results[c].ok()) << "client " << c << ": " << results[c].status();
    EXPECT_EQ((*server)->metrics().rounds_committed.load(), kRounds);
    adapters.push_back((*server)->coordinator().global_adapter());
  }
  EXPECT_TRUE(testing::SameBits(adapters[1], adapters[0]));
  EXPECT_FALSE(testing::SameBits(adapters[0], testing::InitialAdapter()))
      << "the rounds changed nothing";
}

}  // namespace
}  // namespace fedlora
