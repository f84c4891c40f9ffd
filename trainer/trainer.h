#pragma once
// Trainer: the offloaded training pipeline for one job.
//
// Per optimizer step k, for each micro-batch: a forward pass block by block (embedding, decoder
// layers, head) and a backward pass in reverse. The device computes in bf16 or fp16 (fp32 on CPU);
// fp32 master weights and Adam states stay on the host (HostOptimizer: shared arena + worker
// processes, or the NVMe store). As soon as a block's backward has produced its gradients they go
// device-to-host into that block's staging buffer and the workers update the block while the device
// goes on with earlier blocks (active gradient offloading); with exact clipping the updates wait
// for the global norm and then run in ascending block order. fp16 compute adds dynamic loss scaling
// (torch.amp.GradScaler's rule, job/grad_scaler.h): the head scales its fp32 loss gradient by S
// before the cast to fp16, the fp16 gradients are staged as they are, the workers fold 1/S into the
// clip coefficient, and a step whose gradients hold an inf or NaN is skipped as a whole (updates
// always wait for the norm then); the learning-rate schedule counts applied updates only, as HF
// Trainer does. Updated weights flow back host-to-device right behind each block's update, and the
// forward of step k+1 waits for each block's update of step k: no stale weights. On CUDA, compute,
// host-to-device and device-to-host copies run on three streams ordered by events. Weights stay
// resident on the device when the GPU memory budget allows, else they are streamed in a few blocks
// ahead of use and dropped after; each decoder layer's activations are kept, recomputed or
// offloaded to pinned host memory by a static per-job plan (TrainConfig::offload.activations /
// layer_overrides, or AUTO: keep while it fits, recompute the rest).
//
// Steps are pipelined: the forward of step k+1 overlaps the tail of step k's CPU updates, so
// step k's statistics (gradient norm, timings) are reported once step k+1's forward is done, or
// by Flush().
//
// Thread-compatible: drive it from one thread.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "job/moe_pricing.h"
#include "job/step_stats.h"
#include "job/train_config.h"

namespace offloadd::trainer {

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  enum class Level { kDebug, kInfo, kWarning, kError };
  virtual void OnStep(const StepStats& /*stats*/) {}
  virtual void OnEval(const EvalStats& /*stats*/) {}
  virtual void OnProjectorCheck(const ProjectorCheckStats& /*stats*/) {}
  // After each step: the job's worker and store processes (job/step_stats.h RuntimeStats).
  virtual void OnRuntime(const RuntimeStats& /*stats*/) {}
  virtual void OnLog(Level /*level*/, const std::string& /*message*/) {}
  virtual void OnCheckpoint(const std::string& /*path*/, int64_t /*step*/, uint64_t /*bytes*/,
                            double /*loss*/) {}
  // Polled between steps; true ends Train() with CANCELLED after a checkpoint when
  // checkpoint_on_stop is set.
  virtual bool StopRequested() { return false; }
};

// What the job's step is priced at before it runs (TrainConfig::validate_only): the step planner's
// cost model on the node profile's rates and the GPU work of the job's shape.
// The configured step priced at another row length (--validate-only): whether its GPU working set
// fits gpu_memory_limit, the planner's predicted GPU peak (CUDA only; 0 on a CPU device) and step.
struct LengthPrediction {
  int64_t seq = 0;
  bool fits = false;
  int64_t gpu_bytes = 0;
  double step_seconds = 0, tokens_per_second = 0;  // 0 when it does not fit
  std::string text;                                // "8192 tokens: 1.2 s/step, ..."
};

struct StepPrediction {
  double step_seconds = 0;
  double tokens_per_second = 0;  // real (non-padding) tokens
  int64_t micro = 0, accumulation = 0;
  int64_t seq = 0;               // tokens per row priced (the expected padded length for records)
  std::string bound;             // the resource that sets the step time
  std::string basis;             // where the figures come from
  std::string text;              // one line with all of it
  int64_t gpu_bytes = 0;         // the planner's predicted GPU peak (CUDA only; 0 on a CPU device)
  // A mixture of experts' figures at this step (job/moe_pricing.h; num_experts 0 when dense)
  // and their line, with the predicted step time and GPU peak.
  MoeStepFigures moe;
  std::string moe_text;
  // Host RAM and disk (job/host_memory.h), the limit they were checked against, and the same
  // per tier of the optimizer states: all in RAM, all on NVMe (with the disk's step-time floor
  // from the node profile's store rates; 0: not measured).
  uint64_t host_bytes = 0, disk_bytes = 0, host_limit = 0;
  uint64_t ram_tier_host_bytes = 0, nvme_tier_host_bytes = 0, nvme_tier_disk_bytes = 0;
  double nvme_tier_disk_seconds = 0;
  std::string host_text;
  // Powers of two from 1024 (less for a model of fewer than 4096 positions) up to the model's
  // max_position_embeddings, and max_seq_length.
  std::vector<LengthPrediction> lengths;
};

struct TrainResult {
  int64_t steps = 0;  // optimizer steps completed (including those before a resume)
  double final_loss = 0;
  std::string exported_to;      // output_dir/final when exported
  std::string last_checkpoint;  // newest checkpoint directory, or ""
};

class Trainer {
 public:
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                   TrainObserver* observer);
  ~Trainer();

  // Runs until total_steps() (or a stop request), writing checkpoints every save_steps and the
  // final model. Resumes from config.resume_from when set. CANCELLED when stopped early (after
  // writing a checkpoint if checkpoint_on_stop).
  StatusOr<TrainResult> Train(bool checkpoint_on_stop = true);

  // Lower-level API (tests, benches): one optimizer step; the previous step's stats are reported.
  Status RunStep();
  // Waits for the last step's updates and reports its stats.
  Status Flush();
  int64_t completed_steps() const;
  int64_t total_steps() const;
  // The micro-batch and accumulation trained with (per_device_train_batch_size auto: the chosen).
  int32_t batch_size() const;
  int32_t gradient_accumulation_steps() const;
  // Writes output_dir/checkpoint-<step> (flushes first).
  StatusOr<std::string> SaveCheckpoint();
  Status RestoreCheckpoint(const std::string& dir);
  // Writes the current fp32 master weights as a Hugging Face checkpoint (flushes first).
  Status ExportModel(const std::string& dir);
  // Human-readable plan: device, residency, activation modes, arena size.
  std::string DescribePlan() const;
  // TrainConfig::validate_only: the priced step (the trainer stopped after its plan; no step runs).
  const StepPrediction& prediction() const;

 private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd::trainer
