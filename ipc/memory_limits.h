#pragma once
// Pre-flight checks for the limits a shared pinned arena runs into, each returning an error that
// names the limit and how to raise it (instead of a bare ENOMEM/SIGBUS later).
//   - /dev/shm (tmpfs) free space: memfd pages are charged to the same shmem pool;
//   - RLIMIT_MEMLOCK: mlock()/io_uring buffer registration of the arena;
//   - reserved huge pages (/proc/meminfo HugePages_Free) for MFD_HUGETLB segments.
// Free functions, thread-safe.

#include <cstdint>
#include <string>

#include "common/status.h"

namespace offloadd::ipc {

// RESOURCE_EXHAUSTED if the tmpfs at `shm_dir` has less than `bytes` available.
Status CheckShmSpace(uint64_t bytes, const std::string& shm_dir = "/dev/shm");

// Raises the soft RLIMIT_MEMLOCK towards the hard limit if needed; RESOURCE_EXHAUSTED naming both
// limits and the fixes (LimitMEMLOCK=, ulimit -l, /etc/security/limits.conf) if `bytes` can't fit.
Status EnsureMemlock(uint64_t bytes);

// Free 2 MiB huge pages from /proc/meminfo (0 if the file or the field is missing).
uint64_t FreeHugePages();
// RESOURCE_EXHAUSTED with the `sysctl vm.nr_hugepages=N` needed for `bytes`, if too few are free.
Status CheckHugePages(uint64_t bytes);

}  // namespace offloadd::ipc
