#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <string>

namespace offloadd {
namespace {
std::atomic<int> g_min_severity{static_cast<int>(LogSeverity::kInfo)};
}

void SetMinLogSeverity(LogSeverity severity) { g_min_severity = static_cast<int>(severity); }
LogSeverity MinLogSeverity() { return static_cast<LogSeverity>(g_min_severity.load()); }

bool ParseLogSeverity(std::string_view name, LogSeverity* out) {
  if (name == "debug") *out = LogSeverity::kDebug;
  else if (name == "info") *out = LogSeverity::kInfo;
  else if (name == "warning") *out = LogSeverity::kWarning;
  else if (name == "error") *out = LogSeverity::kError;
  else return false;
  return true;
}

void EmitLogLine(LogSeverity severity, std::string_view component, std::string_view message) {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t secs = system_clock::to_time_t(now);
  const auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[96];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(millis));
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  std::string line;
  line.reserve(message.size() + 64);
  line.append(stamp).append(" ").push_back(kLetters[static_cast<int>(severity)]);
  line.append(" ").append(component).append("] ").append(message).push_back('\n');
  // One write per line so concurrent threads and processes do not interleave within a line.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace offloadd
