#pragma once
// HostOptimizer: the CPU side of the offloaded step. Owns the shared pinned arena (one shard per
// model block: gradient staging, fp32 master weights, Adam moments and, where kept, the 16-bit
// weight copy the device reads; without it the device reads the fp32 masters and casts them),
// the offloadd-worker pool running fused AdamW and the StepDriver (exact clipping, accumulation,
// FCFS/LCFS order). The NVMe tier (the offloadd-store process and the few staging slots the fp32
// states pass through) is an NvmeStateTier of its own (nvme_state_tier.h) that this drives.
//
// Threads: the caller (the step loop) and one optimizer thread that owns the StepDriver. The
// step loop hands over "the gradients of block b for micro-batch m are in (or on their way to)
// the staging buffer" with GradsReady(); the optimizer thread first runs the given wait (e.g. a
// CUDA event synchronize for the device-to-host copy) and then lets the workers consume them, so
// CPU updates overlap the rest of backward. When a block's update completes, on_updated(block)
// runs on the optimizer thread (the trainer uploads the new weights from there) and
// WaitUpdated(block, step) returns in the step loop.
//
// NVMe tier: master weights and both moments of a shard live in the store, in the optimizer mode's
// own bytes; before its update (StepDriver::SetBeforeUpdate) they are read into a free slot (the
// next shard's read is issued ahead), and right after it they are written back behind the update
// (NvmeStateTier, run on the optimizer thread). A compute copy of the weights stays in RAM when
// the device computes in fp32 (the fp32 master) or with a bf16 master (its bf16 half).
//
// Thread-safety: every public method is for the step-loop thread except where noted.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "ipc/arena.h"
#include "ipc/shm_segment.h"
#include "job/host_optimizer_options.h"
#include "job/step_stats.h"
#include "job/train_config.h"
#include "trainer/pipeline/arena_population.h"
#include "workers/step_driver.h"

namespace offloadd::storage {
class StoreProcess;
}
namespace offloadd::workers {
class WorkerPool;
struct ShardLayoutOptions;
struct WorkerPoolOptions;
}

namespace offloadd::trainer {

class NvmeStateTier;

namespace internal {
// The 16-bit weight copy the device reads, from fp32 masters (nothing to do for fp32 compute).
void To16(HostDtype dt, const float* src, uint16_t* dst, uint64_t n);
}  // namespace internal

struct UpdateTotals {  // since the last TakeTotals()
  double worker_busy_seconds = 0;
  double nvme_busy_seconds = 0;
  uint64_t nvme_read_bytes = 0, nvme_write_bytes = 0;
};

class HostOptimizer {
 public:
  static StatusOr<std::unique_ptr<HostOptimizer>> Create(const HostOptimizerOptions& options);
  ~HostOptimizer();

  // The arena's size for these options (job/host_optimizer_options.h, where planning and
  // validation read it).
  static uint64_t ArenaBytes(const HostOptimizerOptions& options) {
    return trainer::ArenaBytes(options);
  }
  static double BytesPerParameter(const HostOptimizerOptions& options) {
    return ArenaBytesPerParameter(options);
  }
  static bool WeightsAreFp32(const HostOptimizerOptions& options) {
    return ArenaWeightsAreFp32(options);
  }

  int num_blocks() const { return static_cast<int>(shards_.size()); }
  uint64_t elements(int block) const { return shards_[block].num_elements; }
  // Staging buffer for block gradients, in the compute dtype (fp32, bf16 or fp16).
  void* grad_staging(int block) const;
  uint64_t grad_staging_bytes(int block) const;
  // The weights the device computes with: in the compute dtype (updated in place by the workers,
  // or copied from the staged master after each update in the NVMe tier with fp32 compute), or
  // the fp32 masters themselves when weights_fp32() (the device rounds them to its dtype). With a
  // bf16 master, the master itself (the first half of its region, stepped in place).
  void* compute_weights(int block) const;  // null for a block whose weights are on NVMe
  uint64_t compute_weight_bytes(int block) const;
  bool weights_fp32() const { return weights_fp32_; }
  // The block's 16-bit weights live in the store (HostOptimizerOptions::nvme_weight_blocks).
  bool weights_on_nvme(int block) const;
  // Pinned arena buffers the NVMe weights are read into, each the size of the largest such block:
  // one in use while the next is read.
  static constexpr int kWeightBuffers = kArenaWeightBuffers;
  // Reads block's 16-bit weights (the latest written back: call WaitUpdated for the update wanted
  // first) from the store into weight buffer `buffer` (< kWeightBuffers) and returns where they
  // are (compute_weight_bytes(block) bytes), valid until that buffer is fetched into again. Runs
  // the read on the optimizer thread; for blocks with weights_on_nvme only.
  StatusOr<const void*> FetchWeights(int block, int buffer);
  // Issues that read ahead, into `buffer`, without waiting: a FetchWeights of the same block and
  // buffer then waits only for what is left of it. A prefetch that a later write-back of the block
  // (its update, a restore) overtakes is dropped, and FetchWeights reads again: it always returns
  // the latest weights written back. FetchWeights calls that found their read issued ahead:
  uint64_t weight_prefetch_hits() const;
  Status PrefetchWeights(int block, int buffer);
  // Weight buffer `buffer`'s arena memory and size (the largest such block's 16-bit weights; null
  // and 0 when no block's weights are on NVMe): what the device copies read, to page-lock once.
  void* weight_buffer(int buffer) const;
  uint64_t weight_buffer_bytes() const;
  const ipc::SharedSegment& segment() const { return segment_; }
  // "/proc/<pid>/fd/<fd>" of the arena: how the other ranks of a data-parallel group attach.
  std::string ArenaPath() const;
  // A rank > 0 of a data-parallel group: the leader holds the states and runs the updates.
  bool follower() const { return follower_; }
  // Stops the optimizer thread (a follower's calls on_updated until then; the trainer stops it
  // before the weights it uploads into go away). Idempotent; the destructor calls it.
  void StopThread();

  // Initial values: `fill(block, master)` writes the block's fp32 master weights into the
  // provided buffer; the compute copy is derived from it and the moments start at zero.
  Status Initialize(const std::function<Status(int block, float* master)>& fill);
  // The same in pieces on `threads` threads at once (RAM tier; the NVMe tier stages one block at
  // a time and fills pieces in order): fill(piece, dst) writes elements [begin, begin + count) of
  // the piece's block to dst; pieces must cover every block's elements exactly once.
  struct InitPiece {
    int block = 0;
    uint64_t begin = 0, count = 0;
  };
  Status InitializePieces(const std::vector<InitPiece>& pieces,
                          const std::function<Status(const InitPiece& piece, float* dst)>& fill,
                          uint32_t threads);
  // Wall seconds HostOptimizer::Create spent creating and populating the arena, and starting the
  // workers (and store) on it (the trainer's set-up phases "arena" and "workers").
  double arena_seconds() const { return arena_seconds_; }
  double workers_seconds() const { return workers_seconds_; }
  // The same as intervals. With the population in the background (populate_in_background),
  // arena_end() is when the last page was populated (after WaitPopulated(); until then, the
  // formatting's end) and the workers start before it.
  using Clock = std::chrono::steady_clock;
  Clock::time_point arena_start() const { return arena_start_; }
  Clock::time_point arena_end() const { return arena_end_; }
  Clock::time_point workers_start() const { return workers_start_; }
  Clock::time_point workers_end() const { return workers_end_; }
  bool populating_in_background() const { return population_ != nullptr; }
  // Waits until the whole arena is populated (at once without a background population); its
  // first error (ENOMEM naming the bytes). Idempotent.
  Status WaitPopulated();
  // The block's fp32 master weights in the arena (null for a block whose states are on NVMe,
  // where they live in the store between updates, and with a bf16 master). Read it from the
  // on-updated callback or between steps.
  const float* master_weights(int block) const;
  // Checkpoint I/O between steps: the block's fp32 states (master, exp_avg, exp_avg_sq) are copied
  // out to / in from the given buffers (each elements(block) floats). `adam_step` is the
  // number of updates already applied (Restore sets the workers' step counters to it). A bf16
  // master is read as the fp32 value its next step starts from (master + compensation, exact) and
  // restored by rounding (workers::EncodeBf16Master; not bit for bit: the region below is).
  Status ReadStates(int block, float* master, float* exp_avg, float* exp_avg_sq);
  // exp_avg / exp_avg_sq may be null for ReadStates (only the master wanted); in a compact mode
  // they must be (the states are not fp32): the regions below carry them.
  Status RestoreStates(int block, const float* master, const float* exp_avg,
                       const float* exp_avg_sq, uint64_t adam_step);
  // A bf16 master: the block's master region as the workers hold it (the bf16 master, then its
  // bf16 compensation at workers::MasterCompOffset; workers::MasterRegionBytes), for checkpoints
  // that resume bit for bit; from the arena, or through the store for a block on the NVMe tier.
  // Between steps; FAILED_PRECONDITION with an fp32 master.
  uint64_t master_region_bytes(int block) const;
  Status ReadMasterRegion(int block, uint8_t* region) const;
  Status RestoreMasterRegion(int block, const uint8_t* region);
  // Compact modes: the block's exp_avg / exp_avg_sq regions as the workers hold them
  // (workers::StateRegionBytes: bf16 values, or int8 codes and their block scales), for
  // checkpoints in the states' own format; from the arena or through the store. Between steps.
  uint64_t state_region_bytes(int block) const;
  Status ReadStateRegions(int block, uint8_t* exp_avg, uint8_t* exp_avg_sq) const;
  Status RestoreStateRegions(int block, const uint8_t* exp_avg, const uint8_t* exp_avg_sq);
  const workers::OptimizerMode& mode() const { return options_.mode; }

  // After restoring a checkpoint of `step` whose layers had `adam_step` AdamW updates applied
  // (fewer when fp16 loss scaling skipped steps): every block counts as updated through `step`.
  Status ResumeAt(uint64_t step, uint64_t adam_step);

  // Between steps (after WaitFinished of the last one): the blocks marked here are updated on
  // the device from now on (HostOptimizerOptions::device_blocks).
  Status SetDeviceBlocks(const std::vector<bool>& device_blocks);

  // An error from the callback fails the step (as a failed update would).
  void SetOnUpdated(std::function<Status(int block)> callback) { on_updated_ = std::move(callback); }
  // Trace spans of host work (optimizer thread): track "cpu update" (submit to completion of a
  // block's AdamW) and "nvme read" (staging a block's states in).
  using SpanSink = std::function<void(const char* track, int block, int64_t start_us, int64_t end_us)>;
  void SetSpanSink(SpanSink sink) { span_sink_ = std::move(sink); }

  // grad_unscale: 1 / loss scale (fp16), folded into the workers' clip coefficient.
  Status BeginStep(uint64_t step, double lr, float grad_unscale = 1.0f);
  // Blocks until the staging buffer of `block` may be overwritten.
  Status WaitStagingFree(int block);
  // Queues: run `wait` (may be empty) on the optimizer thread, then hand the gradients over.
  // `done` (may be empty) says without blocking whether `wait` would return at once; while it
  // says no, the optimizer thread keeps taking completions and dispatching updates (a blocking
  // wait for a device-to-host copy would leave the workers' queues to run dry). `sq_norm` (may
  // be empty; only without accumulation), read after `wait`: the gradients' sum of squares,
  // measured where they were made, so the clipping decision needs no pass over them here.
  Status GradsReady(int block, uint32_t micro, std::function<Status()> wait,
                    std::function<bool()> done = nullptr, std::function<double()> sq_norm = nullptr);
  // Blocks until `block`'s weights reflect update `step` (0: nothing to wait for).
  Status WaitUpdated(int block, uint64_t step);
  // Closes the open step: its remaining updates run in the background.
  Status FinishStepAsync();
  // Blocks until step `step`'s outcome is known (after FinishStepAsync: once every gradient norm
  // is in; the CPU updates may still run): its clip coefficient, the grad_scale the device
  // blocks are updated with, or that it is skipped.
  StatusOr<workers::StepResult> WaitDecided(uint64_t step);
  // Waits until every update of `step` is done and returns the step's result (a skipped step
  // counts as done: its blocks keep their weights).
  StatusOr<workers::StepResult> WaitFinished(uint64_t step);
  UpdateTotals TakeTotals();
  // The worker processes (CPU time, work, queue) and the NVMe tier's store (role "optimizer") after
  // a step, and the pinned arena's size; for the per-job metrics.
  void AddRuntime(RuntimeStats* out) const;
  uint32_t worker_processes() const;
  // The CPU AdamW kernel the workers run and why: "avx2 (OFFLOADD_ADAMW_KERNEL=avx2)".
  std::string kernel_description() const;

 private:
  struct Item {
    enum Kind { kBegin, kGrads, kFinish, kRun } kind = kRun;
    int block = 0;
    uint32_t micro = 0;
    uint64_t step = 0;
    double lr = 0;
    float grad_unscale = 1.0f;
    std::function<Status()> fn;
    std::function<bool()> done;  // kGrads: fn would not block
    std::function<double()> sq_norm;  // kGrads: the gradients' ||g||^2, read after fn
  };
  HostOptimizer() = default;
  Status Start(const HostOptimizerOptions& options);
  // Start's parts, in order: the shared arena, its regions and the blocks' shards (returns whether
  // the arena is populated in the background); then (NVMe tier) the NvmeStateTier on it; the step
  // driver's hooks.
  StatusOr<bool> CreateArena(const HostOptimizerOptions& o, const workers::ShardLayoutOptions& lo,
                             const workers::WorkerPoolOptions& po);
  void ConnectDriver();
  Status InitializeBlocks(const std::function<Status(int block, float* master)>& fill);
  // A bf16 master: elements [begin, begin + count) of block's master region from fp32 values.
  void EncodeMaster(size_t block, uint64_t begin, const float* p, uint64_t count);
  double arena_seconds_ = 0, workers_seconds_ = 0;
  Clock::time_point arena_start_, arena_end_, workers_start_, workers_end_;
  void Loop();
  Status Handle(Item& item);
  Status RunOnThread(std::function<Status()> fn);  // runs fn on the optimizer thread, waits
  // The NVMe tier holds the block's states (its weights) in the store.
  bool OnNvme(size_t shard) const;
  bool WeightsOnNvme(size_t shard) const;
  void Fail(const Status& s);
  // Data parallel, leader: waits (dispatching updates) until every rank landed its shard of
  // `block`'s next hand-off; publishes a freed staging buffer.
  Status WaitPeers(int block);
  void PublishStagingFree(int block);
  void PublishBlocks();
  // Data parallel, ranks > 0 (host_optimizer_group.cc).
  Status StartFollower(const HostOptimizerOptions& options);
  void FollowLoop();
  Status FollowUpdates();
  Status StartPopulation();  // populate_in_background: the gates of the arena's population
  // Between steps, the RAM tier: block's states straight from rank 0's arena.
  Status FollowerReadStates(int block, float* master, float* exp_avg, float* exp_avg_sq);

  HostOptimizerOptions options_;
  ipc::SharedSegment segment_;
  // The background population of segment_ (declared after it: stopped before it is unmapped).
  std::unique_ptr<ArenaPopulation> population_;
  std::unique_ptr<ipc::Arena> arena_;
  std::vector<workers::ShardSpec> shards_;
  std::unique_ptr<workers::WorkerPool> pool_;
  std::unique_ptr<workers::StepDriver> driver_;
  // The NVMe tier (null on the RAM tier and on a follower); stopped before the arena goes.
  std::unique_ptr<NvmeStateTier> tier_;
  std::function<Status(int)> on_updated_;
  SpanSink span_sink_;
  std::vector<int64_t> update_start_us_;

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  Status error_;
  uint64_t driver_step_ = 0;  // optimizer thread: the step the driver has open
  std::vector<uint64_t> updated_step_;
  std::vector<bool> staging_busy_;
  uint64_t finished_step_ = 0;
  StatusOr<workers::StepResult> result_ = workers::StepResult{};
  uint64_t decided_step_ = 0;
  workers::StepResult decision_;
  UpdateTotals totals_;
  double busy_base_ = 0;
  // Data parallel: per block, gradient hand-offs taken (leader: consumed by the driver; follower:
  // submitted by the step loop) and, on a follower, landed in the staging buffer.
  bool follower_ = false;
  bool weights_fp32_ = false;  // WeightsAreFp32(options_)
  std::vector<uint64_t> handoffs_;
  std::vector<uint64_t> landed_;
  uint64_t resumed_step_ = 0;  // follower: steps done before this run (a resume)
};

// A store process as its client sees it, with its CPU time (the per-job metrics).
RuntimeStats::Store StoreRuntimeStats(const storage::StoreProcess& store, const char* role);

}  // namespace offloadd::trainer
