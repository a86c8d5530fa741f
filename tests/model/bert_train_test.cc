// Training-mode behaviour of BertClassifier: finite-difference gradients of the whole model,
// gradient accumulation, dropout determinism, padding invariance, input validation.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/bert.h"
#include "tests/model/tiny_checkpoint.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;
using testing_util::MakeTempDir;
using testing_util::TinyConfig;
using testing_util::WriteTinyCheckpoint;

ModelOptions AllTargets(float dropout) {
  ModelOptions o;
  o.num_labels = 3;
  o.lora.rank = 4;
  o.lora.alpha = 8.0f;
  o.lora.dropout = dropout;
  o.lora.target_modules = {"query", "key", "value", "attn_out", "intermediate", "output"};
  o.hidden_dropout = dropout;
  o.attention_dropout = dropout;
  o.max_batch = 2;
  o.max_seq = 8;
  o.seed = 3;
  return o;
}

std::unique_ptr<BertClassifier> TinyModel(const ModelOptions& o, bool roberta = false) {
  const std::string dir = MakeTempDir("bert_train");
  testing_util::TinyCheckpointOptions ckpt;
  if (roberta) {
    ckpt.prefix = "roberta.";
    ckpt.pooler = false;
  }
  EXPECT_TRUE(
      WriteTinyCheckpoint(dir, roberta ? testing_util::TinyRobertaConfig() : TinyConfig(), ckpt)
          .ok());
  auto model = BertClassifier::Load(dir, o);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  // PEFT initialises B to zero, which makes every A gradient zero; give B values so that the
  // test exercises both.
  int t = 0;
  for (Param& p : (*model)->trainable_params()) {
    ++t;
    if (p.name.find("lora_B") == std::string::npos) continue;
    for (size_t i = 0; i < p.value.size(); ++i) p.value[i] = 0.2f * std::sin(0.7f * i + t);
  }
  return std::move(*model);
}

BertClassifier::Batch Padded() {
  // Two sequences of 7 and 4 tokens padded to 7, with both token types.
  return BertClassifier::Batch{2,
                               7,
                               {2, 11, 12, 13, 14, 15, 3, 2, 21, 22, 3, 0, 0, 0},
                               {0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0},
                               {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0},
                               {2, 0}};
}

// Central differences on the fp32 loss, with dropout ON: the masks are a pure function of the
// seed, so the training loss is a smooth function of the parameters and its gradient must match,
// the dropout backward included. h = 1e-2 on parameters of magnitude ~0.1-1: truncation error
// ~h^2 |f'''| / 6 ~ 1e-6, while fp32 rounding of a loss ~1 (a few ulp, ~2e-7) divided by 2h
// gives ~1e-5 absolute; the measured worst case is 7e-6 absolute. We test each tensor's
// largest-gradient entry and two fixed ones against 2e-3 * max|grad| + 3e-5. Each tensor's
// largest gradient is >= 1.5e-3 (BERT) / 3e-4 (RoBERTa), so a sign error or a missing term
// exceeds the bound; bert_reference_test.py checks every entry against PyTorch at 1e-4 relative.
class FiniteDifferenceTest : public ::testing::TestWithParam<bool> {};

TEST_P(FiniteDifferenceTest, GradientsMatch) {
  const bool roberta = GetParam();
  auto model = TinyModel(AllTargets(/*dropout=*/0.1f), roberta);
  ASSERT_NE(model, nullptr);
  BertClassifier::Batch batch = Padded();
  if (roberta) {  // one token type; pad id 1 (real ids are >= 2)
    std::fill(batch.token_type_ids.begin(), batch.token_type_ids.end(), 0);
    for (size_t i = 0; i < batch.input_ids.size(); ++i) {
      if (batch.attention_mask[i] == 0) batch.input_ids[i] = 1;
    }
  }
  constexpr uint64_t kSeed = 11;
  model->ZeroGrad();
  ASSERT_TRUE(model->ForwardBackward(batch, kSeed).ok());
  std::vector<Param>& params = model->trainable_params();
  // 2 layers x 6 targets x {A, B}, then the head: classifier (BERT) or dense + out_proj (RoBERTa).
  ASSERT_EQ(params.size(), 2u * 6 * 2 + (roberta ? 4 : 2));
  std::vector<std::vector<float>> analytic;
  for (const Param& p : params) analytic.push_back(p.grad);
  constexpr float kH = 1e-2f;
  double worst = 0.0, smallest_max = 1e30;
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const std::vector<float>& g = analytic[pi];
    float max_abs = 0.0f;
    size_t arg = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (std::fabs(g[i]) > max_abs) max_abs = std::fabs(g[i]), arg = i;
    }
    ASSERT_GT(max_abs, 1e-5f) << params[pi].name << " has an all-zero gradient";
    smallest_max = std::min<double>(smallest_max, max_abs);
    for (size_t i : {arg, size_t{0}, g.size() / 2 + 1}) {
      float& v = params[pi].value[i];
      const float saved = v;
      v = saved + kH;
      auto plus = model->ForwardBackward(batch, kSeed);
      v = saved - kH;
      auto minus = model->ForwardBackward(batch, kSeed);
      v = saved;
      ASSERT_TRUE(plus.ok() && minus.ok());
      const double fd = (static_cast<double>(*plus) - *minus) / (2.0 * kH);
      const double err = std::fabs(fd - g[i]);
      worst = std::max(worst, err / max_abs);
      EXPECT_LE(err, 2e-3 * max_abs + 3e-5)
          << params[pi].name << "[" << i << "]: analytic " << g[i] << ", fd " << fd;
    }
  }
  std::printf(
      "largest finite-difference error: %.2e of the tensor's max |grad|; smallest max |grad| "
      "%.2e\n",
      worst, smallest_max);
}

INSTANTIATE_TEST_SUITE_P(BertAndRoberta, FiniteDifferenceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Roberta" : "Bert";
                         });

TEST(BertTrainTest, GradientsAccumulateAcrossCalls) {
  auto model = TinyModel(AllTargets(0.1f));
  ASSERT_NE(model, nullptr);
  model->ZeroGrad();
  auto l1 = model->ForwardBackward(Padded(), 5);
  ASSERT_TRUE(l1.ok());
  std::vector<std::vector<float>> once;
  for (const Param& p : model->trainable_params()) once.push_back(p.grad);
  auto l2 = model->ForwardBackward(Padded(), 5);
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(*l1, *l2);  // same seed, same masks, same arithmetic
  for (size_t i = 0; i < once.size(); ++i) {
    // The kernels accumulate inside the GEMM (beta = 1), which rounds once instead of twice, so
    // the sum equals 2g to fp32 rounding rather than bit for bit.
    for (size_t j = 0; j < once[i].size(); ++j) {
      ASSERT_NEAR(model->trainable_params()[i].grad[j], 2.0f * once[i][j],
                  1e-6f * (1.0f + std::fabs(once[i][j])));
    }
  }
  model->ZeroGrad();
  for (const Param& p : model->trainable_params()) {
    EXPECT_TRUE(std::all_of(p.grad.begin(), p.grad.end(), [](float g) { return g == 0.0f; }));
  }
}

TEST(BertTrainTest, DropoutDependsOnTheSeedAndEvalDoesNot) {
  auto model = TinyModel(AllTargets(0.1f));
  ASSERT_NE(model, nullptr);
  auto a = model->ForwardBackward(Padded(), 1);
  auto b = model->ForwardBackward(Padded(), 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  auto e1 = model->Logits(Padded());
  auto e2 = model->Logits(Padded());
  ASSERT_TRUE(e1.ok() && e2.ok());
  EXPECT_EQ(*e1, *e2);
  // Without dropout the training loss is the eval loss.
  auto plain = TinyModel(AllTargets(0.0f));
  auto loss = plain->ForwardBackward(Padded(), 1);
  auto logits = plain->Logits(Padded());
  ASSERT_TRUE(loss.ok() && logits.ok());
  double expected = 0.0;
  const std::vector<int32_t> labels = Padded().labels;
  for (int s = 0; s < 2; ++s) {
    const float* row = logits->data() + 3 * s;
    const double mx = *std::max_element(row, row + 3);
    double sum = 0.0;
    for (int c = 0; c < 3; ++c) sum += std::exp(row[c] - mx);
    expected += (mx + std::log(sum) - row[labels[s]]) / 2.0;
  }
  EXPECT_NEAR(*loss, expected, 1e-6);
}

TEST(BertTrainTest, PaddingDoesNotChangeTheResult) {
  auto model = TinyModel(AllTargets(0.0f));
  ASSERT_NE(model, nullptr);
  // Sequence 1 of Padded() alone, unpadded: its logits and pooled embedding must not change
  // (padding is masked out of attention and the mean).
  BertClassifier::Batch alone{1, 4, {2, 21, 22, 3}, {0, 0, 1, 1}, {}, {}};
  auto both = model->Logits(Padded());
  auto one = model->Logits(alone);
  ASSERT_TRUE(both.ok() && one.ok());
  for (int c = 0; c < 3; ++c) EXPECT_NEAR((*both)[3 + c], (*one)[c], 1e-5f);
  auto pooled_both = model->PooledEmbeddings(Padded(), Pooling::kMean);
  auto pooled_one = model->PooledEmbeddings(alone, Pooling::kMean);
  ASSERT_TRUE(pooled_both.ok() && pooled_one.ok());
  for (int c = 0; c < 32; ++c) EXPECT_NEAR((*pooled_both)[32 + c], (*pooled_one)[c], 1e-5f);
}

// Padded() starts every sequence with a token, so its padding is left out (packed rows, attention
// per sequence). A sequence that starts with padding makes the whole batch keep every position
// under the mask instead; both layouts must give the other sequences the same values, in the
// forward and in the gradients.
TEST(BertTrainTest, PackedAndMaskedLayoutsAgree) {
  ModelOptions o = AllTargets(0.0f);
  o.max_batch = 3;
  auto model = TinyModel(o);
  ASSERT_NE(model, nullptr);
  const BertClassifier::Batch packed = Padded();
  BertClassifier::Batch masked = packed;
  masked.batch_size = 3;
  for (int32_t id : {0, 0, 2, 31, 32, 33, 3}) masked.input_ids.push_back(id);
  for (int i = 0; i < 7; ++i) masked.token_type_ids.push_back(0);
  for (int32_t m : {0, 0, 1, 1, 1, 1, 1}) masked.attention_mask.push_back(m);
  masked.labels.push_back(1);
  auto lp = model->Logits(packed), lm = model->Logits(masked);
  ASSERT_TRUE(lp.ok() && lm.ok());
  for (int i = 0; i < 6; ++i) EXPECT_NEAR((*lm)[i], (*lp)[i], 1e-5f) << i;
  for (Pooling pooling : {Pooling::kMean, Pooling::kCls}) {
    auto pp = model->PooledEmbeddings(packed, pooling),
         pm = model->PooledEmbeddings(masked, pooling);
    ASSERT_TRUE(pp.ok() && pm.ok());
    for (int i = 0; i < 64; ++i) EXPECT_NEAR((*pm)[i], (*pp)[i], 1e-5f) << i;
  }
  // Gradients: the loss is the batch mean, so three times the masked batch's gradients less those
  // of its third sequence alone are twice the packed batch's.
  BertClassifier::Batch third{
      1, 7, {0, 0, 2, 31, 32, 33, 3}, {0, 0, 0, 0, 0, 0, 0}, {0, 0, 1, 1, 1, 1, 1}, {1}};
  auto grads = [&](const BertClassifier::Batch& b) {
    model->ZeroGrad();
    EXPECT_TRUE(model->ForwardBackward(b, 0).ok());
    std::vector<std::vector<float>> g;
    for (const Param& p : model->trainable_params()) g.push_back(p.grad);
    return g;
  };
  const auto gp = grads(packed), gm = grads(masked), g3 = grads(third);
  for (size_t t = 0; t < gp.size(); ++t) {
    for (size_t i = 0; i < gp[t].size(); ++i) {
      EXPECT_NEAR(3.0f * gm[t][i] - g3[t][i], 2.0f * gp[t][i], 1e-4f)
          << model->trainable_params()[t].name << i;
    }
  }
}

// Fused attention (kernels/fused_attention.h), on the CPU here as it runs by default on CUDA:
// the materialising attention's loss, gradients and logits, with dropout everywhere, for a packed
// batch, a masked one (a sequence starting with padding) and one without padding.
TEST(BertTrainTest, FusedAttentionGivesTheMaterialisingAttentionsResults) {
  ModelOptions o = AllTargets(0.1f);
  o.max_batch = 3;
  o.fused_attention = false;
  auto plain = TinyModel(o);
  o.fused_attention = true;
  auto fused = TinyModel(o);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(fused, nullptr);
  BertClassifier::Batch masked = Padded();
  masked.batch_size = 3;
  for (int32_t id : {0, 0, 2, 31, 32, 33, 3}) masked.input_ids.push_back(id);
  for (int i = 0; i < 7; ++i) masked.token_type_ids.push_back(0);
  for (int32_t m : {0, 0, 1, 1, 1, 1, 1}) masked.attention_mask.push_back(m);
  masked.labels.push_back(1);
  const BertClassifier::Batch full{
      2, 4, {2, 11, 12, 3, 2, 21, 22, 3}, {0, 0, 1, 1, 0, 1, 1, 1}, {}, {1, 2}};
  for (const BertClassifier::Batch& b : {Padded(), masked, full}) {
    plain->ZeroGrad();
    fused->ZeroGrad();
    auto lp = plain->ForwardBackward(b, 77), lf = fused->ForwardBackward(b, 77);
    ASSERT_TRUE(lp.ok() && lf.ok()) << lp.status() << lf.status();
    EXPECT_NEAR(*lf, *lp, 1e-5f * std::fabs(*lp)) << "batch of " << b.batch_size;
    for (size_t t = 0; t < plain->trainable_params().size(); ++t) {
      const Param &p = plain->trainable_params()[t], &f = fused->trainable_params()[t];
      float largest = 0.0f;
      for (float g : p.grad) largest = std::max(largest, std::fabs(g));
      for (size_t i = 0; i < p.grad.size(); ++i)
        ASSERT_NEAR(f.grad[i], p.grad[i], 1e-4f * largest) << p.name;
    }
    auto gp = plain->Logits(b), gf = fused->Logits(b);
    ASSERT_TRUE(gp.ok() && gf.ok());
    for (size_t i = 0; i < gp->size(); ++i) EXPECT_NEAR((*gf)[i], (*gp)[i], 1e-5f);
  }
}

TEST(BertTrainTest, TrainableParamsArePeftNamedAndInitialised) {
  ModelOptions o;
  o.max_batch = 1;
  o.max_seq = 4;
  auto model = BertClassifier::FromRandom(TinyConfig(), o);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<Param>& p = (*model)->trainable_params();
  ASSERT_EQ(p.size(), 2u * 2 * 2 + 2);  // 2 layers x {query, value} x {A, B} + classifier
  EXPECT_EQ(p[0].name, "base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight");
  EXPECT_EQ(p[1].name, "base_model.model.bert.encoder.layer.0.attention.self.query.lora_B.weight");
  EXPECT_EQ(p[2].name, "base_model.model.bert.encoder.layer.0.attention.self.value.lora_A.weight");
  EXPECT_EQ(p[7].name, "base_model.model.bert.encoder.layer.1.attention.self.value.lora_B.weight");
  EXPECT_EQ(p[8].name, "base_model.model.classifier.weight");
  EXPECT_EQ(p[9].name, "base_model.model.classifier.bias");
  EXPECT_EQ(p[0].shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(p[1].shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(p[8].shape, (std::vector<int64_t>{2, 32}));
  EXPECT_TRUE(p[0].is_lora && p[1].is_lora && !p[8].is_lora);
  // A ~ U(-1/sqrt(32), 1/sqrt(32)) (PEFT's kaiming_uniform(a=sqrt(5))), B = 0, classifier N(0,
  // 0.02).
  const float bound = 1.0f / std::sqrt(32.0f);
  float max_a = 0.0f;
  for (float v : p[0].value) max_a = std::max(max_a, std::fabs(v));
  EXPECT_LE(max_a, bound);
  EXPECT_GT(max_a, 0.8f * bound);  // 256 draws reach near the bound
  EXPECT_TRUE(std::all_of(p[1].value.begin(), p[1].value.end(), [](float v) { return v == 0.0f; }));
  double var = 0.0;
  for (float v : p[8].value) var += v * v;
  EXPECT_NEAR(std::sqrt(var / 64.0), 0.02, 0.008);  // 64 samples: standard error ~9%
  EXPECT_TRUE(std::all_of(p[9].value.begin(), p[9].value.end(), [](float v) { return v == 0.0f; }));
}

TEST(BertTrainTest, SgdStepsReduceTheLoss) {
  ModelOptions o = AllTargets(0.0f);
  o.lora.target_modules = {"query", "value"};
  auto model = TinyModel(o);
  ASSERT_NE(model, nullptr);
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < 30; ++step) {
    model->ZeroGrad();
    auto loss = model->ForwardBackward(Padded(), step);
    ASSERT_TRUE(loss.ok());
    if (step == 0) first = *loss;
    last = *loss;
    for (Param& p : model->trainable_params()) {
      for (size_t i = 0; i < p.value.size(); ++i) p.value[i] -= 0.5f * p.grad[i];
    }
  }
  EXPECT_LT(last, 0.5f * first);
}

// Softmax cross-entropy of one row, in double.
double RowCrossEntropy(const float* logits, int classes, int label) {
  double m = logits[0];
  for (int c = 1; c < classes; ++c) m = std::max<double>(m, logits[c]);
  double sum = 0.0;
  for (int c = 0; c < classes; ++c) sum += std::exp(logits[c] - m);
  return m + std::log(sum) - logits[label];
}

TEST(BertTrainTest, TrainingLogitOffsetsShiftOnlyTheTrainingLoss) {
  auto model = TinyModel(AllTargets(0.0f));  // no dropout: training logits equal Logits()
  ASSERT_NE(model, nullptr);
  const BertClassifier::Batch b = Padded();
  auto logits = model->Logits(b);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const std::vector<float> offsets = {-2.0f, 0.5f, 1.5f};
  ASSERT_TRUE(model->SetTrainingLogitOffsets(offsets).ok());

  // The loss is the cross-entropy of the logits plus the offsets.
  double expected = 0.0;
  for (int s = 0; s < 2; ++s) {
    float row[3];
    for (int c = 0; c < 3; ++c) row[c] = (*logits)[s * 3 + c] + offsets[c];
    expected += RowCrossEntropy(row, 3, b.labels[s]) / 2.0;
  }
  model->ZeroGrad();
  auto adjusted = model->ForwardBackward(b, 0);
  ASSERT_TRUE(adjusted.ok()) << adjusted.status();
  EXPECT_NEAR(*adjusted, expected, 1e-5);
  // The head bias gradient is the batch mean of softmax(logits + offsets) - onehot.
  const Param& bias = model->trainable_params().back();
  for (int c = 0; c < 3; ++c) {
    double g = 0.0;
    for (int s = 0; s < 2; ++s) {
      double m = -1e30, sum = 0.0, row[3];
      for (int k = 0; k < 3; ++k) m = std::max(m, row[k] = (*logits)[s * 3 + k] + offsets[k]);
      for (int k = 0; k < 3; ++k) sum += std::exp(row[k] - m);
      g += (std::exp(row[c] - m) / sum - (b.labels[s] == c ? 1.0 : 0.0)) / 2.0;
    }
    EXPECT_NEAR(bias.grad[c], g, 1e-5) << "class " << c;
  }
  // Evaluation never sees the offsets.
  auto eval = model->Logits(b);
  ASSERT_TRUE(eval.ok());
  EXPECT_EQ(*eval, *logits);

  // Clearing restores the plain loss.
  ASSERT_TRUE(model->SetTrainingLogitOffsets({}).ok());
  double plain = 0.0;
  for (int s = 0; s < 2; ++s)
    plain += RowCrossEntropy(logits->data() + s * 3, 3, b.labels[s]) / 2.0;
  auto cleared = model->ForwardBackward(b, 0);
  ASSERT_TRUE(cleared.ok());
  EXPECT_NEAR(*cleared, plain, 1e-5);
  EXPECT_GT(std::abs(*adjusted - *cleared), 0.1);

  // Wrong count or non-finite offsets are refused and leave the model unchanged.
  EXPECT_THAT(std::string(model->SetTrainingLogitOffsets({1.0f, 2.0f}).message()),
              HasSubstr("got 2 values for 3 classes"));
  EXPECT_THAT(std::string(model->SetTrainingLogitOffsets({0.0f, NAN, 0.0f}).message()),
              HasSubstr("class 1 is not finite"));
  auto again = model->ForwardBackward(b, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *cleared);
}

TEST(BertTrainTest, BadInputIsInvalidArgument) {
  auto model = TinyModel(AllTargets(0.0f));
  ASSERT_NE(model, nullptr);
  auto expect_invalid = [&](BertClassifier::Batch b, const char* needle) {
    auto r = model->ForwardBackward(b, 0);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(needle));
  };
  BertClassifier::Batch b = Padded();
  b.input_ids[3] = 100;
  expect_invalid(b, "input_ids[3] = 100");
  b = Padded();
  b.input_ids[0] = -1;
  expect_invalid(b, "input_ids[0] = -1");
  b = Padded();
  b.token_type_ids[1] = 2;
  expect_invalid(b, "token_type_ids[1]");
  b = Padded();
  b.labels[1] = 3;
  expect_invalid(b, "labels[1] = 3");
  b = Padded();
  b.labels = {0};
  expect_invalid(b, "labels has 1");
  b = Padded();
  b.attention_mask[2] = 2;
  expect_invalid(b, "attention_mask[2]");
  b = Padded();
  std::fill(b.attention_mask.begin() + 7, b.attention_mask.end(), 0);
  expect_invalid(b, "all padding");
  expect_invalid(BertClassifier::Batch{0, 7, {}, {}, {}, {}}, "empty batch");
  b = Padded();
  b.input_ids.pop_back();
  expect_invalid(b, "input_ids has 13");
  // Longer than planned (max_seq 8) and larger than planned (max_batch 2).
  expect_invalid(BertClassifier::Batch{1, 9, std::vector<int32_t>(9, 5), {}, {}, {0}},
                 "exceeds the planned");
  expect_invalid(BertClassifier::Batch{3, 2, std::vector<int32_t>(6, 5), {}, {}, {0, 0, 0}},
                 "exceeds the planned");
  EXPECT_EQ(model->Logits(BertClassifier::Batch{1, 2, {5}, {}, {}, {}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
