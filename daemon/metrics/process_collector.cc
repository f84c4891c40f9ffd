#include "daemon/metrics/process_collector.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/proc_stat.h"

namespace offloadd::daemon {
namespace {

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) m.counter.value = value;
  else m.gauge.value = value;
  f.metric.push_back(m);
  return f;
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime") {
      in >> value;
      return value;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

int OpenFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
    n -= 3;  // ".", ".." and the directory's own fd
  }
  return n;
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  const std::optional<ProcStat> p = ReadProcStat();
  if (!p) return out;
  const double cpu = p->cpu_seconds;
  const double start = BootTimeSeconds() + p->start_after_boot_s;
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  using prometheus::MetricType;
  out.push_back(Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                       MetricType::Counter, cpu));
  out.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes.",
                       MetricType::Gauge, static_cast<double>(p->resident_bytes)));
  out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                       MetricType::Gauge, static_cast<double>(p->virtual_bytes)));
  out.push_back(Family("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                       MetricType::Gauge, start));
  out.push_back(Family("process_threads", "Number of OS threads in the process.", MetricType::Gauge,
                       static_cast<double>(p->threads)));
  out.push_back(Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, OpenFds()));
  out.push_back(Family("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
                       static_cast<double>(nofile.rlim_cur)));
  return out;
}

}  // namespace offloadd::daemon
