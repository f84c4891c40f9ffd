#pragma once
// ExtentAllocator: hands out 4 KiB-aligned byte ranges of one directory's data file.
// First fit over a free list ordered by offset (coalescing on free), else the end of the file.
// It knows nothing about durability: the store only frees the extents of a version after a
// newer version of that key is committed and no read uses them, so committed bytes are never
// handed out. Not thread-safe (the store holds its per-directory lock).

#include <cstdint>
#include <map>

namespace offloadd::storage {

class ExtentAllocator {
 public:
  // Replaying the manifest: marks a range as in use. Ranges may come in any order.
  void MarkUsed(uint64_t offset, uint64_t length);
  // After all MarkUsed calls: the gaps between used ranges become free.
  void FinishRecovery();

  // Returns the offset of `length` (aligned) free bytes.
  uint64_t Allocate(uint64_t length);
  void Free(uint64_t offset, uint64_t length);

  uint64_t end() const { return end_; }  // bytes of the file in use or free below the end
  uint64_t used_bytes() const { return used_; }
  uint64_t free_extents() const { return free_.size(); }

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> length
  std::map<uint64_t, uint64_t> recovered_;
  uint64_t end_ = 0;
  uint64_t used_ = 0;
};

}  // namespace offloadd::storage
