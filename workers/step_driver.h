#pragma once
// StepDriver: turns "the gradients of shard s are in shared memory" events from the backward
// pass into worker commands for one optimizer step, with exact global-norm clipping.
//
//   StepDriver driver(&pool, shards, config);
//   RETURN_IF_ERROR(driver.BeginStep(step, lr));
//   for each micro-batch m, as backward finishes a shard:  driver.GradsReady(s, m);
//   ASSIGN_OR_RETURN(StepResult r, driver.FinishStep());   // waits for every update
//
// Modes (see workers/README.md, "Exact clipping"):
//  * max_grad_norm <= 0 (no clipping): AdamW for a shard is submitted the moment its last
//    micro-batch lands, so CPU updates overlap the rest of backward (LoHan's active gradient
//    offloading). The norm still comes back, from the update pass itself.
//  * max_grad_norm > 0 ("hold"): as each shard lands, only its squared norm is computed (a
//    read-only pass that overlaps backward); when the last shard is in, the clip coefficient is
//    computed exactly as torch.nn.utils.clip_grad_norm_ does (fp32: c = max / (norm + 1e-6),
//    clamped to 1) and every shard's AdamW is submitted with grad_scale = c, in ascending layer
//    order so that the next forward pass can start behind the first updated layers.
//  * speculation (with clipping, not with skip_nonfinite): instead of measuring a shard's norm
//    and holding it, its AdamW is submitted at once with grad scale 1 (kFlagSpeculative: a chunk
//    with inf/NaN gradients stays untouched), assuming the step will not clip. The driver sums the
//    squared norms as they come back; once the sum exceeds max_grad_norm^2 clipping is certain
//    and later shards go back to the norm-then-hold path. At FinishStep the clip coefficient c is
//    computed exactly as in hold mode. c == 1: the speculative updates are the step's updates,
//    bit for bit. c < 1: each speculated shard gets a kAdamWCorrect(c) (CorrectAdamW), the held
//    ones AdamW(c), in ascending layer order. on-updated callbacks fire only for final updates.
//    Policy: kAlways / kNever, or kAuto: speculate while fewer than half of the steps seen (the
//    last 16 at most) clipped (a clipped step costs a correction pass over the speculated shards).
//    Which shards kAuto speculates depends on timing (which norms came back before a shard was
//    dispatched), and a corrected update differs from a direct AdamW(c) by rounding, so kAuto is
//    reproducible within fp32 rounding only. kAlways speculates every shard whatever the norms
//    known (and, norms given, still lets FinishStep drain before deciding): its bits are the
//    same whatever the timing (e.g. resident against streamed weights, a loaded host).
//  * skip_nonfinite (fp16 dynamic loss scaling): hold mode even without clipping, since no shard
//    may be updated before the whole step is known to be finite. BeginStep's grad_unscale
//    (1 / loss scale) multiplies the norm and is folded into the coefficient the workers apply
//    (grad_scale = clip coefficient * grad_unscale), so unscaling costs no extra pass. A
//    non-finite global norm (any inf/NaN gradient: the squared sums propagate it) skips the step:
//    no shard is updated and the AdamW step count stays, as torch.amp.GradScaler.step does.
// Gradient accumulation: with accumulation_steps > 1 every micro-batch is added (fp32) into the
// shard's accumulation buffer (the first one overwrites), and the update reads that buffer.
// Update order: the next forward needs layer 0 first and layer N-1 last, while backward hands
// layers over from N-1 down to 0. Updates that may run (a landed shard without clipping or while
// speculating, every update once FinishStep knows the coefficient) wait in a ready set; each
// worker holds at most update_depth of them, and a freed place goes to the ready shard of the
// lowest layer: earliest deadline first, the next forward's deadlines being its layer order. The
// CPU never idles while an update may run (work-conserving), during backward this is
// last-come-first-served, and whatever backward leaves over runs in the order the next forward
// consumes it. Norm passes and accumulation are submitted at once (they are short and FIFO).
// OptimizerConfig::defer_below_layer > 0 selects LSP-Offload's static FCFS/LCFS transition.
//
// A shard always goes to the same worker, so its accumulate/norm/update commands run in order
// without waiting in between. The driver consumes the pool's completions while a step is open:
// use one driver per pool. Not thread-safe: call it from one thread.

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "workers/protocol.h"
#include "workers/worker_pool.h"

namespace offloadd::workers {

struct ShardSpec {
  uint32_t layer = 0;
  uint64_t num_elements = 0;
  uint64_t grad_offset = 0;  // staging buffer the GPU writes each micro-batch into
  GradDtype grad_dtype = GradDtype::kBf16;
  uint64_t master_offset = 0, exp_avg_offset = 0, exp_avg_sq_offset = 0;
  // The formats of the master and states (workers/adamw_compact.h; exact by default). A compact
  // mode is never speculated: its updates wait for the global norm when clipping.
  OptimizerMode mode = {};
  uint64_t weights_offset = 0;  // bf16 copy for the GPU
  WeightDtype weight_dtype = WeightDtype::kBf16;
  uint64_t counters_offset = 0;        // CountersBytes(num_elements), zeroed before step 1
  uint64_t accum_offset = 0;           // fp32 buffer, only with accumulation_steps > 1
  uint64_t accum_counters_offset = 0;  // CountersBytes(num_elements), zeroed
  int worker = -1;                     // -1: shard index modulo the pool size
  // Its optimizer states live on the GPU and the trainer updates it there (DeviceOptimizer):
  // the driver only counts its gradient norm (given with its last micro-batch) into the step's
  // clipping and overflow decision, and sends its workers nothing.
  bool on_device = false;
};

enum class Speculation : uint8_t { kNever = 0, kAlways = 1, kAuto = 2 };
std::string_view SpeculationName(Speculation s);  // "never", "always", "auto"
StatusOr<Speculation> ParseSpeculation(std::string_view name);

struct OptimizerConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double max_grad_norm = 0.0;  // <= 0: no clipping
  uint32_t accumulation_steps = 1;
  int timeout_ms = -1;  // per completion wait
  // Update order (see "Update order" above). 0: earliest-needed-first dispatch. > 0: LSP-Offload's
  // static schedule instead: shards of layers below this one are held until FinishStep and then
  // updated in ascending layer order, the others submitted on arrival (first-come-first-served
  // down to this transition layer, last-come-first-served below it).
  uint32_t defer_below_layer = 0;
  // Earliest-needed-first dispatch: AdamW commands queued per worker at a time. 2 keeps a worker
  // busy across the driver's reaction time while the order stays within one command of ideal.
  uint32_t update_depth = 2;
  // fp16 loss scaling: a non-finite gradient norm skips the step instead of failing it, and
  // updates always wait for the norm (see above).
  bool skip_nonfinite = false;
  // Updates before the global norm is known (see above); only with max_grad_norm > 0 and without
  // skip_nonfinite.
  Speculation speculation = Speculation::kNever;
};

struct StepResult {
  double grad_norm = 0;    // global L2 norm of the (accumulated, unscaled) gradients, unclipped
  float clip_coef = 1.0f;  // clip coefficient (the workers applied clip_coef * grad_unscale)
  uint64_t params_updated = 0;
  uint64_t params_corrected = 0;  // passed through a correction (CorrectAdamW) after the update
  bool skipped = false;     // non-finite gradients with skip_nonfinite: nothing was updated
  uint64_t adam_step = 0;   // AdamW updates applied through this step (step - skipped steps)
  bool clipped = false;     // clip_coef < 1
  uint32_t speculated_shards = 0;  // updated before the norm was known
  uint32_t corrected_shards = 0;   // of those, corrected to the clip coefficient
  // The coefficient on_device shards are updated with (clip_coef * grad_unscale, as the workers
  // apply it), known from the moment the driver decides (SetOnDecided).
  float grad_scale = 1.0f;
};

// torch.nn.utils.clip_grad_norm_'s coefficient, in its fp32 arithmetic.
float ClipCoefficient(double total_sq_norm, double max_grad_norm, float* total_norm);

class StepDriver {
 public:
  StepDriver(WorkerPool* pool, std::vector<ShardSpec> shards, OptimizerConfig config);

  // `step` counts optimizer steps, skipped ones included; the AdamW step (bias correction, the
  // workers' per-chunk counters) is step - skipped_steps(). grad_unscale: see skip_nonfinite.
  Status BeginStep(uint64_t step, double lr, float grad_unscale = 1.0f);
  // The gradients of micro-batch `micro` (0-based) for `shard` are in its staging buffer. The
  // caller must not overwrite that buffer until the shard's commands completed: call
  // WaitShardIdle() before reusing it. In hold mode without accumulation the update at
  // FinishStep reads the staging buffer again, so it must stay intact until FinishStep returns.
  // `sq_norm`: the shard's gradient sum of squares (scaled, like the staged gradients) measured
  // where they were made (the GPU, beside the copy); only without accumulation. The workers then
  // measure no norm for the clipping decision, and once every shard's norm is given FinishStep
  // decides without waiting for the speculative updates still running (not with kAlways): those
  // that stand are final as they complete, corrections follow their update.
  Status GradsReady(size_t shard, uint32_t micro, std::optional<double> sq_norm = std::nullopt);
  // Dispatches the shard's ready update first (see "Update order"); from a before-update hook
  // it waits only for the commands already submitted.
  Status WaitShardIdle(size_t shard);
  StatusOr<StepResult> FinishStep();

  // Called on the driver's thread whenever a shard's AdamW update has completed (its bf16 weights
  // may be uploaded now; LSP-Offload overlaps that upload with the rest of the step). Completions
  // are noticed while the driver waits (WaitShardIdle, FinishStep) or in Poll().
  void SetOnShardUpdated(std::function<void(size_t shard)> callback) {
    on_updated_ = std::move(callback);
  }
  // Called on the driver's thread as soon as FinishStep knows the step's outcome (its clip
  // coefficient, or that it is skipped), before the CPU updates that wait for it run: the
  // on_device shards' updates need nothing more. Not called for a step that fails.
  void SetOnDecided(std::function<void(const StepResult&)> callback) {
    on_decided_ = std::move(callback);
  }
  // The shards here are a part of the model (ZeRO-1 across hosts: this host's slice of every
  // block): FinishStep calls `combine` once per step, on the driver's thread, with the sum of its
  // shards' squared norms, and decides (clipping, a non-finite skip) and reports on what it
  // returns, the sum over every part. Every part's driver must call it in the same step order.
  void SetCombineSquaredNorm(std::function<StatusOr<double>(double local_sq)> combine) {
    combine_sq_ = std::move(combine);
  }
  // Handles the completions that have already arrived, without blocking.
  Status Poll();

  // Called on the driver's thread right before a shard's AdamW command is submitted; it may
  // block (e.g. until the shard's fp32 states are read from NVMe into a staging slot) and may
  // change the spec's master / exp_avg / exp_avg_sq offsets, which the command then uses. It may
  // call WaitShardIdle for other shards.
  void SetBeforeUpdate(std::function<Status(size_t shard, ShardSpec* spec)> hook) {
    before_update_ = std::move(hook);
  }
  const ShardSpec& shard(size_t s) const { return shards_[s]; }
  // Between steps: moves a shard's updates to or from the device (ShardSpec::on_device).
  Status SetOnDevice(size_t shard, bool on_device);
  // Steps skipped so far (resuming a run: global step - the AdamW step of its checkpoint).
  uint64_t skipped_steps() const { return skipped_steps_; }
  void set_skipped_steps(uint64_t n) { skipped_steps_ = n; }
  size_t num_shards() const { return shards_.size(); }

 private:
  // A place in a worker's update queue may go to a ready update (see "Update order").
  struct Ready {
    enum What : uint8_t { kLanded, kUpdate, kCorrect } what = kLanded;
    size_t shard = 0;
    float grad_scale = 1.0f;
    uint64_t seq = 0;  // FIFO among equal layers
  };
  void MakeReady(size_t shard, Ready::What what, float grad_scale = 1.0f);
  Status Pump();  // submits ready updates while their workers have room
  Status Dispatch(const Ready& r);
  Status SubmitNorm(size_t shard);  // the read-only ||g||^2 pass (hold mode)
  Status TakeCompletions();         // handles arrived completions, dispatches nothing
  bool IsReady(size_t shard) const;
  Status Submit(size_t shard, const ipc::CommandRecord& r);
  Status SubmitUpdate(size_t shard, float grad_scale, CommandKind kind = CommandKind::kAdamW,
                      uint32_t extra_flags = 0);
  bool hold() const { return config_.max_grad_norm > 0 || config_.skip_nonfinite; }
  Status WaitOne();
  void Handle(WorkerCompletion c);
  void AddNorm(size_t shard, double sq);  // a shard's ||g||^2 is known (measured or given)

  WorkerPool* pool_;
  std::vector<ShardSpec> shards_;
  OptimizerConfig config_;
  uint64_t step_ = 0;
  double lr_ = 0;
  float grad_unscale_ = 1.0f;
  uint64_t skipped_steps_ = 0;
  bool open_ = false;
  uint64_t next_id_ = 1;
  std::vector<uint32_t> outstanding_;  // per shard
  std::vector<uint32_t> micro_seen_;
  std::vector<double> sq_norm_;     // per shard, from the pass that measured it or as given
  std::vector<uint8_t> norm_given_;  // per shard: sq_norm_ came with GradsReady
  size_t norms_given_ = 0;
  std::vector<uint64_t> id_shard_;  // command id -> shard (ids are dense per step)
  uint64_t first_id_ = 1;
  std::vector<uint32_t> id_kind_;
  uint64_t params_updated_ = 0;
  uint64_t params_corrected_ = 0;
  Status error_;
  std::function<void(size_t)> on_updated_;
  std::function<void(const StepResult&)> on_decided_;
  std::function<StatusOr<double>(double)> combine_sq_;
  std::function<Status(size_t, ShardSpec*)> before_update_;
  std::vector<size_t> deferred_;  // shards held for FinishStep (defer_below_layer)
  std::vector<Ready> ready_;      // earliest-needed-first dispatch
  uint64_t ready_seq_ = 0;
  std::vector<uint32_t> updates_queued_;  // per worker: AdamW/correction commands outstanding
  bool pumping_ = false;
  // Speculation (see above).
  bool speculate_ = false;           // this step
  bool clip_certain_ = false;        // the known squared norms already exceed max_grad_norm^2
  bool decided_ = false;             // FinishStep computed the clip coefficient
  bool step_clipped_ = false;        // ... and it is < 1: speculated updates get corrected
  double known_sq_ = 0;              // sum of the squared norms measured so far this step
  std::vector<uint8_t> speculated_;  // per shard
  std::deque<bool> recent_clips_;    // the last 16 steps (kAuto)
};

}  // namespace offloadd::workers
