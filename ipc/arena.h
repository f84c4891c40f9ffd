#pragma once
// Arena: named regions carved by offset out of a SharedSegment, listed in a region table that
// lives in the segment itself, with per-kind byte accounting for metrics.
//
// Usage, creating process (the daemon):
//   ASSIGN_OR_RETURN(SharedSegment seg, SharedSegment::Create(bytes, {.try_huge_pages = true}));
//   ASSIGN_OR_RETURN(Arena arena, Arena::Format(&seg));
//   ASSIGN_OR_RETURN(Region g, arena.Allocate("L3.grad", RegionKind::kGradStaging, n * 2));
//   uint16_t* grads = arena.At<uint16_t>(g.offset);        // this process's address
//   ... send seg.fd() to the child (ipc/fd_passing.h), put g.offset in a command ...
// Usage, attaching process (worker, NVMe store):
//   ASSIGN_OR_RETURN(SharedSegment seg, SharedSegment::Attach(fd));
//   ASSIGN_OR_RETURN(Arena arena, Arena::Open(&seg));
//   ASSIGN_OR_RETURN(Region g, arena.Find("L3.grad"));   // or use an offset from a command
//   RETURN_IF_ERROR(arena.Check(offset, bytes));          // validate offsets that came from a peer
//
// Offsets are from the segment base (SharedSegment::base()), so they mean the same thing in every
// process. Regions are never moved; Release() marks a region free in the table and in the
// accounting but the bytes are not reused (plans are sized once per job; a new plan formats a
// new segment).
//
// Why not Boost.Interprocess managed memory: its named-object allocator serialises on an
// interprocess_mutex that is not robust, so a worker killed while holding it would wedge every
// other process. The table here is lock-free (slot reservation and bump allocation are single
// atomic RMWs), and a dead process can at worst leave one reserved-but-unpublished slot behind.
//
// Thread-safety: Allocate/Release/Find/Stats are safe from any thread of any attached process.
// An Arena object is a view: it does not own the segment, which must outlive it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "ipc/shm_segment.h"

namespace offloadd::ipc {

// What a region holds; used for accounting (metrics label values) only. Append, never renumber:
// the value is stored in shared memory.
enum class RegionKind : uint32_t {
  kGradStaging = 0,   // per-layer gradients copied from the GPU (bf16 or fp32)
  kParamStaging = 1,  // bf16/fp16 parameter copies the GPU reads back
  kMaster = 2,        // fp32 master weights window
  kExpAvg = 3,        // Adam first moment window
  kExpAvgSq = 4,      // Adam second moment window
  kGradAccum = 5,     // fp32 gradient accumulation across micro-batches
  kQueue = 6,         // ring queues (ipc/ring_queue.h)
  kControl = 7,       // step counters, redo slots, other small shared state
  kIoBuffer = 8,      // NVMe store read/write buffers
  kOther = 9,
};
inline constexpr size_t kNumRegionKinds = 10;

// Bounded, stable label value: "grad_staging", "param_staging", "master", "exp_avg",
// "exp_avg_sq", "grad_accum", "queue", "control", "io_buffer", "other".
std::string_view RegionKindName(RegionKind kind);

inline constexpr size_t kRegionNameMax = 47;  // bytes, without the terminating NUL

struct Region {
  std::string name;
  RegionKind kind = RegionKind::kOther;
  uint64_t offset = 0;  // from the segment base
  uint64_t size = 0;    // bytes
};

// A snapshot for metrics (e.g. offloadd_shm_region_bytes{kind="master"}).
struct ArenaStats {
  uint64_t capacity_bytes = 0;  // bytes available to regions
  uint64_t used_bytes = 0;      // bytes handed out, alignment padding included
  uint32_t live_regions = 0;
  uint32_t max_regions = 0;
  std::array<uint64_t, kNumRegionKinds> bytes_by_kind{};  // live regions only
};

struct ArenaOptions {
  uint32_t max_regions = 4096;
  // Every region starts at a multiple of this (power of two, >= 64). 4 KiB keeps regions on
  // separate pages so they can be registered/madvised independently; SIMD needs only 64.
  uint64_t alignment = 4096;
};

class Arena {
 public:
  Arena() = default;

  // Writes a fresh arena header and region table at the start of the segment's data area.
  // Anything that was in the segment is forgotten. Call once, in the creating process.
  static StatusOr<Arena> Format(SharedSegment* segment, const ArenaOptions& options = {});
  // Checks the arena header written by Format() (magic, version, bounds): INVALID_ARGUMENT if the
  // segment was never formatted, is corrupt, or comes from an incompatible build.
  static StatusOr<Arena> Open(SharedSegment* segment);

  // Reserves `bytes` (rounded up to the alignment). ALREADY_EXISTS for a live name,
  // RESOURCE_EXHAUSTED (naming the sizes) when the segment or the table is full,
  // INVALID_ARGUMENT for an empty or too-long name.
  StatusOr<Region> Allocate(std::string_view name, RegionKind kind, uint64_t bytes);
  StatusOr<Region> Find(std::string_view name) const;
  Status Release(std::string_view name);
  std::vector<Region> List() const;
  ArenaStats Stats() const;

  // OK if [offset, offset + bytes) lies inside a live region. Use it on offsets received from
  // another process before dereferencing them.
  Status Check(uint64_t offset, uint64_t bytes) const;

  template <typename T>
  T* At(uint64_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }
  uint8_t* base() const { return base_; }
  size_t segment_size() const { return size_; }

 private:
  Arena(uint8_t* base, size_t size, uint64_t header_offset)
      : base_(base), size_(size), header_offset_(header_offset) {}
  struct Header;
  struct Entry;
  Header* header() const;
  Entry* entries() const;

  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint64_t header_offset_ = 0;
};

}  // namespace offloadd::ipc
