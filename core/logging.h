// Minimal leveled logging to stderr: FEDLORA_LOG(INFO) << "round " << r << " committed";
// The threshold comes from FEDLORA_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default INFO) or
// SetLogLevel(). Each message is written with one write() so lines from threads do not interleave.
// Thread-safe.
#pragma once

#include <sstream>
#include <string_view>

namespace fedlora {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "INFO", "warning", "error"; returns false for anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace fedlora

#define FEDLORA_LOG_LEVEL_DEBUG ::fedlora::LogLevel::kDebug
#define FEDLORA_LOG_LEVEL_INFO ::fedlora::LogLevel::kInfo
#define FEDLORA_LOG_LEVEL_WARNING ::fedlora::LogLevel::kWarning
#define FEDLORA_LOG_LEVEL_ERROR ::fedlora::LogLevel::kError
#define FEDLORA_LOG(severity)                                                   \
  if (FEDLORA_LOG_LEVEL_##severity < ::fedlora::GetLogLevel()) {                \
  } else                                                                        \
    ::fedlora::LogMessage(FEDLORA_LOG_LEVEL_##severity, __FILE__, __LINE__).stream()
