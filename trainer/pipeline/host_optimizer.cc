#include "trainer/pipeline/host_optimizer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/logging.h"
#include "common/proc_stat.h"
#include "job/arena_layout.h"
#include "storage/format.h"
#include "storage/store_client.h"
#include "trainer/pipeline/group_link.h"
#include "trainer/pipeline/nvme_state_tier.h"
#include "trainer/pipeline/trace.h"
#include "workers/adamw_kernel_impl.h"
#include "workers/shard_layout.h"
#include "workers/worker_pool.h"

namespace offloadd::trainer {
namespace {

using internal::LayoutOptions;
using internal::PoolOptions;

// What the compact optimizer modes do not run with yet (docs/optimizer-modes.md).
Status CheckModeSupported(const HostOptimizerOptions& o) {
  if (o.mode.Exact()) return OkStatus();
  const std::string mode = "optimizer mode " + o.mode.Describe();
  // A bf16 master is the device's weights: they must be bf16 (fp32 compute reads fp32 masters,
  // fp16 a 16-bit copy the bf16 master would have to keep beside it).
  if (o.mode.master == workers::MasterDtype::kBf16 && o.compute != HostDtype::kBf16) {
    return UnimplementedError(mode + " with " + (o.compute == HostDtype::kFp32 ? "fp32" : "fp16") +
                              " compute: a bf16 master is the device's bf16 weights");
  }
  // The NVMe tier (NvmeStateTier stores and stages the mode's regions), data parallelism (ranks
  // of one host share this arena) and device blocks (DeviceOptimizer holds their regions in the
  // same format) run; the trainer refuses the combinations that do not (trainer_state.cc
  // CheckOptimizerMode).
  return OkStatus();
}

// The step driver's settings from the job's.
StatusOr<workers::OptimizerConfig> DriverConfig(const HostOptimizerOptions& o,
                                                const workers::ShardLayoutOptions& lo) {
  workers::OptimizerConfig oc;
  oc.beta1 = o.optim.beta1;
  oc.beta2 = o.optim.beta2;
  oc.eps = o.optim.eps;
  oc.weight_decay = o.optim.weight_decay;
  oc.max_grad_norm = o.optim.max_grad_norm;
  oc.accumulation_steps = lo.accumulation_steps;
  oc.defer_below_layer = static_cast<uint32_t>(std::max(0, o.defer_below_block));
  oc.update_depth = o.update_depth;
  oc.skip_nonfinite = o.skip_nonfinite;
  // Unset: the Trainer resolves the default per device (train_config.h); a bare HostOptimizer
  // holds.
  if (!o.optim.speculation.empty()) {
    ASSIGN_OR_RETURN(oc.speculation, workers::ParseSpeculation(o.optim.speculation));
  }
  // NVMe tier: a speculated block holds its staging slot until the step's norm is known, and the
  // slots are fewer than the blocks; fp16: a skipped step would have to undo updates bit for bit.
  if (o.tier == StateTier::kNvme || o.skip_nonfinite) oc.speculation = workers::Speculation::kNever;
  return oc;
}

}  // namespace

StatusOr<std::unique_ptr<HostOptimizer>> HostOptimizer::Create(const HostOptimizerOptions& options) {
  std::unique_ptr<HostOptimizer> h(new HostOptimizer());
  RETURN_IF_ERROR(h->Start(options));
  return h;
}

Status HostOptimizer::Start(const HostOptimizerOptions& o) {
  RETURN_IF_ERROR(CheckModeSupported(o));
  if (o.group != nullptr && o.group->rank() > 0) return StartFollower(o);
  options_ = o;
  weights_fp32_ = WeightsAreFp32(o);
  if (o.block_elements.empty()) return InvalidArgumentError("model has no parameters");
  RETURN_IF_ERROR(NvmeStateTier::CheckOptions(o));
  const auto lo = LayoutOptions(o);
  const auto po = PoolOptions(o);
  ASSIGN_OR_RETURN(const bool background, CreateArena(o, lo, po));
  if (o.tier == StateTier::kNvme) {
    ASSIGN_OR_RETURN(tier_, NvmeStateTier::Start(o, segment_, arena_.get(), &shards_));
  }
  // A block whose device weights are its fp32 master steps with no 16-bit copy to write (on the
  // NVMe tier, one whose states stay in RAM: internal::BlockWeightsFp32).
  for (size_t b = 0; b < shards_.size(); ++b) {
    if (internal::BlockWeightsFp32(o, b)) shards_[b].weight_dtype = workers::WeightDtype::kNone;
  }
  if (background && !segment_.huge_pages()) RETURN_IF_ERROR(StartPopulation());
  workers_start_ = arena_end_ = Clock::now();
  ASSIGN_OR_RETURN(pool_, workers::WorkerPool::Start(&segment_, arena_.get(), po));
  workers_end_ = Clock::now();
  arena_seconds_ = std::chrono::duration<double>(arena_end_ - arena_start_).count();
  workers_seconds_ = std::chrono::duration<double>(workers_end_ - workers_start_).count();
  ASSIGN_OR_RETURN(const workers::OptimizerConfig oc, DriverConfig(o, lo));
  driver_ = std::make_unique<workers::StepDriver>(pool_.get(), shards_, oc);
  if (tier_) tier_->SetDriver(driver_.get());
  update_start_us_.assign(shards_.size(), 0);
  ConnectDriver();
  updated_step_.assign(shards_.size(), 0);
  staging_busy_.assign(shards_.size(), false);
  handoffs_.assign(shards_.size(), 0);
  if (o.group) PublishBlocks();
  thread_ = std::thread([this] { Loop(); });
  return OkStatus();
}

StatusOr<bool> HostOptimizer::CreateArena(const HostOptimizerOptions& o,
                                          const workers::ShardLayoutOptions& lo,
                                          const workers::WorkerPoolOptions& po) {
  const uint64_t bytes = ArenaBytes(o);
  if (o.host_memory_limit > 0 && bytes > o.host_memory_limit) {
    return ResourceExhaustedError(
        "the shared arena needs " + std::to_string(bytes >> 20) + " MiB but host_memory_limit is " +
        std::to_string(o.host_memory_limit >> 20) + " MiB" +
        (o.tier == StateTier::kCpu ? "; offload the optimizer to NVMe" : ""));
  }
  arena_start_ = Clock::now();
  ipc::SegmentOptions so;
  so.name = "offloadd-train";
  so.populate_threads = std::max<uint32_t>(1, o.populate_threads);
  const bool background = o.populate_in_background && so.populate_threads > 1 &&
                          o.tier == StateTier::kCpu && o.group == nullptr;
  so.defer_populate = background;
  ASSIGN_OR_RETURN(segment_, ipc::SharedSegment::Create(bytes, so));
  ipc::ArenaOptions ao;
  ao.max_regions =
      workers::RegionsFor(o.block_elements, lo, po.processes) + internal::ExtraRegions(o);
  ASSIGN_OR_RETURN(ipc::Arena arena, ipc::Arena::Format(&segment_, ao));
  arena_ = std::make_unique<ipc::Arena>(std::move(arena));
  ASSIGN_OR_RETURN(shards_, workers::AllocateShards(arena_.get(), o.block_elements, lo, po.processes));
  if (shards_.size() != o.block_elements.size())
    return InternalError("expected one shard per block");
  if (!o.device_blocks.empty() && o.device_blocks.size() != shards_.size())
    return InvalidArgumentError("device_blocks names " + std::to_string(o.device_blocks.size()) +
                                " blocks, the model has " + std::to_string(shards_.size()));
  for (size_t b = 0; b < o.device_blocks.size(); ++b) shards_[b].on_device = o.device_blocks[b];
  return background;
}

// The step driver's hooks: the NVMe tier's stage-in before an update and write-back after it, the
// update spans, and the waiters on a block's update and on the step's decision.
void HostOptimizer::ConnectDriver() {
  if (options_.combine_sq_norm) driver_->SetCombineSquaredNorm(options_.combine_sq_norm);
  driver_->SetOnShardUpdated([this](size_t shard) {
    if (span_sink_) span_sink_("cpu update", static_cast<int>(shard), update_start_us_[shard], NowMicros());
    if (OnNvme(shard)) {
      Status st = tier_->AfterUpdate(shard);
      if (!st.ok()) Fail(st);
    }
    if (on_updated_) {
      Status st = on_updated_(static_cast<int>(shard));
      if (!st.ok()) Fail(st);
    }
    std::lock_guard<std::mutex> lock(mu_);
    updated_step_[shard] = driver_step_;
    staging_busy_[shard] = false;
    if (options_.group) {
      options_.group->PublishUpdated(static_cast<int>(shard), driver_step_);
      PublishStagingFree(static_cast<int>(shard));
    }
    cv_.notify_all();
  });
  driver_->SetOnDecided([this](const workers::StepResult& r) {
    std::lock_guard<std::mutex> lock(mu_);
    decision_ = r;
    decided_step_ = driver_step_;
    if (options_.group) options_.group->PublishDecision(driver_step_, r);
    cv_.notify_all();
  });
  driver_->SetBeforeUpdate([this](size_t shard, workers::ShardSpec* spec) -> Status {
    if (OnNvme(shard)) {
      const int64_t t0 = NowMicros();
      RETURN_IF_ERROR(tier_->StageIn(shard, spec));
      if (span_sink_) span_sink_("nvme read", static_cast<int>(shard), t0, NowMicros());
    }
    update_start_us_[shard] = NowMicros();
    return OkStatus();
  });
}

void HostOptimizer::StopThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

HostOptimizer::~HostOptimizer() {
  StopThread();
  if (pool_) (void)pool_->Shutdown();
  tier_.reset();  // the store's shutdown is bounded (NvmeStateTier's destructor)
}

bool HostOptimizer::OnNvme(size_t shard) const { return tier_ != nullptr && tier_->OnNvme(shard); }

bool HostOptimizer::WeightsOnNvme(size_t shard) const {
  return tier_ != nullptr && tier_->WeightsOnNvme(shard);
}

uint32_t HostOptimizer::worker_processes() const { return pool_ ? pool_->size() : options_.worker_processes; }

std::string HostOptimizer::kernel_description() const {
  if (follower_) return "rank 0's workers";
  const workers::WorkerPoolMetrics m = pool_->Metrics();
  return m.kernel_path + " (" + m.kernel_reason + ")";
}

void* HostOptimizer::grad_staging(int block) const {
  return arena_->At<void>(shards_[block].grad_offset);
}

const float* HostOptimizer::master_weights(int block) const {
  if (follower_ || OnNvme(block) || options_.mode.master != workers::MasterDtype::kFp32)
    return nullptr;
  return arena_->At<float>(shards_[block].master_offset);
}

void* HostOptimizer::compute_weights(int block) const {
  if (follower_) return arena_->At<void>(shards_[block].weights_offset);  // the leader's choice
  if (WeightsOnNvme(block)) return nullptr;
  if (options_.mode.master == workers::MasterDtype::kBf16)  // NVMe: the master's copy in RAM
    return OnNvme(block) ? tier_->compute_copy(block)
                         : arena_->At<void>(shards_[block].master_offset);
  if (!internal::BlockWeightsFp32(options_, static_cast<size_t>(block)))
    return arena_->At<void>(shards_[block].weights_offset);
  if (OnNvme(block)) return tier_->compute_copy(block);
  return arena_->At<void>(shards_[block].master_offset);
}

// ---- 16-bit weights on NVMe (NvmeStateTier, on the optimizer thread) ----

bool HostOptimizer::weights_on_nvme(int block) const {
  return !follower_ && block >= 0 && block < num_blocks() &&
         WeightsOnNvme(static_cast<size_t>(block));
}

namespace {

Status CheckWeightRequest(bool on_nvme, int block, int buffer, int buffers) {
  if (!on_nvme) {
    return InvalidArgumentError("block " + std::to_string(block) +
                                " has no weights on NVMe to fetch");
  }
  if (buffer < 0 || buffer >= buffers) {
    return InvalidArgumentError("weight buffer " + std::to_string(buffer) + " out of range [0, " +
                                std::to_string(buffers) + ")");
  }
  return OkStatus();
}

}  // namespace

Status HostOptimizer::PrefetchWeights(int block, int buffer) {
  RETURN_IF_ERROR(CheckWeightRequest(weights_on_nvme(block), block, buffer, kWeightBuffers));
  const Status issued = RunOnThread([&]() { return tier_->PrefetchWeights(block, buffer); });
  if (!issued.ok())
    return issued.WithContext("reading block " + std::to_string(block) + "'s weights from NVMe");
  return OkStatus();
}

StatusOr<const void*> HostOptimizer::FetchWeights(int block, int buffer) {
  RETURN_IF_ERROR(CheckWeightRequest(weights_on_nvme(block), block, buffer, kWeightBuffers));
  const void* weights = nullptr;
  const Status read = RunOnThread([&]() -> Status {
    ASSIGN_OR_RETURN(weights, tier_->FetchWeights(block, buffer));
    return OkStatus();
  });
  if (!read.ok())
    return read.WithContext("reading block " + std::to_string(block) + "'s weights from NVMe");
  return weights;
}

void* HostOptimizer::weight_buffer(int buffer) const {
  return tier_ ? tier_->weight_buffer(buffer) : nullptr;
}

uint64_t HostOptimizer::weight_buffer_bytes() const {
  return tier_ ? tier_->weight_buffer_bytes() : 0;
}

uint64_t HostOptimizer::weight_prefetch_hits() const {
  return tier_ ? tier_->weight_prefetch_hits() : 0;
}

uint64_t HostOptimizer::compute_weight_bytes(int block) const {
  return shards_[block].num_elements *
         (internal::BlockWeightsFp32(options_, static_cast<size_t>(block)) ? 4 : 2);
}

uint64_t HostOptimizer::grad_staging_bytes(int block) const {
  return shards_[block].num_elements * (options_.compute == HostDtype::kFp32 ? 4 : 2);
}

void HostOptimizer::Fail(const Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = s;
  if (options_.group) options_.group->Abort(s);
  cv_.notify_all();
}

// ---- optimizer thread ----

void HostOptimizer::Loop() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Completions are only noticed while the driver runs: poll it while gradients trickle in.
      while (queue_.empty() && !stopping_) {
        cv_.wait_for(lock, std::chrono::microseconds(500));
        if (queue_.empty() && !stopping_) {
          lock.unlock();
          Status st = driver_->Poll();
          if (!st.ok()) Fail(st);
          lock.lock();
        }
      }
      if (stopping_ && queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    Status st = Handle(item);
    if (!st.ok()) Fail(st);
  }
}

Status HostOptimizer::Handle(Item& item) {
  switch (item.kind) {
    case Item::kBegin:
      // Every NVMe block's states are read again each step, even one a slot still holds from the
      // last (its read is where a dead store shows before the block is updated); within the step
      // the next block's read is issued ahead (StageIn).
      if (tier_) RETURN_IF_ERROR(tier_->BeginStep());
      driver_step_ = item.step;
      return driver_->BeginStep(item.step, item.lr, item.grad_unscale);
    case Item::kGrads: {
      // Dispatch on completions while the gradients are still on their way (see GradsReady).
      while (item.done && !item.done()) {
        RETURN_IF_ERROR(driver_->Poll());
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (item.fn) RETURN_IF_ERROR(item.fn());
      // Data parallel: the other ranks' shards of the block land in the same staging buffer (a
      // block on the device has its all-reduced gradients on every rank: this rank's norm is it).
      const bool shared = options_.group != nullptr && !shards_[item.block].on_device;
      if (shared) RETURN_IF_ERROR(WaitPeers(item.block));
      std::optional<double> sq;
      if (item.sq_norm) sq = item.sq_norm() + (shared ? options_.group->PeersSquaredNorm(item.block) : 0.0);
      ++handoffs_[item.block];
      RETURN_IF_ERROR(driver_->GradsReady(item.block, item.micro, sq));
      if (item.micro + 1 < std::max<uint32_t>(1, options_.accumulation_steps)) {
        RETURN_IF_ERROR(driver_->WaitShardIdle(item.block));  // accumulated: staging reusable
        std::lock_guard<std::mutex> lock(mu_);
        staging_busy_[item.block] = false;
        if (options_.group) PublishStagingFree(item.block);
        cv_.notify_all();
      }
      return OkStatus();
    }
    case Item::kFinish: {
      auto r = driver_->FinishStep();
      if (r.ok() && tier_) RETURN_IF_ERROR(tier_->Drain());  // write-backs of the last shards
      std::lock_guard<std::mutex> lock(mu_);
      // An earlier failure of this optimizer (a wait for the other ranks' gradients that timed
      // out, a dead worker) is the cause; the driver's complaint about the blocks it then did not
      // get would hide it.
      if (!error_.ok()) r = error_;
      if (r.ok() && r->skipped) {  // no update ran: the blocks keep their weights of the last one
        std::fill(updated_step_.begin(), updated_step_.end(), driver_step_);
        std::fill(staging_busy_.begin(), staging_busy_.end(), false);
        for (int b = 0; options_.group && b < num_blocks(); ++b) {
          options_.group->PublishUpdated(b, driver_step_);
          PublishStagingFree(b);
        }
      }
      if (options_.group) {
        options_.group->PublishFinished(driver_step_, r);
        if (!r.ok()) options_.group->Abort(r.status());  // the other ranks' waits end with it
      }
      // A failed step (a non-finite gradient norm, a dead store or worker) leaves its blocks
      // un-updated: the step loop may already wait for them (WaitUpdated in the next forward), so
      // the failure must reach every waiter, not only WaitFinished.
      if (!r.ok() && error_.ok()) error_ = r.status();
      result_ = std::move(r);
      finished_step_ = driver_step_;
      cv_.notify_all();
      return OkStatus();
    }
    case Item::kRun:
      return item.fn();
  }
  return OkStatus();
}

Status HostOptimizer::RunOnThread(std::function<Status()> fn) {
  auto done = std::make_shared<std::pair<bool, Status>>(false, OkStatus());
  {
    std::lock_guard<std::mutex> lock(mu_);
    Item it;
    it.kind = Item::kRun;
    it.fn = [this, fn, done]() {
      Status st = fn();
      std::lock_guard<std::mutex> l(mu_);
      done->first = true;
      done->second = st;
      cv_.notify_all();
      return OkStatus();
    };
    queue_.push_back(std::move(it));
    cv_.notify_all();
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done->first || !error_.ok(); });
  if (!done->first) return error_;
  return done->second;
}

// ---- step API (step-loop thread) ----

Status HostOptimizer::BeginStep(uint64_t step, double lr, float grad_unscale) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(error_);
  if (follower_) return options_.group->aborted();  // the leader's driver runs the step
  Item it;
  it.kind = Item::kBegin;
  it.step = step;
  it.lr = lr;
  it.grad_unscale = grad_unscale;
  queue_.push_back(std::move(it));
  cv_.notify_all();
  return OkStatus();
}

Status HostOptimizer::WaitStagingFree(int block) {
  if (follower_) {  // the leader consumed this rank's every earlier hand-off of the block
    GroupLink& g = *options_.group;
    RETURN_IF_ERROR(g.Wait([&] { return g.consumed(block) >= handoffs_[block]; },
                           "rank 0 to consume block " + std::to_string(block) + "'s gradients"));
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !staging_busy_[block] || !error_.ok(); });
  return error_;
}

Status HostOptimizer::GradsReady(int block, uint32_t micro, std::function<Status()> wait,
                                 std::function<bool()> done, std::function<double()> sq_norm) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(error_);
  if (follower_ && shards_[block].on_device) return OkStatus();  // rank 0's replica's norm counts
  if (!shards_[block].on_device) staging_busy_[block] = true;
  if (follower_) ++handoffs_[block];
  Item it;
  it.kind = Item::kGrads;
  it.block = block;
  it.micro = micro;
  it.fn = std::move(wait);
  it.done = std::move(done);
  it.sq_norm = std::move(sq_norm);
  queue_.push_back(std::move(it));
  cv_.notify_all();
  if (follower_) options_.group->Nudge();  // its thread sleeps on the group's futex
  return OkStatus();
}

Status HostOptimizer::SetDeviceBlocks(const std::vector<bool>& device_blocks) {
  if (device_blocks.size() != shards_.size()) {
    return InvalidArgumentError("device_blocks names " + std::to_string(device_blocks.size()) +
                                " blocks, the model has " + std::to_string(shards_.size()));
  }
  if (follower_) {  // its ranks' replicas are updated on each GPU; the leader's driver counts them
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t b = 0; b < shards_.size(); ++b) shards_[b].on_device = device_blocks[b];
    return OkStatus();
  }
  const Status moved = RunOnThread([&]() -> Status {
    for (size_t b = 0; b < shards_.size(); ++b) RETURN_IF_ERROR(driver_->SetOnDevice(b, device_blocks[b]));
    return OkStatus();
  });
  RETURN_IF_ERROR(moved);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t b = 0; b < shards_.size(); ++b) shards_[b].on_device = device_blocks[b];
  return OkStatus();
}

Status HostOptimizer::WaitUpdated(int block, uint64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return updated_step_[block] >= step || !error_.ok(); });
  return error_;
}

Status HostOptimizer::ResumeAt(uint64_t step, uint64_t adam_step) {
  if (follower_) {  // once the leader restored the checkpoint into the arena
    RETURN_IF_ERROR(options_.group->WaitInitialized(2));
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(updated_step_.begin(), updated_step_.end(), step);
    resumed_step_ = step;
    return OkStatus();
  }
  if (adam_step > step) {
    return InvalidArgumentError("AdamW step " + std::to_string(adam_step) +
                                " is beyond optimizer step " + std::to_string(step));
  }
  // Accumulate commands are sequenced by micro-batch over all steps, skipped ones included.
  const uint64_t seq = step * std::max<uint32_t>(1, options_.accumulation_steps);
  for (const auto& s : shards_) {
    if (s.accum_counters_offset == 0) continue;
    uint64_t* acc = arena_->At<uint64_t>(s.accum_counters_offset);
    std::fill(acc, acc + workers::NumChunks(s.num_elements), seq);
  }
  RETURN_IF_ERROR(RunOnThread([&]() -> Status {
    driver_->set_skipped_steps(step - adam_step);
    return OkStatus();
  }));
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(updated_step_.begin(), updated_step_.end(), step);
  finished_step_ = step;
  decided_step_ = step;
  if (options_.group) {  // the restored weights are in the arena: the other ranks upload them
    for (int b = 0; b < num_blocks(); ++b) options_.group->PublishUpdated(b, step);
    options_.group->PublishInitialized(2);
  }
  return OkStatus();
}

Status HostOptimizer::FinishStepAsync() {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(error_);
  if (follower_) return OkStatus();
  Item it;
  it.kind = Item::kFinish;
  queue_.push_back(std::move(it));
  cv_.notify_all();
  return OkStatus();
}

StatusOr<workers::StepResult> HostOptimizer::WaitDecided(uint64_t step) {
  if (follower_) return step <= resumed_step_ ? workers::StepResult{} : options_.group->WaitDecision(step);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return decided_step_ >= step || !error_.ok(); });
  if (decided_step_ < step) return error_;
  return decision_;
}

StatusOr<workers::StepResult> HostOptimizer::WaitFinished(uint64_t step) {
  if (follower_) return step <= resumed_step_ ? workers::StepResult{} : options_.group->WaitFinished(step);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_step_ >= step || !error_.ok(); });
  if (finished_step_ < step) return error_;
  return result_;
}

UpdateTotals HostOptimizer::TakeTotals() {
  if (follower_) return UpdateTotals{};  // rank 0 reports the updates
  const auto m = pool_->Metrics();
  double busy = 0;
  for (const auto& w : m.workers) busy += w.busy_seconds_total;
  busy /= std::max<size_t>(1, m.workers.size());
  std::lock_guard<std::mutex> lock(mu_);
  UpdateTotals t = totals_;
  if (tier_) {
    const NvmeStateTier::Totals n = tier_->TakeTotals();
    t.nvme_busy_seconds += n.busy_seconds;
    t.nvme_read_bytes += n.read_bytes;
    t.nvme_write_bytes += n.write_bytes;
  }
  t.worker_busy_seconds = busy - busy_base_;
  busy_base_ = busy;
  totals_ = UpdateTotals{};
  return t;
}

// ---- initial values and checkpoints ----

namespace internal {
void To16(HostDtype dt, const float* src, uint16_t* dst, uint64_t n) {
  if (dt == HostDtype::kBf16) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = workers::internal::FloatToBf16(src[i]);
  } else if (dt == HostDtype::kFp16) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = workers::internal::FloatToFp16(src[i]);
  }
}
}  // namespace internal

Status HostOptimizer::Initialize(const std::function<Status(int, float*)>& fill) {
  if (follower_) return options_.group->WaitInitialized(1);  // rank 0 fills the shared arena
  RETURN_IF_ERROR(InitializeBlocks(fill));
  if (options_.group) options_.group->PublishInitialized(1);
  return OkStatus();
}

Status HostOptimizer::InitializeBlocks(const std::function<Status(int, float*)>& fill) {
  for (size_t b = 0; b < shards_.size(); ++b) {
    const auto& s = shards_[b];
    if (!OnNvme(b)) {
      if (population_) RETURN_IF_ERROR(population_->WaitGate(b));
      if (options_.mode.master == workers::MasterDtype::kBf16) {  // filled in fp32, then rounded
        std::vector<float> master(s.num_elements);
        RETURN_IF_ERROR(fill(static_cast<int>(b), master.data()));
        EncodeMaster(b, 0, master.data(), s.num_elements);
        continue;
      }
      float* master = arena_->At<float>(s.master_offset);
      RETURN_IF_ERROR(fill(static_cast<int>(b), master));
      if (s.weights_offset != 0)
        internal::To16(options_.compute, master, arena_->At<uint16_t>(s.weights_offset),
                       s.num_elements);
      continue;
    }
    const Status staged = RunOnThread([&, b]() -> Status {
      return tier_->InitializeBlock(
          b, [&](float* master) { return fill(static_cast<int>(b), master); });
    });
    RETURN_IF_ERROR(staged);
  }
  return OkStatus();
}

RuntimeStats::Store StoreRuntimeStats(const storage::StoreProcess& store, const char* role) {
  const storage::StoreClientStats c = store.Stats();
  RuntimeStats::Store s;
  s.role = role;
  s.pid = store.pid();
  if (auto p = ReadProcStat(store.pid())) s.cpu_seconds = p->cpu_seconds;
  s.submitted = c.submitted;
  s.completed = c.completed;
  s.errors = c.errors;
  s.in_flight = c.in_flight;
  s.latency_bounds_seconds = c.latency_bounds_seconds;
  s.latency_counts = c.latency_counts;
  s.latency_sum_seconds = c.latency_sum_seconds;
  return s;
}

void HostOptimizer::AddRuntime(RuntimeStats* out) const {
  if (follower_) return;  // rank 0 reports the job's workers and arena
  const workers::WorkerPoolMetrics m = pool_->Metrics();
  for (size_t i = 0; i < m.workers.size(); ++i) {
    const auto& w = m.workers[i];
    RuntimeStats::Worker x;
    x.index = static_cast<int>(i);
    x.pid = w.pid;
    if (auto p = w.pid > 0 ? ReadProcStat(w.pid) : std::nullopt) x.cpu_seconds = p->cpu_seconds;
    x.busy_seconds = w.busy_seconds_total;
    x.params_updated = w.params_updated_total;
    x.queue_depth = w.queue_depth;
    x.restarts = w.restarts;
    out->workers.push_back(x);
  }
  if (tier_) out->stores.push_back(StoreRuntimeStats(tier_->store(), "optimizer"));
  out->arena_bytes += ArenaBytes(options_);
}

}  // namespace offloadd::trainer
