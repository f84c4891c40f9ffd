#include "ipc/arena.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/atomic_fence.h"
#include "common/units.h"

namespace offloadd::ipc {

inline constexpr uint64_t kArenaMagic = 0x314e455241444f21ull;  // "!ODARENA1"-ish
inline constexpr uint32_t kArenaVersion = 1;

// Layout (all offsets from the segment base):
//   [SegmentHeader][pad to data_offset][Arena::Header][Entry * max_regions][pad][regions ...]
struct Arena::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t header_size;
  uint32_t entry_size;
  uint32_t max_regions;
  uint64_t alignment;
  uint64_t table_offset;
  uint64_t heap_begin;
  uint64_t heap_end;
  std::atomic<uint64_t> heap_next;     // bump pointer
  std::atomic<uint32_t> entries_used;  // slots reserved so far (may exceed max_regions on overflow)
  uint32_t reserved0;
  std::atomic<uint64_t> bytes_by_kind[kNumRegionKinds];
  std::atomic<uint64_t> used_bytes;
};

enum EntryState : uint32_t { kEmpty = 0, kLive = 1, kReleased = 2, kAbandoned = 3 };

struct Arena::Entry {
  std::atomic<uint32_t> state;  // published last (release), read first (acquire)
  uint32_t kind;
  uint64_t offset;
  uint64_t size;
  char name[kRegionNameMax + 1];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free (address-free)");

namespace {
uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

Arena::Header* Arena::header() const { return reinterpret_cast<Header*>(base_ + header_offset_); }
Arena::Entry* Arena::entries() const {
  return reinterpret_cast<Entry*>(base_ + header()->table_offset);
}

std::string_view RegionKindName(RegionKind kind) {
  switch (kind) {
    case RegionKind::kGradStaging:
      return "grad_staging";
    case RegionKind::kParamStaging:
      return "param_staging";
    case RegionKind::kMaster:
      return "master";
    case RegionKind::kExpAvg:
      return "exp_avg";
    case RegionKind::kExpAvgSq:
      return "exp_avg_sq";
    case RegionKind::kGradAccum:
      return "grad_accum";
    case RegionKind::kQueue:
      return "queue";
    case RegionKind::kControl:
      return "control";
    case RegionKind::kIoBuffer:
      return "io_buffer";
    case RegionKind::kOther:
      return "other";
  }
  return "other";
}

StatusOr<Arena> Arena::Format(SharedSegment* segment, const ArenaOptions& options) {
  if (segment == nullptr || !segment->valid())
    return InvalidArgumentError("Arena::Format: no segment");
  if (options.alignment < 64 || (options.alignment & (options.alignment - 1)) != 0) {
    return InvalidArgumentError("arena alignment " + std::to_string(options.alignment) +
                                " must be a power of two >= 64");
  }
  if (options.max_regions == 0) return InvalidArgumentError("arena max_regions must be > 0");
  const uint64_t header_offset = segment->header().data_offset;
  const uint64_t table_offset = RoundUp(header_offset + sizeof(Header), 64);
  const uint64_t heap_begin =
      RoundUp(table_offset + uint64_t{options.max_regions} * sizeof(Entry), options.alignment);
  if (heap_begin >= segment->total_size()) {
    return ResourceExhaustedError("segment of " + FormatByteSize(segment->total_size()) +
                                  " is too small for a region table of " +
                                  std::to_string(options.max_regions) + " entries");
  }
  std::memset(segment->base() + header_offset, 0,
              table_offset - header_offset + uint64_t{options.max_regions} * sizeof(Entry));
  Arena arena(segment->base(), segment->total_size(), header_offset);
  Header* h = arena.header();
  h->version = kArenaVersion;
  h->header_size = sizeof(Header);
  h->entry_size = sizeof(Entry);
  h->max_regions = options.max_regions;
  h->alignment = options.alignment;
  h->table_offset = table_offset;
  h->heap_begin = heap_begin;
  h->heap_end = segment->total_size();
  h->heap_next.store(heap_begin);
  // Magic last: a process that Opens a half-formatted arena sees "not formatted".
  offloadd::Fence(std::memory_order_release);
  h->magic = kArenaMagic;
  return arena;
}

StatusOr<Arena> Arena::Open(SharedSegment* segment) {
  if (segment == nullptr || !segment->valid())
    return InvalidArgumentError("Arena::Open: no segment");
  const uint64_t header_offset = segment->header().data_offset;
  const uint64_t size = segment->total_size();
  if (header_offset + sizeof(Header) > size) {
    return InvalidArgumentError("shared segment too small to hold an arena header");
  }
  Arena arena(segment->base(), size, header_offset);
  const Header* h = arena.header();
  if (h->magic != kArenaMagic) {
    return InvalidArgumentError(
        "shared segment holds no offloadd arena (bad arena magic): it was "
        "never formatted or has been overwritten");
  }
  if (h->version != kArenaVersion || h->header_size != sizeof(Header) ||
      h->entry_size != sizeof(Entry)) {
    return InvalidArgumentError("arena version " + std::to_string(h->version) +
                                " but this binary speaks version " + std::to_string(kArenaVersion) +
                                "; restart all offloadd processes together");
  }
  const bool bounds_ok =
      h->table_offset >= header_offset + sizeof(Header) && h->table_offset % 64 == 0 &&
      h->max_regions > 0 && h->alignment >= 64 && (h->alignment & (h->alignment - 1)) == 0 &&
      h->heap_begin % h->alignment == 0 &&
      h->table_offset + uint64_t{h->max_regions} * sizeof(Entry) <= h->heap_begin &&
      h->heap_begin <= h->heap_end && h->heap_end <= size && h->heap_next.load() >= h->heap_begin;
  if (!bounds_ok) {
    return InvalidArgumentError("arena header is corrupt (table/heap bounds outside the " +
                                std::to_string(size) + "-byte segment, or misaligned)");
  }
  // Every live region must lie inside the heap at the arena's alignment: views (rings, tensors)
  // are built on these offsets without further checks.
  for (const Region& r : arena.List()) {
    if (r.offset < h->heap_begin || r.offset % h->alignment != 0 || r.offset > h->heap_end ||
        r.size > h->heap_end - r.offset) {
      return InvalidArgumentError("arena region '" + r.name + "' is corrupt: [" +
                                  std::to_string(r.offset) + ", +" + std::to_string(r.size) +
                                  ") is not an aligned range inside the heap [" +
                                  std::to_string(h->heap_begin) + ", " +
                                  std::to_string(h->heap_end) + ")");
    }
  }
  return arena;
}

StatusOr<Region> Arena::Allocate(std::string_view name, RegionKind kind, uint64_t bytes) {
  if (name.empty() || name.size() > kRegionNameMax) {
    return InvalidArgumentError("region name '" + std::string(name) + "' must be 1.." +
                                std::to_string(kRegionNameMax) + " bytes");
  }
  if (static_cast<uint32_t>(kind) >= kNumRegionKinds) {
    return InvalidArgumentError("unknown region kind " +
                                std::to_string(static_cast<uint32_t>(kind)));
  }
  if (Find(name).ok())
    return AlreadyExistsError("region '" + std::string(name) + "' already exists");
  Header* h = header();
  const uint32_t slot = h->entries_used.fetch_add(1);
  if (slot >= h->max_regions) {
    return ResourceExhaustedError("arena region table is full (" + std::to_string(h->max_regions) +
                                  " regions); raise ArenaOptions::max_regions");
  }
  Entry& e = entries()[slot];
  const uint64_t size = RoundUp(bytes == 0 ? 1 : bytes, h->alignment);
  uint64_t next = h->heap_next.load();
  uint64_t offset = 0;
  do {
    offset = next;  // heap_next is always aligned: every size is a multiple of the alignment
    if (size > h->heap_end - offset) {
      e.state.store(kAbandoned, std::memory_order_release);
      return ResourceExhaustedError(
          "shared arena full: region '" + std::string(name) + "' needs " + FormatByteSize(size) +
          " but only " + FormatByteSize(h->heap_end - offset) + " of " +
          FormatByteSize(h->heap_end - h->heap_begin) +
          " are left; size the shared segment from the job plan (and check `df -h /dev/shm`)");
    }
  } while (!h->heap_next.compare_exchange_weak(next, offset + size));
  e.kind = static_cast<uint32_t>(kind);
  e.offset = offset;
  e.size = bytes;
  std::memset(e.name, 0, sizeof(e.name));
  std::memcpy(e.name, name.data(), name.size());
  h->bytes_by_kind[static_cast<uint32_t>(kind)].fetch_add(bytes);
  h->used_bytes.fetch_add(size);
  e.state.store(kLive, std::memory_order_release);
  return Region{std::string(name), kind, offset, bytes};
}

StatusOr<Region> Arena::Find(std::string_view name) const {
  const Header* h = header();
  const uint32_t n = std::min(h->entries_used.load(), h->max_regions);
  for (uint32_t i = 0; i < n; ++i) {
    const Entry& e = entries()[i];
    if (e.state.load(std::memory_order_acquire) != kLive) continue;
    if (std::string_view(e.name, strnlen(e.name, sizeof(e.name))) == name) {
      return Region{std::string(name), static_cast<RegionKind>(e.kind), e.offset, e.size};
    }
  }
  return NotFoundError("no region named '" + std::string(name) + "' in the shared arena");
}

Status Arena::Release(std::string_view name) {
  const Header* h = header();
  const uint32_t n = std::min(h->entries_used.load(), h->max_regions);
  for (uint32_t i = 0; i < n; ++i) {
    Entry& e = entries()[i];
    if (std::string_view(e.name, strnlen(e.name, sizeof(e.name))) != name) continue;
    uint32_t live = kLive;
    if (e.state.compare_exchange_strong(live, kReleased)) {
      header()->bytes_by_kind[e.kind % kNumRegionKinds].fetch_sub(e.size);
      return OkStatus();
    }
  }
  return NotFoundError("no live region named '" + std::string(name) + "' to release");
}

std::vector<Region> Arena::List() const {
  std::vector<Region> out;
  const Header* h = header();
  const uint32_t n = std::min(h->entries_used.load(), h->max_regions);
  for (uint32_t i = 0; i < n; ++i) {
    const Entry& e = entries()[i];
    if (e.state.load(std::memory_order_acquire) != kLive) continue;
    out.push_back({std::string(e.name, strnlen(e.name, sizeof(e.name))),
                   static_cast<RegionKind>(e.kind), e.offset, e.size});
  }
  return out;
}

ArenaStats Arena::Stats() const {
  const Header* h = header();
  ArenaStats s;
  s.capacity_bytes = h->heap_end - h->heap_begin;
  s.used_bytes = h->used_bytes.load();
  s.max_regions = h->max_regions;
  for (size_t k = 0; k < kNumRegionKinds; ++k) s.bytes_by_kind[k] = h->bytes_by_kind[k].load();
  const uint32_t n = std::min(h->entries_used.load(), h->max_regions);
  for (uint32_t i = 0; i < n; ++i) {
    if (entries()[i].state.load(std::memory_order_acquire) == kLive) ++s.live_regions;
  }
  return s;
}

Status Arena::Check(uint64_t offset, uint64_t bytes) const {
  const Header* h = header();
  const uint32_t n = std::min(h->entries_used.load(), h->max_regions);
  for (uint32_t i = 0; i < n; ++i) {
    const Entry& e = entries()[i];
    if (e.state.load(std::memory_order_acquire) != kLive) continue;
    if (offset >= e.offset && bytes <= e.size && offset - e.offset <= e.size - bytes)
      return OkStatus();
  }
  return OutOfRangeError("shared range [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                         ") is not inside any live region of the arena");
}

}  // namespace offloadd::ipc
