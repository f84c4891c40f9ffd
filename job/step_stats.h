#pragma once
// What one optimizer step of the offloaded pipeline measured: the figures behind JobProgress, the
// offloadd_train_* metrics and the bench harness. Torch-free value type.

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace offloadd::trainer {

// The phases of a run's set-up before its first step, in order: the CUDA
// context and streams, the model's config and checkpoint index, the dataset, the device plan
// (batch size, group, memory), creating and populating the host arena, starting the worker (and
// store) processes, reading the initial weights into the arena, and the device side
// (page-locking, device optimizer, first uploads).
inline constexpr std::array<const char*, 8> kSetupPhases = {
    "cuda", "model", "data", "plan", "arena", "workers", "weights", "device"};

struct StepStats {
  int64_t step = 0;            // 1-based optimizer step just finished
  int64_t max_steps = 0;
  double epoch = 0;            // fractional epochs seen
  int64_t tokens = 0;          // input tokens of this step (all micro-batches)
  int64_t trained_tokens = 0;  // tokens with a target (loss normaliser)
  double loss = 0;             // mean token loss of the step
  // Mixture of experts with output_router_logits: router_aux_loss_coef x the load-balancing loss,
  // summed over the step's micro-batches (part of `loss`, as transformers adds it); else 0.
  double aux_loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;        // before clipping (unscaled; inf or NaN on a skipped step)
  double loss_scale = 1;       // fp16: the scale this step's backward ran with (else 1)
  bool skipped = false;        // fp16: gradients overflowed, no update was applied
  bool clipped = false;        // max_grad_norm scaled the gradients down (clip coefficient < 1)
  int32_t speculated_layers = 0;  // blocks updated during backward, before the norm was known
  int32_t corrected_layers = 0;   // of those, corrected to the clip coefficient afterwards
  // Parameters the CPU passed through AdamW or a correction this step (the update's work).
  uint64_t cpu_update_params = 0;
  // Parameters updated on the GPU this step (blocks with device-resident AdamW states).
  uint64_t device_update_params = 0;
  double step_seconds = 0;     // wall time of the step
  double model_flops = 0;      // 6 * params * tokens (+ attention), without recompute
  // Busy time per resource inside the step (seconds) ...
  double gpu_compute_seconds = 0;
  double gpu_forward_seconds = 0;  // the forward passes' share of it (no recompute)
  double h2d_seconds = 0;
  double d2h_seconds = 0;
  double cpu_update_seconds = 0;  // summed over workers / number of workers
  double nvme_seconds = 0;
  // LSP mode: GPU time of the compressions (P^T G Q, inside gpu_compute_seconds: the backward's
  // spans) and of the materialisations (W_base + P A Q^T, before each block's compute span: not
  // in gpu_compute_seconds).
  double lsp_compress_seconds = 0;
  double lsp_decompress_seconds = 0;
  // ... and time the compute stream (or the step loop) waited for each of them.
  double stall_weights_seconds = 0;  // forward/backward waited for weights (update or H2D)
  double stall_grads_seconds = 0;    // backward waited for a free gradient staging buffer
  double stall_optimizer_seconds = 0;  // end of step waited for CPU updates / NVMe
  double stall_activations_seconds = 0;  // waited for activations to/from NVMe (or buffer room)
  // Bytes moved per link in this step.
  uint64_t h2d_bytes = 0;
  uint64_t d2h_bytes = 0;
  uint64_t nvme_read_bytes = 0;
  uint64_t nvme_write_bytes = 0;
  uint64_t nvme_activation_bytes = 0;  // of the NVMe bytes: activations written + read
  int64_t gpu_peak_bytes = 0;  // CUDA caching allocator peak (reserved) since the job started
  // The first step of a run only (0 / empty on the others): seconds from the trainer's creation
  // to this step's start, and the set-up's share of it by phase (kSetupPhases order; the rest is
  // what ran between set-up and the step, e.g. restoring a checkpoint).
  double time_to_first_step_seconds = 0;
  std::vector<double> setup_phase_seconds;
  // When each phase first began, seconds from the trainer's creation (-1: it did not run).
  // Phases overlap: the arena is populated while the workers start, the weights are read and the
  // device is set up (TrainConfig::setup_overlap), so their seconds do not add up.
  std::vector<double> setup_phase_start_seconds;
};

// A held-out evaluation (TrainConfig::eval_data): the mean token loss over every record.
struct EvalStats {
  int64_t step = 0;    // optimizer steps done when it ran (0: before training)
  double loss = 0;     // mean loss per trained token
  int64_t tokens = 0;  // trained tokens evaluated
  double seconds = 0;
};

// LSP mode's projector check before `step` (trainer/pipeline/lsp_mode.h).
struct ProjectorCheckStats {
  int64_t step = 0;
  int checked = 0, switched = 0;  // matrices
  double mean_bias = 0;           // relative bias of the projectors in use, over the checked ones
  double mean_bias_after = 0;     // of the learned ones, over the switched ones
  double seconds = 0;
};

// The job's helper processes after a step (the daemon exports these per job):
// each optimizer worker's CPU time and work, and each NVMe store as its client sees it.
struct RuntimeStats {
  struct Worker {
    int index = 0;
    pid_t pid = -1;
    double cpu_seconds = 0;   // user + system time of the process (/proc/<pid>/stat); restarts from 0
    double busy_seconds = 0;  // executing commands, since the pool started
    uint64_t params_updated = 0;
    uint32_t queue_depth = 0;
    uint32_t restarts = 0;
  };
  std::vector<Worker> workers;
  struct Store {
    std::string role;  // "optimizer" (the NVMe tier) or "activations"
    pid_t pid = -1;
    double cpu_seconds = 0;
    uint64_t submitted = 0, completed = 0, errors = 0;
    uint32_t in_flight = 0;
    std::vector<double> latency_bounds_seconds;
    std::vector<uint64_t> latency_counts;  // per bucket, the last is +Inf
    double latency_sum_seconds = 0;
  };
  std::vector<Store> stores;
  uint64_t arena_bytes = 0;        // the shared arena: master weights, Adam states, staging
  uint64_t pinned_host_bytes = 0;  // host memory page-locked for the GPU's copies (CUDA; 0 on a CPU device)
};

}  // namespace offloadd::trainer
