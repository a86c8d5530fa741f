// The built-in LoRA trainer (client/lora/lora_trainer.h) on a tiny random checkpoint (2 layers,
// hidden 32, written by tests/model/tiny_checkpoint.h) and a synthetic tokenized dataset:
// determinism, the subset overload, error paths, the site loader, and that training moves the
// adapter; and the same for a decoder site on a tiny random LLaMA (tests/model/tiny_decoder.h).
#include "client/lora/lora_trainer.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/model/tiny_checkpoint.h"
#include "tests/model/tiny_decoder.h"
#include "train/train_config.h"

namespace fedlora {
namespace {

constexpr int kExamples = 24;

class LoraTrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing_util::MakeTempDir("lora_trainer"));
    ASSERT_FALSE(dir_->empty());
    ASSERT_TRUE(testing_util::WriteTinyCheckpoint(*dir_, testing_util::TinyConfig()).ok());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // A fresh model: the same seed gives the same initial adapter every call.
  static std::unique_ptr<BertClassifier> NewModel() {
    ModelOptions o;
    o.num_labels = 2;
    o.seed = 3;
    o.max_batch = 8;
    o.max_seq = 16;
    auto model = BertClassifier::Load(*dir_, o);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  // Two separable classes: label 0 sentences draw tokens from [10, 30), label 1 from [50, 70);
  // lengths 4..11 tokens after [CLS] (id 2), then [SEP] (id 3). Ids stay below the vocab of 100.
  static TokenizedDataset Data() {
    TokenizedDataset d;
    d.num_labels = 2;
    d.label_names = {"a", "b"};
    for (int i = 0; i < kExamples; ++i) {
      TokenizedExample e;
      e.label = i % 2;
      e.input_ids.push_back(2);
      const int len = 4 + (i * 5) % 8;
      for (int j = 0; j < len; ++j)
        e.input_ids.push_back((e.label == 0 ? 10 : 50) + (i * 7 + j * 3) % 20);
      e.input_ids.push_back(3);
      e.token_type_ids.assign(e.input_ids.size(), 0);
      d.examples.push_back(std::move(e));
    }
    return d;
  }

  static std::vector<NamedTensor> Adapter(BertClassifier& model) {
    std::vector<NamedTensor> out;
    for (const Param& p : model.trainable_params()) out.push_back({p.name, p.shape, p.value});
    return out;
  }

  static TrainOptions BaseOptions() {
    v1::TrainingConfig t;
    t.set_batch_size(4);
    t.set_learning_rate(1e-2);  // large enough that 4 steps move every tensor visibly
    return TrainOptionsFromConfig(t, /*max_seq_len=*/16);
  }

  static TrainTask Task(uint64_t seed) {
    TrainTask task;
    task.round = 1;
    task.task_id = "t1";
    task.seed = seed;
    task.local_steps = 4;
    task.batch_size = 4;
    task.run_config_json = "{}";
    return task;
  }

  // A site over one owned model (the lease gives nothing back).
  static LoraTrainer::Site SiteOver(BertClassifier* model,
                                    std::shared_ptr<const TokenizedDataset> data) {
    LoraTrainer::Site site;
    // Borrowed: the test owns the classifier.
    auto lora = std::make_shared<ClassifierModel>(
        std::shared_ptr<BertClassifier>(model, [](BertClassifier*) {}));
    site.acquire_model = [lora] {
      return LoraTrainer::ModelLease(lora.get(), [lora](LoraModel*) {});
    };
    site.data = std::move(data);
    site.options = std::make_shared<const TrainOptions>(BaseOptions());
    return site;
  }

  static bool BitIdentical(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].name != b[i].name || a[i].shape != b[i].shape ||
          a[i].values.size() != b[i].values.size())
        return false;
      if (std::memcmp(a[i].values.data(), b[i].values.data(), a[i].values.size() * sizeof(float)) !=
          0)
        return false;
    }
    return true;
  }

  static std::string* dir_;
};

std::string* LoraTrainerTest::dir_ = nullptr;

TEST_F(LoraTrainerTest, SameSeedGivesBitIdenticalDelta) {
  auto data = std::make_shared<const TokenizedDataset>(Data());
  auto m1 = NewModel(), m2 = NewModel(), m3 = NewModel();
  ASSERT_NE(m1, nullptr);
  ASSERT_NE(m2, nullptr);
  ASSERT_NE(m3, nullptr);
  const std::vector<NamedTensor> global = Adapter(*m1);
  LoraTrainer t1(SiteOver(m1.get(), data)), t2(SiteOver(m2.get(), data)),
      t3(SiteOver(m3.get(), data));
  auto r1 = t1.Train(Task(7), global);
  auto r2 = t2.Train(Task(7), global);
  auto r3 = t3.Train(Task(8), global);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_TRUE(BitIdentical(r1->delta, r2->delta));
  EXPECT_EQ(r1->train_loss_first, r2->train_loss_first);
  EXPECT_EQ(r1->train_loss_last, r2->train_loss_last);
  // The seed matters (shuffling, dropout): another one gives another delta.
  EXPECT_FALSE(BitIdentical(r1->delta, r3->delta));

  // A model that already ran a task (as a pooled one in the simulator) gives the same delta again:
  // the result depends on the global adapter and the task, not on the model's history.
  auto again = t1.Train(Task(7), global);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(BitIdentical(r1->delta, again->delta));
}

TEST_F(LoraTrainerTest, SubsetOfEveryIndexEqualsWholeDataset) {
  const TokenizedDataset data = Data();
  auto whole_model = NewModel(), subset_model = NewModel();
  ASSERT_NE(whole_model, nullptr);
  ASSERT_NE(subset_model, nullptr);
  TrainOptions o = BaseOptions();
  o.epochs = 2;
  o.seed = 11;
  std::vector<int64_t> all(kExamples);
  for (int i = 0; i < kExamples; ++i) all[i] = i;
  auto whole = TrainLocally(*whole_model, data, o);
  auto subset = TrainLocally(*subset_model, data, all, o);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(subset.ok()) << subset.status();
  EXPECT_EQ(whole->num_examples, kExamples);
  EXPECT_EQ(subset->num_examples, kExamples);
  EXPECT_EQ(whole->steps, subset->steps);
  EXPECT_EQ(whole->steps, 2 * kExamples / 4);  // 2 epochs of 6 batches of 4
  EXPECT_EQ(whole->examples_processed, subset->examples_processed);
  EXPECT_EQ(whole->examples_processed, 2 * kExamples);
  EXPECT_EQ(whole->loss_first, subset->loss_first);
  EXPECT_EQ(whole->loss_last, subset->loss_last);
  EXPECT_EQ(whole->loss_mean, subset->loss_mean);
  EXPECT_TRUE(BitIdentical(Adapter(*whole_model), Adapter(*subset_model)));
}

TEST_F(LoraTrainerTest, MismatchedAdapterIsInvalidArgument) {
  auto data = std::make_shared<const TokenizedDataset>(Data());
  auto model = NewModel();
  ASSERT_NE(model, nullptr);
  const std::vector<NamedTensor> good = Adapter(*model);
  ASSERT_GE(good.size(), 2u);
  LoraTrainer trainer(SiteOver(model.get(), data));

  std::vector<NamedTensor> missing(good.begin() + 1, good.end());
  auto r = trainer.Train(Task(1), missing);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(good[0].name), std::string::npos) << r.status();

  std::vector<NamedTensor> wrong_shape = good;
  wrong_shape[0].values.pop_back();
  wrong_shape[0].shape.back() -= 1;
  r = trainer.Train(Task(1), wrong_shape);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("wrong shape"), std::string::npos) << r.status();

  std::vector<NamedTensor> extra = good;
  extra.push_back({"not.a.param.lora_A.weight", {1}, {0.0f}});
  r = trainer.Train(Task(1), extra);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(LoadAdapter(missing, *model).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(LoadAdapter(good, *model).ok());
}

TEST_F(LoraTrainerTest, EmptySubsetAndOutOfRangeIndexAreErrors) {
  const TokenizedDataset data = Data();
  auto model = NewModel();
  ASSERT_NE(model, nullptr);
  const TrainOptions o = BaseOptions();
  const std::vector<int64_t> none;
  EXPECT_EQ(TrainLocally(*model, data, none, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> past_end = {0, kExamples};
  auto r = TrainLocally(*model, data, past_end, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("24"), std::string::npos) << r.status();
  const std::vector<int64_t> negative = {-1};
  EXPECT_EQ(TrainLocally(*model, data, negative, o).status().code(), absl::StatusCode::kOutOfRange);

  // Through the trainer: a site with an empty subset fails every task.
  auto shared = std::make_shared<const TokenizedDataset>(Data());
  LoraTrainer::Site site = SiteOver(model.get(), shared);
  site.indices = std::vector<int64_t>{};
  LoraTrainer trainer(std::move(site));
  EXPECT_EQ(trainer.Train(Task(1), Adapter(*model)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(LoraTrainerTest, SiteLoaderRunsOnceAcrossTasks) {
  auto model = NewModel();
  ASSERT_NE(model, nullptr);
  const std::vector<NamedTensor> global = Adapter(*model);
  int loads = 0;
  uint64_t seen_seed = 0;
  BertClassifier* raw = model.get();
  LoraTrainer trainer([&](const v1::RunConfig& config) -> absl::StatusOr<LoraTrainer::Site> {
    ++loads;
    seen_seed = config.seed();
    LoraTrainer::Site site = SiteOver(raw, std::make_shared<const TokenizedDataset>(Data()));
    site.indices = std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7};
    return site;
  });
  TrainTask task = Task(5);
  // Unknown fields are ignored: a newer server may send more than this client knows.
  task.run_config_json = R"({"seed": "42", "a_future_field": 1})";
  auto r1 = trainer.Train(task, global);
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = trainer.Train(task, global);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(loads, 1);
  EXPECT_EQ(seen_seed, 42u);
  EXPECT_EQ(r1->num_examples, 8);  // the site's subset, not the whole dataset
  EXPECT_TRUE(BitIdentical(r1->delta, r2->delta));
}

TEST_F(LoraTrainerTest, ShuffledIndicesTrainOnExactlyThoseExamples) {
  // 10 of the 24 examples in a scrambled order: training through the indices must equal training
  // on those examples gathered by hand, in that order, and differ from another choice of 10.
  const TokenizedDataset data = Data();
  const std::vector<int64_t> picked = {17, 3, 22, 8, 0, 11, 5, 19, 14, 2};
  TokenizedDataset gathered;
  gathered.num_labels = data.num_labels;
  gathered.label_names = data.label_names;
  for (int64_t i : picked) gathered.examples.push_back(data.examples[static_cast<size_t>(i)]);
  TrainOptions o = BaseOptions();
  o.max_steps = 5;  // an epoch of 10 at batch 4 is 4 + 4 + 2, then 4 + 4 in the next
  o.seed = 9;
  auto via_indices = NewModel(), by_hand = NewModel(), other = NewModel();
  ASSERT_NE(via_indices, nullptr);
  ASSERT_NE(by_hand, nullptr);
  ASSERT_NE(other, nullptr);
  auto a = TrainLocally(*via_indices, data, picked, o);
  auto b = TrainLocally(*by_hand, gathered, o);
  std::vector<int64_t> first_ten(10);
  for (int i = 0; i < 10; ++i) first_ten[i] = i;
  auto c = TrainLocally(*other, data, first_ten, o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(a->num_examples, 10);
  EXPECT_EQ(a->steps, 5);
  EXPECT_EQ(a->examples_processed, 18);  // the short batch counts 2, not 4
  EXPECT_EQ(a->loss_mean, b->loss_mean);
  EXPECT_TRUE(BitIdentical(Adapter(*via_indices), Adapter(*by_hand)));
  EXPECT_FALSE(BitIdentical(Adapter(*via_indices), Adapter(*other)));
}

TEST(TaskTrainOptionsTest, TheTaskSetsItsWorkRateSeedAndProximalTerm) {
  TrainOptions base;
  base.lr = 1e-3f;
  base.batch_size = 8;
  base.epochs = 3;
  base.logit_adjustment = 1.0f;
  TrainTask task;
  task.seed = 42;
  task.local_steps = 6;
  task.batch_size = 4;
  task.learning_rate = 0.25;
  task.proximal_mu = 0.5;
  TrainOptions o = TaskTrainOptions(base, task);
  EXPECT_EQ(o.max_steps, 6);
  EXPECT_EQ(o.batch_size, 4);
  EXPECT_EQ(o.lr, 0.25f);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_EQ(o.proximal_mu, 0.5f);
  EXPECT_EQ(o.logit_adjustment, 1.0f);  // from the site's options (the run config)
  EXPECT_FALSE(o.progress);
  // Epoch mode, and a task without a rate or a proximal term keeps the site's rate and none.
  task.local_steps = 0;
  task.local_epochs = 2;
  task.learning_rate = 0;
  task.proximal_mu = 0;
  o = TaskTrainOptions(base, task);
  EXPECT_EQ(o.max_steps, 0);
  EXPECT_EQ(o.epochs, 2);
  EXPECT_EQ(o.lr, 1e-3f);
  EXPECT_EQ(o.proximal_mu, 0.0f);
}

TEST_F(LoraTrainerTest, BadRunConfigJsonIsInvalidArgumentAndLoaderNotCalled) {
  int loads = 0;
  LoraTrainer trainer([&](const v1::RunConfig&) -> absl::StatusOr<LoraTrainer::Site> {
    ++loads;
    return absl::InternalError("unreachable");
  });
  TrainTask task = Task(1);
  task.run_config_json = "{not json";
  EXPECT_EQ(trainer.Train(task, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(loads, 0);
}

TEST_F(LoraTrainerTest, TrainingChangesTheAdapterWithFiniteLosses) {
  auto data = std::make_shared<const TokenizedDataset>(Data());
  auto model = NewModel();
  ASSERT_NE(model, nullptr);
  const std::vector<NamedTensor> global = Adapter(*model);
  LoraTrainer trainer(SiteOver(model.get(), data));
  auto r = trainer.Train(Task(3), global);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_examples, kExamples);
  EXPECT_EQ(r->steps, 4);
  EXPECT_EQ(r->examples_processed, 16);  // 4 steps of 4 examples
  ASSERT_EQ(r->delta.size(), global.size());
  // Every trainable tensor (LoRA A and B, the classifier) gets a gradient, so each one moves.
  for (size_t i = 0; i < global.size(); ++i) {
    EXPECT_EQ(r->delta[i].name, global[i].name);
    EXPECT_EQ(r->delta[i].shape, global[i].shape);
    double max_abs = 0;
    for (float v : r->delta[i].values) {
      ASSERT_TRUE(std::isfinite(v)) << r->delta[i].name;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
    }
    EXPECT_GT(max_abs, 0.0) << r->delta[i].name;
  }
  // The delta is the model's adapter minus the global one.
  const std::vector<NamedTensor> local = Adapter(*model);
  for (size_t k = 0; k < local[0].values.size(); ++k) {
    EXPECT_EQ(r->delta[0].values[k], local[0].values[k] - global[0].values[k]);
  }
  for (double loss : {r->train_loss_first, r->train_loss_last, r->metrics.at("train_loss_mean")}) {
    EXPECT_TRUE(std::isfinite(loss));
    // Cross-entropy over 2 classes from a near-uniform random head: well above 0, near ln 2.
    EXPECT_GT(loss, 0.0);
    EXPECT_LT(loss, 5.0);
  }
}

// A decoder site (CAUSAL_LM): a random tiny LLaMA and hand-built conversations whose targets are
// the last tokens. The same task on the same global adapter gives the same delta, the subset is
// the gathered data, and training lowers the loss on what it trained on.
class DecoderLoraTrainerTest : public ::testing::Test {
 protected:
  static std::unique_ptr<CausalLm> NewLm() {
    const DecoderConfig c = testing_util::TinyDecoderConfig();
    DecoderOptions o;
    o.lora.rank = 2;
    o.max_batch = 4;
    o.max_seq = 16;
    o.seed = 5;
    auto base = DecoderBase::FromRandom(c, o);
    EXPECT_TRUE(base.ok()) << base.status();
    auto lm = CausalLm::Create(*base, o);
    EXPECT_TRUE(lm.ok()) << lm.status();
    return lm.ok() ? std::move(*lm) : nullptr;
  }

  // Prompts of 3-6 tokens, each answered by the two tokens (p0 + 1, p0 + 2).
  static LmDataset Data() {
    LmDataset d;
    for (int i = 0; i < 12; ++i) {
      LmExample e;
      const int len = 3 + i % 4;
      for (int j = 0; j < len; ++j) e.input_ids.push_back(4 + (i * 5 + j * 3) % 40);
      e.prompt_ids = e.input_ids;
      e.labels.assign(e.input_ids.size(), -100);
      for (int k = 1; k <= 2; ++k) {
        e.input_ids.push_back(e.input_ids[0] + k);
        e.labels.push_back(e.input_ids.back());
      }
      d.examples.push_back(std::move(e));
    }
    return d;
  }

  static LoraTrainer::Site SiteOver(CausalLm* lm, std::shared_ptr<const LmDataset> data) {
    LoraTrainer::Site site;
    // Borrowed: the test owns the decoder.
    auto lora = std::make_shared<CausalLmModel>(std::shared_ptr<CausalLm>(lm, [](CausalLm*) {}));
    site.acquire_model = [lora] {
      return LoraTrainer::ModelLease(lora.get(), [lora](LoraModel*) {});
    };
    site.data = std::move(data);
    v1::TrainingConfig t;
    t.set_batch_size(4);
    t.set_learning_rate(2e-2);
    site.options =
        std::make_shared<const TrainOptions>(TrainOptionsFromConfig(t, /*max_seq_len=*/16));
    return site;
  }
};

TEST_F(DecoderLoraTrainerTest, TrainsTheAdapterDeterministically) {
  auto a = NewLm(), b = NewLm();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<NamedTensor> global;
  for (const Param& p : a->trainable_params()) global.push_back({p.name, p.shape, p.value});
  auto data = std::make_shared<const LmDataset>(Data());
  LoraTrainer ta(SiteOver(a.get(), data)), tb(SiteOver(b.get(), data));
  TrainTask task;
  task.round = 1;
  task.seed = 11;
  task.local_steps = 6;
  task.run_config_json = "{}";
  auto ra = ta.Train(task, global);
  auto rb = tb.Train(task, global);
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(ra->num_examples, 12);
  EXPECT_EQ(ra->steps, 6);
  EXPECT_EQ(ra->examples_processed, 24);
  ASSERT_EQ(ra->delta.size(), global.size());
  bool moved = false;
  for (size_t i = 0; i < global.size(); ++i) {
    EXPECT_EQ(ra->delta[i].name, global[i].name);
    EXPECT_EQ(ra->delta[i].values, rb->delta[i].values) << global[i].name;  // bit-identical
    for (float v : ra->delta[i].values) moved |= v != 0.0f;
  }
  EXPECT_TRUE(moved);
  // Six steps at lr 2e-2 on twelve conversations learn their answers: the loss falls.
  EXPECT_LT(ra->train_loss_last, ra->train_loss_first);

  // The global adapter loads back: the next task starts from it, not from the trained weights.
  auto again = ta.Train(task, global);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->delta[0].values, ra->delta[0].values);
}

TEST_F(DecoderLoraTrainerTest, SubsetIsTheGatheredDataAndIndicesAreChecked) {
  auto via_indices = NewLm(), by_hand = NewLm();
  const LmDataset data = Data();
  const std::vector<int64_t> picked = {7, 2, 9, 4};
  LmDataset gathered;
  for (int64_t i : picked) gathered.examples.push_back(data.examples[static_cast<size_t>(i)]);
  TrainOptions o = *SiteOver(nullptr, nullptr).options;
  o.max_steps = 2;
  auto x = TrainLocally(*via_indices, data, picked, o);
  auto y = TrainLocally(*by_hand, gathered, o);
  ASSERT_TRUE(x.ok()) << x.status();
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(x->num_examples, 4);
  EXPECT_EQ(x->loss_mean, y->loss_mean);
  for (size_t i = 0; i < via_indices->trainable_params().size(); ++i) {
    EXPECT_EQ(via_indices->trainable_params()[i].value, by_hand->trainable_params()[i].value);
  }
  const std::vector<int64_t> none, past_end = {3, 12};
  EXPECT_TRUE(absl::IsInvalidArgument(TrainLocally(*via_indices, data, none, o).status()));
  EXPECT_TRUE(absl::IsOutOfRange(TrainLocally(*via_indices, data, past_end, o).status()));
  // A classifier's adapter does not load into a decoder.
  std::vector<NamedTensor> wrong = {{"classifier.weight", {2, 32}, std::vector<float>(64)}};
  EXPECT_TRUE(absl::IsInvalidArgument(LoadAdapter(wrong, *via_indices)));
}

}  // namespace
}  // namespace fedlora
