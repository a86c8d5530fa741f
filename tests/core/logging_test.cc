#include "core/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

TEST(ParseLogLevel, AcceptsEveryNameInAnyCase) {
  const std::vector<std::pair<std::string, LogLevel>> cases = {
      {"debug", LogLevel::kDebug}, {"DEBUG", LogLevel::kDebug},     {"Info", LogLevel::kInfo},
      {"info", LogLevel::kInfo},   {"warning", LogLevel::kWarning}, {"WARN", LogLevel::kWarning},
      {"error", LogLevel::kError}, {"ErRoR", LogLevel::kError}};
  for (const auto& [text, want] : cases) {
    LogLevel got = want == LogLevel::kDebug ? LogLevel::kError : LogLevel::kDebug;  // anything else
    EXPECT_TRUE(ParseLogLevel(text, &got)) << text;
    EXPECT_EQ(got, want) << text;
  }
}

TEST(ParseLogLevel, RejectsOtherTextAndLeavesLevelAlone) {
  for (const char* bad : {"", "verbose", "fatal", " info", "info ", "2", "warnings"}) {
    LogLevel level = LogLevel::kWarning;
    EXPECT_FALSE(ParseLogLevel(bad, &level)) << bad;
    EXPECT_EQ(level, LogLevel::kWarning) << bad;
  }
}

// Redirects fd 2 into a temporary file for the lifetime of the object.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    file_ = std::tmpfile();
    ::dup2(::fileno(file_), STDERR_FILENO);
  }
  ~StderrCapture() { Restore(); }
  std::string Finish() {
    Restore();
    std::string out;
    std::rewind(file_);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), file_)) > 0) out.append(buf, n);
    return out;
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  int saved_ = -1;
  std::FILE* file_ = nullptr;
};

class LogLevelGuard {
 public:
  LogLevelGuard() : saved_(GetLogLevel()) {}
  ~LogLevelGuard() { SetLogLevel(saved_); }

 private:
  LogLevel saved_;
};

TEST(Logging, FormatAndThreshold) {
  LogLevelGuard guard;
  SetLogLevel(LogLevel::kInfo);
  EXPECT_EQ(GetLogLevel(), LogLevel::kInfo);
  int evaluated = 0;
  auto side_effect = [&] { return ++evaluated; };
  StderrCapture capture;
  FEDLORA_LOG(INFO) << "round " << 7 << " committed";
  FEDLORA_LOG(DEBUG) << "hidden " << side_effect();  // below the threshold: not even evaluated
  FEDLORA_LOG(ERROR) << "disk full";
  const std::string out = capture.Finish();
  EXPECT_EQ(evaluated, 0);
  EXPECT_THAT(
      out, ContainsRegex(
               "^I [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} logging_test\\.cc:[0-9]+\\] round 7 committed\n"));
  EXPECT_THAT(out, ContainsRegex("\nE [0-9:.]+ logging_test\\.cc:[0-9]+\\] disk full\n$"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("hidden")));
}

TEST(Logging, LinesFromManyThreadsDoNotInterleave) {
  LogLevelGuard guard;
  SetLogLevel(LogLevel::kInfo);
  StderrCapture capture;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i)
        FEDLORA_LOG(WARNING) << "thread " << t << " message " << i << " " << std::string(100, 'a' + t);
    });
  }
  for (auto& th : threads) th.join();
  const std::string out = capture.Finish();
  int lines = 0;
  size_t pos = 0;
  while (pos < out.size()) {
    const size_t nl = out.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    const std::string line = out.substr(pos, nl - pos);
    ASSERT_THAT(line, ContainsRegex(
                          "^W [0-9:.]+ logging_test\\.cc:[0-9]+\\] thread [0-3] message [0-9]+ [a-d]{100}$"));
    const char c = line.back();
    ASSERT_EQ(line.substr(line.size() - 100), std::string(100, c));  // one thread's payload, whole
    ++lines;
    pos = nl + 1;
  }
  EXPECT_EQ(lines, 800);
}

}  // namespace
}  // namespace fedlora
