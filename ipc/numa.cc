#include "ipc/numa.h"

#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

namespace offloadd::ipc {

Status BindToNumaNode(void* addr, uint64_t bytes, int node) {
  const long page = ::sysconf(_SC_PAGESIZE);
  if (reinterpret_cast<uintptr_t>(addr) % static_cast<uintptr_t>(page) != 0 || bytes == 0) {
    return InvalidArgumentError("BindToNumaNode: range must be page-aligned and non-empty");
  }
  if (node < 0 || node >= 4096) {
    return InvalidArgumentError("NUMA node " + std::to_string(node) + " out of range");
  }
  constexpr int kBits = 64;
  std::vector<unsigned long> mask(node / kBits + 1, 0);
  mask[node / kBits] = 1ul << (node % kBits);
  const long rc = ::syscall(SYS_mbind, addr, bytes, MPOL_BIND, mask.data(),
                            static_cast<unsigned long>(mask.size() * kBits + 1), MPOL_MF_MOVE);
  if (rc != 0) {
    const int err = errno;
    std::string what = "mbind to NUMA node " + std::to_string(node);
    if (err == EINVAL) what += " (no such node, or the kernel lacks NUMA support)";
    if (err == EIO) what += " (pages could not be moved)";
    return ErrnoError(err, what);
  }
  return OkStatus();
}

}  // namespace offloadd::ipc
