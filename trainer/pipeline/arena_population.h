#pragma once
// ArenaPopulation: faults in a fresh shared arena in the background, in the order its users need
// it. The set-up of a 7B job populates 100 GiB of arena at the VM's rate of
// backing fresh memory (~23 s on the H200 host) and reads 13.5 GB of checkpoint at the disk's
// (~9-13 s); in sequence they were 33 of its 35 s. Populated in gates, the first ones being each
// block's fp32 masters and 16-bit weights in block order, the reader fills block b as soon as
// gate b is done, while the rest of the arena (moments, gradient staging) is populated behind it.
// This adds no memory: every byte is the arena's.
//
// The ranges are split into chunks handed out in order to `threads` threads; gate g is done when
// all its chunks are. Populating never changes a page's contents (ipc::PopulatePages), so the
// pages of a done gate may be written while later ones are populated. The last gate, implicit, is
// everything of [0, size) that no gate names.
//
// Thread-safety: WaitGate and the accessors may be called from any thread; Finish from one.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace offloadd::trainer {

struct ByteRange {
  uint64_t begin = 0, end = 0;  // offsets from the base
};

struct ArenaPopulationOptions {
  uint8_t* base = nullptr;  // page-aligned mapping of `size` bytes
  uint64_t size = 0;
  // Gates in the order they are populated, each a list of byte ranges (rounded out to pages).
  std::vector<std::vector<ByteRange>> gates;
  uint32_t threads = 1;
  uint64_t chunk_bytes = uint64_t{64} << 20;
  // Tests: runs on a populating thread before each chunk (its index in population order).
  std::function<void(size_t chunk)> before_chunk;
};

class ArenaPopulation {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts the threads.
  static StatusOr<std::unique_ptr<ArenaPopulation>> Start(ArenaPopulationOptions options);
  ~ArenaPopulation();  // stops handing out chunks and joins

  // Blocks until gate g (0 <= g <= num_gates(); num_gates() is the rest) is populated; the first
  // population error, if any, from then on.
  Status WaitGate(size_t g);
  // Waits for every gate and joins the threads; the first error. Idempotent.
  Status Finish();

  size_t num_gates() const { return gate_chunks_.size() - 1; }  // not counting the rest
  size_t num_chunks() const { return chunks_.size(); }
  uint64_t populated_bytes() const;  // bytes of the chunks done so far
  Clock::time_point start_time() const { return start_; }
  // When the last chunk completed (Finish() first).
  Clock::time_point end_time() const { return end_; }
  // When gate g completed (WaitGate(g) first).
  Clock::time_point gate_time(size_t g) const;

 private:
  struct Chunk {
    uint64_t begin, end;
    size_t gate;
  };
  explicit ArenaPopulation(ArenaPopulationOptions options) : o_(std::move(options)) {}
  void Plan();
  void Run();

  ArenaPopulationOptions o_;
  std::vector<Chunk> chunks_;
  std::vector<size_t> gate_chunks_;  // chunks per gate, the rest last

  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t next_ = 0;  // next chunk to hand out
  std::vector<size_t> gate_done_;
  std::vector<Clock::time_point> gate_time_;
  uint64_t done_bytes_ = 0;
  size_t chunks_done_ = 0;
  Status error_;
  bool stop_ = false;
  Clock::time_point start_, end_;
  std::vector<std::thread> threads_;
  bool joined_ = false;
};

}  // namespace offloadd::trainer
