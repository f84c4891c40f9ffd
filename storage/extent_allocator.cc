#include "storage/extent_allocator.h"

#include <cassert>

#include "storage/format.h"

namespace offloadd::storage {

void ExtentAllocator::MarkUsed(uint64_t offset, uint64_t length) {
  if (length == 0) return;
  recovered_[offset] = AlignUp(length);
}

void ExtentAllocator::FinishRecovery() {
  free_.clear();
  uint64_t pos = 0;
  used_ = 0;
  for (const auto& [off, len] : recovered_) {
    if (off > pos) free_[pos] = off - pos;
    pos = std::max(pos, off + len);
    used_ += len;
  }
  end_ = pos;
  recovered_.clear();
}

uint64_t ExtentAllocator::Allocate(uint64_t length) {
  length = AlignUp(length);
  if (length == 0) return end_;
  used_ += length;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= length) {
      const uint64_t off = it->first;
      const uint64_t rest = it->second - length;
      free_.erase(it);
      if (rest > 0) free_[off + length] = rest;
      return off;
    }
  }
  const uint64_t off = end_;
  end_ += length;
  return off;
}

void ExtentAllocator::Free(uint64_t offset, uint64_t length) {
  length = AlignUp(length);
  if (length == 0) return;
  assert(used_ >= length);
  used_ -= length;
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && offset + length == next->first) {
    length += next->second;
    free_.erase(next);
  }
  if (offset + length == end_) {
    end_ = offset;  // the tail of the file is reused first, by the end pointer
  } else {
    free_[offset] = length;
  }
}

}  // namespace offloadd::storage
