#include "tools/flags.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/common.h"

namespace fedlora::tools {
namespace {

using ::testing::HasSubstr;

// Builds a mutable argv from string literals (FlagSet::Parse takes char**, as main does).
struct Argv {
  explicit Argv(std::vector<std::string> args) : storage(std::move(args)) {
    for (std::string& s : storage) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> storage;
  std::vector<char*> ptrs;
};

struct Fixture {
  FlagSet flags{"fedlora test", "A test command."};
  std::string model;
  int64_t steps = 10;
  int epochs = 3;
  uint64_t seed = 0;
  float lr = 5e-4f;
  bool bf16 = false;
  Fixture() {
    flags.AddString("model", &model, "model directory", /*required=*/true);
    flags.AddInt("steps", &steps, "steps");
    flags.AddInt("epochs", &epochs, "epochs");
    flags.AddUint("seed", &seed, "seed");
    flags.AddFloat("lr", &lr, "learning rate");
    flags.AddBool("bf16", &bf16, "bf16 weights");
  }
  absl::Status Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "fedlora test");
    Argv a(args);
    return flags.Parse(a.argc(), a.argv());
  }
};

// A renamed flag is refused naming its new name (also as --no-old); a typo gets the nearest name.
TEST(FlagSet, RenamedAndMistypedFlagsNameTheRightOne) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--model", "m", "--clients", "3"},
       "--clients was renamed to --num-clients (a count; see 'fedlora test --help')"},
      {{"--model", "m", "--no-clients"}, "--no-clients was renamed to --num-clients"},
      {{"--model", "m", "--step", "3"},
       "unknown flag --step for 'fedlora test'; did you mean --steps?"},
  };
  for (const auto& [args, message] : refused) {
    Fixture f;
    f.flags.AddRenamed("clients", "num-clients", "a count");
    const absl::Status s = f.Parse(args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  }
  Fixture f;
  f.flags.AddRenamed("clients", "num-clients", "a count");
  EXPECT_THAT(f.flags.Help(), ::testing::Not(HasSubstr("clients")));
}

TEST(FlagSet, ParsesBothSyntaxesAndBooleans) {
  Fixture f;
  ASSERT_TRUE(f.Parse({"--model", "m", "--steps=-5", "--lr", "1e-3", "--bf16",
                       "--seed=18446744073709551615"})
                  .ok());
  EXPECT_EQ(f.model, "m");
  EXPECT_EQ(f.steps, -5);
  EXPECT_FLOAT_EQ(f.lr, 1e-3f);
  EXPECT_TRUE(f.bf16);
  EXPECT_EQ(f.seed, 18446744073709551615ull);
  EXPECT_EQ(f.epochs, 3);  // untouched default
  EXPECT_TRUE(f.flags.WasSet("lr"));
  EXPECT_FALSE(f.flags.WasSet("epochs"));
  Fixture g;
  ASSERT_TRUE(g.Parse({"--model=x", "--bf16=false", "--", "--not-a-flag"}).ok());
  EXPECT_FALSE(g.bf16);
  EXPECT_EQ(g.flags.positional(), (std::vector<std::string>{"--not-a-flag"}));
}

TEST(FlagSet, RejectsUnknownMalformedMissingAndRepeated) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--model", "m", "--bogus", "1"}, "unknown flag --bogus"},
      {{"--model", "m", "--epochs", "abc"}, "--epochs: 'abc' is not a valid integer"},
      {{"--model", "m", "--epochs", "3000000000"}, "--epochs: '3000000000' is not a valid integer"},
      {{"--model", "m", "--steps", "12x"}, "--steps: '12x' is not a valid integer"},
      {{"--model", "m", "--seed", "-1"}, "--seed: '-1' is not a valid non-negative integer"},
      {{"--model", "m", "--lr", "nan"}, "--lr: 'nan' is not a valid finite number"},
      {{"--model", "m", "--bf16=maybe"}, "--bf16: 'maybe' is not a valid boolean"},
      {{"--model", "m", "--lr"}, "--lr needs a float value"},
      {{"--model", "m", "--model", "n"}, "--model given more than once"},
      {{"--epochs", "2"}, "missing required flag --model"},
  };
  for (const Case& c : cases) {
    Fixture f;
    const absl::Status s = f.Parse(c.args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
}

TEST(FlagSet, HelpSkipsRequiredChecksAndListsFlags) {
  Fixture f;
  ASSERT_TRUE(f.Parse({"--help"}).ok());
  EXPECT_TRUE(f.flags.help_requested());
  const std::string help = f.flags.Help();
  EXPECT_THAT(help, HasSubstr("usage: fedlora test [flags]"));
  EXPECT_THAT(help, HasSubstr("--model <string>"));
  EXPECT_THAT(help, HasSubstr("(required)"));
  EXPECT_THAT(help, HasSubstr("(default: 0.0005)"));
  EXPECT_THAT(help, HasSubstr("--[no-]bf16 "));
}

// The conventions of common command-line tools: --no-X for a boolean, -v for --verbose, errors
// naming the flag as it was typed, and a sentinel default shown as what it means.
TEST(FlagSet, FollowsCommonConventions) {
  Fixture f;
  bool progress = true, verbose = false;
  int64_t rounds = -1;
  f.flags.AddBool("progress", &progress, "progress line");
  f.flags.AddBool("verbose", &verbose, "debug lines");
  f.flags.AddInt("rounds", &rounds, "rounds");
  f.flags.SetDefaultText("rounds", "the config's");
  ASSERT_TRUE(f.Parse({"--model", "m", "--no-progress", "-v"}).ok());
  EXPECT_FALSE(progress);
  EXPECT_TRUE(verbose);
  const std::string help = f.flags.Help();
  EXPECT_THAT(help, HasSubstr("-v, --[no-]verbose"));
  EXPECT_THAT(help, HasSubstr("(default: the config's)"));
  EXPECT_THAT(help, ::testing::Not(HasSubstr("(default: -1)")));
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--model", "m", "-x"}, "unknown flag -x for"},
      {{"--model", "m", "--no-model"}, "unknown flag --no-model"},  // not a boolean
      {{"--model", "m", "--no-progress=true"}, "--no-progress takes no value"},
      {{"--model", "m", "--progress", "--no-progress"}, "--progress given more than once"},
      {{"--model", "m", "-lr"}, "-lr needs a float value"},
  };
  for (const auto& [args, message] : refused) {
    Fixture g;
    bool p = true;
    g.flags.AddBool("progress", &p, "progress line");
    const absl::Status s = g.Parse(args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  }
}

// Choices are matched in any case, as the run config's enum values are ("--optimizer ADAMW" and
// "optimizer": "adamw" both work), and a wrong one is answered with the valid ones.
TEST(FlagSet, ChoicesTakeAnyCaseAndSuggestTheNearest) {
  for (const char* typed : {"cosine", "COSINE", "Cosine"}) {
    std::string schedule = "linear";
    FlagSet flags("fedlora test", "A test command.");
    flags.AddChoice("schedule", &schedule, {"constant", "linear", "cosine"},
                    "learning-rate schedule");
    Argv a({"fedlora test", "--schedule", typed});
    ASSERT_TRUE(flags.Parse(a.argc(), a.argv()).ok()) << typed;
    EXPECT_EQ(schedule, "cosine");
  }
  std::string optimizer = "adamw";
  FlagSet flags("fedlora test", "A test command.");
  flags.AddChoice("optimizer", &optimizer, {"adamw", "lamb", "sgd"}, "optimizer");
  EXPECT_THAT(flags.Help(), HasSubstr("--optimizer <adamw|lamb|sgd>"));
  EXPECT_THAT(flags.Help(), HasSubstr("(default: adamw)"));
  Argv a({"fedlora test", "--optimizer=sdg"});
  absl::Status s = flags.Parse(a.argc(), a.argv());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      std::string(s.message()),
      "--optimizer: unknown value 'sdg'; valid: adamw, lamb, sgd (any case); did you mean sgd?");
  EXPECT_EQ(optimizer, "adamw");
}

TEST(SplitList, TrimsAndDropsEmpty) {
  EXPECT_EQ(SplitList(" query, value,,key "), (std::vector<std::string>{"query", "value", "key"}));
  EXPECT_TRUE(SplitList("").empty());
}

TEST(FlagSet, HasNamesRegisteredFlagsOnly) {
  Fixture f;
  EXPECT_TRUE(f.flags.Has("model"));
  EXPECT_TRUE(f.flags.Has("bf16"));
  EXPECT_FALSE(f.flags.Has("verbose"));
}

// Restores the global log settings a test changes.
class LogSettingsGuard {
 public:
  LogSettingsGuard() : level_(GetLogLevel()), format_(GetLogFormat()) {}
  ~LogSettingsGuard() {
    SetLogLevel(level_);
    SetLogFormat(format_);
    EXPECT_TRUE(SetLogFile("").ok());
  }

 private:
  LogLevel level_;
  LogFormat format_;
};

TEST(LogFlags, ParseFlagsOrExitAppliesThem) {
  LogSettingsGuard guard;
  std::string dir = (std::filesystem::temp_directory_path() / "flags_test_XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/logs/x.log";  // the directory is made
  Fixture f;
  Argv a({"fedlora test", "--model", "m", "--verbose", "--log-format", "JSON", "--log-file", path});
  ASSERT_EQ(ParseFlagsOrExit(f.flags, a.argc(), a.argv()), std::nullopt);
  EXPECT_EQ(GetLogLevel(), LogLevel::kDebug);
  EXPECT_EQ(GetLogFormat(), LogFormat::kJson);
  EXPECT_EQ(GetLogFile(), path);
  FEDLORA_LOG(DEBUG) << "to the file";
  ASSERT_TRUE(SetLogFile("").ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("\"level\":\"DEBUG\""));
  EXPECT_THAT(text.str(), HasSubstr("\"msg\":\"to the file\""));
  std::filesystem::remove_all(dir);
}

TEST(LogFlags, LeavesTheSettingsAloneWhenNotGiven) {
  LogSettingsGuard guard;
  SetLogLevel(LogLevel::kWarning);
  SetLogFormat(LogFormat::kText);
  Fixture f;
  Argv a({"fedlora test", "--model", "m"});
  ASSERT_EQ(ParseFlagsOrExit(f.flags, a.argc(), a.argv()), std::nullopt);
  EXPECT_EQ(GetLogLevel(), LogLevel::kWarning);  // e.g. from FEDLORA_LOG_LEVEL
  EXPECT_EQ(GetLogFormat(), LogFormat::kText);
  EXPECT_EQ(GetLogFile(), "");
}

TEST(LogFlags, ACommandsOwnFlagOfTheSameNameWins) {
  LogSettingsGuard guard;
  SetLogLevel(LogLevel::kInfo);
  FlagSet flags("fedlora test", "A test command.");
  bool verbose = false;
  flags.AddBool("verbose", &verbose, "the command's own meaning");
  Argv a({"fedlora test", "--verbose", "--log-level", "error"});
  ASSERT_EQ(ParseFlagsOrExit(flags, a.argc(), a.argv()), std::nullopt);
  EXPECT_TRUE(verbose);
  EXPECT_EQ(GetLogLevel(), LogLevel::kError);  // --verbose was not the logging one
}

TEST(LogFlags, BadValuesAreUsageErrors) {
  LogSettingsGuard guard;
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--log-level", "loud"},
                                               {"--log-format", "xml"},
                                               {"--verbose", "--log-level", "info"}}) {
    Fixture f;
    std::vector<std::string> all = {"fedlora test", "--model", "m"};
    all.insert(all.end(), args.begin(), args.end());
    Argv a(all);
    EXPECT_EQ(ParseFlagsOrExit(f.flags, a.argc(), a.argv()), std::optional<int>(kExitUsage))
        << args[0];
  }
  Fixture f;
  Argv a({"fedlora test", "--model", "m", "--log-file",
          "/dev/null/x.log"});  // under a file: no directory
  EXPECT_EQ(ParseFlagsOrExit(f.flags, a.argc(), a.argv()), std::optional<int>(kExitFailure));
  EXPECT_EQ(GetLogFile(), "");
}

}  // namespace
}  // namespace fedlora::tools
