#include "common/logging.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

namespace offloadd {
namespace {
std::atomic<int> g_min_severity{static_cast<int>(LogSeverity::kInfo)};

// systemd sets JOURNAL_STREAM=<dev>:<inode> for a unit whose stderr goes to the journal; a line
// starting "<N>" (sd-daemon(3)) then carries syslog priority N, so `journalctl -p warning` works.
bool StderrIsJournal() {
  const char* env = std::getenv("JOURNAL_STREAM");
  if (env == nullptr) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(env, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st{};
  return fstat(STDERR_FILENO, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

}  // namespace

bool LogToJournal() {
  static const bool journal = StderrIsJournal();
  return journal;
}

int SyslogPriority(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kDebug:
      return 7;  // LOG_DEBUG
    case LogSeverity::kInfo:
      return 6;  // LOG_INFO
    case LogSeverity::kWarning:
      return 4;  // LOG_WARNING
    case LogSeverity::kError:
      return 3;  // LOG_ERR
  }
  return 6;
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
  if (LogToJournal()) {  // the journal stamps lines itself; it needs the priority
    line.append("<").append(std::to_string(SyslogPriority(severity))).append(">");
  }
  line.append(stamp).append(" ").push_back(kLetters[static_cast<int>(severity)]);
  line.append(" ").append(component).append("] ").append(message).push_back('\n');
  // One write per line so concurrent threads and processes do not interleave within a line.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace offloadd
