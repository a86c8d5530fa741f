// Classifiers sharing one read-only BertBase (issue #5: virtual clients share one copy of the base
// model): they compute exactly what classifiers with their own copy compute, hold the weights
// once, train independently, and run concurrently without interfering.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/base/context.h"
#include "kernels/threads.h"
#include "model/bert.h"
#include "tests/model/tiny_checkpoint.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;
using testing_util::MakeTempDir;
using testing_util::TinyCheckpointOptions;
using testing_util::TinyConfig;
using testing_util::WriteTinyCheckpoint;

ModelOptions Options() {
  ModelOptions o;
  o.num_labels = 3;
  o.lora.rank = 4;
  o.lora.alpha = 8.0f;
  o.lora.target_modules = {"query", "value", "intermediate"};
  o.max_batch = 2;
  o.max_seq = 8;
  o.seed = 11;
  return o;
}

// Two sequences of 7 and 4 tokens padded to 7, with both token types.
BertClassifier::Batch Padded() {
  return BertClassifier::Batch{2,
                               7,
                               {2, 11, 12, 13, 14, 15, 3, 2, 21, 22, 3, 0, 0, 0},
                               {0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0},
                               {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0},
                               {2, 0}};
}

BertClassifier::Batch Other() {
  // Two sequences of 5 and 3 tokens, one token type, different labels from Padded().
  return BertClassifier::Batch{
      2, 5, {2, 40, 41, 42, 3, 2, 50, 3, 0, 0}, {}, {1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {1, 1}};
}

// The bit patterns, so that "identical" means identical (== would equate 0.0f and -0.0f).
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

std::string Checkpoint(const BertConfig& config, const TinyCheckpointOptions& ckpt) {
  const std::string dir = MakeTempDir("bert_shared_base");
  EXPECT_FALSE(dir.empty());
  const absl::Status s = WriteTinyCheckpoint(dir, config, ckpt);
  EXPECT_TRUE(s.ok()) << s;
  return dir;
}

std::vector<float> LogitsOf(BertClassifier& model, const BertClassifier::Batch& batch) {
  auto logits = model.Logits(batch);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>{};
}

// One training step: ForwardBackward, then plain SGD (lr 0.5, large enough to move the logits
// visibly after one step) on every trainable param. Returns the loss.
float TrainStep(BertClassifier& model, const BertClassifier::Batch& batch, uint64_t seed) {
  model.ZeroGrad();
  auto loss = model.ForwardBackward(batch, seed);
  EXPECT_TRUE(loss.ok()) << loss.status();
  for (Param& p : model.trainable_params()) {
    for (size_t i = 0; i < p.value.size(); ++i) p.value[i] -= 0.5f * p.grad[i];
  }
  return loss.ok() ? *loss : 0.0f;
}

// Everything a step produces: the loss, every gradient and every updated value, bit for bit.
std::vector<uint32_t> StepFingerprint(BertClassifier& model, const BertClassifier::Batch& batch,
                                      uint64_t seed) {
  std::vector<uint32_t> out = Bits({TrainStep(model, batch, seed)});
  for (const Param& p : model.trainable_params()) {
    for (const std::vector<float>* v : {&p.grad, &p.value}) {
      const std::vector<uint32_t> b = Bits(*v);
      out.insert(out.end(), b.begin(), b.end());
    }
  }
  return out;
}

struct Variant {
  const char* name;
  bool roberta;
  bool pooler;
  bool bf16;
};

class SharedBaseEquivalenceTest : public ::testing::TestWithParam<Variant> {};

TEST_P(SharedBaseEquivalenceTest, SharedBaseMatchesOwnCopiesBitForBit) {
  const Variant v = GetParam();
  TinyCheckpointOptions ckpt;
  ckpt.pooler = v.pooler;
  if (v.roberta) ckpt.prefix = "roberta.";
  const std::string dir =
      Checkpoint(v.roberta ? testing_util::TinyRobertaConfig() : TinyConfig(), ckpt);
  ModelOptions o = Options();
  o.bf16_weights = v.bf16;
  o.hidden_dropout = 0.1f;  // dropout on, so that the training step exercises the seeded masks
  o.attention_dropout = 0.1f;

  auto base = BertBase::Load(dir, o);
  ASSERT_TRUE(base.ok()) << base.status();
  auto shared_a = BertClassifier::Create(*base, o);
  auto shared_b = BertClassifier::Create(*base, o);
  auto own_a = BertClassifier::Load(dir, o);
  auto own_b = BertClassifier::Load(dir, o);
  ASSERT_TRUE(shared_a.ok()) << shared_a.status();
  ASSERT_TRUE(shared_b.ok()) << shared_b.status();
  ASSERT_TRUE(own_a.ok()) << own_a.status();
  ASSERT_TRUE(own_b.ok()) << own_b.status();
  // Load builds its own base: a different copy holding the same values.
  EXPECT_NE((*own_a)->base().get(), (*own_b)->base().get());

  BertClassifier::Batch batch = Padded();
  if (v.roberta) batch.token_type_ids.clear();  // RoBERTa has a single token type
  for (BertClassifier* shared : {shared_a->get(), shared_b->get()}) {
    for (BertClassifier* own : {own_a->get(), own_b->get()}) {
      EXPECT_EQ(Bits(LogitsOf(*shared, batch)), Bits(LogitsOf(*own, batch)));
    }
  }
  // A training step (loss, gradients, updated values) and the logits after it agree too.
  EXPECT_EQ(StepFingerprint(**shared_a, batch, 7), StepFingerprint(**own_a, batch, 7));
  EXPECT_EQ(Bits(LogitsOf(**shared_a, Other())), Bits(LogitsOf(**own_a, Other())));
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, SharedBaseEquivalenceTest,
                         ::testing::Values(Variant{"Bert", false, true, false},
                                           Variant{"BertBf16", false, true, true},
                                           Variant{"BertWithoutPooler", false, false, false},
                                           Variant{"Roberta", true, false, false}),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return std::string(info.param.name);
                         });

// Known answer for TinyConfig (vocab 100, 64 positions, 2 token types, hidden 32, intermediate 64,
// 2 layers): the element counts of every frozen matrix and vector.
constexpr int64_t kH = 32, kI = 64;
constexpr int64_t kMatrixElems = 100 * kH + 64 * kH + 2 * kH              // embeddings
                                 + 2 * (4 * kH * kH + kI * kH + kH * kI)  // layer linears
                                 + kH * kH;                               // pooler
constexpr int64_t kVectorElems = 2 * kH                                   // embedding LayerNorm
                                 + 2 * (4 * kH + kI + kH + 4 * kH)        // biases, LayerNorms
                                 + kH;                                    // pooler bias

TEST(SharedBaseTest, ClassifiersHoldTheWeightsOnce) {
  const std::string dir = Checkpoint(TinyConfig(), {});
  for (bool bf16 : {false, true}) {
    ModelOptions o = Options();
    o.bf16_weights = bf16;
    auto base = BertBase::Load(dir, o);
    ASSERT_TRUE(base.ok()) << base.status();
    // Matrices at their storage type (4 or 2 bytes), vectors always fp32.
    EXPECT_EQ((*base)->weight_bytes(), kMatrixElems * (bf16 ? 2 : 4) + kVectorElems * 4);
    EXPECT_EQ((*base)->bf16_weights(), bf16);
    EXPECT_FALSE((*base)->weight_seed().has_value());  // every weight came from the file
    std::vector<std::unique_ptr<BertClassifier>> pool;
    for (int i = 0; i < 3; ++i) {
      auto m = BertClassifier::Create(*base, o);
      ASSERT_TRUE(m.ok()) << m.status();
      pool.push_back(std::move(*m));
    }
    for (const auto& m : pool) EXPECT_EQ(m->base().get(), base->get());
    EXPECT_EQ(base->use_count(), 4);  // ours and the pool's three: one copy of the weights
    // The base outlives the caller's handle while a classifier still uses it.
    const BertBase* raw = base->get();
    base->reset();
    EXPECT_EQ(pool[0]->base().get(), raw);
    EXPECT_TRUE(pool[0]->Logits(Padded()).ok());
  }
}

TEST(SharedBaseTest, TrainingOneClassifierLeavesTheOthersUnchanged) {
  const std::string dir = Checkpoint(TinyConfig(), {});
  const ModelOptions o = Options();
  auto base = BertBase::Load(dir, o);
  ASSERT_TRUE(base.ok()) << base.status();
  auto a = BertClassifier::Create(*base, o);
  auto b = BertClassifier::Create(*base, o);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<float> before = LogitsOf(**a, Padded());
  ASSERT_EQ(Bits(before), Bits(LogitsOf(**b, Padded())));  // same seed: the same adapter

  for (uint64_t step = 0; step < 3; ++step) TrainStep(**a, Padded(), step);

  const std::vector<float> trained = LogitsOf(**a, Padded());
  ASSERT_EQ(trained.size(), before.size());
  float moved = 0.0f;
  for (size_t i = 0; i < trained.size(); ++i) {
    moved = std::max(moved, std::abs(trained[i] - before[i]));
  }
  // Three SGD steps at lr 0.5 move the largest logit by 1.77 (measured); 1e-3 is far above fp32
  // rounding of logits ~1 (~1e-7) and far below the movement.
  EXPECT_GT(moved, 1e-3f);
  EXPECT_EQ(Bits(LogitsOf(**b, Padded())), Bits(before));
  // The base itself is untouched: a classifier created from it now computes what b did.
  auto fresh = BertClassifier::Create(*base, o);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(Bits(LogitsOf(**fresh, Padded())), Bits(before));
}

TEST(SharedBaseTest, ConcurrentTrainingMatchesSequential) {
  // As the simulator runs its pool: OpenBLAS single-threaded, classifiers on their own threads,
  // each on a kernel pool of its own whose width differs. Kernel results depend only on their
  // inputs, not on the width, so the runs must agree bit for bit with one-thread runs.
  const int threads_before = kernels::NumThreads();
  kernels::SetNumThreads(1);
  ThreadPool two(3), three(3);
  two.SetWidth(2);
  ModelOptions o = Options();
  o.lora.target_modules = {"query", "key", "value", "attn_out", "intermediate", "output"};
  o.lora.dropout = 0.1f;
  o.hidden_dropout = 0.1f;
  o.attention_dropout = 0.1f;
  auto base = BertBase::FromRandom(TinyConfig(), o);
  ASSERT_TRUE(base.ok()) << base.status();
  constexpr int kSteps = 4;
  auto run = [&](BertClassifier& model, const BertClassifier::Batch& batch,
                 std::vector<uint32_t>* out) {
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<uint32_t> f = StepFingerprint(model, batch, 100 + step);
      out->insert(out->end(), f.begin(), f.end());
    }
    const std::vector<uint32_t> l = Bits(LogitsOf(model, batch));
    out->insert(out->end(), l.begin(), l.end());
  };
  std::vector<std::unique_ptr<BertClassifier>> models;
  for (int i = 0; i < 4; ++i) {
    auto m = BertClassifier::Create(*base, o);
    ASSERT_TRUE(m.ok()) << m.status();
    models.push_back(std::move(*m));
  }
  models[2]->SetThreadPool(&two);
  models[3]->SetThreadPool(&three);
  std::vector<uint32_t> seq_a, seq_b, par_a, par_b;
  run(*models[0], Padded(), &seq_a);
  run(*models[1], Other(), &seq_b);
  std::thread ta([&] { run(*models[2], Padded(), &par_a); });
  std::thread tb([&] { run(*models[3], Other(), &par_b); });
  ta.join();
  tb.join();
  kernels::SetNumThreads(threads_before);
  ASSERT_FALSE(seq_a.empty());
  EXPECT_EQ(par_a, seq_a);
  EXPECT_EQ(par_b, seq_b);
  EXPECT_NE(seq_a, seq_b);  // different data: the comparison above is not vacuous
}

TEST(SharedBaseTest, RandomBaseRecordsItsSeed) {
  const ModelOptions o = Options();
  auto base = BertBase::FromRandom(TinyConfig(), o);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE((*base)->weight_seed().has_value());
  EXPECT_EQ(*(*base)->weight_seed(), o.seed);
  // FromRandom on the classifier is the same model as Create on a random base.
  auto own = BertClassifier::FromRandom(TinyConfig(), o);
  auto shared = BertClassifier::Create(*base, o);
  ASSERT_TRUE(own.ok() && shared.ok());
  EXPECT_EQ(Bits(LogitsOf(**own, Padded())), Bits(LogitsOf(**shared, Padded())));
}

TEST(SharedBaseTest, CreateRefusesOptionsThatDisagreeWithTheBase) {
  const std::string with_pooler = Checkpoint(TinyConfig(), {});
  TinyCheckpointOptions no_pooler_ckpt;
  no_pooler_ckpt.pooler = false;
  const std::string no_pooler = Checkpoint(TinyConfig(), no_pooler_ckpt);
  const ModelOptions o = Options();
  auto fp32 = BertBase::Load(with_pooler, o);
  ASSERT_TRUE(fp32.ok()) << fp32.status();

  auto expect_invalid = [](const absl::Status& s, const char* field) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
  };
  {
    ModelOptions bf16 = o;
    bf16.bf16_weights = true;
    expect_invalid(BertClassifier::Create(*fp32, bf16).status(), "bf16_weights");
    auto bf16_base = BertBase::Load(with_pooler, bf16);
    ASSERT_TRUE(bf16_base.ok());
    expect_invalid(BertClassifier::Create(*bf16_base, o).status(), "bf16_weights");
    ModelOptions math = bf16;
    math.bf16_math = true;
    expect_invalid(BertClassifier::Create(*bf16_base, math).status(), "bf16_math");
    auto math_base = BertBase::Load(with_pooler, math);
    ASSERT_TRUE(math_base.ok()) << math_base.status();
    EXPECT_TRUE((*math_base)->bf16_math());
    expect_invalid(BertClassifier::Create(*math_base, bf16).status(), "bf16_math");
    ModelOptions math_without_bf16 = o;
    math_without_bf16.bf16_math = true;
    expect_invalid(BertBase::Load(with_pooler, math_without_bf16).status(),
                   "bf16_math needs bf16_weights");
  }
  {
    // The pooler of this checkpoint was drawn from o.seed; another seed would be another model.
    auto seeded = BertBase::Load(no_pooler, o);
    ASSERT_TRUE(seeded.ok());
    ASSERT_TRUE((*seeded)->weight_seed().has_value());
    ModelOptions other_seed = o;
    other_seed.seed = o.seed + 1;
    expect_invalid(BertClassifier::Create(*seeded, other_seed).status(), "seed");
    auto random = BertBase::FromRandom(TinyConfig(), o);
    ASSERT_TRUE(random.ok());
    expect_invalid(BertClassifier::Create(*random, other_seed).status(), "seed");
    // With every weight from the file, the seed is the classifier's alone (LoRA A, head): any
    // seed is accepted and gives the same model as loading with that seed.
    auto reseeded = BertClassifier::Create(*fp32, other_seed);
    ASSERT_TRUE(reseeded.ok()) << reseeded.status();
    auto loaded = BertClassifier::Load(with_pooler, other_seed);
    ASSERT_TRUE(loaded.ok());
    EXPECT_EQ(Bits(LogitsOf(**reseeded, Padded())), Bits(LogitsOf(**loaded, Padded())));
  }
  {
    ModelOptions long_seq = o;
    long_seq.max_seq = 65;  // TinyConfig has 64 positions
    expect_invalid(BertClassifier::Create(*fp32, long_seq).status(), "max_seq");
    ModelOptions bad_target = o;
    bad_target.lora.target_modules = {"query", "nonsense"};
    expect_invalid(BertClassifier::Create(*fp32, bad_target).status(), "nonsense");
    expect_invalid(BertClassifier::Create(nullptr, o).status(), "null");
  }
}

}  // namespace
}  // namespace fedlora
