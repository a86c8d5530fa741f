#include "core/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace fedlora {
namespace {

LogLevel InitialLevel() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = std::getenv("FEDLORA_LOG_LEVEL")) ParseLogLevel(env, &level);
  return level;
}
std::atomic<int>& Level() {
  static std::atomic<int> level(static_cast<int>(InitialLevel()));
  return level;
}

LogFormat InitialFormat() {
  LogFormat format = LogFormat::kText;
  if (const char* env = std::getenv("FEDLORA_LOG_FORMAT")) ParseLogFormat(env, &format);
  return format;
}
std::atomic<int>& Format() {
  static std::atomic<int> format(static_cast<int>(InitialFormat()));
  return format;
}

// Where lines go. Replaced whole under SinkMutex(); a writer holds its own reference, so a file is
// closed only once no thread is still writing to it.
struct Sink {
  int fd = STDERR_FILENO;
  std::string path;                             // empty: stderr
  LogLevel console_level = LogLevel::kWarning;  // with a file: copied to stderr from this level up
  ~Sink() {
    if (!path.empty()) ::close(fd);
  }
};
std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}
std::shared_ptr<const Sink>& CurrentSink() {
  static std::shared_ptr<const Sink> sink = std::make_shared<const Sink>();
  return sink;
}
std::shared_ptr<const Sink> GetSink() {
  std::lock_guard<std::mutex> lock(SinkMutex());
  return CurrentSink();
}

void WriteAll(int fd, const std::string& s) {
  // One write(): a short write (a full pipe interrupted by a signal) is not resumed, because a
  // second write could land in the middle of another thread's line.
  ssize_t n;
  do {
    n = ::write(fd, s.data(), s.size());
  } while (n < 0 && errno == EINTR);
}

// Writes a text line to stderr, first clearing a progress line drawn in place on a terminal.
void WriteToStderr(LogFormat format, const std::string& line) {
  if (format == LogFormat::kText && ::isatty(STDERR_FILENO) == 1) {
    WriteAll(STDERR_FILENO, absl::StrCat("\r\x1b[K", line));
  } else {
    WriteAll(STDERR_FILENO, line);
  }
}

constexpr const char* kLevelNames[] = {"DEBUG", "INFO", "WARNING", "ERROR"};

}  // namespace

void SetLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(Level().load(std::memory_order_relaxed)); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  const std::string t = absl::AsciiStrToLower(absl::string_view(text.data(), text.size()));
  if (t == "debug")
    *level = LogLevel::kDebug;
  else if (t == "info")
    *level = LogLevel::kInfo;
  else if (t == "warning" || t == "warn")
    *level = LogLevel::kWarning;
  else if (t == "error")
    *level = LogLevel::kError;
  else
    return false;
  return true;
}

void SetLogFormat(LogFormat format) { Format().store(static_cast<int>(format)); }
LogFormat GetLogFormat() {
  return static_cast<LogFormat>(Format().load(std::memory_order_relaxed));
}

bool ParseLogFormat(std::string_view text, LogFormat* format) {
  const std::string t = absl::AsciiStrToLower(absl::string_view(text.data(), text.size()));
  if (t == "text")
    *format = LogFormat::kText;
  else if (t == "json")
    *format = LogFormat::kJson;
  else
    return false;
  return true;
}

absl::Status SetLogFile(const std::string& path, LogLevel console_level) {
  auto sink = std::make_shared<Sink>();
  sink->console_level = console_level;
  if (!path.empty()) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) {
      const int err = errno;
      return absl::Status(absl::ErrnoToStatusCode(err),
                          absl::StrCat("log file ", path, ": ", std::strerror(err)));
    }
    sink->fd = fd;
    sink->path = path;
  }
  std::shared_ptr<const Sink> old;
  {
    std::lock_guard<std::mutex> lock(SinkMutex());
    old = std::move(CurrentSink());
    CurrentSink() = std::move(sink);
  }
  return absl::OkStatus();  // `old` closes its file here unless a writer still holds it
}

std::string GetLogFile() { return GetSink()->path; }

std::string FormatLogLine(LogFormat format, LogLevel level, std::string_view file, int line,
                          std::chrono::system_clock::time_point time, std::string_view msg) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(time);
  const long long ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  const size_t slash = file.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? file : file.substr(slash + 1);
  char stamp[48];
  if (format == LogFormat::kJson) {
    std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
    char ts[64];
    std::snprintf(ts, sizeof(ts), "%s.%03lldZ", stamp, ms);
    nlohmann::ordered_json j;
    j["ts"] = ts;
    j["level"] = kLevelNames[static_cast<int>(level)];
    j["file"] = std::string(base);
    j["line"] = line;
    j["msg"] = std::string(msg);
    // Compact, UTF-8 kept as is, control characters as \u00XX, invalid UTF-8 replaced by U+FFFD.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  static constexpr char kTag[] = {'D', 'I', 'W', 'E'};
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  char prefix[64];
  std::snprintf(prefix, sizeof(prefix), "%c %s.%03lld ", kTag[static_cast<int>(level)], stamp, ms);
  std::string out = prefix;
  out.append(base.data(), base.size());
  absl::StrAppend(&out, ":", line, "] ");
  out.append(msg.data(), msg.size());
  out.push_back('\n');
  return out;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line), time_(std::chrono::system_clock::now()) {}

LogMessage::~LogMessage() {
  const std::string msg = stream_.str();
  const LogFormat format = GetLogFormat();
  const std::shared_ptr<const Sink> sink = GetSink();
  const std::string line = FormatLogLine(format, level_, file_, line_, time_, msg);
  if (sink->path.empty()) {
    WriteToStderr(format, line);
    return;
  }
  WriteAll(sink->fd, line);
  if (level_ >= sink->console_level) {
    WriteToStderr(LogFormat::kText,
                  format == LogFormat::kText
                      ? line
                      : FormatLogLine(LogFormat::kText, level_, file_, line_, time_, msg));
  }
}

}  // namespace fedlora
