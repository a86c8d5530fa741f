#include "config/config_io.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using v1::AggregationConfig;
using v1::CodecStage;
using v1::DifferentialPrivacyConfig;
using v1::RunConfig;

// CTest sets FEDLORA_SOURCE_DIR to the repository root.
std::string SourceDir() {
  const char* dir = std::getenv("FEDLORA_SOURCE_DIR");
  if (dir == nullptr) {
    ADD_FAILURE() << "FEDLORA_SOURCE_DIR is not set; run this test through ctest";
    return ".";
  }
  return dir;
}

std::string ExamplePath(const std::string& name) { return SourceDir() + "/proto/examples/" + name; }

// The smallest valid config: everything else takes its default.
constexpr char kMinimalJson[] =
    R"({"model": {"path": "models/all-MiniLM-L6-v2"}, "task": {"labels": ["neg", "pos"]}})";

RunConfig MinimalConfig() {
  absl::StatusOr<RunConfig> config = ParseRunConfigJson(kMinimalJson);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : RunConfig();
}

// Valid central differential privacy on a config whose defaults were filled without it.
void EnableDp(RunConfig& c) {
  auto* dp = c.mutable_privacy()->mutable_dp();
  dp->set_enabled(true);
  dp->set_mode(DifferentialPrivacyConfig::CENTRAL);
  dp->set_clip_norm(1);
  dp->set_noise_multiplier(1);
  dp->set_target_delta(1e-5);
  c.mutable_aggregation()->set_weight_by_examples(false);
}

// Valid secure aggregation on a config whose defaults were filled without it.
void EnableSecAgg(RunConfig& c) {
  c.mutable_privacy()->set_secure_aggregation(true);
  c.mutable_aggregation()->set_max_update_norm(1);
  c.mutable_aggregation()->set_weight_by_examples(false);
}

// A robust strategy on a config whose defaults were filled without it, with rounds of `n` clients
// (its own settings left to the caller).
void Robust(RunConfig& c, AggregationConfig::Strategy strategy, uint32_t n) {
  c.mutable_aggregation()->set_strategy(strategy);
  c.mutable_selection()->set_clients_per_round(n);
  c.mutable_selection()->set_min_clients(n);
}

TEST(ConfigIoTest, RobustStrategiesValidateWithinTheirBounds) {
  struct Valid {
    AggregationConfig::Strategy strategy;
    uint32_t n;
    double trim = 0;
    uint32_t f = 0, keep = 0;
  };
  for (const Valid& v :
       {Valid{AggregationConfig::MEDIAN, 1}, Valid{AggregationConfig::TRIMMED_MEAN, 5, 0.2},
        Valid{AggregationConfig::TRIMMED_MEAN, 4, 0.25}, Valid{AggregationConfig::KRUM, 5, 0, 1},
        Valid{AggregationConfig::MULTI_KRUM, 7, 0, 2},
        Valid{AggregationConfig::MULTI_KRUM, 7, 0, 2, 5}, Valid{AggregationConfig::BULYAN, 7, 0, 1},
        Valid{AggregationConfig::BULYAN, 11, 0, 2}}) {
    RunConfig c = MinimalConfig();
    Robust(c, v.strategy, v.n);
    if (v.trim > 0) c.mutable_aggregation()->set_trim_fraction(v.trim);
    if (v.f > 0) c.mutable_aggregation()->set_krum_byzantine_clients(v.f);
    if (v.keep > 0) c.mutable_aggregation()->set_multi_krum_keep(v.keep);
    EXPECT_TRUE(ValidateRunConfig(c).ok()) << AggregationConfig::Strategy_Name(v.strategy)
                                           << " n=" << v.n << ": " << ValidateRunConfig(c);
  }
}

TEST(ConfigIoTest, SimulationAttackScaleDefaultsByKind) {
  for (const auto& [kind, scale] : std::vector<std::pair<v1::SimulationAttack::Kind, double>>{
           {v1::SimulationAttack::SIGN_FLIP, 1.0},
           {v1::SimulationAttack::SCALE, 1000.0},
           {v1::SimulationAttack::GAUSSIAN, 0.1}}) {
    RunConfig a;
    a.mutable_simulation()->mutable_attack()->set_kind(kind);
    ApplyRunConfigDefaults(&a);
    EXPECT_EQ(a.simulation().attack().scale(), scale) << v1::SimulationAttack::Kind_Name(kind);
  }
  // LIE computes its z from the round unless scale is set; min-max takes none.
  for (v1::SimulationAttack::Kind kind :
       {v1::SimulationAttack::LITTLE_IS_ENOUGH, v1::SimulationAttack::MIN_MAX}) {
    RunConfig a;
    a.mutable_simulation()->mutable_attack()->set_kind(kind);
    ApplyRunConfigDefaults(&a);
    EXPECT_FALSE(a.simulation().attack().has_scale()) << v1::SimulationAttack::Kind_Name(kind);
  }
}

TEST(ConfigIoTest, RobustStrategiesWeighEquallyByDefault) {
  // A robust strategy weighs updates equally even with a bound on the claimed counts.
  absl::StatusOr<RunConfig> c = ParseRunConfigJson(
      R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]}, "selection": {"clients_per_round": 5},
          "aggregation": {"strategy": "MEDIAN", "max_examples_per_client": 100}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->aggregation().weight_by_examples());
}

TEST(ConfigIoTest, LoraProductComposesWithWhatKeepsEachClientsFactors) {
  RunConfig c = MinimalConfig();
  c.mutable_aggregation()->set_strategy(AggregationConfig::LORA_PRODUCT);
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  RunConfig weighted = c;  // weights, clipping and a codec: each update is still one client's
  weighted.mutable_aggregation()->set_max_examples_per_client(100);
  weighted.mutable_aggregation()->set_weight_by_examples(true);
  weighted.mutable_aggregation()->set_max_update_norm(1);
  CodecStage* fp16 = weighted.mutable_codec()->add_stages();
  fp16->set_id(CodecStage::FP16);
  fp16->set_version(1);
  EXPECT_TRUE(ValidateRunConfig(weighted).ok()) << ValidateRunConfig(weighted);
  const std::vector<std::pair<std::function<void(RunConfig&)>, std::string>> refused = {
      {EnableSecAgg, "hides from the server"},
      {EnableDp, "LORA_PRODUCT with differential privacy"},
      {[](RunConfig& r) { r.mutable_lora()->set_freeze_a(true); },
       "LORA_PRODUCT with lora.freeze_a"},
      {[](RunConfig& r) { r.mutable_aggregation()->set_server_learning_rate(0.5); },
       "must be 1 with strategy LORA_PRODUCT"},
      {[](RunConfig& r) {
         r.set_rounds(5);
         r.mutable_aggregation()->set_average_last_rounds(2);
       },
       "averaging rounds' A and B apart"},
      {[](RunConfig& r) { r.mutable_aggregation()->set_server_momentum(0.9); },
       "applies to FEDAVG and FEDPROX only"}};
  for (const auto& [change, fragment] : refused) {
    RunConfig r = c;
    change(r);
    const absl::Status s = ValidateRunConfig(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
  }
}

// A valid CAUSAL_LM task in place of MinimalConfig's classification one.
void MakeCausalLm(RunConfig& c) {
  v1::TaskConfig* t = c.mutable_task();
  t->set_kind(v1::TaskConfig::CAUSAL_LM);
  t->clear_labels();
  t->clear_text_field();
  t->clear_label_field();
  t->set_prompt_field("prompt");
  t->set_response_field("response");
}

void ExpectInvalid(const absl::Status& status, const std::string& fragment) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(fragment));
}

TEST(ConfigIoTest, FullExampleLoadsWithValuesIntact) {
  absl::StatusOr<RunConfig> loaded = LoadRunConfigFile(ExamplePath("full.json"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const RunConfig& c = *loaded;
  EXPECT_EQ(c.run_id(), "fortunes-minilm-r8");
  EXPECT_EQ(c.seed(), 1234u);
  EXPECT_EQ(c.rounds(), 20u);
  EXPECT_EQ(c.model().id(), "all-MiniLM-L6-v2");
  // Relative paths in a file are relative to its directory.
  const std::string examples =
      (std::filesystem::absolute(SourceDir()) / "proto/examples").lexically_normal().string();
  EXPECT_EQ(c.model().path(), examples + "/models/all-MiniLM-L6-v2");
  EXPECT_EQ(c.model().architecture(), "bert");
  EXPECT_EQ(c.model().max_seq_len(), 96u);
  EXPECT_EQ(c.lora().rank(), 4u);
  EXPECT_EQ(c.lora().alpha(), 8.0);
  EXPECT_EQ(c.lora().dropout(), 0.1);
  EXPECT_THAT(c.lora().target_modules(), ::testing::ElementsAre("query", "key", "value"));
  EXPECT_EQ(c.task().kind(), v1::TaskConfig::SEQUENCE_CLASSIFICATION);
  EXPECT_THAT(c.task().labels(), ::testing::ElementsAre("fortunes", "literature", "riddles"));
  EXPECT_EQ(c.task().label_field(), "category");
  EXPECT_EQ(c.training().local_work_case(), v1::TrainingConfig::kLocalSteps);
  EXPECT_EQ(c.training().local_steps(), 50u);
  EXPECT_EQ(c.training().batch_size(), 32u);
  EXPECT_EQ(c.training().learning_rate(), 0.001);
  EXPECT_EQ(c.training().optimizer(), v1::TrainingConfig::ADAMW);
  EXPECT_EQ(c.training().weight_decay(), 0.01);
  EXPECT_EQ(c.training().warmup_steps(), 5u);
  EXPECT_EQ(c.training().schedule(), v1::TrainingConfig::COSINE);
  EXPECT_EQ(c.training().grad_accumulation(), 2u);
  EXPECT_EQ(c.selection().clients_per_round(), 8u);
  EXPECT_EQ(c.selection().over_selection(), 1.5);
  EXPECT_EQ(c.selection().min_clients(), 6u);
  EXPECT_EQ(c.selection().round_deadline_seconds(), 300u);
  EXPECT_EQ(c.selection().heartbeat_interval_seconds(), 5u);
  EXPECT_EQ(c.selection().heartbeat_timeout_seconds(), 20u);
  EXPECT_EQ(c.selection().retry_after_seconds(), 3u);
  EXPECT_EQ(c.aggregation().strategy(), AggregationConfig::FEDPROX);
  EXPECT_EQ(c.aggregation().proximal_mu(), 0.05);
  EXPECT_EQ(c.aggregation().average_last_rounds(), 3u);
  ASSERT_EQ(c.codec().stages_size(), 2);
  EXPECT_EQ(c.codec().stages(0).id(), CodecStage::BF16);
  EXPECT_EQ(c.codec().stages(1).zstd().level(), 5);
  EXPECT_FALSE(c.has_privacy());
  EXPECT_EQ(c.data().eval_path(), examples + "/data/fortunes/eval.jsonl");
  EXPECT_EQ(c.data().eval_every_rounds(), 2u);
  EXPECT_EQ(c.server().listen_address(), "127.0.0.1:50061");
  EXPECT_EQ(c.server().store_dir(), "/var/lib/fedlora/fortunes");
  EXPECT_EQ(c.server().chunk_size_bytes(), 262144u);
  EXPECT_EQ(c.server().max_update_bytes(), 67108864u);
  EXPECT_EQ(c.server().max_message_bytes(), 4194304u);
  EXPECT_EQ(c.server().tls().cert_file(), examples + "/certs/server.pem");
  EXPECT_EQ(c.server().tls().crl_file(), examples + "/certs/crl.pem");
  EXPECT_THAT(c.server().tls().allowed_client_ids(), ::testing::ElementsAre("site-a", "site-b"));
  EXPECT_EQ(c.server().max_client_bytes_per_round(), 268435456u);
  EXPECT_EQ(c.server().max_client_uploads_in_flight(), 1u);
  EXPECT_EQ(c.server().max_client_reports_per_round(), 2u);
  EXPECT_EQ(c.server().max_metrics_per_report(), 16u);
  EXPECT_EQ(c.server().min_free_disk_bytes(), 2147483648u);
  EXPECT_EQ(c.simulation().num_clients(), 16u);
  EXPECT_EQ(c.simulation().partition(), v1::SimulationConfig::DIRICHLET);
  EXPECT_EQ(c.simulation().dirichlet_alpha(), 0.3);
  EXPECT_EQ(c.simulation().straggler_delay_seconds(), 2.5);
}

// Every default documented in config.proto, checked on the minimal example file.
TEST(ConfigIoTest, MinimalExampleGetsDocumentedDefaults) {
  absl::StatusOr<RunConfig> loaded = LoadRunConfigFile(ExamplePath("minimal.json"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const RunConfig& c = *loaded;
  EXPECT_EQ(c.run_id(), "default");
  EXPECT_EQ(c.seed(), 0u);
  EXPECT_EQ(c.rounds(), 10u);
  EXPECT_EQ(c.model().id(), "all-MiniLM-L6-v2");  // last component of model.path
  EXPECT_EQ(c.model().max_seq_len(), 128u);
  EXPECT_EQ(c.lora().rank(), 8u);
  EXPECT_EQ(c.lora().alpha(), 16.0);
  EXPECT_EQ(c.lora().dropout(), 0.0);
  EXPECT_THAT(c.lora().target_modules(), ::testing::ElementsAre("query", "value"));
  EXPECT_EQ(c.task().kind(), v1::TaskConfig::SEQUENCE_CLASSIFICATION);
  EXPECT_EQ(c.task().text_field(), "text");
  EXPECT_EQ(c.task().label_field(), "label");
  EXPECT_EQ(c.task().pair_field(), "");
  EXPECT_EQ(c.training().local_work_case(), v1::TrainingConfig::kLocalEpochs);
  EXPECT_EQ(c.training().local_epochs(), 1u);
  EXPECT_EQ(c.training().batch_size(), 16u);
  EXPECT_EQ(c.training().learning_rate(), 5e-4);
  EXPECT_EQ(c.training().optimizer(), v1::TrainingConfig::ADAMW);
  EXPECT_EQ(c.training().schedule(), v1::TrainingConfig::CONSTANT);
  EXPECT_EQ(c.training().grad_clip_norm(), 1.0);
  EXPECT_EQ(c.training().grad_accumulation(), 1u);
  EXPECT_EQ(c.training().adam_beta1(), 0.9);
  EXPECT_EQ(c.training().adam_beta2(), 0.999);
  EXPECT_EQ(c.training().adam_epsilon(), 1e-8);
  EXPECT_EQ(c.selection().clients_per_round(), 10u);
  EXPECT_EQ(c.selection().over_selection(), 1.3);
  EXPECT_EQ(c.selection().min_clients(), 5u);  // half of 10, rounded up
  EXPECT_EQ(c.selection().round_deadline_seconds(), 600u);
  EXPECT_EQ(c.selection().heartbeat_interval_seconds(), 10u);
  EXPECT_EQ(c.selection().heartbeat_timeout_seconds(), 30u);
  EXPECT_EQ(c.selection().retry_after_seconds(), 5u);
  EXPECT_EQ(c.aggregation().strategy(), AggregationConfig::FEDAVG);
  EXPECT_EQ(c.aggregation().proximal_mu(), 0.0);
  EXPECT_EQ(c.aggregation().server_learning_rate(), 1.0);
  // A client's example count is its own claim: without a bound on it, every update weighs the same.
  EXPECT_FALSE(c.aggregation().weight_by_examples());
  EXPECT_EQ(c.aggregation().max_examples_per_client(), 0u);
  EXPECT_EQ(c.aggregation().average_last_rounds(), 0u);
  EXPECT_EQ(c.codec().stages_size(), 0);
  EXPECT_FALSE(
      c.privacy().dp().enabled());  // DP is off by default: none of its defaults are filled
  EXPECT_FALSE(c.privacy().dp().has_clip_norm());
  EXPECT_FALSE(c.privacy().dp().has_target_delta());
  EXPECT_FALSE(c.privacy().secure_aggregation());
  EXPECT_FALSE(c.aggregation().has_trim_fraction());
  EXPECT_FALSE(c.aggregation().has_krum_byzantine_clients());
  EXPECT_EQ(c.data().eval_path(), "");
  EXPECT_EQ(c.data().eval_every_rounds(), 1u);
  EXPECT_EQ(c.data().eval_batch_size(), 64u);
  EXPECT_EQ(c.server().listen_address(), "127.0.0.1:50051");
  EXPECT_EQ(c.server().store_dir(), "fedlora_store");
  EXPECT_EQ(c.server().chunk_size_bytes(), 1u << 20);
  EXPECT_EQ(c.server().max_update_bytes(), 256u << 20);
  EXPECT_EQ(c.server().max_message_bytes(), 8u << 20);
  EXPECT_FALSE(c.server().insecure());
  EXPECT_EQ(c.server().max_client_bytes_per_round(), uint64_t{4} * (256u << 20));
  EXPECT_EQ(c.server().max_client_uploads_in_flight(), 2u);
  EXPECT_EQ(c.server().max_client_reports_per_round(), 4u);
  EXPECT_EQ(c.server().max_metrics_per_report(), 64u);
  EXPECT_EQ(c.server().min_free_disk_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(c.simulation().num_clients(), 10u);
  EXPECT_EQ(c.simulation().partition(), v1::SimulationConfig::IID);
  EXPECT_EQ(c.simulation().dirichlet_alpha(), 0.5);
}

// Hostile input never crashes: every prefix of a valid config, and every single-byte corruption of
// it, gives either an error or a config that passes validation.
TEST(ConfigIoTest, ExampleWeightsFollowTheBoundOnClaimedCounts) {
  absl::StatusOr<RunConfig> bounded = ParseRunConfigJson(
      R"({"model": {"path": "models/m"}, "task": {"labels": ["neg", "pos"]},
          "aggregation": {"max_examples_per_client": 5000}})");
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_TRUE(bounded->aggregation().weight_by_examples());
  EXPECT_EQ(bounded->aggregation().max_examples_per_client(), 5000u);
  absl::StatusOr<RunConfig> unbounded = ParseRunConfigJson(
      R"({"model": {"path": "models/m"}, "task": {"labels": ["neg", "pos"]},
          "aggregation": {"weight_by_examples": true}})");
  EXPECT_TRUE(absl::IsInvalidArgument(unbounded.status())) << unbounded.status();
  EXPECT_THAT(unbounded.status().message(), HasSubstr("needs aggregation.max_examples_per_client"));
}

TEST(ConfigIoTest, CausalLmGetsItsOwnDefaults) {
  absl::StatusOr<RunConfig> c = ParseRunConfigJson(
      R"({"model": {"path": "models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"},
          "task": {"kind": "CAUSAL_LM"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model().id(), "SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(c->model().max_seq_len(), 256u);
  EXPECT_THAT(c->lora().target_modules(),
              ::testing::ElementsAre("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                     "down_proj"));
  EXPECT_EQ(c->task().prompt_field(), "prompt");
  EXPECT_EQ(c->task().response_field(), "response");
  EXPECT_EQ(c->task().text_field(), "");  // classification fields stay unset
  EXPECT_EQ(c->task().label_field(), "");
  EXPECT_FALSE(c->task().exact_match());
  EXPECT_EQ(c->training().learning_rate(), 2e-3);  // the decoders' measured best
  EXPECT_TRUE(ValidateRunConfig(*c).ok());
}

TEST(ConfigIoTest, TruncatedAndCorruptedInputNeverCrashes) {
  std::ifstream in(ExamplePath("full.json"), std::ios::binary);
  std::string full((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(full.size(), 1000u);
  full.erase(full.find_last_of('}') + 1);  // without the trailing newline
  int accepted = 0;
  for (size_t n = 0; n < full.size(); ++n) {
    absl::StatusOr<RunConfig> c = ParseRunConfigJson(std::string_view(full).substr(0, n));
    if (c.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << n;
    }
  }
  EXPECT_EQ(accepted, 0);  // no proper prefix of the document is a complete JSON object
  for (size_t i = 0; i < full.size(); i += 7) {
    for (char replacement : {'\0', '"', '}', '9', '\xff'}) {
      std::string corrupt = full;
      corrupt[i] = replacement;
      absl::StatusOr<RunConfig> c = ParseRunConfigJson(corrupt);
      if (c.ok()) {
        EXPECT_TRUE(ValidateRunConfig(*c).ok());
      } else {
        EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
      }
    }
  }
}

TEST(ConfigIoTest, StrategyAndStageDefaultsDependOnTheirKind) {
  // RANDOMK before BF16 is a valid pipeline; its documented defaults are filled.
  absl::StatusOr<RunConfig> c = RunConfig();
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(R"({
    "model": {"path": "m/"}, "task": {"labels": ["a", "b"]},
    "selection": {"clients_per_round": 7},
    "aggregation": {"strategy": "FEDPROX"},
    "codec": {"stages": [{"id": "RANDOMK"}, {"id": "BF16"}, {"id": "ZSTD"}]}})",
                                                          &*c)
                  .ok());
  ApplyRunConfigDefaults(&*c);
  EXPECT_TRUE(ValidateRunConfig(*c).ok()) << ValidateRunConfig(*c);
  EXPECT_EQ(c->model().id(), "m");                  // trailing slash ignored
  EXPECT_EQ(c->selection().min_clients(), 4u);      // ceil(7 / 2)
  EXPECT_EQ(c->aggregation().proximal_mu(), 0.01);  // FedProx default
  ASSERT_EQ(c->codec().stages_size(), 3);
  for (const CodecStage& stage : c->codec().stages()) EXPECT_EQ(stage.version(), 1u);
  EXPECT_EQ(c->codec().stages(0).random_k().fraction(), 0.01);
  EXPECT_TRUE(c->codec().stages(0).random_k().error_feedback());
  EXPECT_EQ(c->codec().stages(1).params_case(), CodecStage::PARAMS_NOT_SET);
  EXPECT_EQ(c->codec().stages(2).zstd().level(), 3);
}

TEST(ConfigIoTest, TheDownlinkCodecIsCheckedLikeTheUplinksWithoutErrorFeedback) {
  // Defaults fill the downlink's stages too, except error_feedback: the server always carries the
  // downlink's error into the next delta, so the setting does not apply and is refused.
  absl::StatusOr<RunConfig> c = ParseRunConfigJson(R"({
    "model": {"path": "m"}, "task": {"labels": ["a", "b"]},
    "downlink_codec": {"stages": [{"id": "QUANT", "quant": {"bits": 4}}, {"id": "ZSTD"}]}})");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->downlink_codec().stages_size(), 2);
  EXPECT_EQ(c->downlink_codec().stages(0).quant().block_size(), 256u);
  EXPECT_TRUE(c->downlink_codec().stages(0).quant().stochastic());
  EXPECT_FALSE(c->downlink_codec().stages(0).quant().has_error_feedback());
  EXPECT_EQ(c->downlink_codec().stages(1).zstd().level(), 3);

  for (const char* stage : {R"({"id": "TOPK", "top_k": {"error_feedback": true}})",
                            R"({"id": "RANDOMK", "random_k": {"error_feedback": false}})",
                            R"({"id": "QUANT", "quant": {"error_feedback": true}})"}) {
    ExpectInvalid(
        ParseRunConfigJson(absl::StrCat(R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]},
                                                    "downlink_codec": {"stages": [)",
                                        stage, "]}}"))
            .status(),
        "downlink_codec.stages[0] sets error_feedback, which does not apply to the downlink");
  }
  ExpectInvalid(ParseRunConfigJson(R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]},
    "downlink_codec": {"stages": [{"id": "ZSTD"}, {"id": "QUANT"}]}})")
                    .status(),
                "downlink_codec.stages[0].id");
  ExpectInvalid(ParseRunConfigJson(R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]},
    "downlink_codec": {"stages": [{"id": "QUANT", "quant": {"bits": 3}}]}})")
                    .status(),
                "downlink_codec.stages[0].quant.bits");
  absl::StatusOr<RunConfig> lowrank =
      ParseRunConfigJson(R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]},
    "downlink_codec": {"stages": [{"id": "LOWRANK"}, {"id": "BF16"}]}})");
  ASSERT_TRUE(lowrank.ok()) << lowrank.status();
  EXPECT_EQ(lowrank->downlink_codec().stages(0).low_rank().rank(), 4u);
}

TEST(ConfigIoTest, ApplyingDefaultsTwiceChangesNothing) {
  RunConfig once = MinimalConfig();
  RunConfig twice = once;
  ApplyRunConfigDefaults(&twice);
  EXPECT_TRUE(MessageDifferencer::Equals(once, twice));
}

TEST(ConfigIoTest, MalformedJsonIsInvalidArgument) {
  ExpectInvalid(ParseRunConfigJson(R"({"model": {"path": "m"})").status(),
                "line 1, column 24: JSON syntax");
  ExpectInvalid(ParseRunConfigJson("").status(), "the run config is empty");
  ExpectInvalid(ParseRunConfigJson("[1, 2]").status(), "must be a JSON object");
}

TEST(ConfigIoTest, UnknownFieldIsRejectedWithItsName) {
  absl::Status s = ParseRunConfigJson(
                       R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]},
                           "lora": {"rnak": 4}})")
                       .status();
  ExpectInvalid(s, "rnak");
  EXPECT_THAT(std::string(s.message()), HasSubstr("lora"));
}

TEST(ConfigIoTest, WrongTypeIsRejectedWithTheFieldPath) {
  ExpectInvalid(ParseRunConfigJson(R"({"lora": {"rank": "eight"}})").status(), "lora.rank");
  ExpectInvalid(ParseRunConfigJson(R"({"lora": {"rank": -1}})").status(), "lora.rank");
  ExpectInvalid(ParseRunConfigJson(R"({"lora": {"rank": 1.5}})").status(), "lora.rank");
  ExpectInvalid(ParseRunConfigJson(R"({"lora": 5})").status(), "lora");
  ExpectInvalid(ParseRunConfigJson(R"({"training": {"optimizer": "ADAM"}})").status(),
                "training.optimizer");
}

TEST(ConfigIoTest, LocalEpochsAndLocalStepsAreExclusive) {
  ExpectInvalid(
      ParseRunConfigJson(R"({"training": {"local_epochs": 1, "local_steps": 10}})").status(),
      "local_work");
}

// An explicit zero is not "unset": it is validated, not replaced by the default.
TEST(ConfigIoTest, ExplicitZeroIsValidatedNotDefaulted) {
  ExpectInvalid(ParseRunConfigJson(R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]},
                                       "lora": {"rank": 0}})")
                    .status(),
                "lora.rank (0) must be in [1, 4096]");
  ExpectInvalid(ParseRunConfigJson(R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]},
                                       "selection": {"clients_per_round": 10, "min_clients": 12}})")
                    .status(),
                "selection.min_clients (12) exceeds selection.clients_per_round (10)");
}

TEST(ConfigIoTest, ServerBoundsGetDefaultsAndNonsenseIsRefused) {
  absl::StatusOr<RunConfig> c =
      ParseRunConfigJson(R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server().grpc_memory_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(c->server().grpc_max_threads(), 256u);
  EXPECT_EQ(c->server().max_concurrent_streams(), 1000u);
  EXPECT_EQ(c->server().max_client_downloads_in_flight(), 2u);
  absl::Status s = ParseRunConfigJson(R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]},
                                          "server": {"grpc_memory_bytes": 1000, "grpc_max_threads": 0,
                                                     "max_concurrent_streams": 0,
                                                     "max_client_downloads_in_flight": 0}})")
                       .status();
  ExpectInvalid(s, "server.grpc_memory_bytes (1000) must be in [16777216, 68719476736]");
  ExpectInvalid(s, "server.grpc_max_threads (0) must be in [4, 4096]");
  ExpectInvalid(s, "server.max_concurrent_streams (0) must be in [4, 10000]");
  ExpectInvalid(s, "server.max_client_downloads_in_flight (0) must be in [1, 64]");
}

TEST(ConfigIoTest, EveryProblemIsReportedAtOnce) {
  absl::Status s = ParseRunConfigJson(R"({"lora": {"rank": 0}})").status();
  ExpectInvalid(s, "model.path must not be empty");
  ExpectInvalid(s, "lora.rank (0)");
  ExpectInvalid(s, "task.labels has 0 entries, needs at least 2");
}

TEST(ConfigIoTest, DifferentialPrivacyDefaults) {
  absl::StatusOr<RunConfig> c = ParseRunConfigJson(
      R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]}, "selection": {"clients_per_round": 40},
          "privacy": {"dp": {"enabled": true, "clip_norm": 0.5, "noise_multiplier": 1.2,
                             "adaptive_clipping": {"enabled": true}}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  const DifferentialPrivacyConfig& dp = c->privacy().dp();
  EXPECT_EQ(dp.mode(), DifferentialPrivacyConfig::CENTRAL);
  EXPECT_DOUBLE_EQ(dp.target_delta(), 1e-5);
  EXPECT_FALSE(dp.has_max_epsilon());
  EXPECT_FALSE(dp.has_population_size());
  EXPECT_FALSE(c->aggregation().weight_by_examples());  // every update weighs the same under DP
  EXPECT_DOUBLE_EQ(dp.adaptive_clipping().target_quantile(), 0.5);
  EXPECT_DOUBLE_EQ(dp.adaptive_clipping().learning_rate(), 0.2);
  EXPECT_DOUBLE_EQ(dp.adaptive_clipping().count_noise_stddev(), 2.0);  // 40 clients / 20
  RunConfig valid = MinimalConfig();
  EnableDp(valid);
  EXPECT_TRUE(ValidateRunConfig(valid).ok()) << ValidateRunConfig(valid);
}

TEST(ConfigIoTest, SecureAggregationDefaultsToEqualWeights) {
  absl::StatusOr<RunConfig> c = ParseRunConfigJson(
      R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]}, "aggregation": {"max_update_norm": 0.5},
          "privacy": {"secure_aggregation": true}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->aggregation().weight_by_examples());
  // A QUANT stage gets no block size (one scale for the whole update).
  absl::StatusOr<RunConfig> quant = ParseRunConfigJson(
      R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]}, "aggregation": {"max_update_norm": 0.5},
          "codec": {"stages": [{"id": "QUANT", "quant": {"bits": 8}}]}, "privacy": {"secure_aggregation": true}})");
  ASSERT_TRUE(quant.ok()) << quant.status();
  EXPECT_FALSE(quant->codec().stages(0).quant().has_block_size());
  EXPECT_TRUE(quant->codec().stages(0).quant().stochastic());
  RunConfig valid = MinimalConfig();
  EnableSecAgg(valid);
  EXPECT_TRUE(ValidateRunConfig(valid).ok()) << ValidateRunConfig(valid);
  EnableDp(valid);
  valid.mutable_privacy()->mutable_dp()->set_mode(DifferentialPrivacyConfig::DISTRIBUTED);
  valid.mutable_aggregation()->set_max_update_norm(0);
  EXPECT_TRUE(ValidateRunConfig(valid).ok()) << ValidateRunConfig(valid);
}

struct ValidationCase {
  std::string name;
  std::function<void(RunConfig&)> mutate;
  std::string expected;  // fragment of the error message, starting with the field path
};

class ValidationTest : public ::testing::TestWithParam<ValidationCase> {};

TEST_P(ValidationTest, ViolationIsInvalidArgumentNamingTheField) {
  RunConfig config = MinimalConfig();
  ASSERT_TRUE(ValidateRunConfig(config).ok());
  GetParam().mutate(config);
  ExpectInvalid(ValidateRunConfig(config), GetParam().expected);
}

CodecStage Stage(CodecStage::Id id) {
  CodecStage s;
  s.set_id(id);
  s.set_version(1);
  return s;
}

const std::vector<ValidationCase>& Cases() {
  static const auto* cases = new std::vector<ValidationCase>{
      {"RunIdCharset", [](RunConfig& c) { c.set_run_id("a/b"); }, "run_id (\"a/b\")"},
      {"RunIdDotDot", [](RunConfig& c) { c.set_run_id(".."); }, "run_id (\"..\")"},
      {"RoundsZero", [](RunConfig& c) { c.set_rounds(0); }, "rounds (0) must be in [1, 1000000]"},
      {"ModelPathEmpty", [](RunConfig& c) { c.mutable_model()->clear_path(); },
       "model.path must not be empty"},
      {"ModelShaNotHex", [](RunConfig& c) { c.mutable_model()->set_sha256("ABC"); },
       "model.sha256 (\"ABC\") must be 64 lowercase hex"},
      {"MaxSeqLenZero", [](RunConfig& c) { c.mutable_model()->set_max_seq_len(0); },
       "model.max_seq_len (0)"},
      {"LoraRankZero", [](RunConfig& c) { c.mutable_lora()->set_rank(0); }, "lora.rank (0)"},
      {"LoraRankHuge", [](RunConfig& c) { c.mutable_lora()->set_rank(5000); }, "lora.rank (5000)"},
      {"LoraAlphaNegative", [](RunConfig& c) { c.mutable_lora()->set_alpha(-1); },
       "lora.alpha (-1) must be finite and > 0"},
      {"LoraAlphaNan", [](RunConfig& c) { c.mutable_lora()->set_alpha(std::nan("")); },
       "lora.alpha (nan)"},
      {"LoraDropoutOne", [](RunConfig& c) { c.mutable_lora()->set_dropout(1.0); },
       "lora.dropout (1) must be finite and in [0, 1)"},
      {"LoraTargetDuplicate", [](RunConfig& c) { c.mutable_lora()->add_target_modules("query"); },
       "lora.target_modules[2] (\"query\") is a duplicate"},
      {"LoraTargetEmpty", [](RunConfig& c) { c.mutable_lora()->clear_target_modules(); },
       "lora.target_modules has 0 entries"},
      {"TaskOneLabel", [](RunConfig& c) { c.mutable_task()->mutable_labels()->RemoveLast(); },
       "task.labels has 1 entries, needs at least 2"},
      {"TaskDuplicateLabel", [](RunConfig& c) { c.mutable_task()->set_labels(1, "neg"); },
       "task.labels[1] (\"neg\") is a duplicate"},
      {"CausalLmWithLabels",
       [](RunConfig& c) { c.mutable_task()->set_kind(v1::TaskConfig::CAUSAL_LM); },
       "task.labels has 2 entries; CAUSAL_LM takes none"},
      {"PairFieldEqualsTextField", [](RunConfig& c) { c.mutable_task()->set_pair_field("text"); },
       "task.pair_field (\"text\") must differ from task.text_field"},
      {"LocalEpochsZero", [](RunConfig& c) { c.mutable_training()->set_local_epochs(0); },
       "training.local_epochs (0)"},
      {"LocalWorkUnset", [](RunConfig& c) { c.mutable_training()->clear_local_work(); },
       "training.local_epochs or training.local_steps must be set"},
      {"WarmupBeyondSteps",
       [](RunConfig& c) {
         c.mutable_training()->set_local_steps(10);
         c.mutable_training()->set_warmup_steps(11);
       },
       "training.warmup_steps (11) exceeds training.local_steps (10)"},
      {"BatchSizeZero", [](RunConfig& c) { c.mutable_training()->set_batch_size(0); },
       "training.batch_size (0)"},
      {"LearningRateZero", [](RunConfig& c) { c.mutable_training()->set_learning_rate(0); },
       "training.learning_rate (0) must be finite and > 0"},
      {"LearningRateInf", [](RunConfig& c) { c.mutable_training()->set_learning_rate(HUGE_VAL); },
       "training.learning_rate (inf)"},
      {"OptimizerUnknown",
       [](RunConfig& c) {
         c.mutable_training()->set_optimizer(static_cast<v1::TrainingConfig::Optimizer>(17));
       },
       "training.optimizer (17) is not a known optimizer"},
      {"WeightDecayNegative", [](RunConfig& c) { c.mutable_training()->set_weight_decay(-0.1); },
       "training.weight_decay (-0.1)"},
      {"GradClipNegative", [](RunConfig& c) { c.mutable_training()->set_grad_clip_norm(-1); },
       "training.grad_clip_norm (-1)"},
      {"GradAccumulationZero", [](RunConfig& c) { c.mutable_training()->set_grad_accumulation(0); },
       "training.grad_accumulation (0)"},
      {"AdamBeta2One", [](RunConfig& c) { c.mutable_training()->set_adam_beta2(1.0); },
       "training.adam_beta2 (1)"},
      {"ClientsPerRoundZero", [](RunConfig& c) { c.mutable_selection()->set_clients_per_round(0); },
       "selection.clients_per_round (0)"},
      {"OverSelectionBelowOne",
       [](RunConfig& c) { c.mutable_selection()->set_over_selection(0.9); },
       "selection.over_selection (0.9) must be finite and in [1, 10]"},
      {"OverSelectionAboveTen", [](RunConfig& c) { c.mutable_selection()->set_over_selection(11); },
       "selection.over_selection (11)"},
      {"MinClientsZero", [](RunConfig& c) { c.mutable_selection()->set_min_clients(0); },
       "selection.min_clients (0) must be >= 1"},
      {"MinClientsAboveTarget", [](RunConfig& c) { c.mutable_selection()->set_min_clients(11); },
       "selection.min_clients (11) exceeds selection.clients_per_round (10)"},
      {"DeadlineZero", [](RunConfig& c) { c.mutable_selection()->set_round_deadline_seconds(0); },
       "selection.round_deadline_seconds (0)"},
      {"HeartbeatTimeoutNotAboveInterval",
       [](RunConfig& c) { c.mutable_selection()->set_heartbeat_timeout_seconds(10); },
       "selection.heartbeat_timeout_seconds (10) must exceed "
       "selection.heartbeat_interval_seconds (10)"},
      {"RetryAfterZero", [](RunConfig& c) { c.mutable_selection()->set_retry_after_seconds(0); },
       "selection.retry_after_seconds (0)"},
      {"FedProxWithoutMu",
       [](RunConfig& c) { c.mutable_aggregation()->set_strategy(AggregationConfig::FEDPROX); },
       "aggregation.proximal_mu (0) must be > 0 with strategy FEDPROX"},
      {"ProximalMuNegative", [](RunConfig& c) { c.mutable_aggregation()->set_proximal_mu(-1); },
       "aggregation.proximal_mu (-1) must be finite and >= 0"},
      {"ServerLrZero", [](RunConfig& c) { c.mutable_aggregation()->set_server_learning_rate(0); },
       "aggregation.server_learning_rate (0)"},
      {"TrimFractionWithoutTrimmedMean",
       [](RunConfig& c) { c.mutable_aggregation()->set_trim_fraction(0.1); },
       "aggregation.trim_fraction belongs to strategy TRIMMED_MEAN, not FEDAVG"},
      {"KrumFWithoutKrum",
       [](RunConfig& c) { c.mutable_aggregation()->set_krum_byzantine_clients(1); },
       "aggregation.krum_byzantine_clients belongs to strategies KRUM, MULTI_KRUM and BULYAN, "
       "not FEDAVG"},
      {"MultiKrumKeepWithoutMultiKrum",
       [](RunConfig& c) {
         Robust(c, AggregationConfig::KRUM, 5);
         c.mutable_aggregation()->set_krum_byzantine_clients(1);
         c.mutable_aggregation()->set_multi_krum_keep(2);
       },
       "aggregation.multi_krum_keep belongs to strategy MULTI_KRUM, not KRUM"},
      {"TrimmedMeanWithoutFraction",
       [](RunConfig& c) { Robust(c, AggregationConfig::TRIMMED_MEAN, 5); },
       "aggregation.trim_fraction must be set with strategy TRIMMED_MEAN"},
      {"TrimFractionHalf",
       [](RunConfig& c) {
         Robust(c, AggregationConfig::TRIMMED_MEAN, 5);
         c.mutable_aggregation()->set_trim_fraction(0.5);
       },
       "aggregation.trim_fraction (0.5) must be in (0, 0.5)"},
      {"TrimFractionTrimsNothingAtMinClients",
       [](RunConfig& c) {
         Robust(c, AggregationConfig::TRIMMED_MEAN, 4);
         c.mutable_aggregation()->set_trim_fraction(0.2);
       },
       "selection.min_clients (4) trims nothing with aggregation.trim_fraction 0.2"},
      {"KrumWithoutF", [](RunConfig& c) { Robust(c, AggregationConfig::KRUM, 5); },
       "aggregation.krum_byzantine_clients must be set to >= 1 with strategy KRUM"},
      {"KrumBelow2fPlus3",
       [](RunConfig& c) {
         Robust(c, AggregationConfig::KRUM, 4);
         c.mutable_aggregation()->set_krum_byzantine_clients(1);
       },
       "selection.min_clients (4) must be >= 2f + 3 = 5 with strategy KRUM and "
       "aggregation.krum_byzantine_clients 1"},
      {"BulyanBelow4fPlus3",
       [](RunConfig& c) {
         Robust(c, AggregationConfig::BULYAN, 10);
         c.mutable_aggregation()->set_krum_byzantine_clients(2);
       },
       "selection.min_clients (10) must be >= 4f + 3 = 11 with strategy BULYAN"},
      {"MultiKrumKeepTooMany",
       [](RunConfig& c) {
         Robust(c, AggregationConfig::MULTI_KRUM, 5);
         c.mutable_aggregation()->set_krum_byzantine_clients(1);
         c.mutable_aggregation()->set_multi_krum_keep(5);
       },
       "aggregation.multi_krum_keep (5) plus aggregation.krum_byzantine_clients (1) exceeds "
       "selection.min_clients (5)"},
      {"MedianWithSecureAggregation",
       [](RunConfig& c) {
         Robust(c, AggregationConfig::MEDIAN, 5);
         c.mutable_privacy()->set_secure_aggregation(true);
         c.mutable_aggregation()->set_max_update_norm(1);
       },
       "aggregation.strategy MEDIAN needs each client's update, which "
       "privacy.secure_aggregation hides"},
      {"TrimmedMeanWithDp",
       [](RunConfig& c) {
         Robust(c, AggregationConfig::TRIMMED_MEAN, 5);
         c.mutable_aggregation()->set_trim_fraction(0.2);
         EnableDp(c);
       },
       "aggregation.strategy TRIMMED_MEAN with differential privacy"},
      {"MedianWeightedByExamples",
       [](RunConfig& c) {
         Robust(c, AggregationConfig::MEDIAN, 5);
         c.mutable_aggregation()->set_max_examples_per_client(100);
         c.mutable_aggregation()->set_weight_by_examples(true);
       },
       "aggregation.weight_by_examples must be false with strategy MEDIAN"},
      {"CodecStageUnset", [](RunConfig& c) { c.mutable_codec()->add_stages(); },
       "codec.stages[0].id (0) is not a known codec stage"},
      {"CodecVersionUnknown",
       [](RunConfig& c) {
         *c.mutable_codec()->add_stages() = Stage(CodecStage::BF16);
         c.mutable_codec()->mutable_stages(0)->set_version(2);
       },
       "codec.stages[0].version (2) is not a known version"},
      {"CodecZstdNotLast",
       [](RunConfig& c) {
         *c.mutable_codec()->add_stages() = Stage(CodecStage::ZSTD);
         *c.mutable_codec()->add_stages() = Stage(CodecStage::FP16);
         c.mutable_codec()->mutable_stages(0)->mutable_zstd()->set_level(3);
       },
       "codec.stages[0].id (ZSTD) must be the last stage"},
      {"CodecNoneNotAlone",
       [](RunConfig& c) {
         *c.mutable_codec()->add_stages() = Stage(CodecStage::NONE);
         *c.mutable_codec()->add_stages() = Stage(CodecStage::FP16);
       },
       "codec.stages[0].id (NONE) must be the only stage"},
      {"CodecDuplicateStage",
       [](RunConfig& c) {
         *c.mutable_codec()->add_stages() = Stage(CodecStage::FP16);
         *c.mutable_codec()->add_stages() = Stage(CodecStage::FP16);
       },
       "codec.stages[1].id (FP16) appears twice"},
      {"CodecTwoValueEncoders",
       [](RunConfig& c) {
         *c.mutable_codec()->add_stages() = Stage(CodecStage::FP16);
         *c.mutable_codec()->add_stages() = Stage(CodecStage::BF16);
       },
       "codec.stages combine more than one of FP16, BF16 and QUANT"},
      {"CodecParamsMismatch",
       [](RunConfig& c) {
         CodecStage* s = c.mutable_codec()->add_stages();
         *s = Stage(CodecStage::TOPK);
         s->mutable_quant()->set_bits(8);
       },
       "codec.stages[0] has parameters that do not belong to stage TOPK"},
      {"CodecQuantBits",
       [](RunConfig& c) {
         CodecStage* s = c.mutable_codec()->add_stages();
         *s = Stage(CodecStage::QUANT);
         s->mutable_quant()->set_bits(3);
         s->mutable_quant()->set_block_size(64);
       },
       "codec.stages[0].quant.bits (3) must be 1, 2, 4 or 8"},
      {"CodecQuantBlockNotAMultipleOf8",
       [](RunConfig& c) {
         CodecStage* s = c.mutable_codec()->add_stages();
         *s = Stage(CodecStage::QUANT);
         s->mutable_quant()->set_bits(8);
         s->mutable_quant()->set_block_size(100);
       },
       "codec.stages[0].quant.block_size (100) must be a multiple of 8"},
      {"CodecSparsifierAfterTheValueEncoding",
       [](RunConfig& c) {
         *c.mutable_codec()->add_stages() = Stage(CodecStage::BF16);
         *c.mutable_codec()->add_stages() = Stage(CodecStage::TOPK);
       },
       "codec.stages[1].id (TOPK) must come before FP16, BF16 or QUANT"},
      {"CodecTopKFractionZero",
       [](RunConfig& c) {
         CodecStage* s = c.mutable_codec()->add_stages();
         *s = Stage(CodecStage::TOPK);
         s->mutable_top_k()->set_fraction(0);
       },
       "codec.stages[0].top_k.fraction (0) must be finite and in (0, 1]"},
      {"CodecZstdLevel",
       [](RunConfig& c) {
         CodecStage* s = c.mutable_codec()->add_stages();
         *s = Stage(CodecStage::ZSTD);
         s->mutable_zstd()->set_level(23);
       },
       "codec.stages[0].zstd.level (23)"},
      {"DpWithoutClipNorm",
       [](RunConfig& c) {
         c.mutable_privacy()->mutable_dp()->set_enabled(true);
         c.mutable_privacy()->mutable_dp()->set_noise_multiplier(1);
       },
       "privacy.dp.clip_norm is required with differential privacy"},
      {"DpWithoutNoise",
       [](RunConfig& c) {
         c.mutable_privacy()->mutable_dp()->set_enabled(true);
         c.mutable_privacy()->mutable_dp()->set_clip_norm(1);
       },
       "privacy.dp.noise_multiplier is required with differential privacy"},
      {"DpSettingsWhileOff",
       [](RunConfig& c) { c.mutable_privacy()->mutable_dp()->set_clip_norm(1); },
       "privacy.dp settings are given but privacy.dp.enabled is false"},
      {"DpNegativeClip",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_privacy()->mutable_dp()->set_clip_norm(-1);
       },
       "privacy.dp.clip_norm (-1) must be finite and > 0"},
      {"DpDelta",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_privacy()->mutable_dp()->set_target_delta(0.5);
       },
       "privacy.dp.target_delta (0.5) must be finite and in (0, 0.1]"},
      {"WeightByExamplesWithoutABound",
       [](RunConfig& c) { c.mutable_aggregation()->set_weight_by_examples(true); },
       "aggregation.weight_by_examples needs aggregation.max_examples_per_client"},
      {"MaxExamplesAboveTheWeightLimit",
       [](RunConfig& c) {
         c.mutable_aggregation()->set_max_examples_per_client((uint64_t{1} << 32) + 1);
       },
       "aggregation.max_examples_per_client (4294967297) must be at most 2^32"},
      {"DpWeightedByExamples",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_aggregation()->set_weight_by_examples(true);
       },
       "aggregation.weight_by_examples must be false with differential privacy"},
      {"DpAndMaxUpdateNorm",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_aggregation()->set_max_update_norm(2);
       },
       "aggregation.max_update_norm is replaced by privacy.dp.clip_norm"},
      {"DpPopulationSize",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_privacy()->mutable_dp()->set_population_size(1000);
       },
       "privacy.dp.population_size is refused: the server selects the first clients that ask"},
      {"DpCountNoiseTooSmall",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_privacy()->mutable_dp()->set_noise_multiplier(4);
         c.mutable_privacy()->mutable_dp()->mutable_adaptive_clipping()->set_enabled(true);
         c.mutable_privacy()->mutable_dp()->mutable_adaptive_clipping()->set_count_noise_stddev(2);
       },
       "privacy.dp.adaptive_clipping.count_noise_stddev (2) must be finite and > noise_multiplier "
       "/ 2 (2)"},
      {"DpAdaptiveSettingsWhileOff",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_privacy()->mutable_dp()->mutable_adaptive_clipping()->set_target_quantile(0.9);
       },
       "privacy.dp.adaptive_clipping settings are given but adaptive_clipping.enabled is false"},
      {"DpDistributed",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_privacy()->mutable_dp()->set_mode(DifferentialPrivacyConfig::DISTRIBUTED);
       },
       "privacy.dp.mode DISTRIBUTED needs privacy.secure_aggregation"},
      {"SecAggWithACodec",
       [](RunConfig& c) {
         EnableSecAgg(c);
         *c.mutable_codec()->add_stages() = Stage(CodecStage::ZSTD);
       },
       "codec with privacy.secure_aggregation takes no stage but QUANT"},
      {"SecAggQuantWithBlocks",
       [](RunConfig& c) {
         EnableSecAgg(c);
         CodecStage* s = c.mutable_codec()->add_stages();
         *s = Stage(CodecStage::QUANT);
         s->mutable_quant()->set_bits(8);
         s->mutable_quant()->set_stochastic(true);
         s->mutable_quant()->set_block_size(256);
       },
       "codec.stages[0].quant.block_size does not apply with privacy.secure_aggregation"},
      {"SecAggQuantNearest",
       [](RunConfig& c) {
         EnableSecAgg(c);
         CodecStage* s = c.mutable_codec()->add_stages();
         *s = Stage(CodecStage::QUANT);
         s->mutable_quant()->set_bits(8);
         s->mutable_quant()->set_stochastic(false);
       },
       "codec.stages[0].quant.stochastic must be true with privacy.secure_aggregation"},
      {"SecAggQuantOneBit",
       [](RunConfig& c) {
         EnableSecAgg(c);
         CodecStage* s = c.mutable_codec()->add_stages();
         *s = Stage(CodecStage::QUANT);
         s->mutable_quant()->set_bits(1);
         s->mutable_quant()->set_stochastic(true);
       },
       "codec.stages[0].quant.bits (1) must be 2, 4 or 8 with privacy.secure_aggregation"},
      {"SecAggWithoutABound",
       [](RunConfig& c) {
         EnableSecAgg(c);
         c.mutable_aggregation()->set_max_update_norm(0);
       },
       "privacy.secure_aggregation needs a bound on every update"},
      {"SecAggWeighted",
       [](RunConfig& c) {
         EnableSecAgg(c);
         c.mutable_aggregation()->set_weight_by_examples(true);
       },
       "aggregation.weight_by_examples must be false with privacy.secure_aggregation"},
      {"SecAggTwoClients",
       [](RunConfig& c) {
         EnableSecAgg(c);
         c.mutable_selection()->set_min_clients(2);
       },
       "selection.min_clients (2) must be >= 3 with privacy.secure_aggregation"},
      {"SecAggAdaptiveClipping",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_privacy()->set_secure_aggregation(true);
         auto* ac = c.mutable_privacy()->mutable_dp()->mutable_adaptive_clipping();
         ac->set_enabled(true);
         ac->set_target_quantile(0.5);
         ac->set_learning_rate(0.2);
         ac->set_count_noise_stddev(1);
       },
       "privacy.dp.adaptive_clipping with privacy.secure_aggregation is not implemented yet"},
      {"DpLocal",
       [](RunConfig& c) {
         EnableDp(c);
         c.mutable_privacy()->mutable_dp()->set_mode(DifferentialPrivacyConfig::LOCAL);
       },
       "privacy.dp.mode LOCAL is not implemented yet"},
      {"CausalLmGpt2",
       [](RunConfig& c) {
         MakeCausalLm(c);
         c.mutable_model()->set_architecture("gpt2");
       },
       "model.architecture \"gpt2\" for CAUSAL_LM is not implemented yet"},
      {"CausalLmLogitAdjustment",
       [](RunConfig& c) {
         MakeCausalLm(c);
         c.mutable_training()->set_logit_adjustment(1.0);
       },
       "training.logit_adjustment for CAUSAL_LM is not implemented yet"},
      {"CausalLmTextField",
       [](RunConfig& c) {
         MakeCausalLm(c);
         c.mutable_task()->set_text_field("text");
       },
       "task.text_field belongs to SEQUENCE_CLASSIFICATION"},
      {"CausalLmSameFields",
       [](RunConfig& c) {
         MakeCausalLm(c);
         c.mutable_task()->set_response_field("prompt");
       },
       "task.response_field (\"prompt\") must differ from task.prompt_field"},
      {"CausalLmNoPromptField",
       [](RunConfig& c) {
         MakeCausalLm(c);
         c.mutable_task()->clear_prompt_field();
       },
       "task.prompt_field must not be empty"},
      {"CausalLmByLabel",
       [](RunConfig& c) {
         MakeCausalLm(c);
         c.mutable_simulation()->set_partition(v1::SimulationConfig::DIRICHLET);
       },
       "simulation.partition DIRICHLET splits by label and CAUSAL_LM has none"},
      {"ClassifierExactMatch", [](RunConfig& c) { c.mutable_task()->set_exact_match(true); },
       "task.exact_match belongs to CAUSAL_LM"},
      {"ClassifierChatTemplate",
       [](RunConfig& c) { c.mutable_task()->set_chat_template("chatml"); },
       "task.chat_template belongs to CAUSAL_LM"},
      {"Int8PrecisionForAnEncoder",
       [](RunConfig& c) { c.mutable_model()->set_precision(v1::ModelConfig::INT8); },
       "model.precision INT8 applies to decoder models (task.kind CAUSAL_LM)"},
      {"DecoderArchitecture", [](RunConfig& c) { c.mutable_model()->set_architecture("llama"); },
       "model.architecture \"llama\" is not implemented yet"},
      {"LowRankRank",
       [](RunConfig& c) {
         CodecStage s = Stage(CodecStage::LOWRANK);
         s.mutable_low_rank()->set_rank(5000);
         *c.mutable_codec()->add_stages() = s;
       },
       "codec.stages[0].low_rank.rank"},
      {"LogitAdjustmentNegative",
       [](RunConfig& c) { c.mutable_training()->set_logit_adjustment(-0.5); },
       "training.logit_adjustment (-0.5) must be finite and in [0, 10]"},
      {"LogitAdjustmentNaN",
       [](RunConfig& c) { c.mutable_training()->set_logit_adjustment(std::nan("")); },
       "training.logit_adjustment (nan)"},
      {"MomentumOne", [](RunConfig& c) { c.mutable_aggregation()->set_server_momentum(1.0); },
       "aggregation.server_momentum (1)"},
      {"MomentumWithAdam",
       [](RunConfig& c) {
         c.mutable_aggregation()->set_strategy(AggregationConfig::FEDADAM);
         c.mutable_aggregation()->set_server_momentum(0.9);
       },
       "aggregation.server_momentum (0.9) applies to FEDAVG and FEDPROX only, not FEDADAM"},
      {"AverageMoreRoundsThanTheRun",
       [](RunConfig& c) {
         c.set_rounds(5);
         c.mutable_aggregation()->set_average_last_rounds(6);
       },
       "aggregation.average_last_rounds (6) exceeds the run's rounds (5)"},
      {"CrashProbability", [](RunConfig& c) { c.mutable_simulation()->set_crash_probability(1.5); },
       "simulation.crash_probability (1.5)"},
      {"ShardsZero", [](RunConfig& c) { c.mutable_simulation()->set_shards_per_client(0); },
       "simulation.shards_per_client (0)"},
      {"EvalEveryZero", [](RunConfig& c) { c.mutable_data()->set_eval_every_rounds(0); },
       "data.eval_every_rounds (0)"},
      {"ChunkTooSmall", [](RunConfig& c) { c.mutable_server()->set_chunk_size_bytes(4095); },
       "server.chunk_size_bytes (4095) must be in [4096, 67108864]"},
      {"ChunkTooLarge",
       [](RunConfig& c) { c.mutable_server()->set_chunk_size_bytes((64u << 20) + 1); },
       "server.chunk_size_bytes (67108865)"},
      {"MaxUpdateBelowChunk", [](RunConfig& c) { c.mutable_server()->set_max_update_bytes(1000); },
       "server.max_update_bytes (1000) is less than server.chunk_size_bytes (1048576)"},
      {"MaxMessageBelowChunk",
       [](RunConfig& c) { c.mutable_server()->set_max_message_bytes(1u << 20); },
       "server.max_message_bytes (1048576) must be in [server.chunk_size_bytes + 65536"},
      {"StoreDirEmpty", [](RunConfig& c) { c.mutable_server()->clear_store_dir(); },
       "server.store_dir must not be empty"},
      {"ListenNoHost", [](RunConfig& c) { c.mutable_server()->set_listen_address(":50051"); },
       "server.listen_address (\":50051\") must be host:port"},
      {"ListenNoPort", [](RunConfig& c) { c.mutable_server()->set_listen_address("127.0.0.1"); },
       "server.listen_address (\"127.0.0.1\")"},
      {"ListenPortTooBig",
       [](RunConfig& c) { c.mutable_server()->set_listen_address("127.0.0.1:65536"); },
       "server.listen_address (\"127.0.0.1:65536\")"},
      {"ListenUnbracketedV6",
       [](RunConfig& c) { c.mutable_server()->set_listen_address("::1:50051"); },
       "server.listen_address (\"::1:50051\")"},
      {"ListenWildcardWithoutTls",
       [](RunConfig& c) { c.mutable_server()->set_listen_address("0.0.0.0:50051"); },
       "server.listen_address (\"0.0.0.0:50051\") is not a loopback address and needs "
       "server.tls.cert_file"},
      {"ListenLookalikeLoopback",
       [](RunConfig& c) { c.mutable_server()->set_listen_address("127.0.0.1.example.com:1"); },
       "is not a loopback address"},
      {"TlsKeyWithoutCert",
       [](RunConfig& c) { c.mutable_server()->mutable_tls()->set_key_file("k"); },
       "server.tls needs cert_file, key_file and client_ca_file together"},
      {"TlsCaWithoutCert",
       [](RunConfig& c) { c.mutable_server()->mutable_tls()->set_client_ca_file("ca.pem"); },
       "server.tls needs cert_file, key_file and client_ca_file together"},
      {"ServerOnlyTls",
       [](RunConfig& c) {
         c.mutable_server()->mutable_tls()->set_cert_file("s.pem");
         c.mutable_server()->mutable_tls()->set_key_file("s.key");
       },
       "server-only TLS, with self-named clients, is not supported"},
      {"CrlWithoutTls",
       [](RunConfig& c) { c.mutable_server()->mutable_tls()->set_crl_file("crl.pem"); },
       "server.tls.crl_file, allowed_client_ids and operator_ids need server.tls"},
      {"OperatorsWithoutTls",
       [](RunConfig& c) { c.mutable_server()->mutable_tls()->add_operator_ids("ops"); },
       "without TLS no caller has a certificate"},
      {"BadOperatorId",
       [](RunConfig& c) {
         c.mutable_server()->mutable_tls()->set_cert_file("s.pem");
         c.mutable_server()->mutable_tls()->set_key_file("s.key");
         c.mutable_server()->mutable_tls()->set_client_ca_file("ca.pem");
         c.mutable_server()->mutable_tls()->add_operator_ids("no spaces");
       },
       "server.tls.operator_ids[0] (\"no spaces\") must be 1-128 characters"},
      {"InsecureWithTls",
       [](RunConfig& c) {
         c.mutable_server()->set_insecure(true);
         c.mutable_server()->mutable_tls()->set_cert_file("s.pem");
         c.mutable_server()->mutable_tls()->set_key_file("s.key");
         c.mutable_server()->mutable_tls()->set_client_ca_file("ca.pem");
       },
       "server.insecure and server.tls exclude each other"},
      {"InsecureOnWildcard",
       [](RunConfig& c) {
         c.mutable_server()->set_insecure(true);
         c.mutable_server()->set_listen_address("0.0.0.0:50051");
       },
       "is not a loopback address and needs server.tls.cert_file"},
      {"BadAllowedClient",
       [](RunConfig& c) {
         c.mutable_server()->mutable_tls()->set_cert_file("s.pem");
         c.mutable_server()->mutable_tls()->set_key_file("s.key");
         c.mutable_server()->mutable_tls()->set_client_ca_file("ca.pem");
         c.mutable_server()->mutable_tls()->add_allowed_client_ids("site a");
       },
       "server.tls.allowed_client_ids[0] (\"site a\") must be 1-128 characters"},
      {"ClientBytesBelowUpdate",
       [](RunConfig& c) { c.mutable_server()->set_max_client_bytes_per_round(1 << 20); },
       "server.max_client_bytes_per_round (1048576) is less than server.max_update_bytes"},
      {"UploadsInFlightZero",
       [](RunConfig& c) { c.mutable_server()->set_max_client_uploads_in_flight(0); },
       "server.max_client_uploads_in_flight (0)"},
      {"RetainRoundsTooMany",
       [](RunConfig& c) { c.mutable_server()->set_retain_rounds(2'000'000); },
       "server.retain_rounds (2000000) must be in [0, 1000000]"},
      {"ReportsPerRoundZero",
       [](RunConfig& c) { c.mutable_server()->set_max_client_reports_per_round(0); },
       "server.max_client_reports_per_round (0)"},
      {"MetricsAddressBad", [](RunConfig& c) { c.mutable_server()->set_metrics_address("9464"); },
       "server.metrics_address (\"9464\")"},
      {"HealthAddressBad", [](RunConfig& c) { c.mutable_server()->set_health_address("0.0.0.0"); },
       "server.health_address (\"0.0.0.0\") must be host:port"},
      {"HealthAddressIsTheListenAddress",
       [](RunConfig& c) {
         c.mutable_server()->set_listen_address("127.0.0.1:50051");
         c.mutable_server()->set_health_address("127.0.0.1:50051");
       },
       "server.health_address (\"127.0.0.1:50051\") must differ from server.listen_address"},
      {"SimNoClients", [](RunConfig& c) { c.mutable_simulation()->set_num_clients(0); },
       "simulation.num_clients (0)"},
      {"SimByKeyWithoutField",
       [](RunConfig& c) { c.mutable_simulation()->set_partition(v1::SimulationConfig::BY_KEY); },
       "simulation.partition_key_field must be set with partition BY_KEY"},
      {"SimMaliciousAboveNumClients",
       [](RunConfig& c) {
         c.mutable_simulation()->set_malicious_clients(11);
         c.mutable_simulation()->mutable_attack()->set_kind(v1::SimulationAttack::SCALE);
       },
       "simulation.malicious_clients (11) exceeds simulation.num_clients (10)"},
      {"SimMaliciousWithoutAttack",
       [](RunConfig& c) { c.mutable_simulation()->set_malicious_clients(1); },
       "simulation.attack.kind must be set with simulation.malicious_clients > 0"},
      {"SimAttackWithoutMalicious",
       [](RunConfig& c) {
         c.mutable_simulation()->mutable_attack()->set_kind(v1::SimulationAttack::SIGN_FLIP);
       },
       "simulation.attack is set but simulation.malicious_clients is 0"},
      {"SimAttackScaleZero",
       [](RunConfig& c) {
         c.mutable_simulation()->set_malicious_clients(1);
         c.mutable_simulation()->mutable_attack()->set_kind(v1::SimulationAttack::GAUSSIAN);
         c.mutable_simulation()->mutable_attack()->set_scale(0);
       },
       "simulation.attack.scale (0) must be finite and > 0"},
      {"SimMinMaxWithScale",
       [](RunConfig& c) {
         c.mutable_simulation()->set_malicious_clients(1);
         c.mutable_simulation()->mutable_attack()->set_kind(v1::SimulationAttack::MIN_MAX);
         c.mutable_simulation()->mutable_attack()->set_scale(2);
       },
       "simulation.attack.scale is not used by MIN_MAX"},
      {"SimDropoutAboveOne",
       [](RunConfig& c) { c.mutable_simulation()->set_dropout_probability(1.5); },
       "simulation.dropout_probability (1.5)"},
  };
  return *cases;
}

INSTANTIATE_TEST_SUITE_P(AllRules, ValidationTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// Every config the repository ships loads and validates: configs/, the compose federation's, and
// the one embedded in the Kubernetes ConfigMap (the block under "run.json: |").
TEST(ConfigIoTest, ShippedConfigsValidate) {
  std::vector<std::string> files = {"/deploy/compose/run.json"};
  for (const auto& entry : std::filesystem::directory_iterator(SourceDir() + "/configs")) {
    if (entry.path().extension() == ".json")
      files.push_back("/configs/" + entry.path().filename().string());
  }
  ASSERT_GE(files.size(), 5u);
  // configs/ is run from anywhere (`fedlora simulate --config configs/default.json` from the
  // repository's root): its relative paths, relative to configs/, must land in the repository's
  // models/, data/ and runs/.
  std::string root = std::filesystem::absolute(SourceDir()).lexically_normal().string();
  if (root.ends_with("/")) root.pop_back();  // "." under Bazel gives ".../"
  for (const std::string& f : files) {
    auto loaded = fedlora::LoadRunConfigFile(SourceDir() + f);
    EXPECT_TRUE(loaded.ok()) << f << ": " << loaded.status();
    if (!loaded.ok() || !f.starts_with("/configs/")) continue;
    for (const std::string* path : {&loaded->model().path(), &loaded->data().train_path(),
                                    &loaded->data().eval_path(), &loaded->server().store_dir()}) {
      if (path->empty() || *path == "fedlora_store") continue;
      EXPECT_TRUE(path->starts_with(root + "/models/") || path->starts_with(root + "/data/") ||
                  path->starts_with(root + "/runs/"))
          << f << ": " << *path;
    }
  }
  std::ifstream configmap(SourceDir() + "/deploy/k8s/configmap.yaml");
  ASSERT_TRUE(configmap.good());
  std::string line, json;
  bool in_block = false;
  while (std::getline(configmap, line)) {
    if (line == "  run.json: |") {
      in_block = true;
    } else if (in_block) {
      if (!line.empty() && !line.starts_with("    ")) break;
      json += line.empty() ? "" : line.substr(4);
      json += "\n";
    }
  }
  ASSERT_FALSE(json.empty()) << "no run.json block in deploy/k8s/configmap.yaml";
  auto k8s = fedlora::ParseRunConfigJson(json);
  ASSERT_TRUE(k8s.ok()) << k8s.status();
  EXPECT_EQ(k8s->server().health_address(), "0.0.0.0:8081");  // the probes' port
}

TEST(ConfigIoTest, ListenAddressesThatAreAccepted) {
  for (const char* address : {"127.0.0.1:50051", "127.0.0.1:0", "127.3.2.1:1", "localhost:8080",
                              "LOCALHOST:8080", "[::1]:50051"}) {
    RunConfig c = MinimalConfig();
    c.mutable_server()->set_listen_address(address);
    EXPECT_TRUE(ValidateRunConfig(c).ok()) << address << ": " << ValidateRunConfig(c);
  }
  for (const char* address : {"0.0.0.0:50051", "[::]:50051", "10.1.2.3:443", "server.example:1"}) {
    RunConfig c = MinimalConfig();
    c.mutable_server()->set_listen_address(address);
    c.mutable_server()->mutable_tls()->set_cert_file("server.pem");
    c.mutable_server()->mutable_tls()->set_key_file("server.key");
    c.mutable_server()->mutable_tls()->set_client_ca_file("ca.pem");
    EXPECT_TRUE(ValidateRunConfig(c).ok()) << address << ": " << ValidateRunConfig(c);
  }
}

TEST(ConfigIoTest, JsonRoundTripGivesAnEqualMessage) {
  for (const char* name : {"full.json", "minimal.json"}) {
    absl::StatusOr<RunConfig> loaded = LoadRunConfigFile(ExamplePath(name));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    std::string json = RunConfigToJson(*loaded);
    absl::StatusOr<RunConfig> reparsed = ParseRunConfigJson(json);
    ASSERT_TRUE(reparsed.ok()) << name << ": " << reparsed.status() << "\n" << json;
    std::string diff;
    MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&diff);
    EXPECT_TRUE(differencer.Compare(*loaded, *reparsed)) << name << ": " << diff;
    // Printed with the proto field names users write, and every field present.
    EXPECT_THAT(json, HasSubstr("\"clients_per_round\": "));
    EXPECT_THAT(json, HasSubstr("\"weight_decay\""));
  }
}

TEST(ConfigIoTest, RedactionRemovesServerOnlyParts) {
  absl::StatusOr<RunConfig> full = LoadRunConfigFile(ExamplePath("full.json"));
  ASSERT_TRUE(full.ok()) << full.status();
  RunConfig redacted = RedactRunConfigForClients(*full);
  EXPECT_EQ(redacted.model().path(), "");
  EXPECT_EQ(redacted.model().id(), "all-MiniLM-L6-v2");
  EXPECT_FALSE(redacted.has_server());
  EXPECT_FALSE(redacted.has_data());
  EXPECT_FALSE(redacted.has_simulation());
  EXPECT_TRUE(MessageDifferencer::Equals(redacted.lora(), full->lora()));
  EXPECT_TRUE(MessageDifferencer::Equals(redacted.codec(), full->codec()));
  EXPECT_TRUE(MessageDifferencer::Equals(redacted.privacy(), full->privacy()));
  EXPECT_TRUE(MessageDifferencer::Equals(redacted.training(), full->training()));
}

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("proto_config_io_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigFileTest, MissingFileIsNotFoundNamingThePath) {
  std::string path = (dir_ / "absent.json").string();
  absl::Status s = LoadRunConfigFile(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
}

TEST_F(ConfigFileTest, DirectoryIsInvalidArgument) {
  ExpectInvalid(LoadRunConfigFile(dir_.string()).status(), "not a regular file");
}

TEST_F(ConfigFileTest, ParseErrorNamesThePathLineColumnAndField) {
  std::string path = Write("bad.json", R"({"lora": {"rank": "eight"}})");
  absl::Status s = LoadRunConfigFile(path).status();
  ExpectInvalid(s, path + ":1:11: lora.rank must be a whole number");
  ExpectInvalid(s, "eight");
}

TEST_F(ConfigFileTest, ValidationErrorNamesThePathAndTheField) {
  std::string path = Write("rank0.json", R"({"model": {"path": "m"}, "task": {"labels": ["a", "b"]},
                                             "lora": {"rank": 0}})");
  ExpectInvalid(LoadRunConfigFile(path).status(), path + ": lora.rank (0)");
}

}  // namespace
}  // namespace fedlora
