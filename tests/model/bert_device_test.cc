// BertClassifier on its device (ModelOptions::device, kernels/base/backend.h). Built twice:
// model_bert_device_test checks the CPU side (a CUDA classifier is refused with its reason where
// there is no GPU; the CPU base is its own mirror); model_bert_gpu_test (FEDLORA_BERT_GPU_TEST,
// label gpu) checks that a CUDA classifier follows the CPU's loss trajectory over 20 training
// steps, and skips itself without a GPU.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/backend.h"
#include "kernels/base/device.h"
#include "model/bert.h"
#include "tests/model/tiny_checkpoint.h"

namespace fedlora {
namespace {

ModelOptions Options(Device device) {
  ModelOptions o;
  o.num_labels = 3;
  o.lora.rank = 4;
  o.lora.alpha = 8.0f;
  o.lora.target_modules = {"query", "value", "intermediate"};
  o.hidden_dropout = 0.1f;
  o.attention_dropout = 0.1f;
  o.max_batch = 2;
  o.max_seq = 8;
  o.seed = 5;
  o.device = device;
  return o;
}

std::shared_ptr<const BertBase> TinyBase() {
  const std::string dir = testing_util::MakeTempDir("bert_device");
  EXPECT_TRUE(testing_util::WriteTinyCheckpoint(dir, testing_util::TinyConfig()).ok());
  auto base = BertBase::Load(dir, Options(Device::kCpu));
  EXPECT_TRUE(base.ok()) << base.status();
  return base.ok() ? *base : nullptr;
}

[[maybe_unused]] BertClassifier::Batch Batch() {
  return BertClassifier::Batch{2,
                               7,
                               {2, 11, 12, 13, 14, 15, 3, 2, 21, 22, 3, 0, 0, 0},
                               {0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0},
                               {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0},
                               {2, 0}};
}

#if !defined(FEDLORA_BERT_GPU_TEST)
TEST(BertDevice, CudaIsRefusedWithItsReasonWhereThereIsNone) {
  if (kernels::CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  auto base = TinyBase();
  ASSERT_NE(base, nullptr);
  auto model = BertClassifier::Create(base, Options(Device::kCuda));
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(model.status().message().find("CUDA"), std::string::npos) << model.status();
  // The base is still usable on the CPU.
  EXPECT_TRUE(BertClassifier::Create(base, Options(Device::kCpu)).ok());
}

// bf16 math runs on CUDA too (cuBLASLt): Create does not refuse it; without a GPU the only refusal
// is CUDA's absence.
TEST(BertDevice, Bf16MathIsAcceptedOnCuda) {
  const std::string dir = testing_util::MakeTempDir("bert_device_bf16");
  ASSERT_TRUE(testing_util::WriteTinyCheckpoint(dir, testing_util::TinyConfig()).ok());
  ModelOptions o = Options(Device::kCpu);
  o.bf16_weights = o.bf16_math = true;
  auto base = BertBase::Load(dir, o);
  ASSERT_TRUE(base.ok()) << base.status();
  o.device = Device::kCuda;
  auto model = BertClassifier::Create(*base, o);
  if (kernels::CudaAvailable()) {
    EXPECT_TRUE(model.ok()) << model.status();
  } else {
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition) << model.status();
    EXPECT_EQ(model.status().message().find("bf16_math"), std::string::npos) << model.status();
  }
}

TEST(BertDevice, TheCpuBaseIsItsOwnMirrorAndSharedByEveryClassifier) {
  auto base = TinyBase();
  ASSERT_NE(base, nullptr);
  auto a = *base->WeightsOn(Device::kCpu);
  auto b = *base->WeightsOn(Device::kCpu);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(a->bytes(), 0u);  // nothing copied
}

#else
// SGD on the host params, as a trainer would (the optimizer reads the gradients ForwardBackward
// brought back to the host).
void Step(BertClassifier& m, float lr) {
  for (Param& p : m.trainable_params()) {
    for (size_t i = 0; i < p.value.size(); ++i) p.value[i] -= lr * p.grad[i];
  }
}

TEST(BertDevice, GpuFollowsTheCpuOverTwentySteps) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  auto base = TinyBase();
  ASSERT_NE(base, nullptr);
  auto cpu = *BertClassifier::Create(base, Options(Device::kCpu));
  auto gpu = *BertClassifier::Create(base, Options(Device::kCuda));
  auto gpu2 = *BertClassifier::Create(base, Options(Device::kCuda));
  // Both GPU classifiers read one device copy of the base.
  EXPECT_EQ(base->WeightsOn(Device::kCuda)->get(), base->WeightsOn(Device::kCuda)->get());
  EXPECT_GT((*base->WeightsOn(Device::kCuda))->bytes(), 0u);
  const BertClassifier::Batch batch = Batch();
  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE(step);
    cpu->ZeroGrad();
    gpu->ZeroGrad();
    const float lc = *cpu->ForwardBackward(batch, 100 + step);
    const float lg = *gpu->ForwardBackward(batch, 100 + step);
    ASSERT_NEAR(lg, lc, 1e-4f * std::max(1.0f, std::fabs(lc)));
    for (size_t i = 0; i < cpu->trainable_params().size(); ++i) {
      const Param& pc = cpu->trainable_params()[i];
      const Param& pg = gpu->trainable_params()[i];
      float scale = 1e-6f;
      for (float g : pc.grad) scale = std::max(scale, std::fabs(g));
      for (size_t j = 0; j < pc.grad.size(); ++j) {
        ASSERT_NEAR(pg.grad[j], pc.grad[j], 1e-3f * scale) << pc.name << "[" << j << "]";
      }
    }
    Step(*cpu, 0.05f);
    Step(*gpu, 0.05f);
  }
  const auto logits_cpu = *cpu->Logits(batch);
  const auto logits_gpu = *gpu->Logits(batch);
  ASSERT_EQ(logits_cpu.size(), logits_gpu.size());
  for (size_t i = 0; i < logits_cpu.size(); ++i)
    EXPECT_NEAR(logits_gpu[i], logits_cpu[i], 1e-3f) << i;
  const auto pooled_cpu = *cpu->PooledEmbeddings(batch, Pooling::kMean);
  const auto pooled_gpu = *gpu->PooledEmbeddings(batch, Pooling::kMean);
  for (size_t i = 0; i < pooled_cpu.size(); ++i)
    EXPECT_NEAR(pooled_gpu[i], pooled_cpu[i], 1e-3f) << i;
  // The untouched second GPU classifier still gives the initial model's loss.
  auto fresh = *BertClassifier::Create(base, Options(Device::kCpu));
  fresh->ZeroGrad();
  gpu2->ZeroGrad();
  EXPECT_NEAR(*gpu2->ForwardBackward(batch, 7), *fresh->ForwardBackward(batch, 7), 1e-4f);
}

// bf16 math on CUDA (cuBLASLt) against the same bf16 base on the CPU (bf16 where the CPU has
// AVX512_BF16, exact fp32 elsewhere): both round to bf16 differently or not at all, so the losses
// agree to about 1e-2 rather than fp32 rounding.
TEST(BertDevice, GpuBf16MathFollowsTheCpuOverTwentySteps) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing_util::MakeTempDir("bert_gpu_bf16");
  ASSERT_TRUE(testing_util::WriteTinyCheckpoint(dir, testing_util::TinyConfig()).ok());
  ModelOptions o = Options(Device::kCpu);
  o.bf16_weights = o.bf16_math = true;
  auto base = BertBase::Load(dir, o);
  ASSERT_TRUE(base.ok()) << base.status();
  auto cpu = BertClassifier::Create(*base, o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  o.device = Device::kCuda;
  auto gpu = BertClassifier::Create(*base, o);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const BertClassifier::Batch batch = Batch();
  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE(step);
    (*cpu)->ZeroGrad();
    (*gpu)->ZeroGrad();
    const absl::StatusOr<float> lc = (*cpu)->ForwardBackward(batch, 100 + step);
    const absl::StatusOr<float> lg = (*gpu)->ForwardBackward(batch, 100 + step);
    ASSERT_TRUE(lc.ok()) << lc.status();
    ASSERT_TRUE(lg.ok()) << lg.status();
    ASSERT_NEAR(*lg, *lc, 1e-2f * std::max(1.0f, std::fabs(*lc)));
    Step(**cpu, 0.05f);
    Step(**gpu, 0.05f);
  }
}
#endif

}  // namespace
}  // namespace fedlora
