// CausalLm on its device (DecoderOptions::device, kernels/backend.h). Built twice, as
// bert_device_test.cc: model_decoder_device_test checks the CPU side (CUDA refused with its reason
// where there is no GPU; the CPU base is its own mirror); model_decoder_gpu_test
// (FEDLORA_DECODER_GPU_TEST, label gpu) checks that a CUDA model follows the CPU's loss trajectory
// over 20 training steps, and skips itself without a GPU.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/device.h"
#include "model/decoder.h"
#include "tests/model/tiny_decoder.h"

namespace fedlora {
namespace {

DecoderOptions Options(Device device) {
  DecoderOptions o;
  o.lora.rank = 2;
  o.lora.dropout = 0.1f;
  o.max_batch = 2;
  o.max_seq = 8;
  o.seed = 4;
  o.device = device;
  return o;
}

std::shared_ptr<const DecoderBase> TinyBase() {
  auto base = DecoderBase::FromRandom(testing_util::TinyDecoderConfig(), Options(Device::kCpu));
  EXPECT_TRUE(base.ok()) << base.status();
  return base.ok() ? *base : nullptr;
}

// Frozen matrices as bf16, multiplied in bf16.
DecoderOptions Bf16MathOptions(Device device) {
  DecoderOptions o = Options(device);
  o.weights = WeightStorage::kBF16;
  o.bf16_math = true;
  return o;
}

#if !defined(FEDLORA_DECODER_GPU_TEST)
TEST(DecoderDevice, CudaIsRefusedWithItsReasonWhereThereIsNone) {
  if (kernels::CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  auto base = TinyBase();
  ASSERT_NE(base, nullptr);
  auto lm = CausalLm::Create(base, Options(Device::kCuda));
  ASSERT_FALSE(lm.ok());
  EXPECT_EQ(lm.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(lm.status().message().find("CUDA"), std::string::npos) << lm.status();
  EXPECT_TRUE(CausalLm::Create(base, Options(Device::kCpu)).ok());
}

// int8 math is a CPU kernel: asked for on CUDA it is refused, not run as fp32. bf16 math runs on
// CUDA too (cuBLASLt): without a GPU its only refusal is CUDA's absence.
TEST(DecoderDevice, Int8MathIsRefusedOnCudaAndBf16MathIsNot) {
  DecoderOptions int8 = Options(Device::kCpu);
  int8.weights = WeightStorage::kQ8_0;
  int8.int8_math = true;
  for (DecoderOptions o : {Bf16MathOptions(Device::kCpu), int8}) {
    auto base = DecoderBase::FromRandom(testing_util::TinyDecoderConfig(), o);
    ASSERT_TRUE(base.ok()) << base.status();
    o.device = Device::kCuda;
    auto lm = CausalLm::Create(*base, o);
    if (o.int8_math) {
      ASSERT_FALSE(lm.ok());
      EXPECT_EQ(lm.status().code(), absl::StatusCode::kUnimplemented) << lm.status();
      EXPECT_NE(lm.status().message().find("int8_math"), std::string::npos) << lm.status();
    } else if (kernels::CudaAvailable()) {
      EXPECT_TRUE(lm.ok()) << lm.status();
    } else {
      ASSERT_FALSE(lm.ok());
      EXPECT_EQ(lm.status().code(), absl::StatusCode::kFailedPrecondition) << lm.status();
      EXPECT_EQ(lm.status().message().find("bf16_math"), std::string::npos) << lm.status();
    }
  }
}

TEST(DecoderDevice, TheCpuBaseIsItsOwnMirror) {
  auto base = TinyBase();
  ASSERT_NE(base, nullptr);
  auto a = *base->WeightsOn(Device::kCpu);
  EXPECT_EQ(a.get(), base->WeightsOn(Device::kCpu)->get());
  EXPECT_EQ(a->bytes(), 0u);
}
#else
CausalLm::Batch Batch() {
  CausalLm::Batch b;
  b.batch_size = 2;
  b.seq_len = 7;
  b.input_ids = {5, 17, 3, 44, 60, 12, 7, 8, 9, 10, 11, 0, 0, 0};
  b.attention_mask = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0};
  b.labels = {-100, -100, 3, 44, 60, 12, 7, 8, 9, 10, 11, -100, -100, -100};
  return b;
}

TEST(DecoderDevice, GpuFollowsTheCpuOverTwentySteps) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  auto base = TinyBase();
  ASSERT_NE(base, nullptr);
  auto cpu = *CausalLm::Create(base, Options(Device::kCpu));
  auto gpu = *CausalLm::Create(base, Options(Device::kCuda));
  EXPECT_GT((*base->WeightsOn(Device::kCuda))->bytes(), 0u);
  const CausalLm::Batch batch = Batch();
  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE(step);
    cpu->ZeroGrad();
    gpu->ZeroGrad();
    const float lc = *cpu->ForwardBackward(batch, 50 + step);
    const float lg = *gpu->ForwardBackward(batch, 50 + step);
    ASSERT_NEAR(lg, lc, 1e-4f * std::max(1.0f, std::fabs(lc)));
    for (size_t i = 0; i < cpu->trainable_params().size(); ++i) {
      Param& pc = cpu->trainable_params()[i];
      Param& pg = gpu->trainable_params()[i];
      float scale = 1e-6f;
      for (float g : pc.grad) scale = std::max(scale, std::fabs(g));
      for (size_t j = 0; j < pc.grad.size(); ++j) ASSERT_NEAR(pg.grad[j], pc.grad[j], 1e-3f * scale) << pc.name;
      for (size_t j = 0; j < pc.value.size(); ++j) {  // SGD, as a trainer would, on the host
        pc.value[j] -= 0.1f * pc.grad[j];
        pg.value[j] -= 0.1f * pg.grad[j];
      }
    }
  }
  const auto ec = *cpu->Evaluate(batch);
  const auto eg = *gpu->Evaluate(batch);
  EXPECT_EQ(eg.tokens, ec.tokens);
  EXPECT_NEAR(eg.nll, ec.nll, 1e-4 * std::max(1.0, ec.nll));
  const auto logits_cpu = *cpu->Logits(batch);
  const auto logits_gpu = *gpu->Logits(batch);
  ASSERT_EQ(logits_gpu.size(), logits_cpu.size());
  for (size_t i = 0; i < logits_cpu.size(); ++i) EXPECT_NEAR(logits_gpu[i], logits_cpu[i], 1e-3f) << i;
  // Greedy decoding stays on the CPU so far, and says so.
  auto generated = gpu->Generate({5, 17, 3}, {.max_new_tokens = 2, .stop_ids = {}, .use_cache = true});
  EXPECT_EQ(generated.status().code(), absl::StatusCode::kUnimplemented);
}

// bf16 math on CUDA (cuBLASLt) against the same bf16 base on the CPU (bf16 where the CPU has
// AVX512_BF16, exact fp32 elsewhere): the losses agree to about 1e-2 rather than fp32 rounding.
TEST(DecoderDevice, GpuBf16MathFollowsTheCpuOverTwentySteps) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  auto base = DecoderBase::FromRandom(testing_util::TinyDecoderConfig(), Bf16MathOptions(Device::kCpu));
  ASSERT_TRUE(base.ok()) << base.status();
  auto cpu = CausalLm::Create(*base, Bf16MathOptions(Device::kCpu));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = CausalLm::Create(*base, Bf16MathOptions(Device::kCuda));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const CausalLm::Batch batch = Batch();
  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE(step);
    (*cpu)->ZeroGrad();
    (*gpu)->ZeroGrad();
    const absl::StatusOr<float> lc = (*cpu)->ForwardBackward(batch, 50 + step);
    const absl::StatusOr<float> lg = (*gpu)->ForwardBackward(batch, 50 + step);
    ASSERT_TRUE(lc.ok()) << lc.status();
    ASSERT_TRUE(lg.ok()) << lg.status();
    ASSERT_NEAR(*lg, *lc, 1e-2f * std::max(1.0f, std::fabs(*lc)));
    for (size_t i = 0; i < (*cpu)->trainable_params().size(); ++i) {  // SGD on the host, as above
      Param& pc = (*cpu)->trainable_params()[i];
      Param& pg = (*gpu)->trainable_params()[i];
      for (size_t j = 0; j < pc.value.size(); ++j) {
        pc.value[j] -= 0.1f * pc.grad[j];
        pg.value[j] -= 0.1f * pg.grad[j];
      }
    }
  }
}
#endif

}  // namespace
}  // namespace fedlora
