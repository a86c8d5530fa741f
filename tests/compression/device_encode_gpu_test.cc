// EncodeUpdate's device overload (compression/codec.h) on CUDA: the bytes are the CPU's bit for
// bit for a realistic multi-tensor LoRA update under every codec with a GPU path; low-rank is
// refused. Skips itself without a GPU.
#include <memory>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "compression/error_feedback.h"
#include "gtest/gtest.h"
#include "kernels/base/backend.h"
#include "kernels/base/device.h"
#include "tests/compression/lora_update.h"

namespace fedlora {
namespace {

using testing::DeviceCodecs;
using testing::LoraUpdate;

class DeviceEncodeCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::CudaAvailable())
      GTEST_SKIP() << "no CUDA device: " << kernels::CudaDeviceDescription();
    auto b = kernels::Backend::Create(Device::kCuda);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = *std::move(b);
  }
  std::shared_ptr<kernels::Backend> gpu_;
};

TEST_F(DeviceEncodeCuda, BytesEqualTheCpus) {
  const std::vector<UpdateTensor> update = LoraUpdate();
  std::vector<CodecOptions> codecs = DeviceCodecs();
  CodecOptions zstd = codecs[1];
  zstd.zstd = true;
  codecs.push_back(zstd);
  for (const CodecOptions& o : codecs) {
    auto cpu = EncodeUpdate(update, o);
    auto gpu = EncodeUpdate(update, o, gpu_.get());
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(gpu.ok()) << o.Describe() << ": " << gpu.status();
    EXPECT_TRUE(*gpu == *cpu) << o.Describe() << ": " << gpu->size() << " vs " << cpu->size()
                              << " bytes";
  }
}

TEST_F(DeviceEncodeCuda, ErrorFeedbackSendsTheCpusBytes) {
  const CodecOptions o = DeviceCodecs()[0];
  ErrorFeedback on_cpu, on_gpu;
  for (int round = 0; round < 3; ++round) {
    auto a = on_cpu.Encode(LoraUpdate(), o);
    auto b = on_gpu.Encode(LoraUpdate(), o, gpu_.get());
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(*a == *b) << "round " << round;
    on_cpu.Commit();
    on_gpu.Commit();
  }
}

TEST_F(DeviceEncodeCuda, LowRankIsRefused) {
  auto r = EncodeUpdate(
      LoraUpdate(), CodecOptions{.sparsifier = Sparsifier::kLowRank, .low_rank = 2}, gpu_.get());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_NE(r.status().message().find("low-rank"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace fedlora
