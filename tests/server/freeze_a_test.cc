// FFA-LoRA (lora.freeze_a) on the server: which tensors a run federates (config/federated_tensors.h),
// rounds aggregated over them (the global lora_A bit-identical round after round, the products
// B_k A aggregated exactly), an update carrying a lora_A refused at every door, and federations
// whose uploads hold only lora_B and the head: SDK clients in the clear, and raw clients under
// secure aggregation with distributed DP.
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "aggregation/fedavg.h"
#include "aggregation/server_optimizer.h"
#include "config/federated_tensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/round_aggregator.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"
#include "tests/server/secagg_test_client.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;
using testing::InitialAdapter;
using testing::SameBits;
using testing::TempDir;

constexpr char kA[] = "layer.0.query.lora_A.weight";
constexpr char kB[] = "layer.0.query.lora_B.weight";
constexpr char kHead[] = "classifier.weight";

v1::RunConfig Frozen(v1::RunConfig c) {
  c.mutable_lora()->set_freeze_a(true);
  return c;
}

const UpdateTensor& Named(const std::vector<UpdateTensor>& adapter, const std::string& name) {
  for (const UpdateTensor& t : adapter) {
    if (t.name == name) return t;
  }
  static const UpdateTensor kNone;
  ADD_FAILURE() << "no tensor " << name;
  return kNone;
}

bool SameBitsOf(const UpdateTensor& a, const UpdateTensor& b) {
  return a.shape == b.shape && a.values.size() == b.values.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0;
}

int64_t Elements(const std::vector<TensorSpec>& spec) {
  int64_t n = 0;
  for (const TensorSpec& t : spec) {
    int64_t e = 1;
    for (int64_t d : t.shape) e *= d;
    n += e;
  }
  return n;
}

std::string Body(const std::vector<UpdateTensor>& tensors) {
  absl::StatusOr<std::string> wire = EncodeUpdate(tensors, CodecOptions{});
  EXPECT_TRUE(wire.ok()) << wire.status();
  return wire.value_or("");
}

TEST(FederatedTensorsTest, FreezeALeavesOutEveryLoraAAndNothingElse) {
  EXPECT_TRUE(IsLoraA("base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight"));
  EXPECT_TRUE(IsLoraA("lora_A"));
  EXPECT_FALSE(IsLoraA("x.lora_B.weight"));
  EXPECT_FALSE(IsLoraA("x.my_lora_A.weight"));
  EXPECT_FALSE(IsLoraA("base_model.model.classifier.weight"));
  const v1::RunConfig plain;
  const v1::RunConfig frozen = Frozen(plain);
  const std::vector<TensorSpec> spec = SpecFromUpdate(InitialAdapter());
  EXPECT_EQ(FederatedTensors(spec, plain).size(), 3u);
  const std::vector<TensorSpec> federated = FederatedTensors(spec, frozen);
  ASSERT_EQ(federated.size(), 2u);
  EXPECT_EQ(federated[0].name, kHead);
  EXPECT_EQ(federated[1].name, kB);
  // 16x64 of A out of 2240 values: 1216 travel.
  EXPECT_EQ(Elements(federated), 64 * 16 + 3 * 64);
  EXPECT_TRUE(CheckFederated(InitialAdapter(), plain).ok());
  const absl::Status refused = CheckFederated(InitialAdapter(), frozen);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("update tensor '", kA,
                                                        "' is not federated in this run (lora."
                                                        "freeze_a keeps every lora_A")));
}

TEST(FederatedTensorsTest, ValidationTakesFreezeAAndRefusesItWithLoraProduct) {
  absl::StatusOr<v1::RunConfig> c = ParseRunConfigJson(
      R"({"model": {"path": "models/m"}, "task": {"labels": ["neg", "pos"]},
          "lora": {"freeze_a": true}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->lora().freeze_a());
  EXPECT_TRUE(ValidateRunConfig(*c).ok()) << ValidateRunConfig(*c);
  c->mutable_aggregation()->set_strategy(v1::AggregationConfig::LORA_PRODUCT);
  const absl::Status refused = ValidateRunConfig(*c);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("aggregation.strategy LORA_PRODUCT with lora.freeze_a"));
}

// One LoRA pair (A [2,3] drawn at random, B [4,2] at zero) and a head [2,4], sorted by name.
std::vector<UpdateTensor> PairAdapter() {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  std::vector<UpdateTensor> a = {{"head.weight", {2, 4}, std::vector<float>(8, 0.25f)},
                                 {"l.lora_A.weight", {2, 3}, {}},
                                 {"l.lora_B.weight", {4, 2}, std::vector<float>(8, 0.0f)}};
  for (int i = 0; i < 6; ++i) a[1].values.push_back(u(rng));
  return a;
}

// (B A)[i][j] in double: B [4,2], A [2,3].
std::vector<double> Product(const std::vector<float>& b, const std::vector<float>& a) {
  std::vector<double> p(12, 0.0);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int r = 0; r < 2; ++r) p[i * 3 + j] += double(b[i * 2 + r]) * double(a[r * 3 + j]);
    }
  }
  return p;
}

TEST(FrozenLoraARoundsTest, AStaysBitIdenticalAndTheProductsAggregateExactly) {
  // Five rounds of three sites, weighted 1, 3 and 4; each site's delta holds multiples of 2^-6, so
  // the weighted mean (multiples of 2^-9) is exact in fp32 and the products can be compared in
  // double: mean_k(B_k A) against (mean_k B_k) A.
  const v1::RunConfig config = Frozen(v1::RunConfig());
  std::vector<UpdateTensor> global = PairAdapter();
  const UpdateTensor initial_a = global[1];
  const std::vector<TensorSpec> spec = FederatedTensors(SpecFromUpdate(global), config);
  ASSERT_EQ(spec.size(), 2u);
  std::optional<ServerOptimizer> opt(ServerOptimizer::Create({}, spec).value());
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> k(-32, 32);
  const int64_t weights[] = {1, 3, 4};
  for (int round = 1; round <= 5; ++round) {
    RoundSnapshot s;
    s.round = round;
    s.spec = spec;
    s.spec_elements = Elements(spec);
    s.global = std::make_shared<const std::vector<UpdateTensor>>(global);
    s.optimizer = &*opt;
    s.weight_cap = 100;
    absl::StatusOr<RoundAggregator> agg = RoundAggregator::Begin(std::move(s));
    ASSERT_TRUE(agg.ok()) << agg.status();
    std::vector<std::vector<float>> site_b;  // each site's B after its local training
    for (int site = 0; site < 3; ++site) {
      std::vector<UpdateTensor> delta = {{"head.weight", {2, 4}, {}},
                                         {"l.lora_B.weight", {4, 2}, {}}};
      for (UpdateTensor& t : delta) {
        for (int i = 0; i < 8; ++i) t.values.push_back(static_cast<float>(k(rng)) / 64.0f);
      }
      site_b.push_back(global[2].values);
      for (int i = 0; i < 8; ++i) site_b.back()[i] += delta[1].values[i];
      ASSERT_TRUE(agg->Add(absl::StrCat("u", site), weights[site], Body(delta)).ok());
    }
    absl::StatusOr<RoundResult> r = agg->Finish();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->adapter.size(), 3u);
    EXPECT_TRUE(SameBitsOf(Named(r->adapter, "l.lora_A.weight"), initial_a)) << "round " << round;
    const std::vector<float>& b = Named(r->adapter, "l.lora_B.weight").values;
    std::vector<double> mean_of_products(12, 0.0);
    for (int site = 0; site < 3; ++site) {
      const std::vector<double> p = Product(site_b[site], initial_a.values);
      for (int e = 0; e < 12; ++e) mean_of_products[e] += double(weights[site]) * p[e] / 8.0;
    }
    for (int i = 0; i < 8; ++i) {
      const double mean_b = (site_b[0][i] * 1.0 + site_b[1][i] * 3.0 + site_b[2][i] * 4.0) / 8.0;
      EXPECT_EQ(b[i], static_cast<float>(mean_b)) << "round " << round << " B[" << i << "]";
    }
    const std::vector<double> product_of_mean = Product(b, initial_a.values);
    for (int e = 0; e < 12; ++e) {
      EXPECT_NEAR(product_of_mean[e], mean_of_products[e], 1e-15) << "round " << round;
    }
    opt.emplace(*r->optimizer);
    global = r->adapter;
  }
  EXPECT_NE(global[2].values, std::vector<float>(8, 0.0f)) << "B never moved";
}

TEST(FrozenLoraARoundsTest, AnAdaptiveStepTheTailAverageAndTheDownlinkLeaveAAlone) {
  // FedAdam's step, the last round's mean with two earlier adapters and an 8-bit downlink delta:
  // every one moves B and the head, none touches A, in the adapter or in what clients rebuild.
  const v1::RunConfig config = Frozen(v1::RunConfig());
  const std::vector<UpdateTensor> global = PairAdapter();
  const std::vector<TensorSpec> spec = FederatedTensors(SpecFromUpdate(global), config);
  ServerOptimizerOptions adam;
  adam.kind = ServerOptimizerKind::kAdam;
  adam.learning_rate = 0.01;
  const ServerOptimizer opt = ServerOptimizer::Create(adam, spec).value();
  RoundSnapshot s;
  s.round = 4;
  s.spec = spec;
  s.spec_elements = Elements(spec);
  s.global = std::make_shared<const std::vector<UpdateTensor>>(global);
  s.broadcast = s.global;
  s.optimizer = &opt;
  for (int t = 1; t <= 2; ++t) {
    s.tail.push_back({t, [global, t]() -> absl::StatusOr<std::vector<UpdateTensor>> {
                        std::vector<UpdateTensor> earlier = global;
                        for (float& v : earlier[2].values) v = 0.125f * static_cast<float>(t);
                        return earlier;
                      }});
  }
  CodecOptions quant;
  quant.codec = CodecId::kQuant;
  quant.quant_bits = 8;
  s.downlink = quant;
  absl::StatusOr<RoundAggregator> agg = RoundAggregator::Begin(std::move(s));
  ASSERT_TRUE(agg.ok()) << agg.status();
  ASSERT_TRUE(agg->Add("u", 1,
                       Body({{"head.weight", {2, 4}, std::vector<float>(8, 0.5f)},
                             {"l.lora_B.weight", {4, 2}, std::vector<float>(8, -0.25f)}}))
                  .ok());
  absl::StatusOr<RoundResult> r = agg->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(SameBitsOf(Named(r->adapter, "l.lora_A.weight"), global[1]));
  EXPECT_NE(Named(r->adapter, "l.lora_B.weight").values, global[2].values);
  EXPECT_NE(Named(r->adapter, "head.weight").values, global[0].values);
  ASSERT_TRUE(r->downlink.has_value());
  EXPECT_TRUE(SameBitsOf(Named(r->downlink->rebuilt, "l.lora_A.weight"), global[1]));
}

TEST(FrozenLoraARoundsTest, ARobustRuleTakesTheMedianOfBAndTheHead) {
  // MEDIAN over three sites: B and the head step by the coordinate median of their deltas; A,
  // which no update carries, stays.
  const v1::RunConfig config = Frozen(v1::RunConfig());
  const std::vector<UpdateTensor> global = PairAdapter();
  const std::vector<TensorSpec> spec = FederatedTensors(SpecFromUpdate(global), config);
  const ServerOptimizer opt = ServerOptimizer::Create({}, spec).value();
  RoundSnapshot s;
  s.spec = spec;
  s.spec_elements = Elements(spec);
  s.global = std::make_shared<const std::vector<UpdateTensor>>(global);
  s.optimizer = &opt;
  s.aggregation.set_strategy(v1::AggregationConfig::MEDIAN);
  absl::StatusOr<RoundAggregator> agg = RoundAggregator::Begin(std::move(s));
  ASSERT_TRUE(agg.ok()) << agg.status();
  for (float v : {0.5f, -1.0f, 100.0f}) {
    ASSERT_TRUE(agg->Add(absl::StrCat("u", v), 1,
                         Body({{"head.weight", {2, 4}, std::vector<float>(8, v)},
                               {"l.lora_B.weight", {4, 2}, std::vector<float>(8, -v)}}))
                    .ok());
  }
  absl::StatusOr<RoundResult> r = agg->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(SameBitsOf(Named(r->adapter, "l.lora_A.weight"), global[1]));
  EXPECT_EQ(Named(r->adapter, "head.weight").values, std::vector<float>(8, 0.25f + 0.5f));
  EXPECT_EQ(Named(r->adapter, "l.lora_B.weight").values, std::vector<float>(8, -0.5f));
}

TEST(FrozenLoraARoundsTest, AnUpdateCarryingLoraAIsRefused) {
  const v1::RunConfig config = Frozen(v1::RunConfig());
  const std::vector<UpdateTensor> global = PairAdapter();
  const std::vector<TensorSpec> spec = FederatedTensors(SpecFromUpdate(global), config);
  const ServerOptimizer opt = ServerOptimizer::Create({}, spec).value();
  RoundSnapshot s;
  s.spec = spec;
  s.spec_elements = Elements(spec);
  s.global = std::make_shared<const std::vector<UpdateTensor>>(global);
  s.optimizer = &opt;
  absl::StatusOr<RoundAggregator> agg = RoundAggregator::Begin(std::move(s));
  ASSERT_TRUE(agg.ok()) << agg.status();
  // The whole adapter's delta, as a trainer unaware of lora.freeze_a would send it: more values
  // than the federated tensors hold, refused as it decodes.
  EXPECT_EQ(agg->Add("u", 1, Body(global)).code(), absl::StatusCode::kInvalidArgument);
  // lora_A in place of lora_B, within the element count: refused by name.
  std::vector<UpdateTensor> swapped = {global[0], global[1]};
  EXPECT_LE(Elements(SpecFromUpdate(swapped)), Elements(spec));
  const absl::Status refused = agg->Add("v", 1, Body(swapped));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("update tensor 'l.lora_A.weight' is not one of the tensors this run "
                        "aggregates (with lora.freeze_a no lora_A is uploaded"));
  EXPECT_EQ(agg->num_updates(), 0);
}

// DeterministicTrainer's deltas for the tensors the run federates: what a trainer that knows
// lora.freeze_a uploads.
class FrozenATrainer : public ClientTrainer {
 public:
  explicit FrozenATrainer(int client) : client_(client) {}
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override {
    TrainResult r;
    for (NamedTensor& d : testing::DeltaFor(client_, task.round, global)) {
      if (!IsLoraA(d.name)) r.delta.push_back(std::move(d));
    }
    r.num_examples = testing::ExamplesOf(client_);
    r.steps = 1;
    return r;
  }

 private:
  int client_;
};

// Runs one SDK client per trainer until the run ends; their results in order.
std::vector<absl::StatusOr<RunSummary>> RunClients(const std::string& address,
                                                   const std::vector<ClientTrainer*>& trainers) {
  std::vector<absl::StatusOr<RunSummary>> results(trainers.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t c = 0; c < trainers.size(); ++c) {
    threads.emplace_back([&, c] {
      auto client = Client::Create(testing::TestClientOptions(address, absl::StrCat("site-", c)),
                                   trainers[c]);
      results[c] = client.ok() ? (*client)->RunUntilDone() : client.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// What the server must commit: FedAvg of the sites' deltas over the federated tensors (the mean
// and the step computed here with the aggregation library), lora_A left as it was.
std::vector<UpdateTensor> ExpectedFrozenA(const v1::RunConfig& config, int sites, int rounds) {
  std::vector<UpdateTensor> global = InitialAdapter();
  const std::vector<TensorSpec> spec = FederatedTensors(SpecFromUpdate(global), config);
  ServerOptimizer opt = ServerOptimizer::Create({}, spec).value();
  for (int r = 1; r <= rounds; ++r) {
    StreamingFedAvg avg = StreamingFedAvg::Create(spec).value();
    for (int c = 0; c < sites; ++c) {
      EXPECT_TRUE(
          avg.Add(FederatedTensors(testing::DeltaFor(c, r, global), config), testing::ExamplesOf(c))
              .ok());
    }
    std::vector<UpdateTensor> trained = FederatedTensors(global, config);
    EXPECT_TRUE(opt.Step(avg.Finish().value(), trained).ok());
    for (UpdateTensor& t : trained) {
      for (UpdateTensor& g : global) {
        if (g.name == t.name) g.values = t.values;
      }
    }
  }
  return global;
}

TEST(FrozenLoraAFederationTest, SdkClientsUploadOnlyBAndTheHeadAndAStaysAsItWas) {
  TempDir dir;
  const v1::RunConfig config = Frozen(testing::TestRunConfig(2, 3, 3));
  auto server = Server::Create(testing::TestServerOptions(dir.path()), config, InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  FrozenATrainer t0(0), t1(1), t2(2);
  const std::vector<absl::StatusOr<RunSummary>> results =
      RunClients((*server)->address(), {&t0, &t1, &t2});
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<UpdateTensor> global = (*server)->coordinator().global_adapter();
  EXPECT_TRUE(SameBitsOf(Named(global, kA), Named(InitialAdapter(), kA)));
  EXPECT_TRUE(SameBits(global, ExpectedFrozenA(config, 3, 2)));
  EXPECT_TRUE(SameBits(results[0]->final_adapter, global)) << "the clients hold A too";
  // Each upload: the 1216 values of B and the head, not the adapter's 2240.
  testing::RawClient admin((*server)->address(), "operator");
  const v1::GetStatusResponse status = admin.RunStatus();
  ASSERT_EQ(status.history_size(), 2);
  for (const v1::RoundSummary& r : status.history()) {
    EXPECT_EQ(r.update_fp32_bytes(), 3u * 4 * 1216);
    EXPECT_GT(r.upload_bytes(), r.update_fp32_bytes());
    EXPECT_LT(r.upload_bytes(), r.update_fp32_bytes() + 3 * 400);
  }
  (*server)->Shutdown();
}

TEST(FrozenLoraAFederationTest, AnUpdateCarryingLoraAIsRefusedAtTheClientAndAtTheServer) {
  TempDir dir;
  const v1::RunConfig config = Frozen(testing::TestRunConfig(1, 1, 1));
  auto server = Server::Create(testing::TestServerOptions(dir.path()), config, InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  // A trainer unaware of lora.freeze_a: the SDK refuses its delta before anything is uploaded,
  // and the site leaves with the reason.
  testing::DeterministicTrainer unaware(0);
  const std::vector<absl::StatusOr<RunSummary>> results =
      RunClients((*server)->address(), {&unaware});
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(results[0].status().message(),
              HasSubstr(absl::StrCat("update tensor '", kA, "' is not federated in this run")));
  // A raw client declaring lora_A in its manifest is refused by the server.
  testing::RawClient raw((*server)->address(), "raw");
  ASSERT_TRUE(raw.Join().ok());
  v1::TrainTask task;
  ASSERT_TRUE(raw.GetTask(&task));
  const std::string plain = Body(testing::DeltaFor(1, task.round(), InitialAdapter()));
  v1::UploadHeader header = raw.Header(task, plain, "u-raw");
  ASSERT_EQ(task.global_adapter().tensors(1).name(), kA);
  *header.mutable_manifest()->add_tensors() = task.global_adapter().tensors(1);
  v1::UploadAck ack;
  const grpc::Status s = raw.UploadAll(header, plain, &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("manifest tensor '", kA,
                                                        "' is not one of the tensors this run "
                                                        "aggregates (with lora.freeze_a")));
  EXPECT_EQ((*server)->coordinator().rounds_committed(), 0);
  (*server)->Shutdown();
}

TEST(FrozenLoraAFederationTest, SecureAggregationWithDistributedNoiseMasksOnlyBAndTheHead) {
  // Four sites mask their clipped, noised B and head (1216 values, not 2240); the server unmasks
  // the sum, releases it with the accountant's epsilon, and lora_A stays bit for bit as it was.
  constexpr double kClip = 0.1;
  TempDir dir;
  v1::RunConfig config = Frozen(testing::TestRunConfig(1, 4, 4));
  config.mutable_privacy()->set_secure_aggregation(true);
  config.mutable_aggregation()->clear_weight_by_examples();
  v1::DifferentialPrivacyConfig* dp = config.mutable_privacy()->mutable_dp();
  dp->set_enabled(true);
  dp->set_mode(v1::DifferentialPrivacyConfig::DISTRIBUTED);
  dp->set_clip_norm(kClip);
  dp->set_noise_multiplier(1.0);
  ApplyRunConfigDefaults(&config);
  ServerOptions options = testing::TestServerOptions(dir.path());
  options.round_deadline_ms = 6000;
  auto server = Server::Create(options, config, InitialAdapter(), nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::thread> sites;
  std::vector<v1::TrainTask> tasks(4);
  for (int k = 0; k < 4; ++k) {
    sites.emplace_back([&, k] {
      testing::RawClient c((*server)->address(), absl::StrCat("site-", k));
      ASSERT_TRUE(c.Join().ok());
      ASSERT_TRUE(c.GetTask(&tasks[k]));
      std::vector<NamedTensor> delta;
      for (const UpdateTensor& g : InitialAdapter()) {
        if (IsLoraA(g.name)) continue;
        NamedTensor d{g.name, g.shape, {}};
        for (size_t i = 0; i < g.values.size(); ++i)
          d.values.push_back(testing::DeltaValue(k, 1, g.name, static_cast<int64_t>(i)));
        delta.push_back(std::move(d));
      }
      testing::RunSecAggClient(c, tasks[k], delta, absl::StrCat("u", k));
    });
  }
  for (std::thread& t : sites) t.join();
  ASSERT_TRUE(
      testing::WaitFor([&] { return (*server)->coordinator().rounds_committed() == 1; }, 20'000));
  const v1::SecureAggregationTask& sa = tasks[0].secure_aggregation();
  EXPECT_EQ(sa.params().vector_length(), 1216u);
  EXPECT_GT(sa.noise_stddev(), 0.0);
  const std::vector<UpdateTensor> global = (*server)->coordinator().global_adapter();
  EXPECT_TRUE(SameBitsOf(Named(global, kA), Named(InitialAdapter(), kA)));
  EXPECT_NE(Named(global, kB).values, Named(InitialAdapter(), kB).values);
  EXPECT_NE(Named(global, kHead).values, Named(InitialAdapter(), kHead).values);
  testing::RawClient admin((*server)->address(), "operator");
  const v1::GetStatusResponse status = admin.RunStatus();
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).updates_accepted(), 4u);
  EXPECT_GT(status.history(0).dp_epsilon(), 0.0);
  // Four sealed masked updates of 1216 elements of ceil(m / 8) bytes each.
  const uint64_t element_bytes = (sa.params().modulus_bits() + 7) / 8;
  EXPECT_GT(status.history(0).upload_bytes(), 4 * 1216 * element_bytes);
  EXPECT_LT(status.history(0).upload_bytes(), 4 * (1216 * element_bytes + 200));
  (*server)->Shutdown();
}

}  // namespace
}  // namespace fedlora
