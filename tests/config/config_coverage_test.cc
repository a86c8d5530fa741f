// Every field and enum value of fedlora.v1.RunConfig is either carried out, and then a named test
// exercises it, or refused by config validation as not implemented yet. The walk goes over the
// message descriptors, so a field added to config.proto fails this test until it is one or the
// other: no setting is accepted and silently ignored. (When a change implements a refused setting,
// it moves the entry from kRefused to kExercised and adds the test.)
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config/config_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;
using ::testing::HasSubstr;
using v1::RunConfig;

// Paths of every leaf field ("server.tls.crl_file"), and of every enum value but *_UNSPECIFIED
// ("aggregation.strategy=KRUM"); repeated message fields walk their element type.
void Walk(const Descriptor* d, const std::string& prefix, std::vector<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string path = prefix + f->name();
    if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      Walk(f->message_type(), path + ".", out);
      continue;
    }
    out->push_back(path);
    if (f->type() == FieldDescriptor::TYPE_ENUM) {
      for (int v = 0; v < f->enum_type()->value_count(); ++v) {
        const std::string& name = f->enum_type()->value(v)->name();
        if (name.size() < 12 || name.substr(name.size() - 11) != "UNSPECIFIED")
          out->push_back(path + "=" + name);
      }
    }
  }
}

// Carried out: the test file (under tests/) that exercises the setting, and a string of that test
// which shows it does.
struct Exercised {
  const char* file;
  const char* needle;
};

const std::map<std::string, Exercised>& ExercisedSettings() {
  static const auto* m = new std::map<std::string, Exercised>{
      {"run_id", {"server/store_test.cc", "run_id"}},
      {"seed", {"sim/simulator_test.cc", "SameConfigAndSeedGiveTheSameFinalAdapter"}},
      {"model.id", {"server/cli_federation_test.cc", "\"model\""}},
      {"model.path", {"server/cli_federation_test.cc", "\"path\""}},
      {"model.sha256", {"train/train_config_test.cc", "VerifyModelCheckpoint"}},
      {"model.architecture", {"train/train_config_test.cc", "set_architecture"}},
      {"model.max_seq_len", {"server/cli_federation_test.cc", "max_seq_len"}},
      {"model.precision",
       {"train/train_config_test.cc", "PrecisionBf16HoldsAndMultipliesTheBaseInBf16"}},
      {"model.precision=FP32", {"train/train_config_test.cc", "v1::ModelConfig::FP32"}},
      {"model.precision=BF16", {"train/train_config_test.cc", "v1::ModelConfig::BF16"}},
      {"model.precision=INT8", {"train/train_config_test.cc", "v1::ModelConfig::INT8"}},
      {"lora.rank", {"train/train_config_test.cc", "rank"}},
      {"lora.alpha", {"train/train_config_test.cc", "alpha"}},
      {"lora.dropout", {"train/train_config_test.cc", "dropout"}},
      {"lora.target_modules", {"train/train_config_test.cc", "target_modules"}},
      {"lora.freeze_a", {"server/freeze_a_test.cc", "set_freeze_a"}},
      {"task.kind", {"server/cli_federation_test.cc", "\"labels\""}},
      {"task.kind=SEQUENCE_CLASSIFICATION", {"server/cli_federation_test.cc", "\"labels\""}},
      {"task.labels", {"server/cli_federation_test.cc", "\"labels\""}},
      {"task.text_field", {"train/train_config_test.cc", "text_field"}},
      {"task.pair_field", {"train/train_config_test.cc", "pair_field"}},
      {"task.label_field", {"train/train_config_test.cc", "label_field"}},
      {"task.kind=CAUSAL_LM", {"sim/simulator_test.cc", "CAUSAL_LM"}},
      {"task.prompt_field", {"sim/simulator_test.cc", "prompt_field"}},
      {"task.response_field", {"sim/simulator_test.cc", "response_field"}},
      {"task.system_prompt", {"sim/simulator_test.cc", "system_prompt"}},
      {"task.chat_template", {"sim/simulator_test.cc", "chat_template"}},
      {"task.exact_match", {"sim/simulator_test.cc", "exact_match"}},
      {"training.local_epochs", {"sim/simulator_test.cc", "local_epochs"}},
      {"training.local_steps", {"server/cli_federation_test.cc", "local_steps"}},
      {"training.batch_size", {"server/cli_federation_test.cc", "batch_size"}},
      {"training.learning_rate", {"server/cli_federation_test.cc", "learning_rate"}},
      {"training.optimizer", {"train/train_config_test.cc", "optimizer"}},
      {"training.optimizer=ADAMW", {"train/train_config_test.cc", "ADAMW"}},
      {"training.optimizer=LAMB", {"train/train_config_test.cc", "LAMB"}},
      {"training.optimizer=SGD", {"train/train_config_test.cc", "SGD"}},
      {"training.weight_decay", {"train/train_config_test.cc", "weight_decay"}},
      {"training.warmup_steps", {"train/train_config_test.cc", "warmup_steps"}},
      {"training.schedule", {"train/train_config_test.cc", "schedule"}},
      {"training.schedule=CONSTANT", {"train/train_config_test.cc", "CONSTANT"}},
      {"training.schedule=LINEAR", {"train/train_config_test.cc", "LINEAR"}},
      {"training.schedule=COSINE", {"train/train_config_test.cc", "COSINE"}},
      {"training.grad_clip_norm", {"train/train_config_test.cc", "grad_clip_norm"}},
      {"training.grad_accumulation", {"train/train_config_test.cc", "grad_accumulation"}},
      {"training.adam_beta1", {"train/train_config_test.cc", "adam_beta1"}},
      {"training.adam_beta2", {"train/train_config_test.cc", "adam_beta2"}},
      {"training.adam_epsilon", {"train/train_config_test.cc", "adam_epsilon"}},
      {"training.momentum", {"train/train_config_test.cc", "momentum"}},
      {"training.round_schedule", {"server/federation_e2e_test.cc", "set_round_schedule"}},
      {"training.round_schedule=CONSTANT", {"server/federation_e2e_test.cc", "round_schedule"}},
      {"training.round_schedule=LINEAR", {"server/federation_e2e_test.cc", "round_schedule"}},
      {"training.round_schedule=COSINE",
       {"server/federation_e2e_test.cc", "set_round_schedule(v1::TrainingConfig::COSINE)"}},
      {"training.logit_adjustment", {"sim/simulator_test.cc", "logit_adjustment"}},
      {"selection.clients_per_round", {"server/cli_federation_test.cc", "clients_per_round"}},
      {"selection.over_selection", {"server/upload_protocol_test.cc", "over_selection"}},
      {"selection.min_clients", {"server/upload_protocol_test.cc", "min_clients"}},
      {"selection.round_deadline_seconds", {"sim/simulator_test.cc", "round_deadline_seconds"}},
      {"selection.heartbeat_interval_seconds",
       {"server/cli_federation_test.cc", "heartbeat_interval_seconds"}},
      {"selection.heartbeat_timeout_seconds",
       {"sim/simulator_test.cc", "heartbeat_timeout_seconds"}},
      {"selection.retry_after_seconds", {"server/upload_protocol_test.cc", "retry_after_seconds"}},
      {"aggregation.strategy", {"server/crash_recovery_test.cc", "strategy"}},
      {"aggregation.strategy=FEDAVG", {"server/crash_recovery_test.cc", "FEDAVG"}},
      {"aggregation.strategy=FEDPROX", {"sim/simulator_test.cc", "FEDPROX"}},
      {"aggregation.strategy=FEDADAM", {"server/crash_recovery_test.cc", "FEDADAM"}},
      {"aggregation.strategy=FEDYOGI", {"aggregation/server_optimizer_test.cc", "kYogi"}},
      {"aggregation.strategy=FEDADAGRAD", {"aggregation/server_optimizer_test.cc", "kAdagrad"}},
      {"aggregation.proximal_mu", {"sim/simulator_test.cc", "proximal_mu"}},
      {"aggregation.server_learning_rate",
       {"server/test_server_main.cc", "set_server_learning_rate"}},
      {"aggregation.server_beta1", {"aggregation/server_optimizer_test.cc", ".beta1"}},
      {"aggregation.server_beta2", {"aggregation/server_optimizer_test.cc", ".beta2"}},
      {"aggregation.server_tau", {"aggregation/server_optimizer_test.cc", ".tau"}},
      {"aggregation.max_update_norm", {"aggregation/fedavg_test.cc", "ClipUpdateNorm"}},
      {"aggregation.weight_by_examples", {"aggregation/fedavg_test.cc", "WeightingByExamples"}},
      {"aggregation.max_examples_per_client",
       {"server/store_secrecy_test.cc", "TheClaimedWeightIsSealedAndCappedAtTheBound"}},
      {"aggregation.server_momentum",
       {"aggregation/server_optimizer_test.cc", "MomentumAccumulatesDeltas"}},
      {"aggregation.average_last_rounds", {"server/federation_e2e_test.cc", "average_last_rounds"}},
      {"privacy.dp.enabled", {"server/differential_privacy_test.cc", "set_enabled(true)"}},
      {"privacy.dp.mode=DISTRIBUTED",
       {"sim/simulator_test.cc", "DifferentialPrivacyConfig::DISTRIBUTED"}},
      {"privacy.secure_aggregation",
       {"server/secure_aggregation_test.cc", "set_secure_aggregation(true)"}},
      {"privacy.dp.mode", {"config/config_io_test.cc", "DifferentialPrivacyConfig::CENTRAL"}},
      {"privacy.dp.mode=CENTRAL",
       {"config/config_io_test.cc", "DifferentialPrivacyConfig::CENTRAL"}},
      {"privacy.dp.clip_norm",
       {"server/differential_privacy_test.cc", "ClippedUpdatesNeverExceedTheClipNorm"}},
      {"privacy.dp.noise_multiplier",
       {"server/differential_privacy_test.cc", "TheNoiseHasTheConfiguredStddev"}},
      {"privacy.dp.target_delta", {"server/differential_privacy_test.cc", "dp_target_delta"}},
      {"privacy.dp.max_epsilon", {"server/differential_privacy_test.cc", "set_max_epsilon"}},
      {"privacy.dp.population_size",
       {"server/differential_privacy_test.cc", "set_population_size"}},
      {"privacy.dp.adaptive_clipping.enabled",
       {"server/differential_privacy_test.cc", "AdaptiveClipping"}},
      {"privacy.dp.adaptive_clipping.target_quantile",
       {"server/differential_privacy_test.cc", "target_quantile"}},
      {"privacy.dp.adaptive_clipping.learning_rate",
       {"server/differential_privacy_test.cc", "learning_rate()"}},
      {"privacy.dp.adaptive_clipping.count_noise_stddev",
       {"server/differential_privacy_test.cc", "count_noise_stddev"}},
      {"rounds", {"server/cli_federation_test.cc", "\"rounds\""}},
      {"codec.stages.id", {"server/upload_protocol_test.cc", "ZSTD"}},
      {"codec.stages.id=NONE",
       {"compression/codec_test.cc", "Fp32RoundTripIsExactWithAndWithoutZstd"}},
      {"codec.stages.id=ZSTD", {"server/upload_protocol_test.cc", "ZSTD"}},
      {"codec.stages.id=FP16",
       {"compression/codec_test.cc", "HalfCastsRoundTripWithinTheirRoundingBound"}},
      {"codec.stages.id=BF16",
       {"compression/codec_test.cc", "HalfCastsRoundTripWithinTheirRoundingBound"}},
      {"codec.stages.version", {"compression/codec_test.cc", "version"}},
      {"codec.stages.zstd.level", {"compression/codec_test.cc", "zstd"}},
      {"codec.stages.id=TOPK",
       {"sim/simulator_test.cc", "CompressedUpdatesWithErrorFeedbackCrossTheWire"}},
      {"codec.stages.id=RANDOMK",
       {"compression/pipeline_test.cc", "GlobalTopKAndRandomKRoundTrip"}},
      {"codec.stages.id=QUANT", {"sim/simulator_test.cc", "QUANT"}},
      {"codec.stages.top_k.fraction",
       {"compression/pipeline_test.cc", "CodecOptionsFromSpecCarriesEveryParameter"}},
      {"codec.stages.top_k.error_feedback",
       {"compression/pipeline_test.cc", "SentPlusResidualEqualsTheRawSumExactly"}},
      {"codec.stages.top_k.global",
       {"compression/pipeline_test.cc", "GlobalTopKAndRandomKRoundTrip"}},
      {"codec.stages.random_k.fraction",
       {"compression/pipeline_test.cc", "CodecOptionsFromSpecCarriesEveryParameter"}},
      {"codec.stages.random_k.error_feedback",
       {"compression/pipeline_test.cc", "CodecOptionsFromSpecCarriesEveryParameter"}},
      {"codec.stages.quant.bits", {"compression/pipeline_test.cc", "StochasticRoundingIsUnbiased"}},
      {"codec.stages.quant.block_size",
       {"compression/pipeline_test.cc", "CodecOptionsFromSpecCarriesEveryParameter"}},
      {"codec.stages.quant.stochastic",
       {"compression/pipeline_test.cc", "SignModeSendsTheMeanMagnitude"}},
      {"codec.stages.quant.error_feedback",
       {"compression/pipeline_test.cc", "CodecOptionsFromSpecCarriesEveryParameter"}},
      {"downlink_codec.stages.id", {"sim/simulator_test.cc", "mutable_downlink_codec"}},
      {"downlink_codec.stages.id=NONE", {"compression/downlink_test.cc", "CodecStage::NONE"}},
      {"downlink_codec.stages.id=ZSTD", {"sim/simulator_test.cc", "CodecStage::ZSTD"}},
      {"downlink_codec.stages.id=FP16", {"compression/downlink_test.cc", "CodecStage::FP16"}},
      {"downlink_codec.stages.id=BF16", {"compression/downlink_test.cc", "CodecStage::BF16"}},
      {"downlink_codec.stages.id=TOPK", {"compression/downlink_test.cc", "CodecStage::TOPK"}},
      {"downlink_codec.stages.id=RANDOMK", {"compression/downlink_test.cc", "CodecStage::RANDOMK"}},
      {"downlink_codec.stages.id=QUANT",
       {"sim/simulator_test.cc", "DownlinkDeltasRebuildTheBroadcastAdapter"}},
      {"downlink_codec.stages.version", {"compression/downlink_test.cc", "set_version"}},
      {"downlink_codec.stages.zstd.level",
       {"compression/downlink_test.cc", "zstd.mutable_zstd()->set_level"}},
      {"downlink_codec.stages.top_k.fraction",
       {"compression/downlink_test.cc", "mutable_top_k()->set_fraction"}},
      {"downlink_codec.stages.top_k.global",
       {"compression/downlink_test.cc", "mutable_top_k()->set_global(true)"}},
      {"downlink_codec.stages.random_k.fraction",
       {"compression/downlink_test.cc", "mutable_random_k()->set_fraction"}},
      {"downlink_codec.stages.quant.bits",
       {"compression/downlink_test.cc", "mutable_quant()->set_bits"}},
      {"downlink_codec.stages.quant.block_size",
       {"compression/downlink_test.cc", "mutable_quant()->set_block_size"}},
      {"downlink_codec.stages.top_k.error_feedback",
       {"config/config_io_test.cc", "\"top_k\": {\"error_feedback\""}},
      {"downlink_codec.stages.random_k.error_feedback",
       {"config/config_io_test.cc", "\"random_k\": {\"error_feedback\""}},
      {"downlink_codec.stages.quant.error_feedback",
       {"config/config_io_test.cc", "\"quant\": {\"error_feedback\""}},
      {"downlink_codec.stages.quant.stochastic",
       {"compression/downlink_test.cc", "mutable_quant()->set_stochastic"}},
      {"codec.stages.id=LOWRANK", {"sim/simulator_test.cc", "LowRankUpdatesCrossTheWire"}},
      {"codec.stages.low_rank.rank", {"compression/pipeline_test.cc", "low_rank()->set_rank"}},
      {"downlink_codec.stages.id=LOWRANK", {"compression/downlink_test.cc", "CodecStage::LOWRANK"}},
      {"downlink_codec.stages.low_rank.rank",
       {"compression/downlink_test.cc", "mutable_low_rank()->set_rank"}},
      {"data.eval_path", {"server/cli_federation_test.cc", "eval_path"}},
      {"data.train_path", {"sim/simulator_test.cc", "train_path"}},
      {"data.eval_every_rounds", {"server/federation_e2e_test.cc", "eval_every_rounds"}},
      {"data.eval_batch_size", {"server/cli_federation_test.cc", "eval_batch_size"}},
      {"server.listen_address", {"server/cli_federation_test.cc", "listen_address"}},
      {"server.store_dir", {"server/cli_federation_test.cc", "store_dir"}},
      {"server.key_dir", {"server/store_secrecy_test.cc", "key_dir"}},
      {"server.tls.operator_ids", {"server/mtls_test.cc", "operator_ids"}},
      {"server.chunk_size_bytes", {"sim/simulator_test.cc", "chunk_size_bytes"}},
      {"server.max_update_bytes", {"server/abuse_test.cc", "max_upload_bytes"}},
      {"server.max_message_bytes", {"server/abuse_test.cc", "max_message_bytes"}},
      {"server.tls.cert_file", {"server/cli_federation_test.cc", "--cert"}},
      {"server.tls.key_file", {"server/cli_federation_test.cc", "--key"}},
      {"server.tls.client_ca_file", {"server/cli_federation_test.cc", "--client-ca"}},
      {"server.tls.crl_file", {"server/mtls_test.cc", "crl_file"}},
      {"server.tls.allowed_client_ids", {"server/mtls_test.cc", "allowed_client_ids"}},
      {"server.metrics_address", {"server/metrics_test.cc", "metrics"}},
      {"server.health_address", {"server/federation_e2e_test.cc", "health_address"}},
      {"server.insecure", {"tools/fedlora_cli_test.cc", "--insecure"}},
      {"server.max_client_bytes_per_round", {"server/abuse_test.cc", "max_client_bytes_per_round"}},
      {"server.max_client_uploads_in_flight",
       {"server/abuse_test.cc", "max_client_uploads_in_flight"}},
      {"server.max_client_uploads_per_round",
       {"server/abuse_test.cc", "max_client_uploads_per_round"}},
      {"server.max_client_reports_per_round",
       {"server/abuse_test.cc", "max_client_reports_per_round"}},
      {"server.max_metrics_per_report", {"server/abuse_test.cc", "max_metrics_per_report"}},
      {"server.min_free_disk_bytes", {"server/abuse_test.cc", "min_free_disk_bytes"}},
      {"server.grpc_memory_bytes", {"server/floods_test.cc", "set_grpc_memory_bytes"}},
      {"server.grpc_max_threads", {"server/floods_test.cc", "set_grpc_max_threads"}},
      {"server.max_concurrent_streams", {"server/floods_test.cc", "set_max_concurrent_streams"}},
      {"server.max_client_downloads_in_flight",
       {"server/floods_test.cc", "max_client_downloads_in_flight"}},
      {"server.max_aggregation_attempts",
       {"server/round_driver_test.cc", "max_aggregation_attempts"}},
      {"server.retain_rounds", {"server/retention_test.cc", "set_retain_rounds"}},
      {"server.audit_public_key_file", {"server/audit_trail_test.cc", "set_audit_public_key_file"}},
      {"server.stop_on_aggregation_failure",
       {"server/round_driver_test.cc", "stop_on_aggregation_failure"}},
      {"simulation.num_clients", {"sim/simulator_test.cc", "num_clients"}},
      {"simulation.partition", {"sim/simulator_test.cc", "partition"}},
      {"simulation.partition=IID", {"sim/simulator_test.cc", "IID"}},
      {"simulation.partition=DIRICHLET", {"sim/simulator_test.cc", "DIRICHLET"}},
      {"simulation.partition=BY_KEY", {"train/partition_test.cc", "ByKeyKeepsEachKeyOnOneClient"}},
      {"simulation.partition=LABEL_SHARDS",
       {"train/partition_test.cc", "ShardsGiveExactlyKLabelsPerClient"}},
      {"simulation.dirichlet_alpha",
       {"train/partition_test.cc", "SmallAlphaIsSkewedLargeAlphaIsNot"}},
      {"simulation.partition_key_field",
       {"train/partition_test.cc", "ByKeyKeepsEachKeyOnOneClient"}},
      {"simulation.dropout_probability", {"sim/simulator_test.cc", "kDropout"}},
      {"simulation.straggler_probability", {"sim/simulator_test.cc", "kStraggler"}},
      {"simulation.straggler_delay_seconds", {"sim/simulator_test.cc", "straggler_delay_seconds"}},
      {"simulation.shards_per_client",
       {"train/partition_test.cc", "ShardsGiveExactlyKLabelsPerClient"}},
      {"simulation.crash_probability", {"sim/simulator_test.cc", "crash_probability"}},
      {"simulation.parallelism", {"sim/simulator_test.cc", "parallelism"}},
      {"simulation.malicious_clients", {"sim/simulator_test.cc", "set_malicious_clients"}},
      {"simulation.attack.kind", {"sim/simulator_test.cc", "mutable_attack()->set_kind"}},
      {"simulation.attack.kind=SIGN_FLIP",
       {"sim/simulator_test.cc", "SimulationAttack::SIGN_FLIP"}},
      {"simulation.attack.kind=SCALE", {"sim/simulator_test.cc", "SimulationAttack::SCALE"}},
      {"simulation.attack.kind=GAUSSIAN", {"sim/simulator_test.cc", "SimulationAttack::GAUSSIAN"}},
      {"simulation.attack.kind=LITTLE_IS_ENOUGH",
       {"sim/simulator_test.cc", "SimulationAttack::LITTLE_IS_ENOUGH"}},
      {"simulation.attack.kind=MIN_MAX", {"sim/simulator_test.cc", "SimulationAttack::MIN_MAX"}},
      {"simulation.attack.scale", {"sim/simulator_test.cc", "mutable_attack()->set_scale"}},
      {"aggregation.strategy=MEDIAN",
       {"server/federation_e2e_test.cc", "AggregationConfig::MEDIAN"}},
      {"aggregation.strategy=TRIMMED_MEAN",
       {"server/federation_e2e_test.cc", "AggregationConfig::TRIMMED_MEAN"}},
      {"aggregation.strategy=KRUM", {"server/federation_e2e_test.cc", "AggregationConfig::KRUM"}},
      {"aggregation.strategy=MULTI_KRUM",
       {"server/federation_e2e_test.cc", "AggregationConfig::MULTI_KRUM"}},
      {"aggregation.strategy=BULYAN",
       {"server/federation_e2e_test.cc", "AggregationConfig::BULYAN"}},
      {"aggregation.trim_fraction", {"server/federation_e2e_test.cc", "set_trim_fraction"}},
      {"aggregation.krum_byzantine_clients",
       {"server/federation_e2e_test.cc", "set_krum_byzantine_clients"}},
      {"aggregation.multi_krum_keep", {"server/federation_e2e_test.cc", "set_multi_krum_keep"}},
      {"aggregation.strategy=LORA_PRODUCT",
       {"sim/simulator_test.cc", "AggregationConfig::LORA_PRODUCT"}},
  };
  return *m;
}

using Mutation = std::function<void(RunConfig&)>;

// Refused: a change that sets the setting on a valid config; validation must then say it is not
// implemented yet, naming it.
const std::map<std::string, std::pair<Mutation, std::string>>& RefusedSettings() {
  static const auto* m = new std::map<std::string, std::pair<Mutation, std::string>>{
      {"privacy.dp.mode=LOCAL",
       {[](RunConfig& c) {
          c.mutable_privacy()->mutable_dp()->set_mode(v1::DifferentialPrivacyConfig::LOCAL);
        },
        "privacy.dp.mode"}},
  };
  return *m;
}

std::string SourceDir() {
  const char* dir = std::getenv("FEDLORA_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

RunConfig ValidConfig() {
  absl::StatusOr<RunConfig> c =
      ParseRunConfigJson(R"({"model": {"path": "models/m"}, "task": {"labels": ["neg", "pos"]}})");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : RunConfig();
}

TEST(ConfigCoverageTest, EverySettingIsExercisedOrRefused) {
  std::vector<std::string> paths;
  Walk(RunConfig::descriptor(), "", &paths);
  ASSERT_GT(paths.size(), 100u);
  const auto& exercised = ExercisedSettings();
  const auto& refused = RefusedSettings();
  for (const std::string& path : paths) {
    const bool e = exercised.count(path) != 0, r = refused.count(path) != 0;
    EXPECT_TRUE(e || r) << path << " is neither exercised by a test nor refused as not implemented";
    EXPECT_FALSE(e && r) << path << " is listed both as exercised and as refused";
  }
  // No stale entries: each names a setting that exists.
  const std::set<std::string> walked(paths.begin(), paths.end());
  for (const auto& [path, unused] : exercised)
    EXPECT_TRUE(walked.count(path)) << path << " is not in config.proto";
  for (const auto& [path, unused] : refused)
    EXPECT_TRUE(walked.count(path)) << path << " is not in config.proto";
}

TEST(ConfigCoverageTest, ExercisedSettingsAreInTheTestsNamed) {
  for (const auto& [path, where] : ExercisedSettings()) {
    const std::string file = SourceDir() + "/tests/" + where.file;
    std::ifstream in(file);
    ASSERT_TRUE(in) << path << ": " << file << " not found";
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(where.needle), std::string::npos)
        << path << ": " << where.file << " does not contain \"" << where.needle << "\"";
  }
}

TEST(ConfigCoverageTest, RefusedSettingsAreRefusedNamingThemselves) {
  for (const auto& [path, refusal] : RefusedSettings()) {
    RunConfig c = ValidConfig();
    refusal.first(c);
    ApplyRunConfigDefaults(&c);
    const absl::Status s = ValidateRunConfig(c);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << path << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(refusal.second)) << path;
    EXPECT_THAT(std::string(s.message()), HasSubstr("is not implemented yet")) << path;
    EXPECT_FALSE(UnimplementedSettings(c).empty()) << path;
  }
  EXPECT_TRUE(UnimplementedSettings(ValidConfig()).empty());
}

}  // namespace
}  // namespace fedlora
