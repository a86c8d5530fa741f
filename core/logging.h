// Minimal leveled logging: FEDLORA_LOG(INFO) << "round " << r << " committed";
//
// Threshold: FEDLORA_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default INFO) or SetLogLevel(); a
// message below it is not even evaluated.
// Format: FEDLORA_LOG_FORMAT (text, json; default text) or SetLogFormat().
//   text: "I 12:34:56.789 coordinator.cc:887] round 3 committed" (UTC time of day)
//   json: {"ts":"2024-05-01T12:34:56.789Z","level":"INFO","file":"coordinator.cc","line":887,
//          "msg":"round 3 committed"}  (one object per line; msg escaped, invalid UTF-8 replaced)
// Sink: stderr, or a file (SetLogFile) to which lines are appended; with a file, lines at or above
// a console level (default WARNING) are also copied to stderr, in text format, so that a console
// showing a progress display still shows failures.
// Each line is written with one write() so that lines from threads never interleave. When a text
// line goes to a terminal it starts with "\r\x1b[K", clearing a progress line drawn in place.
// Thread-safe.
#pragma once

#include <chrono>
#include <sstream>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace fedlora {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class LogFormat { kText = 0, kJson = 1 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "INFO", "warning", "error"; returns false for anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();
// Parses "text" or "json" in any case; returns false (leaving *format alone) for anything else.
bool ParseLogFormat(std::string_view text, LogFormat* format);

// Appends the log to `path` from now on (created with mode 0640 if missing; O_APPEND, so several
// processes may share it). Lines at `console_level` or above are also written to stderr. An empty
// path sends the log back to stderr alone. On error the sink is unchanged.
absl::Status SetLogFile(const std::string& path, LogLevel console_level = LogLevel::kWarning);
// The file SetLogFile last opened; empty while the log goes to stderr.
std::string GetLogFile();

// One log line, newline included: a pure function of its inputs (`file` is cut to its base name).
std::string FormatLogLine(LogFormat format, LogLevel level, std::string_view file, int line,
                          std::chrono::system_clock::time_point time, std::string_view msg);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::chrono::system_clock::time_point time_;
  std::ostringstream stream_;
};

}  // namespace fedlora

#define FEDLORA_LOG_LEVEL_DEBUG ::fedlora::LogLevel::kDebug
#define FEDLORA_LOG_LEVEL_INFO ::fedlora::LogLevel::kInfo
#define FEDLORA_LOG_LEVEL_WARNING ::fedlora::LogLevel::kWarning
#define FEDLORA_LOG_LEVEL_ERROR ::fedlora::LogLevel::kError
#define FEDLORA_LOG(severity)                                    \
  if (FEDLORA_LOG_LEVEL_##severity < ::fedlora::GetLogLevel()) { \
  } else                                                         \
    ::fedlora::LogMessage(FEDLORA_LOG_LEVEL_##severity, __FILE__, __LINE__).stream()
