// Fuzzes what an optimizer worker reads from shared memory written by another process
// (workers/protocol.h, workers/shard_executor.h, ipc/arena.h, ipc/ring_queue.h):
//   mode 0: one command record (kind, flags, id, 112-byte payload) executed by a real
//           ShardExecutor over a real arena, as the worker's queue loop does with what it pops;
//   mode 1: the redo region a crashed worker left behind, rolled forward by RecoverUndoSlots,
//           as a restarted worker does before taking commands;
//   mode 2: a whole shared segment (header, arena header, region table, ring headers) attached
//           with SharedSegment::Attach, Arena::Open and RingQueue::Attach, as a worker attaches
//           the daemon's segment.
// Input: one mode byte, then the bytes for that mode.
//
// In mode 0 the offsets in the payload are remapped so that most land on real regions: an
// offset o names region (o & 7) at delta (o >> 3), and (o & 7) == 7 keeps o >> 3 as a raw
// offset. Counters and states are zeroed before every input so runs are reproducible.
// Checked: a completion always comes back; a bad command never touches memory outside its
// regions (ASan), and is answered with an error code rather than a crash.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "fuzz/fuzz_util.h"
#include "ipc/arena.h"
#include "ipc/ring_queue.h"
#include "ipc/shm_segment.h"
#include "workers/protocol.h"
#include "workers/shard_executor.h"

namespace ipc = offloadd::ipc;
namespace workers = offloadd::workers;

namespace {

constexpr uint64_t kElements = 4 * workers::kChunkElements + 100;  // a partial last chunk

struct World {
  ipc::SharedSegment segment;
  ipc::Arena arena;
  uint64_t base[7] = {};  // grad, master, exp_avg, exp_avg_sq, weights, counters, accum
  uint64_t size[7] = {};
  uint64_t undo = 0;
  std::unique_ptr<workers::ShardExecutor> executor;
};

World& GetWorld() {
  static World* w = [] {
    auto* world = new World;
    auto seg = ipc::SharedSegment::Create(16u << 20, {.name = "fuzz", .try_huge_pages = false});
    if (!seg.ok()) offloadd::fuzz::SetupFailed(seg.status().ToString());
    world->segment = std::move(*seg);
    auto arena = ipc::Arena::Format(&world->segment);
    if (!arena.ok()) offloadd::fuzz::SetupFailed(arena.status().ToString());
    world->arena = *arena;
    const struct {
      const char* name;
      ipc::RegionKind kind;
      uint64_t bytes;
    } regions[7] = {
        {"grad", ipc::RegionKind::kGradStaging, kElements * 4},
        {"master", ipc::RegionKind::kMaster, kElements * 4},
        {"exp_avg", ipc::RegionKind::kExpAvg, kElements * 4},
        {"exp_avg_sq", ipc::RegionKind::kExpAvgSq, kElements * 4},
        {"weights", ipc::RegionKind::kParamStaging, kElements * 2},
        {"counters", ipc::RegionKind::kControl, 2 * workers::CountersBytes(kElements)},
        {"accum", ipc::RegionKind::kGradAccum, kElements * 4},
    };
    for (int i = 0; i < 7; ++i) {
      auto r = world->arena.Allocate(regions[i].name, regions[i].kind, regions[i].bytes);
      if (!r.ok()) offloadd::fuzz::SetupFailed(r.status().ToString());
      world->base[i] = r->offset;
      world->size[i] = r->size;
    }
    auto undo = world->arena.Allocate("worker0.undo", ipc::RegionKind::kControl,
                                      workers::UndoRegionBytes(1));
    if (!undo.ok()) offloadd::fuzz::SetupFailed(undo.status().ToString());
    world->undo = undo->offset;
    workers::ExecutorOptions opts;
    opts.threads = 1;
    opts.path = workers::KernelPath::kPortable;
    opts.crash_consistent = true;
    opts.undo_offset = world->undo;
    world->executor = std::make_unique<workers::ShardExecutor>(&world->arena, opts);
    if (auto st = world->executor->Start(); !st.ok()) offloadd::fuzz::SetupFailed(st.ToString());
    return world;
  }();
  return *w;
}

void ResetState(World& w) {
  for (int i = 0; i < 7; ++i) std::memset(w.arena.At<uint8_t>(w.base[i]), 0, w.size[i]);
  std::memset(w.arena.At<uint8_t>(w.undo), 0, workers::UndoRegionBytes(1));
  // Gradients and states: small finite values, so the kernels do real arithmetic.
  auto* g = w.arena.At<float>(w.base[0]);
  for (uint64_t i = 0; i < kElements; ++i) g[i] = 0.001f * static_cast<float>(i % 97);
}

uint64_t Remap(const World& w, uint64_t o) {
  const uint64_t region = o & 7;
  return region == 7 ? o >> 3 : w.base[region] + (o >> 3);
}

void RunCommand(World& w, const uint8_t* data, size_t size) {
  ipc::CommandRecord rec{};
  std::memcpy(&rec, data, std::min(size, sizeof rec));
  switch (static_cast<workers::CommandKind>(rec.kind)) {
    case workers::CommandKind::kAdamW: {
      auto c = rec.Unpack<workers::AdamWCommand>();
      for (uint64_t* o : {&c.grad_offset, &c.master_offset, &c.exp_avg_offset,
                          &c.exp_avg_sq_offset, &c.weights_offset, &c.counters_offset}) {
        *o = Remap(w, *o);
      }
      rec.Pack(c);
      break;
    }
    case workers::CommandKind::kAccumulate: {
      auto c = rec.Unpack<workers::AccumulateCommand>();
      for (uint64_t* o : {&c.grad_offset, &c.accum_offset, &c.counters_offset}) *o = Remap(w, *o);
      rec.Pack(c);
      break;
    }
    case workers::CommandKind::kGradNorm: {
      auto c = rec.Unpack<workers::GradNormCommand>();
      c.grad_offset = Remap(w, c.grad_offset);
      rec.Pack(c);
      break;
    }
    default:
      break;
  }
  const workers::WorkerCompletion done = w.executor->Execute(rec);
  FUZZ_CHECK(done.id == rec.id);
  FUZZ_CHECK(std::memchr(done.message, 0, sizeof done.message) != nullptr);
}

void RecoverSlots(World& w, const uint8_t* data, size_t size) {
  // The first 128 bytes are the slot header; remap its offsets like commands' offsets.
  auto* slot = w.arena.At<uint8_t>(w.undo);
  std::memcpy(slot, data, std::min<size_t>(size, workers::UndoRegionBytes(1)));
  uint64_t off;
  for (size_t at : {8, 32, 40, 48, 56, 64, 72}) {  // counter_offset, dst_offset[0..5]
    std::memcpy(&off, slot + at, 8);
    off = Remap(w, off);
    std::memcpy(slot + at, &off, 8);
  }
  (void)workers::RecoverUndoSlots(w.arena, w.undo, 1);
}

void AttachSegment(const uint8_t* data, size_t size) {
  static const int fd = [] {
    int f = memfd_create("segment_fuzz", MFD_CLOEXEC);
    if (f < 0) offloadd::fuzz::SetupFailed("memfd_create failed");
    return f;
  }();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    offloadd::fuzz::SetupFailed("writing the memfd failed");
  }
  auto seg = ipc::SharedSegment::Attach(fd);
  if (!seg.ok()) return;
  auto arena = ipc::Arena::Open(&*seg);
  if (!arena.ok()) return;
  for (const ipc::Region& r : arena->List()) {
    FUZZ_CHECK(r.offset + r.size <= seg->total_size());
    (void)arena->Check(r.offset, r.size);
    (void)ipc::RingQueue<ipc::CommandRecord>::Attach(*arena, r.name);
  }
  (void)arena->Stats();
  (void)arena->Find(workers::CommandQueueName(0));
  if (auto q = ipc::RingQueue<ipc::CommandRecord>::Attach(*arena, workers::CommandQueueName(0));
      q.ok()) {
    ipc::CommandRecord r;
    (void)q->TryPop(&r);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  GetWorld();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  World& w = GetWorld();
  switch (data[0] % 3) {
    case 0:
      ResetState(w);
      RunCommand(w, data + 1, size - 1);
      break;
    case 1:
      ResetState(w);
      RecoverSlots(w, data + 1, size - 1);
      break;
    case 2:
      AttachSegment(data + 1, size - 1);
      break;
  }
  return 0;
}
