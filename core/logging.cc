#include "core/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "absl/strings/ascii.h"

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
}  // namespace

void SetLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(Level().load(std::memory_order_relaxed)); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  const std::string t = absl::AsciiStrToLower(absl::string_view(text.data(), text.size()));
  if (t == "debug") *level = LogLevel::kDebug;
  else if (t == "info") *level = LogLevel::kInfo;
  else if (t == "warning" || t == "warn") *level = LogLevel::kWarning;
  else if (t == "error") *level = LogLevel::kError;
  else return false;
  return true;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static constexpr char kTag[] = {'D', 'I', 'W', 'E'};
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  stream_ << kTag[static_cast<int>(level)] << ' ' << stamp << '.' << (ms < 100 ? (ms < 10 ? "00" : "0") : "")
          << ms << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string s = stream_.str();
  ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
}

}  // namespace fedlora
