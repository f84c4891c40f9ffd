#include "ipc/memory_limits.h"

#include <sys/resource.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "common/units.h"

namespace offloadd::ipc {

Status CheckShmSpace(uint64_t bytes, const std::string& shm_dir) {
  struct statvfs st {};
  if (::statvfs(shm_dir.c_str(), &st) != 0) return ErrnoError(errno, "statvfs(" + shm_dir + ")");
  const uint64_t avail = uint64_t{st.f_bavail} * st.f_frsize;
  if (avail >= bytes) return OkStatus();
  return ResourceExhaustedError("shared arena needs " + FormatByteSize(bytes) + " but " + shm_dir +
                                " has only " + FormatByteSize(avail) +
                                " free; raise it with `mount -o remount,size=<N>G " + shm_dir +
                                "` (in Docker: --shm-size=<N>g) or lower the plan's pinned memory");
}

Status EnsureMemlock(uint64_t bytes) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return ErrnoError(errno, "getrlimit(RLIMIT_MEMLOCK)");
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= bytes) return OkStatus();
  if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= bytes) {
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_MEMLOCK, &rl) == 0) return OkStatus();
  }
  const auto fmt = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : FormatByteSize(v);
  };
  return ResourceExhaustedError(
      "locking " + FormatByteSize(bytes) + " of shared arena exceeds RLIMIT_MEMLOCK (soft " +
      fmt(rl.rlim_cur) + ", hard " + fmt(rl.rlim_max) +
      "); raise it with LimitMEMLOCK=infinity in the systemd unit, `ulimit -l unlimited`, or a "
      "memlock line in /etc/security/limits.conf (Docker: --ulimit memlock=-1)");
}

uint64_t FreeHugePages() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("HugePages_Free:", 0) == 0) {
      std::istringstream fields(line.substr(15));
      uint64_t n = 0;
      fields >> n;
      return n;
    }
  }
  return 0;
}

Status CheckHugePages(uint64_t bytes) {
  constexpr uint64_t kHuge = 2u << 20;
  const uint64_t need = (bytes + kHuge - 1) / kHuge;
  const uint64_t have = FreeHugePages();
  if (have >= need) return OkStatus();
  return ResourceExhaustedError("huge-page arena needs " + std::to_string(need) +
                                " free 2 MiB huge pages but " + std::to_string(have) +
                                " are free; reserve them with `sysctl vm.nr_hugepages=" +
                                std::to_string(need) + "` (or set try_huge_pages=false)");
}

}  // namespace offloadd::ipc
