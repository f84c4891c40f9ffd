#include "common/proc_stat.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>

namespace offloadd {

namespace {

// The whole file through read(2). Not an ifstream: libstdc++'s filebuf throws from underflow when
// read fails, and reading /proc/<pid>/stat of a process reaped after the open fails with ESRCH (a
// killed offloadd-store failed its job with "basic_filebuf::underflow error reading the file").
std::optional<std::string> ReadSmall(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[1024];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > (1u << 16)) break;  // a stat line is a few hundred bytes
  }
  ::close(fd);
  return text;
}

}  // namespace

std::optional<ProcStat> ReadProcStat(pid_t pid) {
  const auto read = ReadSmall(pid == 0 ? std::string("/proc/self/stat") : "/proc/" + std::to_string(pid) + "/stat");
  if (!read) return std::nullopt;
  const std::string& stat = *read;
  // Fields after the command name, which is in parentheses and may contain spaces.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 > stat.size()) return std::nullopt;
  std::istringstream fields(stat.substr(close + 2));
  std::string f[24];
  for (std::string& x : f) {
    if (!(fields >> x)) return std::nullopt;
  }
  // Indices are field number - 3 (proc(5)): utime 14, stime 15, num_threads 20, starttime 22,
  // vsize 23, rss 24.
  auto num = [](const std::string& s) { return std::strtod(s.c_str(), nullptr); };
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  ProcStat p;
  p.cpu_seconds = (num(f[11]) + num(f[12])) / ticks;
  p.threads = static_cast<int64_t>(num(f[17]));
  p.start_after_boot_s = num(f[19]) / ticks;
  p.virtual_bytes = static_cast<uint64_t>(num(f[20]));
  p.resident_bytes = static_cast<uint64_t>(num(f[21]) * page);
  return p;
}

}  // namespace offloadd
