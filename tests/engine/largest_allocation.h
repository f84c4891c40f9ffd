#pragma once
// LargestAllocation: the largest single CPU allocation (and the peak of live CPU bytes) while the
// profiler's memory reporting is on, i.e. inside
//   c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, probe);
// LibTorch's CPU allocator reports every allocation (size > 0) and free (size < 0) to it.
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <cstdint>

namespace offloadd::engine {

struct LargestAllocation final : c10::MemoryReportingInfoBase {
  void reportMemoryUsage(void*, int64_t size, size_t, size_t, c10::Device) override {
    largest = std::max(largest, size);
    live += size;
    peak = std::max(peak, live);
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t largest = 0;
  int64_t live = 0;  // since the probe was installed (frees of older tensors make it negative)
  int64_t peak = 0;
};

}  // namespace offloadd::engine
