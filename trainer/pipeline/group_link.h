#pragma once
// GroupLink: what the ranks of one data-parallel job on one host share besides the arena (issue
// #15, docs/data_parallel.md). Rank 0 owns the job's HostOptimizer (the arena, the workers, the
// step's decisions); every other rank attaches to its arena and to this control segment, and
// follows:
//   - per block: where its staging and weights are in the arena; how many gradient hand-offs each
//     rank has landed in the staging (with its shard's ||g||^2); how many of them the leader has
//     consumed (the staging may be written again); the step its weights reflect;
//   - per step: the leader's decision (clip coefficient, skip) and the step's result;
//   - once: that the initial (or restored) weights are in the arena; an abort with its reason.
// Every publication bumps one futex word; waiters sleep on it (a shared futex: the processes map
// the segment at different addresses) and re-check. Every wait is bounded by the group timeout
// and ends early when the group is aborted.
//
// Thread-safe: each counter has one writer (the leader's optimizer thread, or a rank's own
// hand-off thread); readers anywhere.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "ipc/shm_segment.h"
#include "workers/step_driver.h"

namespace offloadd::trainer {

class GroupLink {
 public:
  // Where a block lives in the leader's arena (offsets into it).
  struct BlockInfo {
    uint64_t num_elements = 0;
    uint64_t grad_offset = 0;
    uint64_t weights_offset = 0;  // the compute copy the devices read (0: master_offset)
    uint64_t master_offset = 0;
    uint64_t exp_avg_offset = 0, exp_avg_sq_offset = 0;  // RAM tier (0: in rank 0's store)
  };
  static constexpr int kMaxWorld = 64;

  // Rank 0: a fresh segment for `world` ranks and `blocks` blocks.
  static StatusOr<std::unique_ptr<GroupLink>> Create(int world, int blocks, double timeout_seconds);
  // Ranks > 0: the segment behind `path` (Path() of the leader's link).
  static StatusOr<std::unique_ptr<GroupLink>> Attach(const std::string& path, int rank,
                                                     double timeout_seconds);
  // "/proc/<pid>/fd/<fd>": how another process of the same user opens this segment.
  std::string Path() const;

  int world() const;
  int blocks() const;
  int rank() const { return rank_; }
  double timeout_seconds() const { return timeout_seconds_; }  // every wait's bound

  // ---- leader (rank 0) ----
  void SetBlock(int b, const BlockInfo& info);
  void PublishInitialized(uint64_t generation);           // weights in the arena (init, restore)
  void PublishConsumed(int b, uint64_t handoffs);        // staging of b free after `handoffs`
  void PublishUpdated(int b, uint64_t step);              // b's weights reflect `step`
  void PublishDecision(uint64_t step, const workers::StepResult& r);
  void PublishFinished(uint64_t step, const StatusOr<workers::StepResult>& r);
  // Between steps: whether the job stops after `completed` steps (rank 0 polls the stop request;
  // every rank must stop at the same step, or the others would wait in a collective).
  void PublishBoundary(int64_t completed, bool stop);
  // Hand-offs of block b every other rank has landed, at least `handoffs`? And their shards'
  // ||g||^2 summed (valid once they have).
  bool PeersArrived(int b, uint64_t handoffs) const;
  double PeersSquaredNorm(int b) const;

  // ---- any rank ----
  void PublishArrived(int b, uint64_t handoffs, double sq_norm);  // this rank's shard landed
  // Fails the group: every wait of every rank returns `why`.
  void Abort(const Status& why);
  Status aborted() const;

  BlockInfo block(int b) const;
  uint64_t consumed(int b) const;
  uint64_t updated(int b) const;
  // Waits until pred() holds (pred reads the shared counters). `what` names the wait in errors.
  Status Wait(const std::function<bool()>& pred, const std::string& what) const;
  // Waits for decision / result of `step` (published by the leader).
  StatusOr<workers::StepResult> WaitDecision(uint64_t step) const;
  StatusOr<workers::StepResult> WaitFinished(uint64_t step) const;
  Status WaitInitialized(uint64_t generation) const;
  StatusOr<bool> WaitBoundary(int64_t completed) const;
  // Wakes every waiter (of every rank) to re-check: a process-local change they also wait for.
  void Nudge() { Bump(); }
  // The sequence number every publication bumps (for waits over several conditions).
  uint32_t sequence() const;
  // Sleeps until the sequence moves past `seen` or `timeout_ms` passes.
  void SleepWhile(uint32_t seen, int timeout_ms) const;

 private:
  struct Control;
  struct StepSlot;
  GroupLink(ipc::SharedSegment segment, int rank, double timeout_seconds);
  Control* control() const;
  StepSlot* slot(bool finished, uint64_t step) const;
  std::atomic<uint64_t>* consumed_at(int b) const;
  std::atomic<uint64_t>* updated_at(int b) const;
  std::atomic<uint64_t>* arrived_at(int rank, int b) const;
  std::atomic<uint64_t>* sq_at(int rank, int b) const;
  BlockInfo* info_at(int b) const;
  void Bump();
  StatusOr<workers::StepResult> WaitSlot(bool finished, uint64_t step) const;

  ipc::SharedSegment segment_;
  int rank_ = 0;
  double timeout_seconds_ = 600;
};

}  // namespace offloadd::trainer
