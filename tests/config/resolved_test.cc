// The resolved run config (config/resolved.h): codec options derived once, equal to what each
// consumer derived on its own before; one heartbeat source; and the defaults each written once, so
// that a config built by hand (no ApplyRunConfigDefaults) means what its defaulted twin means to
// every consumer that falls back on a default.
#include "config/resolved.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "compression/update_io.h"
#include "config/config_io.h"
#include "config/defaults.h"
#include "gtest/gtest.h"
#include "server/options.h"
#include "server/server.h"
#include "train/train_config.h"
#include "train/training_defaults.h"

namespace fedlora {
namespace {

v1::RunConfig Parse(const std::string& json) {
  absl::StatusOr<v1::RunConfig> config = ParseRunConfigJson(json);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : v1::RunConfig();
}

// Every field of CodecOptions that the wire or the client's encoder reads.
void ExpectSameOptions(const CodecOptions& got, const CodecOptions& want, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(got.SameWireFormat(want)) << got.Describe() << " vs " << want.Describe();
  EXPECT_EQ(got.sparsifier, want.sparsifier);
  EXPECT_EQ(got.fraction, want.fraction);
  EXPECT_EQ(got.global_top_k, want.global_top_k);
  EXPECT_EQ(got.low_rank, want.low_rank);
  EXPECT_EQ(got.codec, want.codec);
  EXPECT_EQ(got.quant_bits, want.quant_bits);
  EXPECT_EQ(got.quant_block_size, want.quant_block_size);
  EXPECT_EQ(got.quant_stochastic, want.quant_stochastic);
  EXPECT_EQ(got.zstd, want.zstd);
  EXPECT_EQ(got.zstd_level, want.zstd_level);
  EXPECT_EQ(got.error_feedback, want.error_feedback);
}

constexpr char kModel[] = R"("model": {"path": "models/m"}, "task": {"labels": ["a", "b"]})";

TEST(ResolvedRunConfig, CodecOptionsEqualWhatCodecOptionsFromSpecGave) {
  const std::vector<std::string> codecs = {
      R"("codec": {"stages": [{"id": "TOPK", "top_k": {"fraction": 0.05, "global": true}},
                              {"id": "QUANT", "quant": {"bits": 4}}, {"id": "ZSTD"}]},
         "downlink_codec": {"stages": [{"id": "BF16"}, {"id": "ZSTD", "zstd": {"level": 9}}]})",
      R"("codec": {"stages": [{"id": "LOWRANK", "low_rank": {"rank": 2}}, {"id": "FP16"}]})",
      R"("codec": {"stages": [{"id": "RANDOMK"}, {"id": "QUANT",
                              "quant": {"bits": 8, "stochastic": false}}]})",
      R"("codec": {"stages": []})",
  };
  for (const std::string& codec : codecs) {
    const v1::RunConfig config = Parse(absl::StrCat("{", kModel, ", ", codec, "}"));
    absl::StatusOr<ResolvedRunConfig> run = ResolveRunConfig(config);
    ASSERT_TRUE(run.ok()) << run.status();
    absl::StatusOr<CodecOptions> uplink = CodecOptionsFromSpec(config.codec());
    ASSERT_TRUE(uplink.ok()) << uplink.status();
    ExpectSameOptions(run->codecs.uplink, *uplink, codec);
    if (config.downlink_codec().stages_size() == 0) {
      EXPECT_FALSE(run->codecs.downlink.has_value()) << codec;
    } else {
      absl::StatusOr<CodecOptions> downlink = CodecOptionsFromSpec(config.downlink_codec());
      ASSERT_TRUE(downlink.ok()) << downlink.status();
      ASSERT_TRUE(run->codecs.downlink.has_value()) << codec;
      ExpectSameOptions(*run->codecs.downlink, *downlink, codec);
    }
  }
  // The first spec, checked against the values written in it, not only against the old path.
  absl::StatusOr<ResolvedRunConfig> run =
      ResolveRunConfig(Parse(absl::StrCat("{", kModel, ", ", codecs[0], "}")));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->codecs.uplink.sparsifier, Sparsifier::kTopK);
  EXPECT_EQ(run->codecs.uplink.fraction, 0.05);
  EXPECT_TRUE(run->codecs.uplink.global_top_k);
  EXPECT_EQ(run->codecs.uplink.quant_bits, 4);
  EXPECT_TRUE(run->codecs.uplink.zstd);
  ASSERT_TRUE(run->codecs.downlink.has_value());
  EXPECT_EQ(run->codecs.downlink->codec, CodecId::kBF16);
  EXPECT_EQ(run->codecs.downlink->zstd_level, 9);
}

TEST(ResolvedRunConfig, ACodecSpecThatCannotBeCarriedOutIsRefusedOnce) {
  v1::RunConfig config;  // built in code: ValidateRunConfig never saw it
  v1::CodecStage* stage = config.mutable_codec()->add_stages();
  stage->set_id(v1::CodecStage::LOWRANK);
  stage->mutable_low_rank()->set_rank(0);
  absl::StatusOr<ResolvedRunConfig> run = ResolveRunConfig(config);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(run.status().message().find("low_rank.rank 0"), std::string::npos) << run.status();
}

TEST(ResolvedRunConfig, TheHeartbeatHasOneSource) {
  v1::RunConfig config =
      Parse(absl::StrCat("{", kModel, R"(, "selection": {"heartbeat_interval_seconds": 7,
                                       "heartbeat_timeout_seconds": 40}})"));
  absl::StatusOr<ResolvedRunConfig> run = ResolveRunConfig(config);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->heartbeat_interval_ms, 7000);
  EXPECT_EQ(run->heartbeat_timeout_ms, 40'000);
  const ServerOptions server = ServerOptionsFromRunConfig(config);
  EXPECT_EQ(server.heartbeat_interval_ms, run->heartbeat_interval_ms);
  EXPECT_EQ(server.heartbeat_timeout_ms, run->heartbeat_timeout_ms);
  // The options of the resolved value (what `fedlora server` and the simulator build) say the same.
  const ServerOptions resolved = ServerOptionsFromRunConfig(*run);
  EXPECT_EQ(resolved.heartbeat_interval_ms, 7000);
  EXPECT_EQ(resolved.heartbeat_timeout_ms, 40'000);

  // Unset, in a config built in code: the same default as a defaulted config and ServerOptions.
  const v1::RunConfig bare;
  v1::RunConfig defaulted;
  ApplyRunConfigDefaults(&defaulted);
  EXPECT_EQ(HeartbeatIntervalMs(bare), 10'000);
  EXPECT_EQ(HeartbeatIntervalMs(bare), HeartbeatIntervalMs(defaulted));
  EXPECT_EQ(HeartbeatTimeoutMs(bare), HeartbeatTimeoutMs(defaulted));
  EXPECT_EQ(ServerOptions{}.heartbeat_interval_ms, HeartbeatIntervalMs(bare));
  EXPECT_EQ(ServerOptions{}.heartbeat_timeout_ms, HeartbeatTimeoutMs(bare));
}

// A consumer given a config built by hand falls back on the default of each unset field; given the
// defaulted config it reads the field. Both must agree, for every consumer: the default is written
// once, and changing it changes them all.
TEST(ResolvedRunConfig, ABareConfigMeansWhatItsDefaultedTwinMeansToEveryConsumer) {
  v1::RunConfig bare;
  bare.mutable_model()->set_path("models/m");
  v1::RunConfig defaulted = bare;
  ApplyRunConfigDefaults(&defaulted);

  const TrainOptions from_bare = TrainOptionsFromConfig(bare.training(), 128);
  const TrainOptions from_defaulted = TrainOptionsFromConfig(defaulted.training(), 128);
  EXPECT_EQ(from_bare.batch_size, from_defaulted.batch_size);
  EXPECT_EQ(from_bare.lr, from_defaulted.lr);
  EXPECT_EQ(from_bare.grad_clip, from_defaulted.grad_clip);
  EXPECT_EQ(from_bare.grad_accumulation, from_defaulted.grad_accumulation);
  EXPECT_EQ(from_bare.adam_beta1, from_defaulted.adam_beta1);
  EXPECT_EQ(from_bare.adam_beta2, from_defaulted.adam_beta2);
  // adam_epsilon is left out: unset, TrainOptions keeps -1, "the optimizer's own" (1e-8 for
  // ADAMW, train/optim.cc), which the defaulted config names.
  EXPECT_EQ(from_defaulted.lr, static_cast<float>(kDefaultLearningRate));
  EXPECT_EQ(ConfiguredMaxSeqLen(bare.model()), ConfiguredMaxSeqLen(defaulted.model()));
  EXPECT_EQ(ConfiguredEvalBatchSize(bare.data()), ConfiguredEvalBatchSize(defaulted.data()));

  const ServerOptions b = ServerOptionsFromRunConfig(bare);
  const ServerOptions d = ServerOptionsFromRunConfig(defaulted);
  const ServerOptions none;  // ServerOptions' own defaults, for a server built without a config
  for (const ServerOptions* o : {&b, &none}) {
    EXPECT_EQ(o->max_client_bytes_per_round, d.max_client_bytes_per_round);
    EXPECT_EQ(o->max_client_uploads_in_flight, d.max_client_uploads_in_flight);
    EXPECT_EQ(o->max_client_uploads_per_round, d.max_client_uploads_per_round);
    EXPECT_EQ(o->max_client_reports_per_round, d.max_client_reports_per_round);
    EXPECT_EQ(o->max_metrics_per_report, d.max_metrics_per_report);
    EXPECT_EQ(o->min_free_disk_bytes, d.min_free_disk_bytes);
    EXPECT_EQ(o->max_client_downloads_in_flight, d.max_client_downloads_in_flight);
    EXPECT_EQ(o->grpc_memory_bytes, d.grpc_memory_bytes);
    EXPECT_EQ(o->grpc_max_threads, d.grpc_max_threads);
    EXPECT_EQ(o->max_concurrent_streams, d.max_concurrent_streams);
    EXPECT_EQ(o->max_message_bytes, d.max_message_bytes);
    EXPECT_EQ(o->chunk_bytes, d.chunk_bytes);
    EXPECT_EQ(o->max_upload_chunk_bytes, d.max_upload_chunk_bytes);
    EXPECT_EQ(o->max_upload_bytes, d.max_upload_bytes);
    EXPECT_EQ(o->round_deadline_ms, d.round_deadline_ms);
    EXPECT_EQ(o->retry_after_ms, d.retry_after_ms);
    EXPECT_EQ(o->heartbeat_interval_ms, d.heartbeat_interval_ms);
    EXPECT_EQ(o->heartbeat_timeout_ms, d.heartbeat_timeout_ms);
    EXPECT_EQ(o->max_aggregation_attempts, d.max_aggregation_attempts);
    EXPECT_EQ(o->retain_rounds, d.retain_rounds);
  }
  EXPECT_EQ(b.listen_address, kDefaultListenAddress);
  EXPECT_EQ(b.data_dir, d.data_dir);
  EXPECT_EQ(d.data_dir, kDefaultStoreDir);

  // A bare codec stage and its defaulted twin encode alike.
  for (v1::CodecStage::Id id : {v1::CodecStage::TOPK, v1::CodecStage::RANDOMK,
                                v1::CodecStage::QUANT, v1::CodecStage::LOWRANK}) {
    v1::RunConfig with_stage = bare;
    with_stage.mutable_codec()->add_stages()->set_id(id);
    v1::RunConfig with_defaults = with_stage;
    ApplyRunConfigDefaults(&with_defaults);
    absl::StatusOr<CodecOptions> from_bare_stage = CodecOptionsFromSpec(with_stage.codec());
    absl::StatusOr<CodecOptions> from_defaulted_stage = CodecOptionsFromSpec(with_defaults.codec());
    ASSERT_TRUE(from_bare_stage.ok()) << from_bare_stage.status();
    ASSERT_TRUE(from_defaulted_stage.ok()) << from_defaulted_stage.status();
    ExpectSameOptions(*from_bare_stage, *from_defaulted_stage, v1::CodecStage::Id_Name(id));
  }
}

// The server derives the run's codec options once, when it starts: a codec it cannot carry out
// stops it there, before its store is opened, instead of failing every upload of the run.
TEST(ResolvedRunConfig, TheServerRefusesAnUnusableRunCodecWhenItStarts) {
  std::string dir = (std::filesystem::temp_directory_path() / "fedlora_resolved_XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.metrics_address = "127.0.0.1:0";
  o.insecure = true;
  o.data_dir = dir;
  v1::RunConfig config;
  config.set_run_id("resolved");
  config.mutable_model()->set_path("unused");
  config.set_rounds(1);
  config.mutable_selection()->set_clients_per_round(1);
  config.mutable_selection()->set_min_clients(1);
  ApplyRunConfigDefaults(&config);
  v1::CodecStage* stage =
      config.mutable_codec()->add_stages();  // after the defaults: built in code
  stage->set_id(v1::CodecStage::LOWRANK);
  stage->mutable_low_rank()->set_rank(0);
  const std::vector<UpdateTensor> adapter = {{"layer.0.query.lora_A.weight", {2, 4}, {}},
                                             {"layer.0.query.lora_B.weight", {4, 2}, {}}};
  std::vector<UpdateTensor> initial = adapter;
  for (UpdateTensor& t : initial) t.values.assign(8, 0.5f);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(o, config, initial);
  EXPECT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("low_rank.rank 0"), std::string::npos)
      << server.status();
  if (server.ok()) (*server)->Shutdown();
  // Refused before the store is opened: no run with that codec was written to it.
  EXPECT_FALSE(std::filesystem::exists(dir + "/fedlora.db"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace fedlora
