#pragma once
// Fence(order): std::atomic_thread_fence, except in ThreadSanitizer builds, which do not model
// standalone fences (GCC refuses them there with -Wtsan). There the fence becomes a read-modify-
// write of one process-wide atomic with the same ordering: all such RMWs are totally ordered and
// each synchronises with the previous one, which is what TSan needs to see the fences of two
// threads ordered (the Dekker-style waiter/notifier pairs of ipc/ring_queue.h, for one). Release
// and acquire fences become acq_rel RMWs: stronger, never weaker. Only TSan builds pay for it.

#include <atomic>
#include <cstdint>

namespace offloadd {

#if defined(__SANITIZE_THREAD__)
inline std::atomic<uint32_t> g_tsan_fence{0};
#endif

inline void Fence(std::memory_order order) {
#if defined(__SANITIZE_THREAD__)
  g_tsan_fence.fetch_add(0, order == std::memory_order_seq_cst ? std::memory_order_seq_cst
                                                                : std::memory_order_acq_rel);
#else
  std::atomic_thread_fence(order);
#endif
}

}  // namespace offloadd
