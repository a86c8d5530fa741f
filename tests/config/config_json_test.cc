// Config errors a person can act on (config/config_json.h, config/config_paths.h): syntax errors at
// their line and column, field paths with the nearest known name, types in words, enum values in
// any case with the valid ones listed, and relative paths resolved against the config's directory.
#include "config/config_json.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/config_io.h"
#include "config/config_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using v1::RunConfig;

constexpr char kValid[] = R"("model": {"path": "m"}, "task": {"labels": ["a", "b"]})";

// The message of parsing `json`, which must fail with InvalidArgument.
std::string Error(const std::string& json) {
  absl::StatusOr<RunConfig> c = ParseRunConfigJson(json);
  EXPECT_FALSE(c.ok()) << json;
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

TEST(ConfigJsonTest, TrailingCommasAreRefusedAtTheirLineAndColumn) {
  EXPECT_EQ(Error("{\n  \"rounds\": 3,\n}"),
            "line 3, column 1: JSON syntax: a trailing comma before '}' (JSON allows none)");
  EXPECT_EQ(Error(std::string("{") + kValid + ",\n \"task\": {\"labels\": [\"a\", \"b\",]}}"),
            "line 2, column 31: JSON syntax: a trailing comma before ']' (JSON allows none)");
}

TEST(ConfigJsonTest, UnquotedKeysAreRefused) {
  EXPECT_THAT(Error("{rounds: 3}"),
              HasSubstr("line 1, column 2: JSON syntax: expected a field name in double quotes"));
}

TEST(ConfigJsonTest, AMissingCommaPointsAtTheNextMember) {
  EXPECT_EQ(Error("{\n  \"rounds\": 3\n  \"seed\": 1\n}"),
            "line 3, column 3: JSON syntax: expected ',' or '}' after an object member, found "
            "unexpected string literal");
}

TEST(ConfigJsonTest, OtherSyntaxErrorsSayWhatWasExpected) {
  EXPECT_THAT(Error("{\"rounds\" 3}"),
              HasSubstr("line 1, column 11: JSON syntax: expected ':' after the field name"));
  EXPECT_THAT(Error("{\"rounds\": 3"),
              HasSubstr("JSON syntax: expected ',' or '}' after an object member, found the end"));
  EXPECT_THAT(Error("{\"rounds\": 3} x"),
              HasSubstr("JSON syntax: text after the end of the config's object"));
  EXPECT_THAT(Error("{\"run_id\": 'x'}"),
              HasSubstr("line 1, column 12: JSON syntax: expected a value"));
  EXPECT_EQ(Error(" \n"), "the run config is empty (expected a JSON object {...})");
  EXPECT_EQ(Error("[1, 2]"), "the run config must be a JSON object {...}, not a list [...]");
}

TEST(ConfigJsonTest, DuplicateKeysAreRefused) {
  EXPECT_EQ(Error(std::string("{") + kValid + ",\n\"rounds\": 3, \"rounds\": 4}"),
            "line 2, column 14: rounds is given twice (JSON keys must be unique)");
  // Protobuf reads lowerCamelCase names too: one field under both of its names is given twice.
  EXPECT_THAT(Error(R"({"training": {"local_steps": 1, "localSteps": 2}})"),
              HasSubstr("training.local_steps is given twice (as localSteps and local_steps)"));
}

TEST(ConfigJsonTest, AnUnknownFieldNamesItsPathAndTheNearestName) {
  EXPECT_EQ(Error(std::string("{") + kValid +
                  ",\n  \"selection\": {\"clients_per_round\": 4,\n    \"clients_per_rund\": 3}}"),
            "line 3, column 5: unknown field selection.clients_per_rund; did you mean "
            "clients_per_round?");
  EXPECT_THAT(Error(R"({"aggregaton": {}})"),
              HasSubstr("unknown field aggregaton; did you mean aggregation?"));
}

TEST(ConfigJsonTest, AFieldInTheWrongSectionIsShownWhereItBelongs) {
  EXPECT_THAT(Error(std::string("{") + kValid + R"(, "clients_per_round": 3})"),
              HasSubstr("unknown field clients_per_round; clients_per_round belongs elsewhere: "
                        "selection.clients_per_round"));
}

TEST(ConfigJsonTest, WithNothingNearTheKnownFieldsAreListed) {
  EXPECT_THAT(Error(R"({"lora": {"zzzzzz": 1}})"),
              HasSubstr("unknown field lora.zzzzzz (the fields of lora: rank, alpha, dropout, "
                        "target_modules, freeze_a)"));
}

TEST(ConfigJsonTest, WrongTypesSayTheExpectedTypeInWords) {
  const std::string e = Error(R"({"selection": {"clients_per_round": "x"},
      "lora": {"alpha": "big", "target_modules": "query"},
      "privacy": {"secure_aggregation": "yes"}, "run_id": 7, "task": {"labels": ["a", 2]},
      "rounds": -1, "training": 5})");
  EXPECT_THAT(
      e,
      HasSubstr("line 1, column 16: selection.clients_per_round must be a whole number from 0 to "
                "4294967295, not the string \"x\""));
  EXPECT_THAT(e, HasSubstr("lora.alpha must be a number, not the string \"big\""));
  EXPECT_THAT(
      e, HasSubstr(
             "lora.target_modules must be a list [...] (each item a string in double quotes), not "
             "the string \"query\""));
  EXPECT_THAT(
      e, HasSubstr("privacy.secure_aggregation must be true or false, not the string \"yes\""));
  EXPECT_THAT(e, HasSubstr("run_id must be a string in double quotes, not the number 7"));
  EXPECT_THAT(e, HasSubstr("task.labels[1] must be a string in double quotes, not the number 2"));
  EXPECT_THAT(e,
              HasSubstr("rounds must be a whole number from 0 to 4294967295, not the number -1"));
  EXPECT_THAT(e, HasSubstr("training must be an object {...}, not the number 5"));
  EXPECT_THAT(e, Not(HasSubstr("TYPE_")));
}

TEST(ConfigJsonTest, AnUnknownEnumValueListsTheValidOnesAndTheNearest) {
  const std::string e =
      Error(std::string("{") + kValid + ",\n \"aggregation\": {\"strategy\": \"FEDAVGG\"}}");
  EXPECT_THAT(
      e, HasSubstr(
             "line 2, column 18: unknown value 'FEDAVGG' for aggregation.strategy; valid: FEDAVG, "
             "FEDPROX, FEDADAM, FEDYOGI, FEDADAGRAD"));
  EXPECT_THAT(e, HasSubstr("FEDADAGRAD, MEDIAN, TRIMMED_MEAN, KRUM, MULTI_KRUM, BULYAN, "
                           "LORA_PRODUCT (any case); did you mean FEDAVG?"));
  // A value refused by UnimplementedSettings is listed apart, never suggested.
  EXPECT_THAT(Error(R"({"privacy": {"dp": {"mode": "LOCALL"}}})"),
              HasSubstr("valid: CENTRAL, DISTRIBUTED (any case; not implemented yet: LOCAL)"));
  EXPECT_THAT(Error(R"({"privacy": {"dp": {"mode": "LOCAL"}}})"), Not(HasSubstr("did you mean")));
  EXPECT_THAT(e, Not(HasSubstr("STRATEGY_UNSPECIFIED")));
  EXPECT_THAT(Error(R"({"codec": {"stages": [{"id": "QUANT"}, {"id": "zstdd"}]}})"),
              HasSubstr("unknown value 'zstdd' for codec.stages[1].id; valid: NONE,"));
  EXPECT_THAT(Error(R"({"training": {"optimizer": 3.5}})"),
              HasSubstr("training.optimizer must be one of ADAMW, LAMB, SGD, not the number 3.5"));
}

TEST(ConfigJsonTest, EnumValuesAreAcceptedInAnyCase) {
  absl::StatusOr<RunConfig> c = ParseRunConfigJson(R"({"task": {"labels": ["a", "b"]},
      "aggregation": {"strategy": "fedprox"}, "training": {"optimizer": "Sgd", "schedule": "cosine"},
      "codec": {"stages": [{"id": "quant"}, {"id": "Zstd"}]}, "simulation": {"partition": "dirichlet"},
      "model": {"path": "m", "precision": "bf16"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->aggregation().strategy(), v1::AggregationConfig::FEDPROX);
  EXPECT_EQ(c->training().optimizer(), v1::TrainingConfig::SGD);
  EXPECT_EQ(c->training().schedule(), v1::TrainingConfig::COSINE);
  EXPECT_EQ(c->codec().stages(0).id(), v1::CodecStage::QUANT);
  EXPECT_EQ(c->codec().stages(1).id(), v1::CodecStage::ZSTD);
  EXPECT_EQ(c->simulation().partition(), v1::SimulationConfig::DIRICHLET);
  EXPECT_EQ(c->model().precision(), v1::ModelConfig::BF16);
}

TEST(ConfigJsonTest, WhatProtobufWritesIsStillRead) {
  // 64-bit integers as strings, enum numbers, non-finite doubles as names, camelCase names, null.
  absl::StatusOr<std::string> text = CheckRunConfigJson(
      R"({"seed": "17", "training": {"optimizer": 2, "learningRate": 0.5, "weight_decay": "NaN"},
          "server": {"max_update_bytes": "1048576"}, "lora": null})",
      "");
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<RunConfig> c = ParseRunConfigJson(std::string("{") + kValid + R"(, "seed": "17",
      "training": {"optimizer": 2, "learningRate": 0.5}, "lora": null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->seed(), 17u);
  EXPECT_EQ(c->training().optimizer(), v1::TrainingConfig::LAMB);
  EXPECT_EQ(c->training().learning_rate(), 0.5);
}

TEST(ConfigJsonTest, OneofMembersExcludeEachOther) {
  EXPECT_THAT(Error(R"({"training": {"local_epochs": 1, "local_steps": 10}})"),
              HasSubstr("training.local_epochs and training.local_steps exclude each other "
                        "(training.local_work): set one"));
}

TEST(ConfigJsonTest, EveryProblemOfTheTextIsReportedAtOnce) {
  const std::string e =
      Error(R"({"roundz": 3, "lora": {"rank": "x"}, "aggregation": {"strategy": "MEAN"}})");
  EXPECT_THAT(e, HasSubstr("unknown field roundz; did you mean rounds?"));
  EXPECT_THAT(e, HasSubstr("lora.rank must be a whole number"));
  EXPECT_THAT(e, HasSubstr("unknown value 'MEAN' for aggregation.strategy"));
}

class ConfigPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("proto_config_json_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "configs");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::string Abs(const std::string& relative) const {
    return (dir_ / relative).lexically_normal().string();
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigPathsTest, RelativePathsResolveAgainstTheConfigsDirectory) {
  const std::string config = Write("configs/run.json", R"({
      "model": {"path": "../models/m"}, "task": {"labels": ["a", "b"]},
      "data": {"train_path": "../data/train.jsonl", "eval_path": "eval.jsonl"},
      "server": {"store_dir": "store", "key_dir": "/abs/keys", "audit_public_key_file": "audit.pem",
                 "listen_address": "0.0.0.0:1",
                 "tls": {"cert_file": "tls/s.pem", "key_file": "tls/s.key", "client_ca_file": "./tls/ca.pem",
                         "crl_file": "tls/crl.pem"}}})");
  absl::StatusOr<RunConfig> c = LoadRunConfigFile(config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model().path(), Abs("models/m"));
  EXPECT_EQ(c->model().id(), "m");
  EXPECT_EQ(c->data().train_path(), Abs("data/train.jsonl"));
  EXPECT_EQ(c->data().eval_path(), Abs("configs/eval.jsonl"));
  EXPECT_EQ(c->server().store_dir(), Abs("configs/store"));
  EXPECT_EQ(c->server().key_dir(), "/abs/keys");
  EXPECT_EQ(c->server().audit_public_key_file(), Abs("configs/audit.pem"));
  EXPECT_EQ(c->server().tls().cert_file(), Abs("configs/tls/s.pem"));
  EXPECT_EQ(c->server().tls().key_file(), Abs("configs/tls/s.key"));
  EXPECT_EQ(c->server().tls().client_ca_file(), Abs("configs/tls/ca.pem"));
  EXPECT_EQ(c->server().tls().crl_file(), Abs("configs/tls/crl.pem"));
  EXPECT_EQ(RunConfigPathFields().size(), 10u);  // each is asserted above
}

TEST_F(ConfigPathsTest, FlagsAndDefaultsAndTextStayRelativeToTheWorkingDirectory) {
  const std::string config = Write("configs/run.json", std::string("{") + kValid + "}");
  absl::StatusOr<RunConfig> c = LoadRunConfigFile(config, [](RunConfig* r) {
    r->mutable_data()->set_eval_path(
        "from/flag.jsonl");  // set by a flag, after the file's paths resolved
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model().path(), Abs("configs/m"));
  EXPECT_EQ(c->data().eval_path(), "from/flag.jsonl");
  EXPECT_EQ(c->server().store_dir(), "fedlora_store");  // the default
  EXPECT_FALSE(c->server().has_tls());                  // resolving creates no section
  absl::StatusOr<RunConfig> text = ParseRunConfigJson(std::string("{") + kValid + "}");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->model().path(), "m");  // no file, no directory to resolve against
}

// "run.json" has the parent path "": its directory is the working directory.
TEST_F(ConfigPathsTest, AConfigNamedWithoutADirectoryResolvesAgainstTheWorkingDirectory) {
  Write("configs/run.json", std::string("{") + kValid + "}");
  const std::filesystem::path before = std::filesystem::current_path();
  std::filesystem::current_path(dir_ / "configs");
  absl::StatusOr<RunConfig> c = LoadRunConfigFile("run.json");
  std::filesystem::current_path(before);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model().path(), Abs("configs/m"));
}

TEST_F(ConfigPathsTest, ErrorsInAFileStartWithItsPathLineAndColumn) {
  const std::string config = Write("configs/run.json", "{\n  \"lora\": {\"rank\": \"eight\"}\n}");
  absl::Status s = LoadRunConfigFile(config).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      std::string(s.message()),
      config +
          ":2:12: lora.rank must be a whole number from 0 to 4294967295, not the string \"eight\"");
  const std::string comma = Write("configs/comma.json", "{\"rounds\": 3,}");
  EXPECT_EQ(std::string(LoadRunConfigFile(comma).status().message()),
            comma + ":1:14: JSON syntax: a trailing comma before '}' (JSON allows none)");
}

TEST_F(ConfigPathsTest, AMissingInputNamesItsField) {
  const std::string config = Write(
      "configs/run.json", std::string("{") + kValid +
                              R"(, "data": {"train_path": "t.jsonl", "eval_path": "e.jsonl"}})");
  absl::StatusOr<RunConfig> c = LoadRunConfigFile(config);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status missing = CheckRunConfigInputsExist(*c, /*reads_train_data=*/true);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(missing.message()),
            "model.path: " + Abs("configs/m") +
                " does not exist; data.train_path: " + Abs("configs/t.jsonl") +
                " does not exist; data.eval_path: " + Abs("configs/e.jsonl") + " does not exist");
  std::filesystem::create_directories(dir_ / "configs/m");
  Write("configs/e.jsonl", "");
  EXPECT_TRUE(CheckRunConfigInputsExist(*c, /*reads_train_data=*/false)
                  .ok());  // the server reads no train_path
  EXPECT_THAT(std::string(CheckRunConfigInputsExist(*c, true).message()),
              HasSubstr("data.train_path: "));
}

}  // namespace
}  // namespace fedlora
