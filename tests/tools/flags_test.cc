#include "tools/flags.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
  EXPECT_THAT(help, HasSubstr("--bf16 "));
}

TEST(SplitList, TrimsAndDropsEmpty) {
  EXPECT_EQ(SplitList(" query, value,,key "), (std::vector<std::string>{"query", "value", "key"}));
  EXPECT_TRUE(SplitList("").empty());
}

}  // namespace
}  // namespace fedlora::tools
