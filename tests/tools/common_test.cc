// tools/common.h: which device a run computes on when part of it needs the CPU.
#include "tools/common.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora::tools {
namespace {

using ::testing::HasSubstr;

TEST(DeviceForRun, CpuOnlyWorkSendsAutoToTheCpuAndRefusesCuda) {
  EXPECT_EQ(CpuOnlyWork(false), "");
  EXPECT_EQ(CpuOnlyWork(true), "int8 math");
  // Nothing needs the CPU: the resolved device stands.
  EXPECT_EQ(*DeviceForRun("cuda", Device::kCuda, ""), Device::kCuda);
  EXPECT_EQ(*DeviceForRun("auto", Device::kCuda, ""), Device::kCuda);
  // Something does: auto takes the CPU, cuda is refused naming the work.
  EXPECT_EQ(*DeviceForRun("auto", Device::kCuda, "int8 math"), Device::kCpu);
  const auto refused = DeviceForRun("cuda", Device::kCuda, CpuOnlyWork(true));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("int8 math runs on the CPU only so far"));
  // On the CPU anything goes.
  EXPECT_EQ(*DeviceForRun("cpu", Device::kCpu, "int8 math"), Device::kCpu);
  EXPECT_EQ(*DeviceForRun("auto", Device::kCpu, "int8 math"), Device::kCpu);
}

// A run config names its precision; bf16 math and exact-match scoring (greedy decoding) run on
// CUDA, so they keep a run on the GPU; INT8 does not.
TEST(DeviceForRun, ARunConfigNamesOnlyInt8Precision) {
  v1::RunConfig c;
  c.mutable_task()->set_kind(v1::TaskConfig::CAUSAL_LM);
  c.mutable_task()->set_exact_match(true);
  EXPECT_EQ(CpuOnlyWork(c), "");
  EXPECT_EQ(*DeviceForRun("cuda", Device::kCuda, CpuOnlyWork(c)), Device::kCuda);
  EXPECT_EQ(*DeviceForRun("auto", Device::kCuda, CpuOnlyWork(c)), Device::kCuda);
  c.mutable_model()->set_precision(v1::ModelConfig::BF16);
  EXPECT_EQ(CpuOnlyWork(c), "");
  c.mutable_model()->set_precision(v1::ModelConfig::INT8);
  EXPECT_EQ(CpuOnlyWork(c), "int8 math");
}

}  // namespace
}  // namespace fedlora::tools
