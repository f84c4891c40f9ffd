#pragma once
// A process's /proc/<pid>/stat (proc(5)): CPU time, memory, threads and start time, for the
// daemon's process_* metrics and the per-job metrics of its helper processes. Torch-free.
#include <sys/types.h>

#include <cstdint>
#include <optional>

namespace offloadd {

struct ProcStat {
  double cpu_seconds = 0;          // utime + stime
  double start_after_boot_s = 0;   // starttime
  uint64_t resident_bytes = 0;     // rss
  uint64_t virtual_bytes = 0;      // vsize
  int64_t threads = 0;             // num_threads
};

// pid 0: this process. nullopt when the process is gone or the file does not parse.
std::optional<ProcStat> ReadProcStat(pid_t pid = 0);

}  // namespace offloadd
