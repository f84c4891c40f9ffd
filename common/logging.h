#pragma once
// Minimal leveled logging to stderr: "2026-11-22T10:00:00.123Z I component] message".
// Thread-safe (one write(2) per line). Journald adds its own timestamps; that is fine.

#include <sstream>
#include <string_view>

namespace offloadd {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetMinLogSeverity(LogSeverity severity);
LogSeverity MinLogSeverity();
// "debug" | "info" | "warning" | "error"; false if unknown.
bool ParseLogSeverity(std::string_view name, LogSeverity* out);

void EmitLogLine(LogSeverity severity, std::string_view component, std::string_view message);
// True when stderr is the systemd journal (JOURNAL_STREAM names it): lines then start with "<N>",
// the syslog priority (debug 7, info 6, warning 4, error 3), as sd-daemon(3) describes.
bool LogToJournal();
int SyslogPriority(LogSeverity severity);

class LogMessage {
 public:
  LogMessage(LogSeverity severity, std::string_view component)
      : severity_(severity), component_(component) {}
  ~LogMessage() { EmitLogLine(severity_, component_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::string_view component_;
  std::ostringstream stream_;
};

}  // namespace offloadd

// A for statement rather than if/else so the macro is safe as the body of an unbraced if.
#define OFFLOADD_LOG(severity, component)                                                     \
  for (bool _offloadd_log_on = ::offloadd::LogSeverity::severity >= ::offloadd::MinLogSeverity(); \
       _offloadd_log_on; _offloadd_log_on = false)                                             \
  ::offloadd::LogMessage(::offloadd::LogSeverity::severity, component).stream()
