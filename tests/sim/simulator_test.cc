// A small simulation end to end: a tiny random BERT checkpoint, a vocabulary and JSONL data written
// into a temp dir, 4 virtual clients talking to the real server over loopback gRPC, 2 rounds. And a
// CAUSAL_LM federation of the real 4-bit SmolLM2 (fetched by scripts/setup.sh) on two sites.
#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compression/error_feedback.h"
#include "config/config_io.h"
#include "core/file.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "model/bert.h"
#include "tests/model/tiny_classifier_run.h"
#include "train/train_config.h"

namespace fedlora::sim {
namespace {

// Writes the model dir (config.json, model.safetensors, vocab.txt) and train/eval JSONL files with
// three labels, each label using its own words so that the task is learnable.
std::string MakeFixture() {
  auto dir = testing_util::WriteTinyClassifierRun("sim", {.train = 120, .eval = 45});
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.value_or("");
}

v1::RunConfig Config(const std::string& dir, int rounds) {
  const std::string json =
      absl::StrCat(R"({
    "run_id": "sim-test", "seed": 5, "rounds": )",
                   rounds, R"(,
    "model": {"path": ")",
                   dir, R"(/model", "max_seq_len": 16},
    "lora": {"rank": 8, "alpha": 16},
    "task": {"labels": ["red", "green", "blue"]},
    "training": {"local_epochs": 1, "batch_size": 8, "learning_rate": 0.01},
    "selection": {"clients_per_round": 4, "over_selection": 1.0, "min_clients": 2,
                  "round_deadline_seconds": 4, "heartbeat_interval_seconds": 1,
                  "heartbeat_timeout_seconds": 30, "retry_after_seconds": 1},
    "data": {"train_path": ")",
                   dir, R"(/train.jsonl", "eval_path": ")", dir, R"(/eval.jsonl",
             "eval_batch_size": 16},
    "server": {"chunk_size_bytes": 4096},
    "simulation": {"num_clients": 4, "partition": "IID", "parallelism": 2}
  })");
  auto config = ParseRunConfigJson(json);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : v1::RunConfig();
}

// `fedlora simulate` of `config` into <dir>/<name>, within a minute.
SimResult RunIn(const std::string& dir, const std::string& name, const v1::RunConfig& config) {
  SimOptions options;
  options.out_dir = absl::StrCat(dir, "/", name);
  options.progress = false;
  options.max_seconds = 60;
  auto result = RunSimulation(config, options);
  EXPECT_TRUE(result.ok()) << name << ": " << result.status();
  return result.ok() ? *result : SimResult{};
}

// QUANT 8 bit in blocks of 256, and ZSTD level 3, as a config holds them.
v1::CodecStage QuantStage(bool stochastic) {
  v1::CodecStage quant;
  quant.set_id(v1::CodecStage::QUANT);
  quant.set_version(1);
  quant.mutable_quant()->set_bits(8);
  quant.mutable_quant()->set_block_size(256);
  quant.mutable_quant()->set_stochastic(stochastic);
  return quant;
}

v1::CodecStage ZstdStage() {
  v1::CodecStage zstd;
  zstd.set_id(v1::CodecStage::ZSTD);
  zstd.set_version(1);
  zstd.mutable_zstd()->set_level(3);
  return zstd;
}

std::string Read(const std::string& path) {
  auto s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : std::string();
}

int Count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

TEST(Simulator, TwoRoundsWithADropoutACrashedUploadAndAStraggler) {
  const std::string dir = MakeFixture();
  SimOptions options;
  options.out_dir = dir + "/out";
  options.progress = false;
  options.max_seconds = 80;
  // Round 1: client 2 vanishes after selection; client 0's upload is cut midway and resumed.
  // Round 2: client 1 sleeps 6 s after training, past the 4 s deadline: its update is refused.
  options.faults = {
      {1, 2, FaultKind::kDropout}, {1, 0, FaultKind::kCrash}, {2, 1, FaultKind::kStraggler}};
  v1::RunConfig config = Config(dir, 2);
  config.mutable_simulation()->set_straggler_delay_seconds(6);
  auto result = RunSimulation(config, options);
  ASSERT_TRUE(result.ok()) << result.status();

  ASSERT_EQ(result->rounds.size(), 3u);  // round 0 (untuned) + 2 rounds
  for (size_t i = 0; i < result->rounds.size(); ++i) {
    const RoundRecord& r = result->rounds[i];
    EXPECT_EQ(r.round, static_cast<int>(i));
    EXPECT_GE(r.eval_accuracy, 0.0);
    EXPECT_LE(r.eval_accuracy, 1.0);
    EXPECT_GT(r.eval_loss, 0.0);
  }
  const RoundRecord& r1 = result->rounds[1];
  EXPECT_EQ(r1.server_round, 1u);
  EXPECT_EQ(r1.selected, 4);
  EXPECT_EQ(r1.dropped, 1);
  EXPECT_EQ(r1.crashed, 1);
  EXPECT_EQ(r1.reported, 3);  // the dropout's update never comes; the crashed one is resumed
  EXPECT_EQ(result->connection_cuts, 1);
  const RoundRecord& r2 = result->rounds[2];
  EXPECT_EQ(r2.selected, 4);  // the dropped client rejoined
  EXPECT_EQ(r2.dropped, 0);
  EXPECT_EQ(r2.stragglers, 1);
  EXPECT_EQ(r2.reported, 3);  // closed at the deadline without the straggler
  for (const RoundRecord* r : {&r1, &r2}) {
    EXPECT_GT(r->bytes_up, 0);
    EXPECT_GT(r->bytes_down, 0);
    EXPECT_TRUE(std::isfinite(r->mean_train_loss));
  }
  // Both rounds accepted 3 updates of the same size; round 1 also carries the cut-off part of the
  // crashed upload, so it received at least as many bytes.
  EXPECT_GE(r1.bytes_up, r2.bytes_up);
  EXPECT_EQ(result->client_sizes, (std::vector<int64_t>{30, 30, 30, 30}));

  const std::string out = options.out_dir;
  const std::string jsonl = Read(out + "/rounds.jsonl");
  EXPECT_EQ(Count(jsonl, "\n"), 3);
  EXPECT_NE(jsonl.find("\"dropped\":1"), std::string::npos);
  const std::string csv = Read(out + "/rounds.csv");
  EXPECT_EQ(Count(csv, "\n"), 4);
  EXPECT_EQ(csv.rfind("round,server_round,eval_accuracy", 0), 0u);
  const std::string svg = Read(out + "/rounds.svg");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(Count(svg, "<polyline"), 5);  // accuracy; held-out and training loss; bytes up and down
  EXPECT_EQ(Count(svg, "<g id="), 3);
  EXPECT_EQ(Count(svg, "<g"), Count(svg, "</g>"));
  EXPECT_EQ(Count(svg, "<svg"), Count(svg, "</svg>"));
  EXPECT_TRUE(std::filesystem::exists(out + "/summary.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/adapter/adapter_model.safetensors"));
  // The adapter says how to use it: the run's label order and max_seq_len, an absolute base path.
  auto labels = ReadJsonFile(out + "/adapter/labels.json");
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ((*labels)["label_names"], nlohmann::json({"red", "green", "blue"}));
  auto meta = ReadJsonFile(out + "/adapter/fedlora_adapter.json");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ((*meta)["max_seq_len"], 16);
  EXPECT_EQ((*meta)["task"], "sequence_classification");
  EXPECT_EQ((*meta)["round"], result->rounds.back().server_round);
  auto peft = ReadJsonFile(out + "/adapter/adapter_config.json");
  ASSERT_TRUE(peft.ok());
  EXPECT_EQ((*peft)["base_model_name_or_path"], config.model().path());
  auto adapter = SafetensorsFile::Open(out + "/final_adapter.safetensors");
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ((*adapter)->names().size(), result->final_adapter.size());
  std::filesystem::remove_all(dir);
}

TEST(Simulator, SameConfigAndSeedGiveTheSameFinalAdapter) {
  const std::string dir = MakeFixture();
  std::string first;
  // Runs 0 and 1: the same config. Run 2 trains one client at a time, on every core instead of
  // sharing them: a client's result must not depend on the threads it got.
  for (int run = 0; run < 3; ++run) {
    SimOptions options;
    options.out_dir = absl::StrCat(dir, "/out", run);
    options.progress = false;
    options.max_seconds = 40;
    // Partial participation: 2 of the 4 clients per round, so the selection must not depend on
    // which clients happened to poll first.
    v1::RunConfig config = Config(dir, 2);
    config.mutable_selection()->set_clients_per_round(2);
    config.mutable_selection()->set_min_clients(2);
    if (run == 2) config.mutable_simulation()->set_parallelism(1);
    auto result = RunSimulation(config, options);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->rounds.size(), 3u);
    // Training moved the adapter away from its initialisation.
    EXPECT_NE(result->rounds[2].eval_loss, result->rounds[0].eval_loss);
    const std::string bytes = Read(options.out_dir + "/final_adapter.safetensors");
    ASSERT_FALSE(bytes.empty());
    if (run == 0) {
      first = bytes;
    } else {
      EXPECT_TRUE(bytes == first) << "final adapters differ between run " << run << " and run 0";
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Simulator, ProximalTermAndLogitAdjustmentReachTheVirtualClients) {
  // Each setting travels to the clients differently (proximal_mu with the task, logit_adjustment
  // in the run config the client reads); a client that ignored either would train exactly as
  // plain FedAvg does, and the final adapters would be equal.
  const std::string dir = MakeFixture();
  auto final_adapter = [&](const std::string& name, const v1::RunConfig& config) {
    SimOptions options;
    options.out_dir = absl::StrCat(dir, "/", name);
    options.progress = false;
    options.max_seconds = 40;
    auto result = RunSimulation(config, options);
    EXPECT_TRUE(result.ok()) << name << ": " << result.status();
    return Read(options.out_dir + "/final_adapter.safetensors");
  };
  v1::RunConfig plain = Config(dir, 1);
  plain.mutable_simulation()->set_partition(v1::SimulationConfig::DIRICHLET);
  plain.mutable_simulation()->set_dirichlet_alpha(0.3);
  v1::RunConfig prox = plain;
  prox.mutable_aggregation()->set_strategy(v1::AggregationConfig::FEDPROX);
  prox.mutable_aggregation()->set_proximal_mu(1.0);
  v1::RunConfig adjusted = plain;
  adjusted.mutable_training()->set_logit_adjustment(1.0);
  const std::string a = final_adapter("plain", plain);
  const std::string b = final_adapter("prox", prox);
  const std::string c = final_adapter("adjusted", adjusted);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  ASSERT_FALSE(c.empty());
  EXPECT_NE(a, b) << "FEDPROX's proximal term changed nothing";
  EXPECT_NE(a, c) << "training.logit_adjustment changed nothing";
  std::filesystem::remove_all(dir);
}

// Five virtual sites, every one in every round, three rounds at learning rate 0.05 (enough for
// this task to learn under FedAvg), aggregated by `strategy`.
v1::RunConfig FiveSites(const std::string& dir, v1::AggregationConfig::Strategy strategy) {
  v1::RunConfig config = Config(dir, 3);
  config.mutable_training()->set_learning_rate(0.05);
  config.mutable_selection()->set_clients_per_round(5);
  config.mutable_selection()->set_min_clients(5);
  config.mutable_simulation()->set_num_clients(5);
  config.mutable_aggregation()->set_strategy(strategy);
  return config;
}

TEST(Simulator, RobustStrategiesTrainAVirtualFederation) {
  // Five virtual sites, every one in every round: the robust rules and LORA_PRODUCT run in the
  // simulator's server as in `fedlora server`, the federation learns under the median, Multi-Krum
  // and LORA_PRODUCT, and each rule
  // commits an adapter of its own (not FedAvg's mean). Krum alone follows one site a round, which
  // on this task does not lower the loss in three rounds; it is checked to run and differ only.
  const std::string dir = MakeFixture();
  auto run = [&](const std::string& name, v1::AggregationConfig::Strategy strategy, bool learns) {
    v1::RunConfig config = FiveSites(dir, strategy);
    if (strategy == v1::AggregationConfig::KRUM || strategy == v1::AggregationConfig::MULTI_KRUM)
      config.mutable_aggregation()->set_krum_byzantine_clients(1);
    EXPECT_TRUE(ValidateRunConfig(config).ok()) << name << ": " << ValidateRunConfig(config);
    const SimResult r = RunIn(dir, name, config);
    EXPECT_EQ(r.rounds.size(), 4u) << name;
    if (learns && r.rounds.size() == 4u) {
      EXPECT_LT(r.rounds[3].eval_loss, r.rounds[0].eval_loss) << name << " did not learn";
    }
    return Read(absl::StrCat(dir, "/", name, "/final_adapter.safetensors"));
  };
  const std::string fedavg = run("fedavg", v1::AggregationConfig::FEDAVG, true);
  const std::string median = run("median", v1::AggregationConfig::MEDIAN, true);
  const std::string multi_krum = run("multi_krum", v1::AggregationConfig::MULTI_KRUM, true);
  const std::string krum = run("krum", v1::AggregationConfig::KRUM, false);
  // LORA_PRODUCT: the global pairs become the rank-r factors of the mean product.
  const std::string product = run("lora_product", v1::AggregationConfig::LORA_PRODUCT, true);
  ASSERT_FALSE(fedavg.empty());
  for (const std::string* other : {&median, &multi_krum, &krum, &product})
    EXPECT_NE(*other, fedavg);
  EXPECT_NE(median, multi_krum);
  EXPECT_NE(krum, multi_krum);
  std::filesystem::remove_all(dir);
}

TEST(Simulator, AttacksDamageFedAvgAndTheMedianHoldsThem) {
  // Five sites, all in every round. Site 0 alone mounts the attacks from its own delta: each
  // raises FedAvg's final eval loss by more than 0.5 over the clean run's (ln 3 = 1.10 is a
  // uniform guess), and leaves the median's within 0.1 of its own clean run's. Sites 0 and 1 mount
  // LIE and min-max (2 of 5, the most the median's majority allows), which stay within the honest
  // updates' spread to slip through robust rules: the median does not hold them (its loss rises by
  // more than that 0.1), and they hurt it more than FedAvg, whose loss they move little (+0.085
  // and +0.096 at this seed; -0.02 to +0.07 at seeds 6 and 7: docs/results.md).
  const std::string dir = MakeFixture();
  auto final_loss = [&](const std::string& name, v1::AggregationConfig::Strategy strategy,
                        v1::SimulationAttack::Kind attack, double scale, uint32_t malicious = 1) {
    v1::RunConfig config = FiveSites(dir, strategy);
    if (attack != v1::SimulationAttack::KIND_UNSPECIFIED) {
      config.mutable_simulation()->set_malicious_clients(malicious);
      config.mutable_simulation()->mutable_attack()->set_kind(attack);
      if (scale > 0) config.mutable_simulation()->mutable_attack()->set_scale(scale);
    }
    EXPECT_TRUE(ValidateRunConfig(config).ok()) << name << ": " << ValidateRunConfig(config);
    const SimResult r = RunIn(dir, name, config);
    EXPECT_EQ(r.rounds.size(), 4u) << name;
    return r.rounds.empty() ? 0.0 : r.rounds.back().eval_loss;
  };
  const double fedavg_clean = final_loss("fedavg", v1::AggregationConfig::FEDAVG,
                                         v1::SimulationAttack::KIND_UNSPECIFIED, 0);
  const double median_clean = final_loss("median", v1::AggregationConfig::MEDIAN,
                                         v1::SimulationAttack::KIND_UNSPECIFIED, 0);
  struct Attack {
    const char* name;
    v1::SimulationAttack::Kind kind;
    double scale;  // 0: the kind's own (LIE's z from n and f; min-max takes none)
    uint32_t malicious;
    bool median_holds;
  };
  for (const Attack& a : {Attack{"sign_flip", v1::SimulationAttack::SIGN_FLIP, 10, 1, true},
                          Attack{"scale", v1::SimulationAttack::SCALE, 1000, 1, true},
                          Attack{"gaussian", v1::SimulationAttack::GAUSSIAN, 10, 1, true},
                          Attack{"lie", v1::SimulationAttack::LITTLE_IS_ENOUGH, 0, 2, false},
                          Attack{"min_max", v1::SimulationAttack::MIN_MAX, 0, 2, false}}) {
    const double fedavg = final_loss(absl::StrCat("fedavg_", a.name), v1::AggregationConfig::FEDAVG,
                                     a.kind, a.scale, a.malicious);
    const double median = final_loss(absl::StrCat("median_", a.name), v1::AggregationConfig::MEDIAN,
                                     a.kind, a.scale, a.malicious);
    std::fprintf(stderr, "ATTACK %s fedavg %f (clean %f) median %f (clean %f)\n", a.name, fedavg,
                 fedavg_clean, median, median_clean);
    if (a.median_holds) {
      EXPECT_GT(fedavg, fedavg_clean + 0.5) << a.name << " did not damage FedAvg";
      EXPECT_LT(median, median_clean + 0.1) << a.name << " moved the median";
    } else {
      EXPECT_GT(median, median_clean + 0.1) << a.name << " no longer slips through the median";
      EXPECT_GT(median - median_clean, fedavg - fedavg_clean)
          << a.name << " hurt FedAvg more than the median";
    }
  }
  std::filesystem::remove_all(dir);
}

// The final adapter's values end to end (tensors sorted by name).
std::vector<double> Flat(const SimResult& r) {
  std::vector<double> v;
  for (const UpdateTensor& t : r.final_adapter) v.insert(v.end(), t.values.begin(), t.values.end());
  return v;
}

// The largest gamma with max_i ||mu - gamma sigma - h_i|| <= max_{i,j} ||h_i - h_j||: each
// bound is a quadratic in gamma, a gamma^2 - 2 b_i gamma + c_i <= D^2 with a = |sigma|^2,
// b_i = <mu - h_i, sigma>, c_i = |mu - h_i|^2.
double MinMaxGamma(const std::vector<std::vector<double>>& h, const std::vector<double>& mu,
                   const std::vector<double>& sigma) {
  auto dot = [](const std::vector<double>& x, const std::vector<double>& y) {
    double s = 0;
    for (size_t k = 0; k < x.size(); ++k) s += x[k] * y[k];
    return s;
  };
  double d2 = 0;
  for (const auto& x : h) {
    for (const auto& y : h) {
      std::vector<double> diff(x.size());
      for (size_t k = 0; k < x.size(); ++k) diff[k] = x[k] - y[k];
      d2 = std::max(d2, dot(diff, diff));
    }
  }
  const double a = dot(sigma, sigma);
  double gamma = INFINITY;
  for (const auto& x : h) {
    std::vector<double> dev(x.size());
    for (size_t k = 0; k < x.size(); ++k) dev[k] = mu[k] - x[k];
    const double b = dot(dev, sigma), c = dot(dev, dev);
    gamma = std::min(gamma, (b + std::sqrt(b * b - a * (c - d2))) / a);
  }
  return gamma;
}

TEST(Simulator, LieAndMinMaxForgeFromEveryHonestUpdateOfTheRound) {
  // One FedAvg round of five equal sites: every run starts from the same adapter x_0 and site i
  // trains the same delta h_i, so the round's adapter is x_0 plus the mean of what the sites
  // send. Runs where sites 0 .. m-1 flip their sign (each moves the adapter by -2 h_i / 5) give
  // every h_i; the test computes LIE's and min-max's forgeries F from the definitions over all
  // five, and checks the adapters of the runs where sites 0 and 1 mount them: x_0 + (2 F + h_2 +
  // h_3 + h_4) / 5. An attacker that forged from fewer deltas, or two different forgeries, would
  // not give it.
  const std::string dir = MakeFixture();
  auto adapter = [&](const std::string& name, uint32_t malicious, v1::SimulationAttack::Kind kind) {
    v1::RunConfig config = FiveSites(dir, v1::AggregationConfig::FEDAVG);
    config.set_rounds(1);
    if (malicious > 0) {
      config.mutable_simulation()->set_malicious_clients(malicious);
      config.mutable_simulation()->mutable_attack()->set_kind(kind);
      if (kind == v1::SimulationAttack::SIGN_FLIP)
        config.mutable_simulation()->mutable_attack()->set_scale(1);
    }
    const SimResult r = RunIn(dir, name, config);
    EXPECT_EQ(r.client_sizes, (std::vector<int64_t>{24, 24, 24, 24, 24})) << name;
    return Flat(r);
  };
  std::vector<std::vector<double>> flipped;  // flipped[m]: sites 0 .. m-1 send -h_i
  for (uint32_t m = 0; m <= 5; ++m)
    flipped.push_back(adapter(absl::StrCat("flip", m), m, v1::SimulationAttack::SIGN_FLIP));
  const std::vector<double> lie = adapter("lie", 2, v1::SimulationAttack::LITTLE_IS_ENOUGH);
  const std::vector<double> min_max = adapter("min_max", 2, v1::SimulationAttack::MIN_MAX);
  const size_t d = flipped[0].size();
  ASSERT_GT(d, 0u);
  ASSERT_EQ(flipped[5].size(), d);
  ASSERT_EQ(lie.size(), d);
  ASSERT_EQ(min_max.size(), d);
  std::vector<std::vector<double>> h(5, std::vector<double>(d));
  std::vector<double> mu(d, 0), sigma(d, 0);
  for (size_t k = 0; k < d; ++k) {
    for (int i = 0; i < 5; ++i) {
      h[i][k] = (flipped[i][k] - flipped[i + 1][k]) * 5 / 2;
      mu[k] += h[i][k] / 5;
    }
    for (int i = 0; i < 5; ++i) sigma[k] += (h[i][k] - mu[k]) * (h[i][k] - mu[k]) / 4;
    sigma[k] = std::sqrt(sigma[k]);
  }
  // n = 5, f = 2: s = floor(5/2 + 1) - 2 = 1, z = Phi^-1(4/5).
  const double z = 0.8416212335729144;
  const double gamma = MinMaxGamma(h, mu, sigma);
  double lie_error = 0, min_max_error = 0, spread = 0;
  for (size_t k = 0; k < d; ++k) {
    const double x0 = flipped[0][k] - mu[k];
    const double rest = h[2][k] + h[3][k] + h[4][k];
    lie_error =
        std::max(lie_error, std::abs(lie[k] - (x0 + (2 * (mu[k] - z * sigma[k]) + rest) / 5)));
    min_max_error = std::max(
        min_max_error, std::abs(min_max[k] - (x0 + (2 * (mu[k] - gamma * sigma[k]) + rest) / 5)));
    spread = std::max(spread, sigma[k]);
  }
  std::fprintf(stderr, "largest sigma %g, min-max gamma %f; errors: LIE %g, min-max %g\n", spread,
               gamma, lie_error, min_max_error);
  EXPECT_GT(spread, 1e-3);  // the sites' deltas differ: the forgeries are not the mean
  EXPECT_GT(gamma, 0.1);
  EXPECT_LT(lie_error, 1e-5);
  EXPECT_LT(min_max_error, 1e-5);
  std::filesystem::remove_all(dir);
}

TEST(Simulator, CompressedUpdatesWithErrorFeedbackCrossTheWire) {
  // The same federation uncompressed and with [TOPK 10%, QUANT 8 bit, ZSTD]: the server accepts
  // the compressed updates (it checks their format and kept counts), they are several times
  // smaller on the wire, training still moves the adapter, and every client that uploaded keeps
  // its error-feedback residual in its state directory.
  const std::string dir = MakeFixture();
  const v1::RunConfig plain = Config(dir, 2);
  v1::RunConfig packed = plain;
  v1::CodecStage* topk = packed.mutable_codec()->add_stages();
  topk->set_id(v1::CodecStage::TOPK);
  topk->set_version(1);
  topk->mutable_top_k()->set_fraction(0.1);
  topk->mutable_top_k()->set_error_feedback(true);
  *packed.mutable_codec()->add_stages() = QuantStage(/*stochastic=*/true);
  *packed.mutable_codec()->add_stages() = ZstdStage();
  ASSERT_TRUE(ValidateRunConfig(packed).ok()) << ValidateRunConfig(packed);
  const SimResult a = RunIn(dir, "plain", plain);
  const SimResult b = RunIn(dir, "packed", packed);
  ASSERT_EQ(a.rounds.size(), 3u);
  ASSERT_EQ(b.rounds.size(), 3u);
  for (int r = 1; r <= 2; ++r) {
    EXPECT_EQ(b.rounds[r].reported, a.rounds[r].reported) << "round " << r;
    EXPECT_LT(b.rounds[r].bytes_up * 3, a.rounds[r].bytes_up) << "round " << r;
    // Both runs accepted the same updates: the same dense fp32 size, which the uncompressed wire
    // bytes exceed only by framing and the compressed ones undercut.
    EXPECT_EQ(b.rounds[r].bytes_up_fp32, a.rounds[r].bytes_up_fp32) << "round " << r;
    EXPECT_GT(a.rounds[r].bytes_up, a.rounds[r].bytes_up_fp32) << "round " << r;
    EXPECT_LT(b.rounds[r].bytes_up * 3, b.rounds[r].bytes_up_fp32) << "round " << r;
  }
  EXPECT_NE(b.rounds[2].eval_loss, b.rounds[0].eval_loss) << "compressed updates changed nothing";
  int residuals = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/packed/clients")) {
    residuals += std::filesystem::exists(e.path() / "error_feedback.safetensors");
  }
  EXPECT_EQ(residuals, 4) << "each of the 4 clients trained and kept its residual";
  EXPECT_FALSE(
      std::filesystem::exists(dir + "/plain/clients/sim-client-00000/error_feedback.safetensors"));
  std::filesystem::remove_all(dir);
}

TEST(Simulator, LowRankUpdatesCrossTheWire) {
  // [LOWRANK 2, QUANT 8 bit, ZSTD]: the server accepts the factored updates (their counts follow
  // from the header's rank), they are several times smaller, and each client keeps its residual
  // and warm start.
  const std::string dir = MakeFixture();
  const v1::RunConfig plain = Config(dir, 2);
  v1::RunConfig packed = plain;
  v1::CodecStage* lowrank = packed.mutable_codec()->add_stages();
  lowrank->set_id(v1::CodecStage::LOWRANK);
  lowrank->set_version(1);
  lowrank->mutable_low_rank()->set_rank(2);
  *packed.mutable_codec()->add_stages() = QuantStage(/*stochastic=*/false);
  *packed.mutable_codec()->add_stages() = ZstdStage();
  ASSERT_TRUE(ValidateRunConfig(packed).ok()) << ValidateRunConfig(packed);
  const SimResult a = RunIn(dir, "plain", plain);
  const SimResult b = RunIn(dir, "packed", packed);
  ASSERT_EQ(b.rounds.size(), 3u);
  for (int r = 1; r <= 2; ++r) {
    EXPECT_EQ(b.rounds[r].reported, a.rounds[r].reported) << "round " << r;
    EXPECT_LT(b.rounds[r].bytes_up * 5, b.rounds[r].bytes_up_fp32) << "round " << r;
  }
  EXPECT_NE(b.rounds[2].eval_loss, b.rounds[0].eval_loss) << "low-rank updates changed nothing";
  auto kept = ErrorFeedback::Load(
      dir + "/packed/clients/sim-client-00000/error_feedback.safetensors", "sim-test");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(kept->residual().empty());
  EXPECT_FALSE(kept->warm_start().empty());
  std::filesystem::remove_all(dir);
}

TEST(Simulator, DownlinkDeltasRebuildTheBroadcastAdapter) {
  // The same federation with full downloads and with downlink_codec [QUANT 8 bit, ZSTD]. Every
  // client trains every round, so from round 2 on each holds the previous broadcast adapter and is
  // offered its delta. The server accepts only updates from the broadcast adapter's hash, so every
  // accepted update proves its client rebuilt that adapter bit for bit.
  const std::string dir = MakeFixture();
  const v1::RunConfig plain = Config(dir, 3);
  v1::RunConfig packed = plain;
  *packed.mutable_downlink_codec()->add_stages() = QuantStage(/*stochastic=*/false);
  *packed.mutable_downlink_codec()->add_stages() = ZstdStage();
  ASSERT_TRUE(ValidateRunConfig(packed).ok()) << ValidateRunConfig(packed);
  const SimResult a = RunIn(dir, "plain", plain);
  const SimResult b = RunIn(dir, "packed", packed);
  ASSERT_EQ(a.rounds.size(), 4u);
  ASSERT_EQ(b.rounds.size(), 4u);
  for (int r = 1; r <= 3; ++r) {
    EXPECT_EQ(a.rounds[r].reported, 4) << "round " << r;
    EXPECT_EQ(b.rounds[r].reported, 4) << "round " << r;
    // Full downloads stand for themselves.
    EXPECT_EQ(a.rounds[r].bytes_down_full, a.rounds[r].bytes_down) << "round " << r;
    EXPECT_GT(a.rounds[r].bytes_down, 0) << "round " << r;
  }
  // Round 1 starts from the initial adapter, downloaded whole; later rounds send deltas.
  EXPECT_EQ(b.rounds[1].bytes_down, a.rounds[1].bytes_down);
  for (int r = 2; r <= 3; ++r) {
    EXPECT_EQ(b.rounds[r].bytes_down_full, a.rounds[r].bytes_down_full) << "round " << r;
    EXPECT_LT(b.rounds[r].bytes_down * 3, b.rounds[r].bytes_down_full) << "round " << r;
  }
  EXPECT_NE(b.rounds[3].eval_loss, b.rounds[0].eval_loss) << "training changed nothing";
  // Each client keeps the adapter it trained from, for deltas after a restart.
  for (const auto& e : std::filesystem::directory_iterator(dir + "/packed/clients")) {
    EXPECT_TRUE(std::filesystem::exists(e.path() / "global_adapter.safetensors")) << e.path();
  }
  std::filesystem::remove_all(dir);
}

TEST(Simulator, DifferentialPrivacyReportsEpsilonEachRound) {
  // Central DP, z = 1.1, 4 of 10 clients per round, accounted at sampling rate 1 (the server's
  // cohorts are not uniform samples): the report's epsilon after each round is Opacus 1.5.2's for
  // that many steps (compute_rdp, alpha * steps / (2 z^2) at q = 1; get_privacy_spent, default orders).
  const std::string dir = MakeFixture();
  v1::RunConfig config = Config(dir, 2);
  config.mutable_aggregation()->clear_weight_by_examples();
  auto* dp = config.mutable_privacy()->mutable_dp();
  dp->set_enabled(true);
  dp->set_clip_norm(0.5);
  dp->set_noise_multiplier(1.1);
  ApplyRunConfigDefaults(&config);
  ASSERT_TRUE(ValidateRunConfig(config).ok()) << ValidateRunConfig(config);
  const SimResult r = RunIn(dir, "dp", config);
  ASSERT_EQ(r.rounds.size(), 3u);
  EXPECT_NEAR(r.rounds[0].dp_epsilon, 0.0, 1e-12);
  EXPECT_NEAR(r.rounds[1].dp_epsilon, 4.239640834979212, 1e-6 * 4.239640834979212);
  EXPECT_NEAR(r.rounds[2].dp_epsilon, 6.327364712808747, 1e-6 * 6.327364712808747);
  EXPECT_NE(r.rounds[2].eval_loss, r.rounds[0].eval_loss) << "the noisy updates changed nothing";
  std::filesystem::remove_all(dir);
}

TEST(Simulator, FrozenLoraATrainsBAndTheHeadAndUploadsOnlyThem) {
  // FFA-LoRA on the five sites: the federation learns, every lora_A of the final adapter is the
  // seeded one the pooled models drew (a model built from the same config), and each round's
  // updates carry only B and the head: bytes_up_fp32 = 5 sites x 4 bytes x their elements.
  const std::string dir = MakeFixture();
  // Three local epochs at 0.1 (a frozen A wants a larger rate; training A too, this rate takes
  // the loss from 1.097 to 1.153).
  v1::RunConfig config = FiveSites(dir, v1::AggregationConfig::FEDAVG);
  config.mutable_training()->set_local_epochs(3);
  config.mutable_training()->set_learning_rate(0.1);
  config.mutable_lora()->set_freeze_a(true);
  ASSERT_TRUE(ValidateRunConfig(config).ok()) << ValidateRunConfig(config);
  const SimResult r = RunIn(dir, "ffa", config);
  ASSERT_EQ(r.rounds.size(), 4u);
  // Measured: loss 1.097 -> 0.538, accuracy 0.33 -> 0.82.
  EXPECT_LT(r.rounds[3].eval_loss, r.rounds[0].eval_loss - 0.3) << "did not learn";
  EXPECT_GT(r.rounds[3].eval_accuracy, 0.6);
  auto model = BertClassifier::Load(
      dir + "/model", ModelOptionsFromConfig(config, 16, ModelRole::kTrainAndEvaluate));
  ASSERT_TRUE(model.ok()) << model.status();
  int64_t a_tensors = 0, trained_elements = 0;
  for (const Param& p : (*model)->trainable_params()) {
    const auto it = std::find_if(r.final_adapter.begin(), r.final_adapter.end(),
                                 [&](const UpdateTensor& t) { return t.name == p.name; });
    ASSERT_NE(it, r.final_adapter.end()) << p.name;
    if (p.name.find(".lora_A.") != std::string::npos) {
      ++a_tensors;
      EXPECT_EQ(it->values, p.value) << p.name << " moved";
    } else {
      trained_elements += p.numel();
      EXPECT_NE(it->values, p.value) << p.name << " did not train";
    }
  }
  EXPECT_GT(a_tensors, 0);
  for (size_t i = 1; i < r.rounds.size(); ++i)
    EXPECT_EQ(r.rounds[i].bytes_up_fp32, 5 * 4 * trained_elements) << "round " << i;
  std::filesystem::remove_all(dir);
}

TEST(Simulator, SecureAggregationWithDistributedNoiseOverMutualTlsThroughADropout) {
  // Everything on: mutual TLS (a PKI made for the run), sealed updates, secure aggregation and
  // distributed DP. The SDK's secure-aggregation path: 4 clients mask their clipped, noised updates; in round 1
  // client 2 drops after sharing its keys, so the server unmasks the other three. Each client adds
  // noise of variance (z C)^2 / 4, so round 1's sum carries z_eff = 2 sqrt(3/4) and round 2's z = 2;
  // the expected epsilons are Opacus 1.5.2's for those (compute_rdp at q = 1, get_privacy_spent).
  const std::string dir = MakeFixture();
  v1::RunConfig config = Config(dir, 2);
  config.mutable_aggregation()->clear_weight_by_examples();
  config.mutable_selection()->set_min_clients(3);
  config.mutable_selection()->set_round_deadline_seconds(8);
  config.mutable_privacy()->set_secure_aggregation(true);
  auto* dp = config.mutable_privacy()->mutable_dp();
  dp->set_enabled(true);
  dp->set_mode(v1::DifferentialPrivacyConfig::DISTRIBUTED);
  dp->set_clip_norm(0.5);
  dp->set_noise_multiplier(2.0);
  ApplyRunConfigDefaults(&config);
  ASSERT_TRUE(ValidateRunConfig(config).ok()) << ValidateRunConfig(config);
  SimOptions options;
  options.out_dir = dir + "/secagg";
  options.progress = false;
  options.max_seconds = 90;
  options.faults = {{1, 2, FaultKind::kDropout}};
  options.mtls = true;
  auto run = RunSimulation(config, options);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->rounds.size(), 3u);
  EXPECT_EQ(run->rounds[1].reported, 3);
  EXPECT_EQ(run->rounds[2].reported, 4);
  EXPECT_NEAR(run->rounds[0].dp_epsilon, 0.0, 1e-12);
  // A hair above Opacus's values at z_eff: the accountant takes the sensitivity C + 2^-f sqrt(d) of
  // the fixed point, a relative 1e-5 more here (differential_privacy_test checks the scaling).
  EXPECT_GE(run->rounds[1].dp_epsilon, 2.541218097242522);
  EXPECT_LE(run->rounds[1].dp_epsilon, 2.541218097242522 * (1 + 1e-4));
  EXPECT_GE(run->rounds[2].dp_epsilon, 3.47863372538627);
  EXPECT_LE(run->rounds[2].dp_epsilon, 3.47863372538627 * (1 + 1e-4));
  EXPECT_NE(run->rounds[2].eval_loss, run->rounds[0].eval_loss)
      << "the masked updates changed nothing";
  // (A server without TLS would have refused to start: options.mtls leaves it no plaintext.)
  EXPECT_TRUE(std::filesystem::exists(dir + "/secagg/pki/sim-client-00003.pem"));
  std::filesystem::remove_all(dir);
}

TEST(Simulator, HundredsOfVirtualClientsWithFewTraining) {
  // 200 clients of 2 examples each (400 examples, IID), 8 selected per round: the clients are
  // cheap records and threads blocked in long polls; only 2 models exist.
  const std::string dir = testing_util::MakeTempDir("sim_many");
  const std::string fixture = MakeFixture();
  v1::RunConfig config = Config(fixture, 2);
  std::string train;
  const std::string base = Read(fixture + "/train.jsonl");
  for (int copy = 0; copy < 4; ++copy) train += base;  // 480 examples
  ASSERT_TRUE(WriteFileAtomically(fixture + "/train.jsonl", train).ok());
  config.mutable_simulation()->set_num_clients(200);
  config.mutable_selection()->set_clients_per_round(8);
  config.mutable_selection()->set_min_clients(8);
  config.mutable_data()->set_eval_every_rounds(2);  // round 1 is not evaluated, round 2 is
  SimOptions options;
  options.out_dir = dir + "/out";
  options.progress = false;
  options.max_seconds = 80;
  auto result = RunSimulation(config, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->rounds.size(), 3u);
  for (int r = 1; r <= 2; ++r) {
    EXPECT_EQ(result->rounds[static_cast<size_t>(r)].selected, 8);
    EXPECT_EQ(result->rounds[static_cast<size_t>(r)].reported, 8);
  }
  EXPECT_TRUE(std::isnan(result->rounds[1].eval_accuracy));
  EXPECT_GE(result->rounds[2].eval_accuracy, 0.0);
  EXPECT_GE(result->rounds[0].eval_accuracy, 0.0);  // the untuned model always is
  ASSERT_EQ(result->client_sizes.size(), 200u);
  for (int64_t s : result->client_sizes) EXPECT_GE(s, 2);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(fixture);
}

TEST(Simulator, RejectsConfigsItCannotRun) {
  const std::string dir = MakeFixture();
  SimOptions options;
  options.out_dir = dir + "/out";
  options.progress = false;
  v1::RunConfig config = Config(dir, 1);
  config.mutable_simulation()->set_num_clients(3);  // 4 per round can never fill
  EXPECT_EQ(RunSimulation(config, options).status().code(), absl::StatusCode::kInvalidArgument);
  config = Config(dir, 1);
  config.mutable_data()->clear_eval_path();
  EXPECT_EQ(RunSimulation(config, options).status().code(), absl::StatusCode::kInvalidArgument);
  config = Config(dir, 1);
  config.mutable_simulation()->set_crash_probability(1.5);
  EXPECT_EQ(RunSimulation(config, options).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

TEST(Report, CsvJsonAndSvgOfKnownRecords) {
  RoundRecord a;
  a.round = 0;
  a.eval_accuracy = 0.25;
  a.mean_train_loss = std::nan("");
  RoundRecord b;
  b.round = 1;
  b.server_round = 1;
  b.eval_accuracy = 0.5;
  b.bytes_up = 3 << 20;
  b.bytes_down = 1 << 20;
  b.selected = 4;
  b.reported = 3;
  b.dropped = 1;
  b.dp_epsilon = 2.5;
  EXPECT_EQ(RoundRecordToJson(a).find("\"mean_train_loss\":null") != std::string::npos, true);
  EXPECT_NE(RoundRecordToJson(a).find("\"dp_epsilon\":null"), std::string::npos);  // no DP
  EXPECT_NE(RoundRecordToJson(b).find("\"dp_epsilon\":2.5"), std::string::npos);
  const std::string csv = RoundsToCsv({a, b});
  // eval_perplexity is empty (NaN for a classifier); bytes_up_fp32, bytes_down_full and dp_epsilon
  // come last.
  EXPECT_NE(csv.find("\n1,1,0.5,0,0,0,3145728,1048576,0,0,4,3,1,0,0,,0,0,2.5\n"), std::string::npos)
      << csv;
  EXPECT_NE(csv.find("\n0,0,0.25,0,0,,0,0,0,0,0,0,0,0,0,,0,0,\n"), std::string::npos) << csv;
  const std::string svg = RoundsToSvg({a, b}, "a <title> & more");
  EXPECT_NE(svg.find("a &lt;title&gt; &amp; more"), std::string::npos);
  // Cumulative MiB up reaches 3 at round 1: the bytes axis tops out at a nice value >= 3.
  EXPECT_NE(svg.find(">3<"), std::string::npos);
  // The untuned model is a line across the accuracy panel, and the legend gives both totals.
  EXPECT_NE(svg.find(">untuned (round 0)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">uploaded 3 MiB</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">downloaded 1 MiB (dashed)</text>"), std::string::npos);
  const std::string table = SummaryTable({a, b});
  EXPECT_NE(table.find("total"), std::string::npos);
  EXPECT_NE(table.find("0.5000"), std::string::npos);
}

TEST(Report, SvgDrawsLossesReferencesAndBytesLinesThatCoincideApart) {
  RoundRecord a;
  a.round = 0;
  a.eval_accuracy = 0.25;
  a.eval_loss = 2.0;
  a.mean_train_loss = std::nan("");
  RoundRecord b;
  b.round = 1;
  b.eval_accuracy = 0.5;
  b.eval_loss = 1.5;
  b.mean_train_loss = 1.75;
  b.bytes_up = b.bytes_down = 2 << 20;  // every byte up comes down again: the two lines coincide
  const std::string svg = RoundsToSvg({a, b}, "t", {{"centralized", 0.75}, {"off the axis", 7.0}});
  // Accuracy at y = 50 + 190 * (1 - v): the untuned line at 0.25, the reference at 0.75.
  EXPECT_NE(
      svg.find("<line class=\"untuned\" x1=\"80.0\" y1=\"192.5\" x2=\"720.0\" y2=\"192.5\"/>"),
      std::string::npos)
      << svg;
  EXPECT_NE(svg.find("<line class=\"reference\" x1=\"80.0\" y1=\"97.5\""), std::string::npos);
  EXPECT_NE(svg.find(">centralized</text>"), std::string::npos);
  EXPECT_EQ(svg.find("off the axis"), std::string::npos);  // outside [0, 1]: left out
  // The loss panel: held-out loss at both rounds, training loss at round 1 only.
  EXPECT_NE(svg.find("<g id=\"loss\">"), std::string::npos);
  EXPECT_EQ(Count(svg, "<circle class=\"evalloss\""), 2);
  EXPECT_EQ(Count(svg, "<rect class=\"trainloss\" x=\""), 2);  // one marker and the legend's swatch
  // Down is dashed with square markers, up solid with circles: the same points stay visible apart.
  EXPECT_NE(svg.find("polyline.down { stroke-dasharray"), std::string::npos);
  EXPECT_EQ(Count(svg, "<circle class=\"up\""), 2);
  EXPECT_EQ(Count(svg, "<rect class=\"down\" x=\""), 3);  // two markers and the legend's swatch
  EXPECT_EQ(Count(svg, "<polyline class=\"up\""), 1);
  EXPECT_EQ(Count(svg, "<polyline class=\"down\""), 1);
}

// Instruction tuning of SmolLM2-135M-Instruct (Q4_1 base) across two sites that each know one
// answer: partitioned BY_KEY on "site", a system prompt and the checkpoint's own template named,
// exact match scored. Two rounds of two local steps learn both answers: the held-out perplexity of
// the federated adapter falls far below the untuned model's.
TEST(Simulator, DecoderFederationLearnsBothSitesAnswers) {
  const char* src = std::getenv("FEDLORA_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "run through ctest";
  const std::string model =
      std::string(src) + "/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model))
    GTEST_SKIP() << model << " missing (scripts/setup.sh fetches it)";
  const std::string dir = testing_util::MakeTempDir("sim_decoder");
  ASSERT_FALSE(dir.empty());
  auto write = [&](const std::string& path, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) {
      const bool a = i % 2 == 0;
      absl::StrAppend(&out, "{\"question\": \"Say the ", a ? "first" : "second",
                      " code word, please (", i, ").\", \"answer\": \"", a ? "zebra" : "walrus",
                      "\", \"site\": \"", a ? "a" : "b", "\"}\n");
    }
    ASSERT_TRUE(WriteFileAtomically(path, out).ok());
  };
  write(dir + "/train.jsonl", 16);
  write(dir + "/eval.jsonl", 4);
  const std::string json =
      absl::StrCat(R"({
    "run_id": "sim-decoder", "seed": 3, "rounds": 2,
    "model": {"path": ")",
                   model, R"(", "max_seq_len": 64},
    "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "task": {"kind": "CAUSAL_LM", "prompt_field": "question", "response_field": "answer",
             "system_prompt": "You answer in one word.", "chat_template": "smollm2", "exact_match": true},
    "training": {"local_steps": 2, "batch_size": 4, "learning_rate": 0.01},
    "selection": {"clients_per_round": 2, "over_selection": 1.0, "min_clients": 2,
                  "round_deadline_seconds": 300, "heartbeat_interval_seconds": 1,
                  "heartbeat_timeout_seconds": 60, "retry_after_seconds": 1},
    "data": {"train_path": ")",
                   dir, R"(/train.jsonl", "eval_path": ")", dir, R"(/eval.jsonl"},
    "server": {"chunk_size_bytes": 65536},
    "simulation": {"num_clients": 2, "partition": "BY_KEY", "partition_key_field": "site", "parallelism": 2}
  })");
  absl::StatusOr<v1::RunConfig> config = ParseRunConfigJson(json);
  ASSERT_TRUE(config.ok()) << config.status();
  SimOptions options;
  options.out_dir = dir + "/out";
  options.progress = false;
  options.max_seconds = 300;
  auto result = RunSimulation(*config, options);
  ASSERT_TRUE(result.ok()) << result.status();

  ASSERT_EQ(result->rounds.size(), 3u);
  for (const RoundRecord& r : result->rounds) {
    EXPECT_TRUE(std::isfinite(r.eval_perplexity)) << r.round;
    EXPECT_NEAR(r.eval_perplexity, std::exp(r.eval_loss), 1e-9 * r.eval_perplexity);
    EXPECT_GE(r.eval_accuracy, 0.0);  // exact match asked for
    EXPECT_LE(r.eval_accuracy, 1.0);
    EXPECT_TRUE(std::isnan(r.eval_macro_f1));
  }
  EXPECT_EQ(result->rounds[1].reported, 2);
  EXPECT_EQ(result->rounds[2].reported, 2);
  // The untuned model has never seen these answers; the federated adapter has learnt both.
  EXPECT_GT(result->rounds[0].eval_perplexity, 20.0);
  EXPECT_LT(result->rounds[2].eval_perplexity, 0.2 * result->rounds[0].eval_perplexity);
  EXPECT_EQ(result->client_sizes, (std::vector<int64_t>{8, 8}));  // one site per key
  // The adapter is LoRA on q_proj and v_proj only: A and B for each of 30 layers.
  EXPECT_EQ(result->final_adapter.size(), 30u * 2 * 2);

  auto adapter_config = ReadJsonFile(options.out_dir + "/adapter/adapter_config.json");
  ASSERT_TRUE(adapter_config.ok()) << adapter_config.status();
  EXPECT_EQ((*adapter_config)["task_type"], "CAUSAL_LM");
  EXPECT_EQ((*adapter_config)["r"], 4);
  auto meta = ReadJsonFile(options.out_dir + "/adapter/fedlora_adapter.json");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ((*meta)["system_prompt"], "You answer in one word.");
  EXPECT_EQ((*meta)["chat_template"], "smollm2");
  EXPECT_EQ((*meta)["max_seq_len"], 64);
  auto summary = ReadJsonFile(options.out_dir + "/summary.json");
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ((*summary)["final_perplexity"].get<double>(), result->rounds[2].eval_perplexity);
  EXPECT_TRUE(summary->contains("final_accuracy"));
  EXPECT_NE(Read(options.out_dir + "/rounds.csv").find("eval_perplexity"), std::string::npos);

  // A classification task on a decoder checkpoint is refused before anything runs.
  v1::RunConfig classify = *config;
  classify.mutable_task()->Clear();
  classify.mutable_task()->set_kind(v1::TaskConfig::SEQUENCE_CLASSIFICATION);
  classify.mutable_task()->add_labels("zebra");
  classify.mutable_task()->add_labels("walrus");
  classify.mutable_task()->set_text_field("question");
  classify.mutable_task()->set_label_field("answer");
  classify.mutable_lora()->clear_target_modules();
  classify.mutable_lora()->add_target_modules("query");
  absl::Status refused = RunSimulation(classify, options).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(refused.message().find("is a decoder checkpoint"), absl::string_view::npos) << refused;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fedlora::sim
