// config/device_plan.h: one rule for where the server, the client and the simulator compute.
#include "config/device_plan.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

v1::RunConfig WithPrecision(v1::ModelConfig::Precision precision) {
  v1::RunConfig config;
  config.mutable_model()->set_precision(precision);
  return config;
}

TEST(DevicePlan, ServerAndClientSumAndEncodeOnTheirDeviceWhateverTheModelsNeed) {
  const v1::RunConfig int8 = WithPrecision(v1::ModelConfig::INT8);
  for (RunRole role : {RunRole::kServer, RunRole::kClient}) {
    absl::StatusOr<DevicePlan> plan = PlanDevices("auto", Device::kCuda, role, int8);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->models, Device::kCpu);    // int8 math: the CPU only so far
    EXPECT_EQ(plan->updates, Device::kCuda);  // exact sums, encoding: the GPU still
  }
}

TEST(DevicePlan, TheSimulatorKeepsItsUpdatesWithItsModels) {
  absl::StatusOr<DevicePlan> plan =
      PlanDevices("auto", Device::kCuda, RunRole::kSimulator, WithPrecision(v1::ModelConfig::INT8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->models, Device::kCpu);
  EXPECT_EQ(plan->updates, Device::kCpu);
  plan =
      PlanDevices("cuda", Device::kCuda, RunRole::kSimulator, WithPrecision(v1::ModelConfig::BF16));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->models, Device::kCuda);
  EXPECT_EQ(plan->updates, Device::kCuda);
}

TEST(DevicePlan, CudaWithCpuOnlyWorkIsRefusedForEveryRole) {
  for (RunRole role : {RunRole::kServer, RunRole::kClient, RunRole::kSimulator}) {
    absl::StatusOr<DevicePlan> plan =
        PlanDevices("CUDA", Device::kCuda, role, WithPrecision(v1::ModelConfig::INT8));
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(plan.status().message()),
                HasSubstr("int8 math runs on the CPU only so far"));
  }
}

TEST(DevicePlan, TheCpuIsAlwaysTheCpuAndABadFlagIsNamed) {
  for (RunRole role : {RunRole::kServer, RunRole::kClient, RunRole::kSimulator}) {
    absl::StatusOr<DevicePlan> plan =
        PlanDevices("Cpu", role, WithPrecision(v1::ModelConfig::INT8));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->models, Device::kCpu);
    EXPECT_EQ(plan->updates, Device::kCpu);
  }
  absl::StatusOr<DevicePlan> bad = PlanDevices("gpu", RunRole::kServer, v1::RunConfig());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unknown value 'gpu'"));
}

}  // namespace
}  // namespace fedlora
