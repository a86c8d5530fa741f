// The trainer with its model on a GPU: the loop holds the params there and steps AdamW on the
// device (train/device_step.h). Two epochs of a tiny encoder on CUDA against the same run on the
// CPU. Label gpu: skips itself without a GPU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device.h"
#include "model/device_params.h"
#include "tests/train/tiny_task.h"
#include "train/trainer.h"

namespace fedlora {
namespace {

TEST(DeviceStepGpu, TrainerOnCudaFollowsTheCpu) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  const TokenizedDataset train = MarkerTask(24, 5);
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 4;
  opts.grad_accumulation = 2;
  opts.lr = 2e-2f;
  opts.grad_clip = 0.05f;
  opts.proximal_mu = 0.5f;
  opts.seed = 3;
  opts.progress = false;
  std::vector<std::vector<Param>> params;
  std::vector<std::vector<float>> losses;
  for (Device device : {Device::kCpu, Device::kCuda}) {
    auto model = TinyModel(/*seed=*/11, /*dropout=*/0.0f, device);
    ASSERT_NE(model, nullptr);
    Trainer trainer(*model, opts);
    std::vector<float> loss;
    trainer.on_step = [&](const StepReport& s) {
      loss.push_back(s.loss);
      // The GPU run holds its params on the device for the whole step.
      EXPECT_EQ(model->device_params().resident(), device == Device::kCuda);
    };
    ASSERT_TRUE(trainer.Train(train, nullptr).ok());
    EXPECT_FALSE(model->device_params().resident());
    params.push_back(model->trainable_params());
    losses.push_back(loss);
  }
  ASSERT_EQ(losses[1].size(), losses[0].size());
  for (size_t i = 0; i < losses[0].size(); ++i)
    EXPECT_NEAR(losses[1][i], losses[0][i], 1e-4f) << "step " << i;
  for (size_t i = 0; i < params[0].size(); ++i) {
    float largest = 0.0f;
    for (float v : params[0][i].value) largest = std::max(largest, std::fabs(v));
    for (size_t j = 0; j < params[0][i].value.size(); ++j) {
      ASSERT_NEAR(params[1][i].value[j], params[0][i].value[j], 1e-3f * largest)
          << params[0][i].name;
    }
  }
}

}  // namespace
}  // namespace fedlora
