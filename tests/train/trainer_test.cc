#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/device_params.h"
#include "tests/train/tiny_task.h"
#include "train/train_loop.h"

namespace fedlora {
namespace {

TEST(MakeBatch, PadsToLongestWithMask) {
  TokenizedDataset d;
  d.num_labels = 3;
  d.examples = {{{1, 7, 2}, {0, 0, 0}, 2}, {{1, 8, 9, 10, 2}, {0, 0, 1, 1, 1}, 0}};
  const std::vector<int64_t> idx = {1, 0};
  const BertClassifier::Batch b = MakeBatch(d, idx, /*pad_id=*/0);
  EXPECT_EQ(b.batch_size, 2);
  EXPECT_EQ(b.seq_len, 5);
  EXPECT_EQ(b.input_ids, (std::vector<int32_t>{1, 8, 9, 10, 2, 1, 7, 2, 0, 0}));
  EXPECT_EQ(b.token_type_ids, (std::vector<int32_t>{0, 0, 1, 1, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(b.attention_mask, (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(b.labels, (std::vector<int32_t>{0, 2}));
}

int64_t PaddedTokens(const TokenizedDataset& d, const std::vector<int64_t>& order, int batch) {
  int64_t total = 0;
  for (size_t b = 0; b < order.size(); b += batch) {
    size_t longest = 0;
    const size_t e = std::min(order.size(), b + batch);
    for (size_t i = b; i < e; ++i)
      longest = std::max(longest, d.examples[order[i]].input_ids.size());
    total += static_cast<int64_t>(longest * (e - b));
  }
  return total;
}

TEST(EpochOrder, PermutationPerEpochAndLengthGrouping) {
  const TokenizedDataset d = MarkerTask(203, 8);  // 203 = 12 full batches of 16 + 11
  TrainOptions opts;
  opts.batch_size = 16;
  opts.seed = 5;
  for (bool grouped : {false, true}) {
    opts.group_by_length = grouped;
    const std::vector<int64_t> e1 = EpochOrder(d, opts, 1), e2 = EpochOrder(d, opts, 2);
    EXPECT_EQ(e1, EpochOrder(d, opts, 1));  // deterministic
    EXPECT_NE(e1, e2);                      // reshuffled every epoch
    std::vector<int64_t> sorted = e1;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < d.size(); ++i) ASSERT_EQ(sorted[i], i) << "grouped=" << grouped;
  }
  // All 203 examples fit in one chunk of 50 batches, so grouping sorts them by length: every
  // full batch then spans a narrow length range, and padding drops well below the random order's
  // (lengths are uniform in 6..20; random batches of 16 nearly always pad to ~20).
  opts.group_by_length = false;
  const int64_t random_tokens = PaddedTokens(d, EpochOrder(d, opts, 1), 16);
  opts.group_by_length = true;
  const std::vector<int64_t> grouped = EpochOrder(d, opts, 1);
  const int64_t grouped_tokens = PaddedTokens(d, grouped, 16);
  EXPECT_LT(grouped_tokens, random_tokens * 0.8);
  int64_t real_tokens = 0;
  for (const auto& ex : d.examples) real_tokens += static_cast<int64_t>(ex.input_ids.size());
  EXPECT_LT(grouped_tokens, real_tokens * 1.1);  // near-zero padding
}

TEST(Trainer, SameSeedGivesBitIdenticalParams) {
  const TokenizedDataset train = MarkerTask(40, 1);
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 8;
  opts.lr = 5e-3f;
  opts.seed = 42;
  opts.progress = false;
  std::vector<std::vector<Param>> runs;
  for (uint64_t train_seed : {42, 42, 43}) {
    auto model = TinyModel(/*seed=*/3, /*dropout=*/0.1f);
    ASSERT_NE(model, nullptr);
    opts.seed = train_seed;
    Trainer trainer(*model, opts);
    ASSERT_TRUE(trainer.Train(train, nullptr).ok());
    runs.push_back(model->trainable_params());
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  bool differs_with_other_seed = false;
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[0][i].name, runs[1][i].name);
    EXPECT_EQ(runs[0][i].value, runs[1][i].value) << runs[0][i].name;  // bitwise
    differs_with_other_seed |= runs[0][i].value != runs[2][i].value;
  }
  // Another seed reorders the data and redraws dropout: the result must change.
  EXPECT_TRUE(differs_with_other_seed);
}

TEST(Trainer, LearnsSeparableTask) {
  const TokenizedDataset train = MarkerTask(96, 11), eval = MarkerTask(48, 12);
  auto model = TinyModel(/*seed=*/5, /*dropout=*/0.0f);
  ASSERT_NE(model, nullptr);
  auto before = Evaluate(*model, eval, 16);
  ASSERT_TRUE(before.ok()) << before.status();

  TrainOptions opts;
  opts.epochs = 12;
  opts.batch_size = 16;
  opts.lr = 1e-2f;
  opts.warmup_steps = 6;
  opts.seed = 1;
  opts.progress = false;
  Trainer trainer(*model, opts);
  std::vector<EpochReport> epochs;
  int64_t steps_seen = 0;
  trainer.on_epoch = [&](const EpochReport& r) { epochs.push_back(r); };
  trainer.on_step = [&](const StepReport& r) {
    EXPECT_EQ(r.step, ++steps_seen);
    EXPECT_EQ(r.total_steps, 12 * 6);
  };
  ASSERT_TRUE(trainer.Train(train, &eval).ok());
  ASSERT_EQ(epochs.size(), 12u);
  EXPECT_EQ(steps_seen, 72);
  // At random init the classes are indistinguishable (accuracy ~0.5, loss ~ln 2 = 0.69). The
  // marker token is a perfect feature; after 72 steps the model must have found it.
  EXPECT_LT(epochs.back().train_loss, 0.5 * epochs.front().train_loss);
  EXPECT_TRUE(epochs.back().has_eval);
  EXPECT_GE(epochs.back().eval.accuracy, 0.9);
  EXPECT_GT(epochs.back().eval.accuracy, before->accuracy);
  EXPECT_LT(epochs.back().eval.loss, before->loss);
  EXPECT_GE(epochs.back().eval.macro_f1, 0.9);
}

TEST(Trainer, AccumulationMatchesOneLargeBatch) {
  // Without dropout, 2 micro-batches of 4 (accumulated, averaged) equal one batch of 8 up to
  // fp32 summation order (the padding differs per micro-batch; masked positions contribute 0).
  const TokenizedDataset train = MarkerTask(32, 4);
  std::vector<std::vector<Param>> results;
  for (int accumulation : {1, 2}) {
    auto model = TinyModel(/*seed=*/9, /*dropout=*/0.0f);
    ASSERT_NE(model, nullptr);
    TrainOptions opts;
    opts.epochs = 1;
    opts.batch_size = 8 / accumulation;
    opts.grad_accumulation = accumulation;
    opts.lr = 1e-2f;
    opts.optimizer = "sgd";  // Adam's normalisation would hide a wrong gradient scale
    opts.grad_clip = 0.0f;
    opts.progress = false;
    Trainer trainer(*model, opts);
    ASSERT_TRUE(trainer.Train(train, nullptr).ok());
    EXPECT_EQ(trainer.history().back().steps, 4);
    results.push_back(model->trainable_params());
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    for (size_t j = 0; j < results[0][i].value.size(); ++j) {
      ASSERT_NEAR(results[0][i].value[j], results[1][i].value[j], 1e-5)
          << results[0][i].name << "[" << j << "]";
    }
  }
}

TEST(Trainer, MaxStepsOverridesEpochs) {
  const TokenizedDataset train = MarkerTask(20, 2);
  auto model = TinyModel(1, 0.0f);
  TrainOptions opts;
  opts.epochs = 1;
  opts.max_steps = 7;  // 3 steps per epoch of 20 at batch 8: runs into a third epoch
  opts.batch_size = 8;
  opts.progress = false;
  Trainer trainer(*model, opts);
  ASSERT_TRUE(trainer.Train(train, nullptr).ok());
  ASSERT_EQ(trainer.history().size(), 3u);
  EXPECT_EQ(trainer.history().back().steps, 7);
  EXPECT_EQ(trainer.optimizer()->step_count(), 7);
}

TEST(LogitAdjustment, OffsetsAreScaledLogSmoothedPriors) {
  TokenizedDataset d = MarkerTask(4, 1);
  for (auto& e : d.examples) e.label = 0;
  d.examples[3].label = 1;  // counts {3, 1}: smoothed priors 4/6 and 2/6
  EXPECT_TRUE(LogitAdjustmentOffsets(d, 0.0f).empty());
  const std::vector<float> o = LogitAdjustmentOffsets(d, 1.0f);
  ASSERT_EQ(o.size(), 2u);
  EXPECT_NEAR(o[0], std::log(4.0 / 6.0), 1e-6);
  EXPECT_NEAR(o[1], std::log(2.0 / 6.0), 1e-6);
  const std::vector<float> half = LogitAdjustmentOffsets(d, 0.5f);
  EXPECT_NEAR(half[1], 0.5 * std::log(2.0 / 6.0), 1e-6);
}

// MarkerTask(120) as is (balanced) or cut to 60 examples of class 0 and 6 of class 1, trained with
// SGD from the same initialisation.
std::unique_ptr<BertClassifier> TrainMarkers(float logit_adjustment, bool skewed) {
  TokenizedDataset train = MarkerTask(120, 21);
  if (skewed) {
    std::vector<TokenizedExample> kept;
    for (size_t i = 0; i < train.examples.size(); ++i) {
      if (train.examples[i].label == 0 || i % 20 == 1) kept.push_back(train.examples[i]);
    }
    train.examples = std::move(kept);
  }
  auto model = TinyModel(/*seed=*/13, /*dropout=*/0.0f);
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 8;
  opts.lr = 0.05f;
  opts.optimizer = "sgd";
  opts.grad_clip = 0.0f;
  opts.logit_adjustment = logit_adjustment;
  opts.progress = false;
  Trainer trainer(*model, opts);
  EXPECT_TRUE(trainer.Train(train, nullptr).ok());
  return model;
}

TEST(LogitAdjustment, CountersTheSkewOfTheTrainingLabels) {
  // Plain cross-entropy on 10:1 labels drives the head's bias towards the frequent class; the
  // adjusted loss already accounts for the prior, so the learned bias gap is much smaller.
  const auto plain = TrainMarkers(0.0f, /*skewed=*/true);
  const auto model = TrainMarkers(1.0f, /*skewed=*/true);
  const std::vector<float>& b_plain = plain->trainable_params().back().value;
  const std::vector<float>& b_adj = model->trainable_params().back().value;
  const float gap_plain = b_plain[0] - b_plain[1], gap_adj = b_adj[0] - b_adj[1];
  EXPECT_GT(gap_plain, 0.1f);
  EXPECT_LT(gap_adj, 0.5f * gap_plain) << "plain " << gap_plain << ", adjusted " << gap_adj;

  // Train() leaves no offsets behind: a later training loss is the plain cross-entropy.
  const TokenizedDataset probe = MarkerTask(2, 5);
  const BertClassifier::Batch batch = MakeBatch(probe, std::vector<int64_t>{0, 1}, 0);
  auto logits = model->Logits(batch);
  ASSERT_TRUE(logits.ok());
  double expected = 0.0;
  for (int s = 0; s < 2; ++s) {
    const float* z = logits->data() + 2 * s;
    const double m = std::max(z[0], z[1]);
    expected += (m + std::log(std::exp(z[0] - m) + std::exp(z[1] - m)) - z[batch.labels[s]]) / 2;
  }
  auto loss = model->ForwardBackward(batch, 0);
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(*loss, expected, 1e-5);
}

TEST(LogitAdjustment, ChangesNothingOnBalancedLabels) {
  // Equal priors shift every logit by the same amount, which the softmax ignores.
  const std::vector<Param> plain = TrainMarkers(0.0f, /*skewed=*/false)->trainable_params();
  const std::vector<Param> adjusted = TrainMarkers(1.0f, /*skewed=*/false)->trainable_params();
  for (size_t i = 0; i < plain.size(); ++i) {
    for (size_t j = 0; j < plain[i].value.size(); ++j) {
      ASSERT_NEAR(plain[i].value[j], adjusted[i].value[j], 1e-5)
          << plain[i].name << "[" << j << "]";
    }
  }
}

TEST(Trainer, ProximalTermAddsMuTimesTheDistanceFromTheStart) {
  // Two SGD steps with FedProx's term, against the same two steps written out by hand:
  // w <- w - lr * (grad + mu * (w - w_start)). The first step starts at w_start, so only the
  // second tells a missing or mis-signed term apart.
  const TokenizedDataset train = MarkerTask(16, 8);
  TrainOptions opts;
  opts.epochs = 1;
  opts.max_steps = 2;
  opts.batch_size = 8;
  opts.lr = 0.05f;
  opts.optimizer = "sgd";
  opts.weight_decay = 0.0f;
  opts.grad_clip = 0.0f;
  opts.schedule = "constant";
  opts.proximal_mu = 4.0f;
  opts.seed = 4;
  opts.progress = false;
  auto prox = TinyModel(/*seed=*/7, /*dropout=*/0.0f);
  ASSERT_TRUE(Trainer(*prox, opts).Train(train, nullptr).ok());
  TrainOptions plain_opts = opts;
  plain_opts.proximal_mu = 0.0f;
  auto plain = TinyModel(7, 0.0f);
  ASSERT_TRUE(Trainer(*plain, plain_opts).Train(train, nullptr).ok());

  auto manual = TinyModel(7, 0.0f);
  std::vector<Param>& params = manual->trainable_params();
  std::vector<std::vector<float>> start;
  for (const Param& p : params) start.push_back(p.value);
  const std::vector<int64_t> order = EpochOrder(train, opts, 1);
  for (int step = 0; step < 2; ++step) {
    manual->ZeroGrad();
    const auto batch = MakeBatch(train, std::span<const int64_t>(order).subspan(8 * step, 8),
                                 static_cast<int32_t>(manual->config().pad_token_id));
    ASSERT_TRUE(manual->ForwardBackward(batch, 0).ok());
    for (size_t i = 0; i < params.size(); ++i) {
      for (size_t j = 0; j < params[i].value.size(); ++j) {
        const float w = params[i].value[j];
        params[i].value[j] =
            w - opts.lr * (params[i].grad[j] + opts.proximal_mu * (w - start[i][j]));
      }
    }
  }
  double max_diff_plain = 0.0;
  for (size_t i = 0; i < params.size(); ++i) {
    for (size_t j = 0; j < params[i].value.size(); ++j) {
      ASSERT_NEAR(prox->trainable_params()[i].value[j], params[i].value[j], 1e-6)
          << params[i].name << "[" << j << "]";
      max_diff_plain = std::max<double>(
          max_diff_plain, std::abs(plain->trainable_params()[i].value[j] - params[i].value[j]));
    }
  }
  EXPECT_GT(max_diff_plain, 1e-4);  // the term is large enough to matter in this test
}

TEST(Trainer, RejectsBadOptionsAndData) {
  auto model = TinyModel(1, 0.0f);
  const TokenizedDataset train = MarkerTask(8, 3);
  TrainOptions opts;
  opts.progress = false;
  opts.batch_size = 0;
  EXPECT_EQ(Trainer(*model, opts).Train(train, nullptr).code(), absl::StatusCode::kInvalidArgument);
  opts.batch_size = 64;  // the model was planned for 16
  EXPECT_EQ(Trainer(*model, opts).Train(train, nullptr).code(), absl::StatusCode::kInvalidArgument);
  opts.batch_size = 4;
  opts.optimizer = "adagrad";
  EXPECT_EQ(Trainer(*model, opts).Train(train, nullptr).code(), absl::StatusCode::kInvalidArgument);
  opts.optimizer = "adamw";
  opts.logit_adjustment = -1.0f;
  absl::Status negative = Trainer(*model, opts).Train(train, nullptr);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(negative.message()), testing::HasSubstr("logit_adjustment"));
  opts.logit_adjustment = 0.0f;
  opts.proximal_mu = NAN;
  EXPECT_THAT(std::string(Trainer(*model, opts).Train(train, nullptr).message()),
              testing::HasSubstr("proximal_mu"));
  opts.proximal_mu = 0.0f;
  opts.momentum = 1.0f;
  EXPECT_THAT(std::string(Trainer(*model, opts).Train(train, nullptr).message()),
              testing::HasSubstr("momentum must be in [0, 1)"));
  opts.momentum = 0.0f;
  opts.adam_epsilon = 0.0f;
  EXPECT_THAT(std::string(Trainer(*model, opts).Train(train, nullptr).message()),
              testing::HasSubstr("adam_epsilon"));
  opts.adam_epsilon = -1.0f;
  TokenizedDataset bad = train;
  bad.examples[3].label = 2;
  absl::Status s = Trainer(*model, opts).Train(bad, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("example 3"));
  EXPECT_EQ(Trainer(*model, opts).Train(TokenizedDataset{}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Evaluate(*model, TokenizedDataset{}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The trainer's loop over `model` and `data`, padding with id 0.
TrainLoop LoopOver(BertClassifier& model, const TokenizedDataset& data) {
  return ModelTrainLoop(model, data, [](const TokenizedDataset& d, std::span<const int64_t> i) {
    return MakeBatch(d, i, /*pad_id=*/0);
  });
}

// The device step (train/device_step.h) on the CPU backend, where the device copies are the
// params' own vectors, against the host loop: accumulation, FedProx, clipping that bites, weight
// decay and dropout, over two epochs with a callback between them.
TEST(DeviceStep, MatchesTheHostLoopOnTheCpuBackend) {
  const TokenizedDataset train = MarkerTask(24, 5);
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 4;
  opts.grad_accumulation = 2;
  opts.lr = 2e-2f;
  opts.weight_decay = 0.05f;
  opts.grad_clip = 0.05f;  // below the norms of this task: every step clips
  opts.proximal_mu = 0.5f;
  opts.seed = 3;
  opts.progress = false;
  struct Run {
    std::vector<Param> params;
    OptimizerState state;
    std::vector<float> norms;
    std::vector<bool>
        held;  // DeviceParams::resident() during each step's report / each epoch's callback
    std::vector<bool> held_in_callback;
  };
  auto run = [&](bool on_device) {
    Run r;
    auto model = TinyModel(/*seed=*/11, /*dropout=*/0.1f);
    EXPECT_NE(model, nullptr);
    const std::vector<float> start = model->trainable_params()[0].value;
    TrainLoop loop = LoopOver(*model, train);
    EXPECT_FALSE(loop.step_on_device);  // a CPU model steps on the host unless asked
    loop.step_on_device = on_device;
    loop.on_step = [&](const StepReport& s) {
      r.norms.push_back(s.grad_norm);
      r.held.push_back(model->device_params().resident());
    };
    loop.after_epoch = [&](int, int64_t, double, double) {
      r.held_in_callback.push_back(model->device_params().resident());
      // The callback sees the trained values on the host.
      EXPECT_NE(model->trainable_params()[0].value, start);
      return absl::OkStatus();
    };
    std::unique_ptr<Optimizer> optimizer;
    EXPECT_TRUE(RunTrainLoop(opts, loop, &optimizer).ok());
    EXPECT_FALSE(model->device_params().resident());
    r.params = model->trainable_params();
    r.state = optimizer->ExportState();
    return r;
  };
  const Run host = run(false), device = run(true);
  EXPECT_EQ(host.held, std::vector<bool>(6, false));
  EXPECT_EQ(device.held, std::vector<bool>(6, true));
  EXPECT_EQ(device.held_in_callback, std::vector<bool>(2, false));
  ASSERT_EQ(device.norms.size(), host.norms.size());
  for (size_t i = 0; i < host.norms.size(); ++i) {
    EXPECT_GT(host.norms[i], opts.grad_clip);
    EXPECT_NEAR(device.norms[i], host.norms[i], 1e-4f * host.norms[i]) << "step " << i;
  }
  ASSERT_EQ(device.params.size(), host.params.size());
  for (size_t i = 0; i < host.params.size(); ++i) {
    float largest = 0.0f;
    for (float v : host.params[i].value) largest = std::max(largest, std::fabs(v));
    for (size_t j = 0; j < host.params[i].value.size(); ++j) {
      ASSERT_NEAR(device.params[i].value[j], host.params[i].value[j], 1e-4f * largest)
          << host.params[i].name << "[" << j << "]";
    }
  }
  EXPECT_EQ(device.state.optimizer, "adamw");
  EXPECT_EQ(device.state.step, host.state.step);
  ASSERT_EQ(device.state.tensors.size(), host.state.tensors.size());
  for (size_t i = 0; i < host.state.tensors.size(); ++i) {
    const OptimizerStateTensor &h = host.state.tensors[i], &d = device.state.tensors[i];
    ASSERT_EQ(d.name, h.name);
    ASSERT_EQ(d.shape, h.shape);
    float largest = 0.0f;
    for (float v : h.value) largest = std::max(largest, std::fabs(v));
    for (size_t j = 0; j < h.value.size(); ++j)
      ASSERT_NEAR(d.value[j], h.value[j], 1e-3f * largest) << h.name;
  }
}

// FFA-LoRA (LoraOptions::freeze_a): with weight decay, FedProx, clipping and dropout on, under
// each optimizer and on the device step, every lora_A keeps its bits and gets no gradient (the
// backward skips dA), no optimizer state is kept for it, and B, the head and the loss move.
TEST(Trainer, FrozenLoraAKeepsItsBitsWhileBAndTheHeadTrain) {
  const TokenizedDataset train = MarkerTask(24, 5);
  for (const char* optimizer : {"adamw", "adamw-device", "lamb", "sgd"}) {
    TrainOptions opts;
    opts.epochs = 2;
    opts.batch_size = 4;
    opts.lr = 2e-2f;
    opts.weight_decay = 0.05f;
    opts.proximal_mu = 0.5f;
    opts.seed = 3;
    opts.progress = false;
    opts.optimizer = std::string(optimizer).substr(0, 5) == "adamw" ? "adamw" : optimizer;
    auto model = TinyModel(/*seed=*/11, /*dropout=*/0.1f, Device::kCpu, /*freeze_a=*/true);
    ASSERT_NE(model, nullptr);
    const std::vector<Param> before = model->trainable_params();
    TrainLoop loop = LoopOver(*model, train);
    loop.step_on_device = std::string(optimizer) == "adamw-device";
    std::unique_ptr<Optimizer> opt;
    ASSERT_TRUE(RunTrainLoop(opts, loop, &opt).ok()) << optimizer;
    const std::vector<Param>& after = model->trainable_params();
    int frozen = 0;
    for (size_t i = 0; i < after.size(); ++i) {
      const bool is_a = after[i].name.find(".lora_A.") != std::string::npos;
      EXPECT_EQ(after[i].frozen, is_a) << after[i].name;
      if (is_a) {
        ++frozen;
        EXPECT_EQ(0, std::memcmp(after[i].value.data(), before[i].value.data(),
                                 before[i].value.size() * sizeof(float)))
            << optimizer << ": " << after[i].name << " moved";
        EXPECT_EQ(after[i].grad, std::vector<float>(after[i].grad.size(), 0.0f))
            << optimizer << ": " << after[i].name << " got a gradient";
      } else {
        EXPECT_NE(after[i].value, before[i].value) << optimizer << ": " << after[i].name;
      }
    }
    EXPECT_EQ(frozen, 4) << "two layers, query and value";
    for (const OptimizerStateTensor& t : opt->ExportState().tensors)
      EXPECT_EQ(t.name.find(".lora_A."), std::string::npos) << optimizer << ": " << t.name;
  }
}

// LearnsSeparableTask with every lora_A frozen: B and the head alone still find the marker, at a
// larger learning rate (at LearnsSeparableTask's 1e-2 the loss barely moves in 72 steps, where
// training A too reaches 0.17: a frozen random A passes B a small signal, which Adam's normalised
// steps grow slowly).
TEST(Trainer, FrozenLoraAStillLearnsSeparableTask) {
  const TokenizedDataset train = MarkerTask(96, 11), eval = MarkerTask(48, 12);
  auto model = TinyModel(/*seed=*/5, /*dropout=*/0.0f, Device::kCpu, /*freeze_a=*/true);
  ASSERT_NE(model, nullptr);
  TrainOptions opts;
  opts.epochs = 12;
  opts.batch_size = 16;
  opts.lr = 1e-1f;
  opts.warmup_steps = 6;
  opts.seed = 1;
  opts.progress = false;
  Trainer trainer(*model, opts);
  std::vector<EpochReport> epochs;
  trainer.on_epoch = [&](const EpochReport& r) { epochs.push_back(r); };
  ASSERT_TRUE(trainer.Train(train, &eval).ok());
  ASSERT_EQ(epochs.size(), 12u);
  // Measured: 0.704 -> 0.149, accuracy 0.917.
  EXPECT_LT(epochs.back().train_loss, 0.3 * epochs.front().train_loss);
  EXPECT_GE(epochs.back().eval.accuracy, 0.85);
}

// LAMB and SGD have no device step: asked for one, the loop steps on the host.
TEST(DeviceStep, OtherOptimizersStepOnTheHost) {
  const TokenizedDataset train = MarkerTask(8, 6);
  TrainOptions opts;
  opts.epochs = 1;
  opts.batch_size = 4;
  opts.optimizer = "lamb";
  opts.progress = false;
  auto model = TinyModel(2, 0.0f);
  ASSERT_NE(model, nullptr);
  TrainLoop loop = LoopOver(*model, train);
  loop.step_on_device = true;
  int steps = 0;
  loop.on_step = [&](const StepReport&) {
    EXPECT_FALSE(model->device_params().resident());
    ++steps;
  };
  std::unique_ptr<Optimizer> optimizer;
  ASSERT_TRUE(RunTrainLoop(opts, loop, &optimizer).ok());
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(optimizer->step_count(), 2);
}

// A non-finite norm on the device path fails the step and still hands the params back.
TEST(DeviceStep, ANonFiniteNormFailsAndReleasesTheParams) {
  const TokenizedDataset train = MarkerTask(8, 6);
  TrainOptions opts;
  opts.epochs = 1;
  opts.batch_size = 4;
  opts.progress = false;
  auto model = TinyModel(2, 0.0f);
  ASSERT_NE(model, nullptr);
  TrainLoop loop = LoopOver(*model, train);
  loop.step_on_device = true;
  auto forward_backward = loop.forward_backward;
  loop.forward_backward = [&](std::span<const int64_t> i, uint64_t seed) -> absl::StatusOr<float> {
    auto loss = forward_backward(i, seed);
    model->device_params().Grad(0)[0] = std::numeric_limits<float>::infinity();
    return loss;
  };
  std::unique_ptr<Optimizer> optimizer;
  const absl::Status s = RunTrainLoop(opts, loop, &optimizer);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("gradient norm became inf"));
  EXPECT_FALSE(model->device_params().resident());
}

}  // namespace
}  // namespace fedlora
