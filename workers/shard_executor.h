#pragma once
// ShardExecutor: runs one worker process's commands on its T threads. A command's shard is cut
// into kChunkElements chunks that the threads claim in order; each chunk is checked against its
// step counter (skip if done, refuse if out of order), updated by the fused kernel (into the
// thread's redo slot when crash-consistency is on, then copied over the shared state), and
// committed by advancing its counter. The squared gradient norm is summed per chunk in chunk
// order, so it does not depend on the thread count or on which chunks a crashed predecessor did.
//
// Redo slots (region UndoRegionName(worker), UndoRegionBytes(threads) bytes): one per thread, a
// header plus one chunk of master/exp_avg/exp_avg_sq. Why redo rather than undo: an undo log
// needs an extra read pass over the old state before the update (measured ~30% slower here); a
// redo slot is written by the kernel itself while it sits in L1 and copied back while the target
// lines are still cached, which measured 5-15% (bench/workers/RESULTS.md).
// RecoverUndoSlots() rolls forward every slot that was marked committing; the restarted worker
// calls it before taking commands, and the pool calls it itself for a worker it gives up on.
//
// Thread-safety: Execute() is called by one thread (the worker's queue loop) at a time.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "ipc/arena.h"
#include "workers/adamw_kernel.h"
#include "workers/protocol.h"

namespace offloadd::workers {

uint64_t UndoRegionBytes(uint32_t threads);

// Completes every chunk commit recorded in the redo region at `undo_offset` (for `threads`
// slots) that had not advanced its counter yet. Returns how many chunks it completed.
StatusOr<uint32_t> RecoverUndoSlots(const ipc::Arena& arena, uint64_t undo_offset,
                                    uint32_t threads);

struct ExecutorOptions {
  uint32_t worker = 0;
  uint32_t threads = 1;
  KernelPath path = KernelPath::kPortable;
  bool crash_consistent = true;
  std::vector<int> cpus;     // thread t is pinned to cpus[t % size]; empty: no pinning
  uint64_t undo_offset = 0;  // required when crash_consistent
  // Test seam: SIGKILL this process at `crash_point` of the chunk after `crash_after_chunks`
  // chunks have been processed.
  CrashPoint crash_point = CrashPoint::kNone;
  uint64_t crash_after_chunks = 0;
};

class ShardExecutor {
 public:
  ShardExecutor(const ipc::Arena* arena, ExecutorOptions options);
  ~ShardExecutor();
  ShardExecutor(const ShardExecutor&) = delete;
  ShardExecutor& operator=(const ShardExecutor&) = delete;

  // Starts the threads (and pins them). Errors if pinning fails.
  Status Start();
  // Validates and runs one command; never throws or aborts on bad input (the completion carries
  // INVALID_ARGUMENT / OUT_OF_RANGE / FAILED_PRECONDITION instead).
  WorkerCompletion Execute(const ipc::CommandRecord& command);

 private:
  struct Job;
  void ThreadMain(uint32_t thread);
  Status RunChunk(const Job& job, uint32_t thread, uint64_t chunk, double* sq_norm, bool* applied);
  Status Validate(const ipc::CommandRecord& command, Job* job) const;

  const ipc::Arena* arena_;
  ExecutorOptions options_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  uint64_t generation_ = 0;
  uint32_t running_ = 0;
  bool stop_ = false;
  std::unique_ptr<Job> job_;
  std::atomic<uint64_t> chunks_processed_{0};
};

}  // namespace offloadd::workers
