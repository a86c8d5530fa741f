// RoundAggregator alone: hand-built updates in, the round's result out, with no store, no lock and
// no coordinator. Expected values are computed here from the inputs (small binary fractions, so
// that the exact weighted mean is also the fp32 one).
#include "server/round_aggregator.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;

// Sorted by name, as the coordinator's spec is.
std::vector<TensorSpec> Spec() { return {{"a", {2}}, {"b", {1, 2}}}; }

std::vector<UpdateTensor> Tensors(std::vector<float> a, std::vector<float> b) {
  return {{"a", {2}, std::move(a)}, {"b", {1, 2}, std::move(b)}};
}

// An opened update body as a client encodes it (fp32, no compression).
std::string Body(const std::vector<UpdateTensor>& tensors) {
  absl::StatusOr<std::string> wire = EncodeUpdate(tensors, CodecOptions{});
  EXPECT_TRUE(wire.ok()) << wire.status();
  return wire.value_or("");
}

std::vector<UpdateTensor> Zeros() { return Tensors({0.0f, 0.0f}, {0.0f, 0.0f}); }

std::vector<float> Flat(const std::vector<UpdateTensor>& adapter) {
  std::vector<float> out;
  for (const UpdateTensor& t : adapter) out.insert(out.end(), t.values.begin(), t.values.end());
  return out;
}

class RoundAggregatorTest : public ::testing::Test {
 protected:
  RoundAggregatorTest() {
    // Plain FedAvg: the server step x += 1.0 * mean.
    opt_.emplace(ServerOptimizer::Create({}, Spec()).value());
  }

  RoundSnapshot Snapshot() {
    RoundSnapshot s;
    s.round = 3;
    s.spec = Spec();
    s.spec_elements = 4;
    s.global = std::make_shared<const std::vector<UpdateTensor>>(global_);
    s.optimizer = &*opt_;
    return s;
  }

  std::vector<UpdateTensor> global_ = Tensors({1.0f, -2.0f}, {0.5f, 0.0f});
  std::optional<ServerOptimizer> opt_;
};

TEST_F(RoundAggregatorTest, WeightedMeanOfTheUpdatesStepsTheGlobalAdapter) {
  RoundSnapshot s = Snapshot();
  s.weight_cap = 10;  // weigh by claimed examples, at most 10
  absl::StatusOr<RoundAggregator> a = RoundAggregator::Begin(std::move(s));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->needs_all_updates());
  const std::vector<float> u1 = {0.5f, 1.0f, -0.25f, 2.0f};
  const std::vector<float> u2 = {-1.5f, 0.0f, 0.75f, 1.0f};
  const std::vector<float> u3 = {0.25f, -0.5f, 0.5f, -1.0f};
  ASSERT_TRUE(a->Add("u1", 1, Body(Tensors({u1[0], u1[1]}, {u1[2], u1[3]}))).ok());
  ASSERT_TRUE(a->Add("u2", 3, Body(Tensors({u2[0], u2[1]}, {u2[2], u2[3]}))).ok());
  // Claims 100 examples: counted as the cap, 10.
  ASSERT_TRUE(a->Add("u3", 100, Body(Tensors({u3[0], u3[1]}, {u3[2], u3[3]}))).ok());
  EXPECT_EQ(a->num_updates(), 3);
  absl::StatusOr<RoundResult> r = a->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->updates, 3);
  const std::vector<float> g = Flat(global_);
  std::vector<float> want(4);
  for (size_t i = 0; i < 4; ++i) {
    const double mean = (1.0 * u1[i] + 3.0 * u2[i] + 10.0 * u3[i]) / 14.0;
    want[i] = static_cast<float>(static_cast<double>(g[i]) + static_cast<double>(float(mean)));
  }
  EXPECT_EQ(Flat(r->adapter), want);
  EXPECT_EQ(r->adapter[0].name, "a");
  EXPECT_EQ(r->adapter[1].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(r->downlink.has_value());
  EXPECT_FALSE(r->dp.has_value());
  ASSERT_TRUE(r->optimizer.has_value());
  // Finished: the aggregator takes nothing more.
  EXPECT_EQ(a->Add("u4", 1, Body(global_)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RoundAggregatorTest, WithoutAWeightCapEveryUpdateWeighsTheSame) {
  absl::StatusOr<RoundAggregator> a = RoundAggregator::Begin(Snapshot());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->Add("u1", 1, Body(Tensors({1.0f, 1.0f}, {1.0f, 1.0f}))).ok());
  ASSERT_TRUE(a->Add("u2", 7, Body(Tensors({0.0f, 2.0f}, {-1.0f, 0.5f}))).ok());
  absl::StatusOr<RoundResult> r = a->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  // (u1 + u2) / 2 added to global {1, -2, 0.5, 0}.
  EXPECT_EQ(Flat(r->adapter), (std::vector<float>{1.5f, -0.5f, 0.5f, 0.75f}));
}

TEST_F(RoundAggregatorTest, RefusedUpdatesLeaveTheAggregateUnchanged) {
  absl::StatusOr<RoundAggregator> a = RoundAggregator::Begin(Snapshot());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->Add("good", 1, Body(Tensors({2.0f, 4.0f}, {-2.0f, 1.0f}))).ok());
  // A tensor of another shape.
  std::vector<UpdateTensor> wrong_shape = Tensors({1.0f, 1.0f}, {1.0f, 1.0f});
  wrong_shape[1].shape = {2, 1};
  absl::Status s = a->Add("shape", 1, Body(wrong_shape));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'b' has shape [2,1]"));
  // A tensor the adapter does not have.
  std::vector<UpdateTensor> wrong_name = Tensors({1.0f, 1.0f}, {1.0f, 1.0f});
  wrong_name[1].name = "c";
  EXPECT_EQ(a->Add("name", 1, Body(wrong_name)).code(), absl::StatusCode::kInvalidArgument);
  // Not an encoded update at all.
  EXPECT_FALSE(a->Add("junk", 1, "not an update").ok());
  // A value out of the exact accumulator's range (|w x| >= 2^43): refused by the strategy, and
  // named by its upload id.
  s = a->Add("huge", 1, Body(Tensors({1e14f, 0.0f}, {0.0f, 0.0f})));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("update huge"));
  EXPECT_EQ(a->num_updates(), 1);
  absl::StatusOr<RoundResult> r = a->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->updates, 1);
  // Only "good" counted: global + good.
  EXPECT_EQ(Flat(r->adapter), (std::vector<float>{3.0f, 2.0f, -1.5f, 1.0f}));
}

TEST_F(RoundAggregatorTest, NothingAddedIsAnError) {
  absl::StatusOr<RoundAggregator> a = RoundAggregator::Begin(Snapshot());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RoundAggregatorTest, UpdatesAreClippedToTheMaxNorm) {
  RoundSnapshot s = Snapshot();
  s.max_update_norm = 1.0;
  absl::StatusOr<RoundAggregator> a = RoundAggregator::Begin(std::move(s));
  ASSERT_TRUE(a.ok()) << a.status();
  // Norm 5: scaled by 1/5. Norm 0.5: within the bound, unchanged.
  ASSERT_TRUE(a->Add("big", 1, Body(Tensors({3.0f, 0.0f}, {0.0f, 4.0f}))).ok());
  ASSERT_TRUE(a->Add("small", 1, Body(Tensors({0.0f, 0.5f}, {0.0f, 0.0f}))).ok());
  absl::StatusOr<RoundResult> r = a->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<float> got = Flat(r->adapter);
  const std::vector<double> want = {1.0 + 0.6 / 2, -2.0 + 0.5 / 2, 0.5, 0.8 / 2};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
}

TEST_F(RoundAggregatorTest, TheOrderOfTheUpdatesDoesNotChangeABit) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::vector<UpdateTensor>> updates;
  for (int i = 0; i < 6; ++i) {
    updates.push_back(Tensors({value(gen), value(gen) * 1e-4f}, {value(gen) * 1e3f, value(gen)}));
  }
  auto run = [&](bool reversed) {
    RoundSnapshot s = Snapshot();
    s.weight_cap = 1000;
    RoundAggregator a = RoundAggregator::Begin(std::move(s)).value();
    for (int k = 0; k < 6; ++k) {
      const int i = reversed ? 5 - k : k;
      EXPECT_TRUE(a.Add(absl::StrCat("u", i), 1 + 17 * i, Body(updates[i])).ok());
    }
    return Flat(a.Finish().value().adapter);
  };
  EXPECT_EQ(run(false), run(true));
}

TEST_F(RoundAggregatorTest, AMaskedRoundTakesTheUnmaskedMean) {
  RoundSnapshot s = Snapshot();
  s.masked = true;
  absl::StatusOr<RoundAggregator> a = RoundAggregator::Begin(std::move(s));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->Add("u1", 1, Body(global_)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<RoundResult> r =
      a->FinishUnmasked(Tensors({0.25f, 0.25f}, {-0.5f, 1.0f}), /*n=*/4, /*cohort=*/5);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->updates, 4);
  EXPECT_EQ(Flat(r->adapter), (std::vector<float>{1.25f, -1.75f, 0.0f, 1.0f}));
}

TEST_F(RoundAggregatorTest, TheLastRoundAveragesWithTheTailAdapters) {
  RoundSnapshot s = Snapshot();
  int loads = 0;
  s.tail = {{1,
             [&]() -> absl::StatusOr<std::vector<UpdateTensor>> {
               ++loads;
               return Tensors({0.0f, 0.0f}, {0.0f, 0.0f});
             }},
            {2, [&]() -> absl::StatusOr<std::vector<UpdateTensor>> {
               ++loads;
               return Tensors({2.0f, -1.0f}, {1.0f, 3.0f});
             }}};
  RoundAggregator a = RoundAggregator::Begin(std::move(s)).value();
  ASSERT_TRUE(a.Add("u1", 1, Body(Tensors({2.0f, -1.0f}, {0.5f, 0.0f}))).ok());
  absl::StatusOr<RoundResult> r = a.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(loads, 2);
  // The round's adapter is global + u1 = {3, -3, 1, 0}; the mean with the two tail adapters.
  EXPECT_EQ(Flat(r->adapter), (std::vector<float>{5.0f / 3, -4.0f / 3, 2.0f / 3, 1.0f}));
}

TEST_F(RoundAggregatorTest, ALostTailAdapterFailsTheRound) {
  RoundSnapshot s = Snapshot();
  s.tail = {{1, []() -> absl::StatusOr<std::vector<UpdateTensor>> {
               return absl::DataLossError("blob gone");
             }}};
  RoundAggregator a = RoundAggregator::Begin(std::move(s)).value();
  ASSERT_TRUE(a.Add("u1", 1, Body(global_)).ok());
  EXPECT_EQ(a.Finish().status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(RoundAggregatorTest, TheDownlinkDeltaLeadsFromTheBroadcastAdapter) {
  RoundSnapshot s = Snapshot();
  const std::vector<UpdateTensor> broadcast = Tensors({1.0f, -2.0f}, {0.25f, 0.0f});
  s.broadcast = std::make_shared<const std::vector<UpdateTensor>>(broadcast);
  s.downlink = CodecOptions{};  // fp32: the delta is exact for these values
  RoundAggregator a = RoundAggregator::Begin(std::move(s)).value();
  ASSERT_TRUE(a.Add("u1", 1, Body(Tensors({0.5f, 0.5f}, {0.5f, 0.5f}))).ok());
  absl::StatusOr<RoundResult> r = a.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->downlink.has_value());
  EXPECT_FALSE(r->downlink->blob.empty());
  EXPECT_EQ(Flat(r->adapter), (std::vector<float>{1.5f, -1.5f, 1.0f, 0.5f}));
  EXPECT_EQ(Flat(r->downlink->rebuilt), Flat(r->adapter));
  // The blob is the delta from the broadcast adapter: applied to it, it gives the new adapter.
  std::vector<UpdateTensor> applied = broadcast;
  ASSERT_TRUE(ApplyDownlinkDelta(applied, r->downlink->blob, DecodeLimits{}).ok());
  EXPECT_EQ(Flat(applied), Flat(r->adapter));
}

TEST_F(RoundAggregatorTest, ASnapshotWithoutItsAdapterIsRefused) {
  RoundSnapshot s = Snapshot();
  s.global = nullptr;
  EXPECT_EQ(RoundAggregator::Begin(std::move(s)).status().code(),
            absl::StatusCode::kInvalidArgument);
  s = Snapshot();
  s.downlink = CodecOptions{};  // without the broadcast adapter
  EXPECT_EQ(RoundAggregator::Begin(std::move(s)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MakeUpdateAggregatorTest, FedAvgFamilyStreamsAndRobustStrategiesHoldEveryUpdate) {
  for (auto strategy : {v1::AggregationConfig::FEDAVG, v1::AggregationConfig::FEDPROX,
                        v1::AggregationConfig::FEDADAM, v1::AggregationConfig::FEDYOGI,
                        v1::AggregationConfig::FEDADAGRAD}) {
    v1::AggregationConfig config;
    config.set_strategy(strategy);
    absl::StatusOr<std::unique_ptr<UpdateAggregator>> a =
        MakeUpdateAggregator(config, Spec(), Zeros(), Device::kCpu);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->name(), "fedavg");
    EXPECT_FALSE((*a)->needs_all_updates());
  }
  const std::vector<std::pair<v1::AggregationConfig::Strategy, std::string>> robust = {
      {v1::AggregationConfig::MEDIAN, "median"},
      {v1::AggregationConfig::TRIMMED_MEAN, "trimmed_mean"},
      {v1::AggregationConfig::KRUM, "krum"},
      {v1::AggregationConfig::MULTI_KRUM, "multi_krum"},
      {v1::AggregationConfig::BULYAN, "bulyan"}};
  for (const auto& [strategy, name] : robust) {
    v1::AggregationConfig config;
    config.set_strategy(strategy);
    config.set_trim_fraction(0.2);
    config.set_krum_byzantine_clients(1);
    absl::StatusOr<std::unique_ptr<UpdateAggregator>> a =
        MakeUpdateAggregator(config, Spec(), Zeros(), Device::kCpu);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->name(), name);
    EXPECT_TRUE((*a)->needs_all_updates());
    // Their statistic takes the mean's place in the plain server step.
    absl::StatusOr<ServerOptimizerOptions> o = ServerOptimizerOptionsFromConfig(config);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->kind, ServerOptimizerKind::kSgd);
    EXPECT_EQ(o->learning_rate, 1.0);
  }
  v1::AggregationConfig product;
  product.set_strategy(v1::AggregationConfig::LORA_PRODUCT);
  const std::vector<UpdateTensor> pair = {{"m.lora_A.weight", {1, 2}, {1.0f, 0.0f}},
                                          {"m.lora_B.weight", {2, 1}, {0.0f, 0.0f}}};
  absl::StatusOr<std::unique_ptr<UpdateAggregator>> p =
      MakeUpdateAggregator(product, SpecFromUpdate(pair), pair, Device::kCpu);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->name(), "lora_product");
  EXPECT_TRUE((*p)->needs_all_updates());
  EXPECT_EQ(ServerOptimizerOptionsFromConfig(product)->learning_rate, 1.0);
  // An adapter without a lora_A / lora_B pair has no product to aggregate.
  EXPECT_EQ(MakeUpdateAggregator(product, Spec(), Zeros(), Device::kCpu).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A Krum without its f is refused by the rule itself, whatever validated the config.
  v1::AggregationConfig krum;
  krum.set_strategy(v1::AggregationConfig::KRUM);
  EXPECT_EQ(MakeUpdateAggregator(krum, Spec(), Zeros(), Device::kCpu).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RoundAggregatorTest, MedianRoundStepsWithTheCoordinateMedian) {
  RoundSnapshot s = Snapshot();
  s.aggregation.set_strategy(v1::AggregationConfig::MEDIAN);
  RoundAggregator a = RoundAggregator::Begin(std::move(s)).value();
  EXPECT_TRUE(a.needs_all_updates());
  ASSERT_TRUE(a.Add("u1", 7, Body(Tensors({1.0f, 0.5f}, {-1.0f, 0.0f}))).ok());
  ASSERT_TRUE(a.Add("u2", 1, Body(Tensors({100.0f, 0.25f}, {-3.0f, 8.0f}))).ok());
  ASSERT_TRUE(a.Add("u3", 9, Body(Tensors({2.0f, -4.0f}, {-2.0f, 1.0f}))).ok());
  absl::StatusOr<RoundResult> r = a.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->updates, 3);
  // The global adapter (1, -2, 0.5, 0) plus the coordinate medians (2, 0.25, -2, 1); the claimed
  // example counts do not weigh.
  EXPECT_EQ(Flat(r->adapter), (std::vector<float>{3.0f, -1.75f, -1.5f, 1.0f}));
}

// LORA_PRODUCT on one pair (A [1, 2], B [2, 1]), by hand. Client 1 ends at A = [1 0],
// B = [1; 0] (product diag(1, 0)), client 2 at A = [0 1], B = [0; 1] (diag(0, 1)); weighted 3 : 1
// the mean product is diag(0.75, 0.25), whose best rank-1 factors are A' = [1 0], B' = [0.75; 0].
// Averaging A and B apart would give [0.75 0.25] and [0.75; 0.25], whose product is not diagonal.
TEST(LoraProductRound, TheGlobalPairBecomesTheRankRFactorsOfTheMeanProduct) {
  const std::vector<UpdateTensor> global = {{"m.lora_A.weight", {1, 2}, {1.0f, 0.0f}},
                                            {"m.lora_B.weight", {2, 1}, {0.0f, 0.0f}}};
  ServerOptimizer opt = ServerOptimizer::Create({}, SpecFromUpdate(global)).value();
  RoundSnapshot s;
  s.round = 1;
  s.spec = SpecFromUpdate(global);
  s.spec_elements = 4;
  s.global = std::make_shared<const std::vector<UpdateTensor>>(global);
  s.optimizer = &opt;
  s.weight_cap = 10;
  s.aggregation.set_strategy(v1::AggregationConfig::LORA_PRODUCT);
  RoundAggregator a = RoundAggregator::Begin(std::move(s)).value();
  EXPECT_TRUE(a.needs_all_updates());
  auto update = [](std::vector<float> da, std::vector<float> db) {
    return Body(
        {{"m.lora_A.weight", {1, 2}, std::move(da)}, {"m.lora_B.weight", {2, 1}, std::move(db)}});
  };
  ASSERT_TRUE(a.Add("u1", 3, update({0.0f, 0.0f}, {1.0f, 0.0f})).ok());
  ASSERT_TRUE(a.Add("u2", 1, update({-1.0f, 1.0f}, {0.0f, 1.0f})).ok());
  absl::StatusOr<RoundResult> r = a.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->adapter.size(), 2u);
  EXPECT_THAT(r->adapter[0].values, ElementsAre(FloatNear(1.0f, 1e-6f), FloatNear(0.0f, 1e-6f)));
  EXPECT_THAT(r->adapter[1].values, ElementsAre(FloatNear(0.75f, 1e-6f), FloatNear(0.0f, 1e-6f)));
}

TEST_F(RoundAggregatorTest, RobustRoundsTakeCompressedUpdatesAsTheyDecode) {
  // fp16 values (exact for these): the median sees each update as it decodes, as in
  // MedianRoundStepsWithTheCoordinateMedian. (A sparsified update's zeros:
  // RobustTest.SparseUpdatesAreTheirKeptEntriesInZeros; this adapter is too small for top-k's
  // index overhead to fit the server's size limit.)
  CodecOptions codec;
  codec.codec = CodecId::kF16;
  auto body = [&](std::vector<float> a, std::vector<float> b) {
    absl::StatusOr<std::string> wire = EncodeUpdate(Tensors(std::move(a), std::move(b)), codec);
    EXPECT_TRUE(wire.ok()) << wire.status();
    return wire.value_or("");
  };
  RoundSnapshot s = Snapshot();
  s.aggregation.set_strategy(v1::AggregationConfig::MEDIAN);
  RoundAggregator a = RoundAggregator::Begin(std::move(s)).value();
  ASSERT_TRUE(a.Add("u1", 1, body({1.0f, 0.5f}, {-1.0f, 0.0f})).ok());
  ASSERT_TRUE(a.Add("u2", 1, body({100.0f, 0.25f}, {-3.0f, 8.0f})).ok());
  ASSERT_TRUE(a.Add("u3", 1, body({2.0f, -4.0f}, {-2.0f, 1.0f})).ok());
  absl::StatusOr<RoundResult> r = a.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Flat(r->adapter), (std::vector<float>{3.0f, -1.75f, -1.5f, 1.0f}));
}

}  // namespace
}  // namespace fedlora
