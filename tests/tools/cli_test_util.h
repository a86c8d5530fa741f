// The fedlora binary run from a test as a user runs it: a scratch directory per test, and each
// command's exit code, stdout and stderr.
//
//   class StoreCli : public testing::CliTest {};
//   TEST_F(StoreCli, ...) { testing::CliResult r = Run({"store", "verify", "--data-dir", dir_}); }
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/file.h"
#include "gtest/gtest.h"

namespace fedlora::testing {

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

// `s` in single quotes for sh, its own single quotes escaped.
inline std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class CliTest : public ::testing::Test {
 protected:
  // FEDLORA_BINARY_DIR/tools/fedlora (ctest sets it) and a fresh scratch directory in dir_.
  void SetUp() override {
    const char* bin = std::getenv("FEDLORA_BINARY_DIR");
    ASSERT_NE(bin, nullptr) << "run through ctest (FEDLORA_BINARY_DIR)";
    fedlora_ = std::string(bin) + "/tools/fedlora";
    ASSERT_TRUE(std::filesystem::exists(fedlora_)) << fedlora_;
    std::string tmpl = (std::filesystem::temp_directory_path() / "fedlora_cli_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Runs `fedlora args...`; `env`: "NAME=value " assignments put before the command.
  CliResult Run(const std::vector<std::string>& args, const std::string& env = "") {
    std::string cmd = env + ShellQuote(fedlora_);
    // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on " " + ShellQuote(a).
    for (const std::string& a : args) cmd.append(" ").append(ShellQuote(a));
    const std::string out = dir_ + "/stdout", err = dir_ + "/stderr";
    cmd.append(" >").append(ShellQuote(out)).append(" 2>").append(ShellQuote(err));
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadFileToString(out).value_or("");
    r.err = ReadFileToString(err).value_or("");
    return r;
  }

  std::string fedlora_, dir_;
};

}  // namespace fedlora::testing
