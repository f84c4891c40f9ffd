#pragma once
// HostGather: ZeRO-1 across hosts, the all-gather of the updated slices on a thread of its own.
// After step k's gradients are handed over (Submit(k)), the thread takes the blocks in the next
// forward's order (0, 1, ..., n-1) and gathers each one as soon as this host's update of its
// slice is done (hooks.wait_updated), not after the whole step: the next forward of block b waits
// for block b's gather only (WaitGathered), so the gathers overlap the other blocks' CPU updates
// and the forward. Every rank gathers the same blocks in the same order, whatever its updates'
// timing, so the collectives (hooks.gather, on a process group of their own) always match. A
// skipped step (fp16 overflow, hooks.skipped) gathers nothing: the weights did not change.
//
// Torch-free: the trainer supplies what a block's gather does (trainer_hosts.cc: straight into
// the device's resident weights on CUDA, into the pinned host copy when streamed or on a CPU
// device) and where it waits. The first error (an update that failed, a lost host) ends the
// thread and is returned to every waiter.
//
// Thread-safety: Submit, WaitGathered, WaitAll and Stop are for any thread; the hooks run on the
// gather thread.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace offloadd::trainer {

class HostGather {
 public:
  struct Hooks {
    // Blocks until this host's slice of block b holds update `step` (HostOptimizer::WaitUpdated).
    std::function<Status(int b, uint64_t step)> wait_updated;
    // Whether step `step` was skipped (called before its first block; may be empty: no step is).
    std::function<StatusOr<bool>(uint64_t step)> skipped;
    // The collective: this host's slice of block b into every rank's whole weights of block b.
    std::function<Status(int b)> gather;
    // Runs first on the gather thread (e.g. the CUDA device current); may be empty.
    std::function<void()> on_start;
    // A gather's span (host clock, issue to return); may be empty.
    std::function<void(int b, int64_t start_us, int64_t end_us)> span;
  };
  HostGather(int blocks, Hooks hooks);
  ~HostGather();  // Stop()
  HostGather(const HostGather&) = delete;
  HostGather& operator=(const HostGather&) = delete;

  // Queues step `step`'s gathers (after its updates were started: HostOptimizer::
  // FinishStepAsync). restored: the host's slices were just restored (a resume at `step`): every
  // block is gathered at once, none waited for, and the earlier gathers no longer count.
  Status Submit(uint64_t step, bool restored = false);
  // Blocks until block b's weights of `step` are gathered (0: at once). On CUDA, gathered means
  // issued: the hook left an event for the compute stream to wait on.
  Status WaitGathered(int b, uint64_t step);
  // Every block of `step` gathered (before the weights are read outside a forward, or the
  // slices are written: an evaluation, a restore).
  Status WaitAll(uint64_t step);
  // Finishes the gathers queued (every rank runs the same ones: a rank that stopped in the
  // middle would leave the others waiting in a collective) and ends the thread. Idempotent.
  void Stop();
  // Blocks gathered so far, in the order gathered (the first kOrderKept; tests: the order the
  // collectives ran in).
  static constexpr size_t kOrderKept = 4096;
  std::vector<int> gathered_order() const;

 private:
  struct Job {
    uint64_t step = 0;
    bool restored = false;
  };
  void Loop();
  Status Run(const Job& job);

  const int n_;
  const Hooks hooks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<uint64_t> gathered_;  // per block: the step its gathered weights are of
  std::vector<int> order_;
  Status error_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace offloadd::trainer
