// tools/common.h: which device a run computes on when part of it needs the CPU, and the run config
// `fedlora train` and `fedlora eval` load through.
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

// The flags of `fedlora train` / `fedlora eval` as the run config the workload factory reads: the
// kind by the checkpoint, the precision by the math flags (--bf16 alone is the request's), the
// data fields and prompt settings as given, no labels (the data's or the adapter's).
TEST(CommandRunConfig, TheFlagsAsARunConfig) {
  DecoderDataFlags data;
  data.system = "Be brief.";
  data.chat_template = "chatml";
  data.exact_match = true;
  EncoderDataFlags fields;
  fields.text_field = "sentence";
  v1::RunConfig c = CommandRunConfig("models/m", true, 64, {.bf16 = true}, data, fields);
  EXPECT_EQ(c.model().path(), "models/m");
  EXPECT_EQ(c.model().max_seq_len(), 64u);
  EXPECT_EQ(c.model().precision(), v1::ModelConfig::PRECISION_UNSPECIFIED);
  EXPECT_EQ(c.task().kind(), v1::TaskConfig::CAUSAL_LM);
  EXPECT_EQ(c.task().system_prompt(), "Be brief.");
  EXPECT_EQ(c.task().chat_template(), "chatml");
  EXPECT_TRUE(c.task().exact_match());
  EXPECT_EQ(c.task().prompt_field(), "prompt");
  EXPECT_EQ(c.task().text_field(), "sentence");
  EXPECT_EQ(c.task().labels_size(), 0);
  c = CommandRunConfig("m", false, 128, {.bf16_math = true}, {}, {});
  EXPECT_EQ(c.task().kind(), v1::TaskConfig::SEQUENCE_CLASSIFICATION);
  EXPECT_EQ(c.model().precision(), v1::ModelConfig::BF16);
  c = CommandRunConfig("m", true, 128, {.int8_math = true}, {}, {});
  EXPECT_EQ(c.model().precision(), v1::ModelConfig::INT8);
  EXPECT_EQ(CpuOnlyWork(c), "int8 math");

  EXPECT_TRUE(CheckPrecisionFlags({.bf16 = true, .bf16_math = true}).ok());
  const absl::Status both = CheckPrecisionFlags({.bf16 = true, .int8_math = true});
  EXPECT_EQ(both.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(both.message()), HasSubstr("not with --bf16"));
}

}  // namespace
}  // namespace fedlora::tools
