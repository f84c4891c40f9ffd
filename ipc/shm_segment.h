#pragma once
// SharedSegment: a memfd-backed shared memory mapping that starts with a versioned header.
//
// The daemon Create()s a segment and passes its fd to child processes (SCM_RIGHTS over a Unix
// socket, or inheritance across fork/exec); children Attach() to the fd, which checks magic,
// version and size before handing out the mapping. Everything stored inside is addressed by
// offset from the segment base, never by pointer, because each process maps it at its own address.
//
// Ownership: a SharedSegment owns its fd and its mapping; moving transfers both. Not thread-safe
// to move/destroy concurrently with use; the memory itself is shared and synchronised by its users.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace offloadd::ipc {

inline constexpr uint64_t kSegmentMagic = 0x3144444f4c464f21ull;  // "!OFLODD1" little-endian
inline constexpr uint32_t kSegmentVersion = 1;

// First bytes of every segment. Layout is part of the cross-process ABI: change kSegmentVersion
// whenever it changes.
struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_size;  // sizeof(SegmentHeader) of the creator
  uint64_t total_size;   // bytes mapped, header included
  uint64_t data_offset;  // first usable byte, 4 KiB aligned
  char name[64];         // creator-provided label, NUL-terminated (for diagnostics)
};
static_assert(sizeof(SegmentHeader) == 96, "SegmentHeader is shared across processes");

struct SegmentOptions {
  std::string name = "offloadd";
  // Try MFD_HUGETLB first; fall back to normal pages (and say so in hugepage_fallback_reason()).
  bool try_huge_pages = false;
  // Normal pages are faulted in at creation (no page faults later, in the step). 1: the kernel's
  // MAP_POPULATE, on this thread. More: that many threads each populate a slice
  // (MADV_POPULATE_WRITE, else a write per page): a 100 GiB arena is faulted in at the memory's
  // rate rather than one core's.
  uint32_t populate_threads = 1;
  // Leave the normal pages unpopulated: the caller faults them in with PopulatePages, e.g. in the
  // background while it fills the first regions (trainer/pipeline/arena_population.h).
  bool defer_populate = false;
};

// Faults in the pages of [addr, addr + bytes) writable without changing their contents
// (MADV_POPULATE_WRITE; before Linux 5.14 an atomic add of zero to a byte of each page), so other
// threads may be writing into them meanwhile. ENOMEM names the bytes when memory runs out.
Status PopulatePages(void* addr, size_t bytes);

class SharedSegment {
 public:
  SharedSegment() = default;
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();

  // Creates a segment of at least `data_bytes` usable bytes. Errors name the limit that was hit
  // (memfd/ftruncate ENOMEM or ENOSPC, mmap failure) and how to raise it.
  static StatusOr<SharedSegment> Create(size_t data_bytes, const SegmentOptions& options = {});

  // Maps the segment behind `fd` (the caller keeps ownership of `fd`; it is duplicated) and checks
  // the header. Fails with INVALID_ARGUMENT on a foreign or incompatible segment.
  static StatusOr<SharedSegment> Attach(int fd);

  bool valid() const { return base_ != nullptr; }
  int fd() const { return fd_; }
  const SegmentHeader& header() const { return *static_cast<const SegmentHeader*>(base_); }
  uint8_t* base() const { return static_cast<uint8_t*>(base_); }
  size_t total_size() const { return size_; }
  // The usable area after the header.
  uint8_t* data() const { return base() + header().data_offset; }
  size_t data_size() const { return size_ - header().data_offset; }
  bool huge_pages() const { return huge_pages_; }
  const std::string& hugepage_fallback_reason() const { return hugepage_fallback_reason_; }

 private:
  void Reset();

  int fd_ = -1;
  void* base_ = nullptr;
  size_t size_ = 0;
  bool huge_pages_ = false;
  std::string hugepage_fallback_reason_;
};

}  // namespace offloadd::ipc
