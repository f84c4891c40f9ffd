#include "ipc/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

namespace offloadd::ipc {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = 2u << 20;

size_t RoundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

Status SizeError(int err, size_t bytes, const char* what) {
  std::string hint;
  if (err == ENOMEM || err == ENOSPC) {
    hint = " (memfd segments are anonymous shared memory: they count against free RAM and the "
           "service's memory cgroup limit (MemoryMax=), not /dev/shm; for huge pages, "
           "/proc/sys/vm/nr_hugepages)";
  }
  return ErrnoError(err, std::string(what) + " of " + std::to_string(bytes) + " bytes" + hint);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// Faults in [base, base + bytes) on `threads` threads, each a slice of whole pages.
Status PopulateInParallel(void* base, size_t bytes, uint32_t threads) {
  const size_t pages = bytes / kPage;
  const size_t per = (pages + threads - 1) / threads;
  std::vector<int> errs(threads, 0);
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t) {
    const size_t first = std::min(pages, t * per), last = std::min(pages, first + per);
    if (first == last) break;
    pool.emplace_back([&errs, t, base, first, last] {
      char* p = static_cast<char*>(base) + first * kPage;
      const size_t len = (last - first) * kPage;
      if (::madvise(p, len, MADV_POPULATE_WRITE) == 0) return;
      if (errno != EINVAL) {  // EINVAL: a kernel before 5.14; ENOMEM / EFAULT: no memory for it
        errs[t] = errno;
        return;
      }
      for (size_t off = 0; off < len; off += kPage) static_cast<volatile char*>(p)[off] = 0;
    });
  }
  for (auto& th : pool) th.join();
  for (int e : errs) {
    if (e != 0) return SizeError(e, bytes, "populating the shared segment");
  }
  return OkStatus();
}

}  // namespace

Status PopulatePages(void* addr, size_t bytes) {
  char* const p = static_cast<char*>(addr);
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / kPage * kPage;
  const size_t len = RoundUp(reinterpret_cast<uintptr_t>(p) + bytes, kPage) - first;
  if (bytes == 0) return OkStatus();
  if (::madvise(reinterpret_cast<void*>(first), len, MADV_POPULATE_WRITE) == 0) return OkStatus();
  if (errno != EINVAL) return SizeError(errno, bytes, "populating the shared segment");
  for (size_t off = 0; off < len; off += kPage) {
    __atomic_fetch_add(reinterpret_cast<char*>(first + off), 0, __ATOMIC_RELAXED);
  }
  return OkStatus();
}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept { *this = std::move(other); }

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    huge_pages_ = other.huge_pages_;
    hugepage_fallback_reason_ = std::move(other.hugepage_fallback_reason_);
  }
  return *this;
}

SharedSegment::~SharedSegment() { Reset(); }

void SharedSegment::Reset() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
  base_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

StatusOr<SharedSegment> SharedSegment::Create(size_t data_bytes, const SegmentOptions& options) {
  SharedSegment seg;
  const size_t header_bytes = RoundUp(sizeof(SegmentHeader), kPage);
  size_t total = RoundUp(header_bytes + data_bytes, kPage);

  int fd = -1;
  void* base = MAP_FAILED;
  if (options.try_huge_pages) {
    // Huge pages can fail at any of the three steps (no hugetlbfs support, no reserved pages at
    // ftruncate or only at mmap time), so all three must succeed before we commit to them.
    const size_t huge_total = RoundUp(total, kHugePage);
    fd = ::memfd_create(options.name.c_str(), MFD_CLOEXEC | MFD_HUGETLB);
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(huge_total)) == 0) {
      base = ::mmap(nullptr, huge_total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    }
    if (base != MAP_FAILED) {
      total = huge_total;
      seg.huge_pages_ = true;
    } else {
      seg.hugepage_fallback_reason_ =
          std::string("huge pages unavailable (") + std::strerror(errno) +
          "); using 4 KiB pages. Reserve them with `sysctl vm.nr_hugepages=N`";
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    fd = ::memfd_create(options.name.c_str(), MFD_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "memfd_create(" + options.name + ")");
    if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
      const int err = errno;
      ::close(fd);
      return SizeError(err, total, "ftruncate of shared segment");
    }
    const uint32_t threads = std::max<uint32_t>(1, options.populate_threads);
    base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE,
                  MAP_SHARED | (threads == 1 && !options.defer_populate ? MAP_POPULATE : 0), fd, 0);
    if (base == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return SizeError(err, total, "mmap of shared segment");
    }
    if (threads > 1 && !options.defer_populate) {
      if (Status st = PopulateInParallel(base, total, threads); !st.ok()) {
        ::munmap(base, total);
        ::close(fd);
        return st;
      }
    }
  }
  seg.fd_ = fd;
  seg.base_ = base;
  seg.size_ = total;
  auto* h = static_cast<SegmentHeader*>(base);
  std::memset(h, 0, sizeof(*h));
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
  h->header_size = sizeof(SegmentHeader);
  h->total_size = total;
  h->data_offset = header_bytes;
  std::strncpy(h->name, options.name.c_str(), sizeof(h->name) - 1);
  return seg;
}

StatusOr<SharedSegment> SharedSegment::Attach(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "fstat of shared segment fd");
  if (static_cast<size_t>(st.st_size) < sizeof(SegmentHeader)) {
    return InvalidArgumentError("shared segment fd " + std::to_string(fd) + " is " +
                                std::to_string(st.st_size) + " bytes, smaller than its header");
  }
  const int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return ErrnoError(errno, "dup of shared segment fd");
  const size_t size = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, dup_fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(dup_fd);
    return ErrnoError(err, "mmap of shared segment");
  }
  SharedSegment seg;
  seg.fd_ = dup_fd;
  seg.base_ = base;
  seg.size_ = size;
  const SegmentHeader& h = seg.header();
  if (h.magic != kSegmentMagic) return InvalidArgumentError("fd is not an offloadd shared segment (bad magic)");
  if (h.version != kSegmentVersion || h.header_size != sizeof(SegmentHeader)) {
    return InvalidArgumentError("shared segment version " + std::to_string(h.version) +
                                " (header " + std::to_string(h.header_size) + " bytes) but this binary speaks version " +
                                std::to_string(kSegmentVersion) + "; restart all offloadd processes together");
  }
  if (h.total_size != size || h.data_offset >= size) {
    return InvalidArgumentError("shared segment header says " + std::to_string(h.total_size) +
                                " bytes but the mapping has " + std::to_string(size));
  }
  // Create puts the data at a whole page past the header; what lies there (the arena header) is
  // read through 8-byte fields and atomics, so an unaligned offset is corruption, not a layout.
  if (h.data_offset < sizeof(SegmentHeader) || h.data_offset % kPage != 0) {
    return InvalidArgumentError("shared segment header is corrupt: data offset " +
                                std::to_string(h.data_offset) + " is not a multiple of " +
                                std::to_string(kPage) + " past the " +
                                std::to_string(sizeof(SegmentHeader)) + "-byte header");
  }
  return seg;
}

}  // namespace offloadd::ipc
