// The flags of every `fedlora` command, read from the built binary's own help: each flag name has
// one type across all commands and verbs (a name that is a count in one command and a list or a
// boolean in another is refused), every shown default is a real value (never -1, never two), and a
// renamed flag is refused with its new name.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

struct Result {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

std::string Fedlora() {
  const char* bin = std::getenv("FEDLORA_BINARY_DIR");
  return bin == nullptr ? std::string() : absl::StrCat(bin, "/tools/fedlora");
}

// Runs fedlora with `args` (words without quotes or shell characters).
Result RunFedlora(const std::string& args) {
  Result r;
  FILE* p = popen(absl::StrCat(Fedlora(), " ", args, " 2>&1 </dev/null").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

struct FlagLine {
  std::string name, type, help;  // type: "bool", or what help shows in <...>
};

// The flag lines of a FlagSet's help ("  --name <type>  help", "  --[no-]name  help").
std::vector<FlagLine> ParseFlags(const std::string& help) {
  static const std::regex kLine(R"(^  (?:-v, )?--(\[no-\])?([a-z0-9-]+)(?: <([^>]+)>)?\s+(.*)$)");
  std::vector<FlagLine> flags;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, kLine) || m[2] == "help") continue;
    flags.push_back({m[2], m[1].matched ? "bool" : m[3].str(), m[4]});
  }
  return flags;
}

// "fedlora certs" lists its verbs under "verbs:"; store and audit name them in their usage line
// ("usage: fedlora store verify|repair ...").
std::vector<std::string> Verbs(const std::string& command, const std::string& help) {
  std::vector<std::string> verbs;
  std::istringstream in(help);
  bool in_verbs = false;
  for (std::string line; std::getline(in, line);) {
    if (line == "verbs:") {
      in_verbs = true;
    } else if (in_verbs && absl::StartsWith(line, "  ")) {
      verbs.push_back(std::vector<std::string>(
          absl::StrSplit(absl::StripLeadingAsciiWhitespace(line), ' '))[0]);
    } else if (in_verbs) {
      in_verbs = false;
    }
  }
  if (!verbs.empty()) return verbs;
  const std::string usage = absl::StrCat("usage: fedlora ", command, " ");
  if (absl::StartsWith(help, usage)) {
    const std::string word = help.substr(usage.size(), help.find(' ', usage.size()) - usage.size());
    if (!word.empty() && word[0] != '[' && word[0] != '<') verbs = absl::StrSplit(word, '|');
  }
  return verbs;
}

// Read once for the suite: command (and verb) -> its flags.
class FlagNames : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { Read(); }
  void SetUp() override { ASSERT_GE(table_.size(), 20u) << "reading the help failed (see above)"; }

  static void Read() {
    ASSERT_FALSE(Fedlora().empty()) << "run through ctest (FEDLORA_BINARY_DIR)";
    const Result top = RunFedlora("--help");
    ASSERT_EQ(top.exit_code, 0) << top.out;
    static const std::regex kCommand(R"(^  ([a-z-]+)\s+\S.*$)");
    std::istringstream in(top.out);
    std::vector<std::string> commands;
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (std::regex_match(line, m, kCommand)) commands.push_back(m[1]);
    }
    ASSERT_GE(commands.size(), 13u) << top.out;
    for (const std::string& c : commands) {
      const Result help = RunFedlora(c + " --help");
      ASSERT_EQ(help.exit_code, 0) << c << ": " << help.out;
      std::vector<FlagLine> flags = ParseFlags(help.out);
      if (!flags.empty()) {
        table_[c] = flags;
        continue;
      }
      const std::vector<std::string> verbs = Verbs(c, help.out);
      ASSERT_FALSE(verbs.empty()) << "fedlora " << c << " --help shows neither flags nor verbs:\n"
                                  << help.out;
      for (const std::string& v : verbs) {
        const Result vhelp = RunFedlora(c + " " + v + " --help");
        ASSERT_EQ(vhelp.exit_code, 0) << c << " " << v << ": " << vhelp.out;
        table_[c + " " + v] = ParseFlags(vhelp.out);
        ASSERT_FALSE(table_[c + " " + v].empty()) << c << " " << v << ": " << vhelp.out;
      }
    }
  }

  static std::map<std::string, std::vector<FlagLine>> table_;
};

std::map<std::string, std::vector<FlagLine>> FlagNames::table_;

TEST_F(FlagNames, EachNameHasOneTypeAcrossCommands) {
  std::map<std::string, std::map<std::string, std::vector<std::string>>>
      types;  // name -> type -> commands
  size_t count = 0;
  for (const auto& [command, flags] : table_) {
    for (const FlagLine& f : flags) {
      types[f.name][f.type].push_back(command);
      ++count;
    }
  }
  // Every command and verb was read (SetUp: 10 commands with flags, certs' 7 verbs, store's 2,
  // audit's 1).
  EXPECT_GT(count, 150u);
  for (const auto& [name, by_type] : types) {
    if (by_type.size() == 1) continue;
    std::vector<std::string> uses;
    for (const auto& [type, commands] : by_type) {
      uses.push_back(absl::StrCat(type, " in ", absl::StrJoin(commands, ", ")));
    }
    ADD_FAILURE() << "--" << name << " means different things: " << absl::StrJoin(uses, "; ");
  }
}

TEST_F(FlagNames, DefaultsShownAreRealValues) {
  static const std::regex kDefault(R"(default[: ])", std::regex::icase);
  for (const auto& [command, flags] : table_) {
    for (const FlagLine& f : flags) {
      const std::string where = absl::StrCat("fedlora ", command, " --", f.name, ": ", f.help);
      EXPECT_THAT(f.help, ::testing::Not(HasSubstr("(default: -1)"))) << where;
      const auto n = std::distance(std::sregex_iterator(f.help.begin(), f.help.end(), kDefault),
                                   std::sregex_iterator());
      EXPECT_LE(n, 1) << "a default said twice: " << where;
    }
  }
}

TEST(RenamedFlags, AreRefusedNamingTheNewName) {
  ASSERT_FALSE(Fedlora().empty()) << "run through ctest (FEDLORA_BINARY_DIR)";
  const struct {
    std::string args, new_name;
  } cases[] = {
      {"simulate --config none.json --clients 3", "renamed to --num-clients"},
      {"status --server 127.0.0.1:1 --insecure --clients", "renamed to --list-clients"},
      {"store verify --data-dir none", "renamed to --store"},
      {"audit open --data-dir none --key k --out o", "renamed to --store"},
  };
  for (const auto& c : cases) {
    const Result r = RunFedlora(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.new_name)) << c.args;
  }
  // A typo gets the nearest name.
  const Result r = RunFedlora("train --epoch 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("unknown flag --epoch for 'fedlora train'; did you mean --epochs?"));
}

}  // namespace
}  // namespace fedlora
