#pragma once
// Placing shared memory on a NUMA node: each optimizer worker should update state that lives on
// its own node's memory controller. The segment's pages are first touched by the daemon, so on a
// multi-node machine they must be moved (mbind with MPOL_MF_MOVE) before the workers start.
// Free function; thread-safe.

#include <cstdint>

#include "common/status.h"

namespace offloadd::ipc {

// Binds [addr, addr + bytes) (addr page-aligned) to NUMA node `node` and moves the pages already
// there. INVALID_ARGUMENT for a bad node or range; the error names the cause (e.g. EPERM without
// CAP_SYS_NICE for pages shared with other processes).
Status BindToNumaNode(void* addr, uint64_t bytes, int node);

}  // namespace offloadd::ipc
