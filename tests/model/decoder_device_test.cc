// CausalLm on its device (DecoderOptions::device, kernels/base/backend.h). Built twice, as
// bert_device_test.cc: model_decoder_device_test checks the CPU side (CUDA refused with its reason
// where there is no GPU; the CPU base is its own mirror); model_decoder_gpu_test
// (FEDLORA_DECODER_GPU_TEST, label gpu) checks that a CUDA model follows the CPU's loss trajectory
// over 20 training steps and decodes the CPU's greedy tokens, and skips itself without a GPU.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/backend.h"
#include "kernels/base/device.h"
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
      for (size_t j = 0; j < pc.grad.size(); ++j)
        ASSERT_NEAR(pg.grad[j], pc.grad[j], 1e-3f * scale) << pc.name;
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
  for (size_t i = 0; i < logits_cpu.size(); ++i)
    EXPECT_NEAR(logits_gpu[i], logits_cpu[i], 1e-3f) << i;
  // The trained adapters decode to the CPU's tokens.
  auto generated =
      gpu->Generate({5, 17, 3}, {.max_new_tokens = 4, .stop_ids = {}, .use_cache = true});
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_EQ(*generated,
            *cpu->Generate({5, 17, 3}, {.max_new_tokens = 4, .stop_ids = {}, .use_cache = true}));
}

// Greedy decoding on CUDA returns the CPU's tokens, with the KV cache (prefill, then one-row steps
// through kernels/decode_attention.h) and without (the whole sequence each step): for a short
// prompt, and for one whose cache grows past a DecodeAttention chunk (256 positions), with
// nonzero LoRA B so the adapters take part.
TEST(DecoderDevice, GpuGreedyDecodingReturnsTheCpusTokens) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  DecoderConfig config = testing_util::TinyDecoderConfig();
  config.max_position_embeddings = 320;
  DecoderOptions o = Options(Device::kCpu);
  o.max_batch = 1;
  o.max_seq = 272;
  auto base = DecoderBase::FromRandom(config, o);
  ASSERT_TRUE(base.ok()) << base.status();
  auto cpu = *CausalLm::Create(*base, o);
  o.device = Device::kCuda;
  auto gpu = *CausalLm::Create(*base, o);
  for (size_t i = 0; i < cpu->trainable_params().size(); ++i) {
    std::vector<float>& vc = cpu->trainable_params()[i].value;
    for (size_t j = 0; j < vc.size(); ++j)
      vc[j] = 0.05f * std::sin(0.37f * static_cast<float>(i * 131 + j));
    gpu->trainable_params()[i].value = vc;
  }
  std::vector<int32_t> long_prompt(262);
  for (size_t i = 0; i < long_prompt.size(); ++i)
    long_prompt[i] = static_cast<int32_t>((i * 29 + 7) % 64);
  struct Case {
    std::vector<int32_t> prompt;
    int new_tokens;
  };
  for (const Case& c : {Case{{5, 17, 3}, 12}, Case{long_prompt, 8}}) {
    for (bool cache : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << "prompt " << c.prompt.size() << (cache ? " cached" : " uncached"));
      const CausalLm::GenerateOptions go{
          .max_new_tokens = c.new_tokens, .stop_ids = {}, .use_cache = cache};
      auto want = cpu->Generate(c.prompt, go);
      auto got = gpu->Generate(c.prompt, go);
      ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
      EXPECT_EQ(want->size(), static_cast<size_t>(c.new_tokens));
      EXPECT_EQ(*got, *want);
    }
  }
}

// bf16 math on CUDA (cuBLASLt) against the same bf16 base on the CPU (bf16 where the CPU has
// AVX512_BF16, exact fp32 elsewhere): the losses agree to about 1e-2 rather than fp32 rounding.
TEST(DecoderDevice, GpuBf16MathFollowsTheCpuOverTwentySteps) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  auto base =
      DecoderBase::FromRandom(testing_util::TinyDecoderConfig(), Bf16MathOptions(Device::kCpu));
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
