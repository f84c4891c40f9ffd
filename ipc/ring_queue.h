#pragma once
// RingQueue<Record>: a bounded single-producer/single-consumer ring of fixed-size records that
// lives in shared memory (a kQueue region of an ipc::Arena), and Channel<Record>, which adds
// eventfd wake-ups and blocking Push/Pop with back-pressure. Generic: the optimizer workers use it
// for update commands/completions and the NVMe store for read/write commands. Records must be
// trivially copyable and must not contain pointers (send arena offsets instead).
//
// Usage (creator, e.g. the daemon, one queue per direction per peer):
//   ASSIGN_OR_RETURN(auto q, RingQueue<CommandRecord>::Create(&arena, "store.cmd", 256));
//   ASSIGN_OR_RETURN(UniqueFd ready, MakeEventFd());  // "data available", consumer waits on it
//   ASSIGN_OR_RETURN(UniqueFd space, MakeEventFd());  // "space available", producer waits on it
//   // hand seg.fd(), ready.get(), space.get() to the peer (SendFds, ipc/fd_passing.h)
//   Channel<CommandRecord> cmd(q, ready.get(), space.get());
//   RETURN_IF_ERROR(cmd.Push(record, /*timeout_ms=*/-1, /*abort_fd=*/peer_pidfd));
// Peer:
//   ASSIGN_OR_RETURN(auto q, RingQueue<CommandRecord>::Attach(arena, "store.cmd"));
//   Channel<CommandRecord> cmd(q, ready_fd, space_fd);
//   CommandRecord r;
//   Status st = cmd.Pop(&r, -1, control_socket_fd);   // UNAVAILABLE once the daemon is gone
//
// Wake-up protocol (no polling loops, no syscall per record in steady state): a consumer that
// finds the ring empty raises `consumer_waiting`, re-checks, and only then sleeps in poll() on the
// "ready" eventfd; a producer writes the eventfd after a push only if that flag is up. Fences on
// both sides (Dekker) make a lost wake-up impossible. The "space" eventfd works the same way in
// the other direction, so a full ring blocks the producer (back-pressure) without losing records.
// For epoll-driven loops, Arm/Disarm{Consumer,Producer}Wait() expose the same protocol.
//
// Thread-safety: exactly one producer thread and one consumer thread at a time (possibly in
// different processes). RingQueue and Channel are non-owning views; the arena/segment and the
// eventfds must outlive them.
//
// Peer death: records are published with a release store of `tail` after the slot is written,
// so a producer that dies mid-push leaves nothing half-visible. A supervisor that has seen the
// consumer die may call ResetAfterPeerDeath() (drops unread records) and re-push what it needs.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/atomic_fence.h"
#include "common/status.h"
#include "ipc/arena.h"
#include "ipc/event_fd.h"

namespace offloadd::ipc {

inline constexpr uint64_t kRingMagic = 0x31474e4952444f21ull;
inline constexpr uint32_t kRingVersion = 1;

// Shared-memory header of one ring. Each index sits on its own cache line so producer and
// consumer do not false-share.
struct RingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t record_size;
  uint32_t capacity;  // power of two
  uint32_t reserved0;
  uint64_t reserved1[5];
  alignas(64) std::atomic<uint64_t> tail;  // next slot to write; written by the producer only
  alignas(64) std::atomic<uint64_t> head;  // next slot to read; written by the consumer only
  alignas(64) std::atomic<uint32_t> consumer_waiting;
  alignas(64) std::atomic<uint32_t> producer_waiting;
};
static_assert(sizeof(RingHeader) == 320, "RingHeader is shared across processes");
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// A general-purpose 128-byte command/completion record: `kind` says how to read `payload`.
// Components may instead define their own trivially-copyable record types.
struct alignas(64) CommandRecord {
  uint32_t kind;
  uint32_t flags;
  uint64_t id;  // caller-chosen, echoed in completions
  uint8_t payload[112];

  template <typename T>
  void Pack(const T& value) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(payload));
    std::memcpy(payload, &value, sizeof(T));
  }
  template <typename T>
  T Unpack() const {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(payload));
    T value;
    std::memcpy(&value, payload, sizeof(T));
    return value;
  }
};
static_assert(sizeof(CommandRecord) == 128);

template <typename Record>
class RingQueue {
  static_assert(std::is_trivially_copyable_v<Record>, "ring records are copied as bytes");
  static_assert(sizeof(Record) % 8 == 0, "pad ring records to a multiple of 8 bytes");

 public:
  RingQueue() = default;

  static constexpr uint64_t SlotsOffset() { return (sizeof(RingHeader) + 63) / 64 * 64; }
  static constexpr uint64_t BytesFor(uint32_t capacity) {
    return SlotsOffset() + uint64_t{capacity} * sizeof(Record);
  }

  // Initialises an empty ring in `bytes` of memory at `mem` (64-byte aligned).
  static StatusOr<RingQueue> Format(void* mem, uint64_t bytes, uint32_t capacity) {
    if (capacity < 2 || (capacity & (capacity - 1)) != 0) {
      return InvalidArgumentError("ring capacity " + std::to_string(capacity) +
                                  " must be a power of two >= 2");
    }
    if (bytes < BytesFor(capacity) || reinterpret_cast<uintptr_t>(mem) % 64 != 0) {
      return InvalidArgumentError("ring of " + std::to_string(capacity) + " records needs " +
                                  std::to_string(BytesFor(capacity)) + " aligned bytes");
    }
    auto* h = new (mem) RingHeader{};
    h->version = kRingVersion;
    h->record_size = sizeof(Record);
    h->capacity = capacity;
    offloadd::Fence(std::memory_order_release);
    h->magic = kRingMagic;
    return RingQueue(h);
  }

  // Checks a ring another process formatted: magic, version, record size, bounds.
  static StatusOr<RingQueue> Open(void* mem, uint64_t bytes) {
    auto* h = static_cast<RingHeader*>(mem);
    if (bytes < sizeof(RingHeader) || h->magic != kRingMagic) {
      return InvalidArgumentError("no ring queue at this location (bad ring magic)");
    }
    if (h->version != kRingVersion || h->record_size != sizeof(Record)) {
      return InvalidArgumentError("ring queue has version " + std::to_string(h->version) + " and " +
                                  std::to_string(h->record_size) +
                                  "-byte records; this binary expects version " +
                                  std::to_string(kRingVersion) + " and " +
                                  std::to_string(sizeof(Record)) + "-byte records");
    }
    if (h->capacity < 2 || (h->capacity & (h->capacity - 1)) != 0 ||
        bytes < BytesFor(h->capacity)) {
      return InvalidArgumentError("ring queue header is corrupt (capacity " +
                                  std::to_string(h->capacity) + ")");
    }
    return RingQueue(h);
  }

  // Allocates a kQueue region called `name` in the arena and formats a ring there.
  static StatusOr<RingQueue> Create(Arena* arena, std::string_view name, uint32_t capacity) {
    ASSIGN_OR_RETURN(Region r, arena->Allocate(name, RegionKind::kQueue, BytesFor(capacity)));
    return Format(arena->At<void>(r.offset), r.size, capacity);
  }
  static StatusOr<RingQueue> Attach(const Arena& arena, std::string_view name) {
    ASSIGN_OR_RETURN(Region r, arena.Find(name));
    return Open(arena.At<void>(r.offset), r.size);
  }

  bool valid() const { return h_ != nullptr; }
  uint32_t capacity() const { return h_->capacity; }
  uint64_t Size() const {
    return h_->tail.load(std::memory_order_acquire) - h_->head.load(std::memory_order_acquire);
  }
  bool Empty() const { return Size() == 0; }

  // Producer side. False if the ring is full.
  bool TryPush(const Record& r) {
    const uint64_t tail = h_->tail.load(std::memory_order_relaxed);
    if (tail - h_->head.load(std::memory_order_acquire) >= h_->capacity) return false;
    std::memcpy(Slot(tail), &r, sizeof(Record));
    h_->tail.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Consumer side. False if the ring is empty.
  bool TryPop(Record* r) {
    const uint64_t head = h_->head.load(std::memory_order_relaxed);
    if (h_->tail.load(std::memory_order_acquire) == head) return false;
    std::memcpy(r, Slot(head), sizeof(Record));
    h_->head.store(head + 1, std::memory_order_release);
    return true;
  }

  // Only when the consumer is known dead: drops unread records and clears wait flags.
  void ResetAfterPeerDeath() {
    h_->head.store(h_->tail.load(std::memory_order_acquire), std::memory_order_release);
    h_->consumer_waiting.store(0);
    h_->producer_waiting.store(0);
  }

  RingHeader* header() const { return h_; }

 private:
  explicit RingQueue(RingHeader* h) : h_(h) {}
  void* Slot(uint64_t index) const {
    return reinterpret_cast<uint8_t*>(h_) + SlotsOffset() +
           (index & (h_->capacity - 1)) * sizeof(Record);
  }

  RingHeader* h_ = nullptr;
};

// A RingQueue plus its two eventfds: `ready_fd` (signalled after a push the consumer waits for)
// and `space_fd` (signalled after a pop the producer waits for). The fds are borrowed.
template <typename Record>
class Channel {
 public:
  Channel() = default;
  Channel(RingQueue<Record> queue, int ready_fd, int space_fd)
      : q_(queue), ready_fd_(ready_fd), space_fd_(space_fd) {}

  RingQueue<Record>& queue() { return q_; }
  int ready_fd() const { return ready_fd_; }
  int space_fd() const { return space_fd_; }

  bool TryPush(const Record& r) {
    if (!q_.TryPush(r)) return false;
    WakeIfWaiting(&q_.header()->consumer_waiting, ready_fd_);
    return true;
  }
  bool TryPop(Record* r) {
    if (!q_.TryPop(r)) return false;
    WakeIfWaiting(&q_.header()->producer_waiting, space_fd_);
    return true;
  }

  // Blocks while the ring is full. DEADLINE_EXCEEDED after timeout_ms (-1: never), UNAVAILABLE if
  // abort_fd (peer pidfd/socket, -1 for none) fires first. The record is not pushed on error.
  Status Push(const Record& r, int timeout_ms = -1, int abort_fd = -1) {
    return Blocking([&] { return TryPush(r); }, &q_.header()->producer_waiting, space_fd_,
                    timeout_ms, abort_fd);
  }
  // Blocks while the ring is empty; same errors as Push.
  Status Pop(Record* r, int timeout_ms = -1, int abort_fd = -1) {
    return Blocking([&] { return TryPop(r); }, &q_.header()->consumer_waiting, ready_fd_,
                    timeout_ms, abort_fd);
  }

  // For consumers that multiplex many channels with epoll on ready_fd(): call Arm before sleeping;
  // if it returns false the ring is non-empty and the caller must not sleep. Disarm after waking.
  bool ArmConsumerWait() {
    q_.header()->consumer_waiting.store(1, std::memory_order_relaxed);
    offloadd::Fence(std::memory_order_seq_cst);
    if (!q_.Empty()) {
      q_.header()->consumer_waiting.store(0, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void DisarmConsumerWait() {
    q_.header()->consumer_waiting.store(0, std::memory_order_relaxed);
    DrainEventFd(ready_fd_);
  }
  // The producer-side equivalent, for epoll on space_fd(): false if there is room now.
  bool ArmProducerWait() {
    q_.header()->producer_waiting.store(1, std::memory_order_relaxed);
    offloadd::Fence(std::memory_order_seq_cst);
    if (q_.Size() < q_.capacity()) {
      q_.header()->producer_waiting.store(0, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void DisarmProducerWait() {
    q_.header()->producer_waiting.store(0, std::memory_order_relaxed);
    DrainEventFd(space_fd_);
  }

 private:
  static void WakeIfWaiting(std::atomic<uint32_t>* flag, int fd) {
    offloadd::Fence(std::memory_order_seq_cst);  // pairs with the waiter's fence
    if (flag->load(std::memory_order_relaxed) != 0) SignalEventFd(fd);
  }

  template <typename Try>
  Status Blocking(Try attempt, std::atomic<uint32_t>* flag, int fd, int timeout_ms, int abort_fd) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
    for (;;) {
      if (attempt()) return OkStatus();
      flag->store(1, std::memory_order_relaxed);
      offloadd::Fence(std::memory_order_seq_cst);  // flag visible before re-checking
      if (attempt()) {
        flag->store(0, std::memory_order_relaxed);
        return OkStatus();
      }
      int wait_ms = -1;  // a stale wake-up must not extend the caller's deadline
      if (timeout_ms >= 0) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        wait_ms = left < 0 ? 0 : static_cast<int>(left);
      }
      Status st = WaitReadable(fd, abort_fd, wait_ms);
      flag->store(0, std::memory_order_relaxed);
      DrainEventFd(fd);
      if (!st.ok()) return attempt() ? OkStatus() : st;
    }
  }

  RingQueue<Record> q_;
  int ready_fd_ = -1;
  int space_fd_ = -1;
};

}  // namespace offloadd::ipc
