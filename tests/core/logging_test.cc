#include "core/logging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
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

// Restores the level and format, and sends the log back to stderr.
class LogLevelGuard {
 public:
  LogLevelGuard() : saved_(GetLogLevel()), format_(GetLogFormat()) {}
  ~LogLevelGuard() {
    SetLogLevel(saved_);
    SetLogFormat(format_);
    EXPECT_TRUE(SetLogFile("").ok());
  }

 private:
  LogLevel saved_;
  LogFormat format_;
};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A fresh temporary directory, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "logging_test_XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// 2024-05-01T12:34:56.007Z
std::chrono::system_clock::time_point FixedTime() {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(1714566896007LL));
}

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
  EXPECT_THAT(out, ContainsRegex("^I [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} "
                                 "logging_test\\.cc:[0-9]+\\] round 7 committed\n"));
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
        FEDLORA_LOG(WARNING) << "thread " << t << " message " << i << " "
                             << std::string(100, 'a' + t);
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
    ASSERT_THAT(
        line,
        ContainsRegex(
            "^W [0-9:.]+ logging_test\\.cc:[0-9]+\\] thread [0-3] message [0-9]+ [a-d]{100}$"));
    const char c = line.back();
    ASSERT_EQ(line.substr(line.size() - 100), std::string(100, c));  // one thread's payload, whole
    ++lines;
    pos = nl + 1;
  }
  EXPECT_EQ(lines, 800);
}

TEST(ParseLogFormat, AcceptsTextAndJsonOnly) {
  LogFormat f = LogFormat::kText;
  EXPECT_TRUE(ParseLogFormat("JSON", &f));
  EXPECT_EQ(f, LogFormat::kJson);
  EXPECT_TRUE(ParseLogFormat("text", &f));
  EXPECT_EQ(f, LogFormat::kText);
  for (const char* bad : {"", "jsonl", "plain", " json"}) {
    f = LogFormat::kJson;
    EXPECT_FALSE(ParseLogFormat(bad, &f)) << bad;
    EXPECT_EQ(f, LogFormat::kJson) << bad;
  }
}

TEST(FormatLogLine, TextIsTheClassicFormat) {
  EXPECT_EQ(FormatLogLine(LogFormat::kText, LogLevel::kWarning, "/src/server/coordinator.cc", 887,
                          FixedTime(), "round 3 committed"),
            "W 12:34:56.007 coordinator.cc:887] round 3 committed\n");
}

TEST(FormatLogLine, JsonHasTheFieldsInOrderAndEscapes) {
  const std::string msg =
      std::string("say \"hi\"\\ back\nline two\ttab \x01\x1f caf\xc3\xa9 \xe6\x97\xa5 end");
  const std::string line = FormatLogLine(LogFormat::kJson, LogLevel::kError, "server/services.cc",
                                         508, FixedTime(), msg);
  ASSERT_EQ(line.back(), '\n');
  ASSERT_EQ(line.find('\n'), line.size() - 1) << "one line: the newline in msg is escaped";
  EXPECT_EQ(line,
            "{\"ts\":\"2024-05-01T12:34:56.007Z\",\"level\":\"ERROR\",\"file\":\"services.cc\","
            "\"line\":508,"
            "\"msg\":\"say \\\"hi\\\"\\\\ back\\nline two\\ttab \\u0001\\u001f caf\xc3\xa9 "
            "\xe6\x97\xa5 end\"}\n");
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["ts"], "2024-05-01T12:34:56.007Z");
  EXPECT_EQ(j["level"], "ERROR");
  EXPECT_EQ(j["file"], "services.cc");
  EXPECT_EQ(j["line"], 508);
  EXPECT_EQ(j["msg"].get<std::string>(), msg);  // round-trips exactly
}

TEST(FormatLogLine, JsonReplacesInvalidUtf8) {
  const std::string line = FormatLogLine(LogFormat::kJson, LogLevel::kInfo, "a.cc", 1, FixedTime(),
                                         std::string("bad \xff\xc3 bytes"));
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << line;
  EXPECT_EQ(j["msg"].get<std::string>(), "bad \xef\xbf\xbd\xef\xbf\xbd bytes");  // U+FFFD each
}

TEST(Logging, JsonFormatThroughTheMacro) {
  LogLevelGuard guard;
  SetLogLevel(LogLevel::kInfo);
  SetLogFormat(LogFormat::kJson);
  StderrCapture capture;
  const auto before = std::chrono::system_clock::now();
  FEDLORA_LOG(INFO) << "upload "
                    << "u-1"
                    << " refused: \"INVALID_ARGUMENT: chunk 3\"";
  const std::string out = capture.Finish();
  const std::vector<std::string> lines = Lines(out);
  ASSERT_EQ(lines.size(), 1u) << out;
  const nlohmann::json j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j["level"], "INFO");
  EXPECT_EQ(j["file"], "logging_test.cc");
  EXPECT_GT(j["line"].get<int>(), 0);
  EXPECT_EQ(j["msg"], "upload u-1 refused: \"INVALID_ARGUMENT: chunk 3\"");
  const std::string ts = j["ts"];
  EXPECT_THAT(ts,
              ContainsRegex("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$"));
  // UTC: the stamp reads as the time of the call.
  std::tm tm{};
  ASSERT_NE(::strptime(ts.c_str(), "%Y-%m-%dT%H:%M:%S", &tm), nullptr) << ts;
  const std::time_t logged = ::timegm(&tm), called = std::chrono::system_clock::to_time_t(before);
  EXPECT_LE(std::abs(static_cast<long long>(logged - called)), 2) << ts;
}

TEST(LogFile, AppendsFiltersAndCopiesWarningsToTheConsole) {
  LogLevelGuard guard;
  SetLogLevel(LogLevel::kInfo);
  SetLogFormat(LogFormat::kText);
  TempDir dir;
  const std::string path = dir.path() + "/server.log";
  { std::ofstream(path) << "earlier run\n"; }
  StderrCapture capture;
  ASSERT_TRUE(SetLogFile(path).ok());
  EXPECT_EQ(GetLogFile(), path);
  FEDLORA_LOG(DEBUG) << "hidden debug";
  FEDLORA_LOG(INFO) << "round 1 committed";
  FEDLORA_LOG(WARNING) << "client 3 is slow";
  SetLogLevel(LogLevel::kDebug);
  FEDLORA_LOG(DEBUG) << "shown debug";
  FEDLORA_LOG(ERROR) << "disk full";
  ASSERT_TRUE(SetLogFile("").ok());
  EXPECT_EQ(GetLogFile(), "");
  FEDLORA_LOG(INFO) << "back on stderr";
  const std::string console = capture.Finish();

  const std::vector<std::string> file = Lines(ReadAll(path));
  ASSERT_EQ(file.size(), 5u) << ReadAll(path);
  EXPECT_EQ(file[0], "earlier run");  // appended, not truncated
  EXPECT_THAT(file[1], ContainsRegex("^I [0-9:.]+ logging_test\\.cc:[0-9]+\\] round 1 committed$"));
  EXPECT_THAT(file[2], ContainsRegex("^W .*\\] client 3 is slow$"));
  EXPECT_THAT(file[3], ContainsRegex("^D .*\\] shown debug$"));
  EXPECT_THAT(file[4], ContainsRegex("^E .*\\] disk full$"));

  // The console saw the WARNING and the ERROR (the copy), then the line logged after the switch back.
  const std::vector<std::string> lines = Lines(console);
  ASSERT_EQ(lines.size(), 3u) << console;
  EXPECT_EQ(lines[0], file[2]);
  EXPECT_EQ(lines[1], file[4]);
  EXPECT_THAT(lines[2], HasSubstr("] back on stderr"));

  // A file SetLogFile creates is 0640 (less the umask).
  struct stat st {};
  const std::string fresh = dir.path() + "/fresh.log";
  const mode_t old_umask = ::umask(022);
  ASSERT_TRUE(SetLogFile(fresh).ok());
  ::umask(old_umask);
  ASSERT_EQ(::stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST(LogFile, IsOpenedCloseOnExec) {
  LogLevelGuard guard;
  TempDir dir;
  const std::string path = dir.path() + "/x.log";
  ASSERT_TRUE(SetLogFile(path).ok());
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(entry.path(), ec) != path || ec) continue;
    const int fd = std::stoi(entry.path().filename().string());
    EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    EXPECT_NE(::fcntl(fd, F_GETFL) & O_APPEND, 0);
    ++found;
  }
  EXPECT_EQ(found, 1);
}

TEST(LogFile, ConsoleLevelAndJsonCopy) {
  LogLevelGuard guard;
  SetLogLevel(LogLevel::kInfo);
  SetLogFormat(LogFormat::kJson);
  TempDir dir;
  const std::string path = dir.path() + "/a.log";
  StderrCapture capture;
  ASSERT_TRUE(SetLogFile(path, LogLevel::kError).ok());
  FEDLORA_LOG(WARNING) << "only in the file";
  FEDLORA_LOG(ERROR) << "in both";
  const std::string console = capture.Finish();
  const std::vector<std::string> file = Lines(ReadAll(path));
  ASSERT_EQ(file.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(file[0])["msg"], "only in the file");
  EXPECT_EQ(nlohmann::json::parse(file[1])["level"], "ERROR");
  // The console copy is for a person: text, whatever the file's format.
  EXPECT_THAT(console, ContainsRegex("^E [0-9:.]+ logging_test\\.cc:[0-9]+\\] in both\n$"));
}

TEST(LogFile, UnopenablePathIsAnErrorAndKeepsTheSink) {
  LogLevelGuard guard;
  TempDir dir;
  const std::string good = dir.path() + "/good.log";
  ASSERT_TRUE(SetLogFile(good).ok());
  const absl::Status s = SetLogFile(dir.path() + "/no/such/dir/x.log");
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("no/such/dir/x.log"));
  EXPECT_EQ(GetLogFile(), good);
  FEDLORA_LOG(INFO) << "still here";
  EXPECT_THAT(ReadAll(good), HasSubstr("] still here\n"));
}

// 4 threads x 300 JSON lines into a file while the main thread switches between two files: every
// line is whole JSON in one of them, and none is lost.
TEST(LogFile, ConcurrentJsonLinesStayWholeAcrossSwitches) {
  LogLevelGuard guard;
  SetLogLevel(LogLevel::kInfo);
  SetLogFormat(LogFormat::kJson);
  TempDir dir;
  const std::string a = dir.path() + "/a.log", b = dir.path() + "/b.log";
  ASSERT_TRUE(SetLogFile(a).ok());
  constexpr int kThreads = 4, kLines = 300;
  std::atomic<int> running{kThreads};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &running] {
      for (int i = 0; i < kLines; ++i)
        FEDLORA_LOG(INFO) << "thread " << t << " message " << i << " \""
                          << std::string(200, 'a' + t) << "\"\n";
      running.fetch_sub(1);
    });
  }
  for (int k = 0; running.load() > 0 && k < 10000; ++k) {
    ASSERT_TRUE(SetLogFile(k % 2 ? a : b).ok());
    std::this_thread::yield();
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(SetLogFile("").ok());
  std::vector<int> seen(kThreads * kLines, 0);
  for (const std::string& path : {a, b}) {
    for (const std::string& line : Lines(ReadAll(path))) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(j.is_discarded()) << line;
      const std::string msg = j["msg"];
      int t = -1, i = -1;
      ASSERT_EQ(std::sscanf(msg.c_str(), "thread %d message %d", &t, &i), 2) << msg;
      ASSERT_TRUE(t >= 0 && t < kThreads && i >= 0 && i < kLines) << msg;
      EXPECT_EQ(msg, "thread " + std::to_string(t) + " message " + std::to_string(i) + " \"" +
                         std::string(200, static_cast<char>('a' + t)) + "\"\n");
      ++seen[static_cast<size_t>(t * kLines + i)];
    }
  }
  for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], 1) << "line " << k;
}

}  // namespace
}  // namespace fedlora
