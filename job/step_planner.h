#pragma once
// StepPlanner: after the first step, places the AdamW states of the lowest blocks on the GPU and
// keeps (instead of recomputing) the activations of the top decoder layers, so that the predicted
// step time is smallest under the GPU budget (OFFMATE's placement question with
// LoHan's profile-fed cost model).
//
// Cost model: every resource works concurrently with the others (the pipeline overlaps them), so a
// step takes as long as its busiest resource:
//   T = max(GPU, CPU update, host memory, H2D, D2H)
//   GPU     = measured compute - recompute time of the kept layers + device AdamW of the placed
//             parameters
//   CPU     = CPU-updated parameters at the AdamW pool's rate alone (node profile), except while
//             the PCIe copies run (the longer direction's time): then at its rate during DMA
//             (node profile; the copies share the memory bus)
//   host    = (CPU-updated parameters * host_bytes_per_param + NVMe parameters * 2 x 12 B
//             + H2D bytes + D2H bytes) / host memory bandwidth (HostUpdateBytesPerParam: 26 B by
//             default; an NVMe block's states also land in and leave the staging slots)
//   H2D/D2H = measured bytes - what the placed blocks no longer move (their weights stay on the
//             GPU, their gradients are not copied out), over the profiled link rates
//   NVMe    = the NVMe blocks' 12 B per parameter (nvme_state_bytes: the optimizer mode's) read
//             and written at the store's measured rates
//             (NvmeStepSeconds; the placement is job/state_placement.h's), and the layer
//             inputs on NVMe written and read (job/checkpoint_placement.h)
// and, when the updates are held until the step's global gradient norm is known (clipping
// without speculation, fp16's overflow check), the dependency that exactness imposes: no update
// starts before the backward ends, and the next forward needs each block's update, so
//   held    = GPU backward (less the kept layers' recompute) + norm tail + device AdamW
//             + max(GPU forward, CPU update at max(pool rate, host memory roofline) + update tail)
// (the tails: the last gradients' copy before the norm exists; the last block's upload and
// forward after its update)
// subject to  first-step peak + margin + placed states + kept activations <= GPU budget.
// The decision is (s, k): the lowest s blocks' states on the GPU (a prefix: the next forward needs
// them first and their gradients land last) and the top k decoder layers kept. The planner
// enumerates every (s, k) pair, so its answer is the exact optimum of the integer program over
// per-block binaries when decoder layers are alike (tests/python/trainer/test_step_planner_ilp.py
// checks it against an ILP solver on the benchmark shapes). (n+1)(L+1) evaluations: microseconds
// for 80 layers.
//
// Torch-free; offloadd-plan (train/plan_main.cc) runs it on JSON for tests and tools.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::trainer {

struct PlanInputs {
  // Per block, embedding first.
  std::vector<int64_t> params;            // parameters the optimizer updates
  std::vector<int64_t> device_state_bytes;  // GPU bytes its AdamW states (+ resident weight) need
  std::vector<int64_t> keep_extra_bytes;    // kept minus recomputed activations (0: cannot keep)
  std::vector<double> recompute_seconds;    // GPU time its recompute costs (0: not recomputed)
  int64_t budget_bytes = 0;
  int64_t base_peak_bytes = 0;  // the first step's allocator peak (nothing placed, all recomputed)
  int64_t margin_bytes = int64_t{512} << 20;
  double gpu_seconds = 0;  // measured compute per step, as planned in the first step
  double h2d_bytes = 0;    // measured per step
  double d2h_bytes = 0;
  // Node profile.
  double host_bytes_per_s = 0;
  double cpu_params_per_s = 0;
  double cpu_params_per_s_during_dma = 0;  // 0: not measured (the rate alone throughout)
  double h2d_bytes_per_s = 0;
  double d2h_bytes_per_s = 0;
  // Model constants (ApplyParamTraffic derives them from the arena's layout).
  double host_bytes_per_param = 26;  // bf16 grad in, fp32 master/m/v read and written
  double h2d_saved_per_param = 8;    // a placed block's weights stay on the GPU (2 fp32 uploads)
  double d2h_saved_per_param = 2;    // and its bf16 gradients are not copied out
  // Parameters whose states are on NVMe, read and written every step at the store's rates, in
  // their mode's bytes (nvme_state_bytes: 12 exact; ApplyParamTraffic sets it to state_bytes).
  double nvme_params = 0;
  double nvme_state_bytes = 12;
  double nvme_read_bytes_per_s = 0;
  double nvme_write_bytes_per_s = 0;
  // Of them, those whose 16-bit weights are on NVMe too (offload_param: nvme): 2 B read for each
  // of nvme_weight_reads passes a step (2 per micro-batch streamed, 1 resident) and 2 B written
  // after the update.
  double nvme_weight_params = 0;
  double nvme_weight_reads = 2;
  // Layer inputs on NVMe (trainer/checkpoint_placement.h): bytes written, and read back, per step.
  double nvme_activation_bytes = 0;
  // >= 0: at most this many lowest blocks may have GPU states (a block whose weights are on NVMe
  // stays updated on the host).
  int max_device_blocks = -1;
  double device_seconds_per_param = 1e-11;  // ATen fused AdamW, ~30 B/param at ~3 TB/s
  // Choices the job leaves open (false: fixed at 0).
  bool place_states = true;
  bool keep_activations = true;
  // Updates wait for the global norm (see above); gpu_forward_seconds: the forward's share of
  // gpu_seconds (the shape profile's per-block forward times).
  bool held_updates = false;
  double gpu_forward_seconds = 0;
  // The held dependency's tails: the norm exists only once the backward's
  // last gradients (the embedding's) are copied out, and after the last block's CPU update (the
  // head's, earliest-needed-first) the next forward still uploads it and runs it:
  //   held = backward + norm_tail + device AdamW + max(forward, update + update_tail).
  double norm_tail_seconds = 0;
  double update_tail_seconds = 0;
  // >= 0: the number of blocks with GPU states is fixed at this (they are already there).
  int fixed_device_blocks = -1;
};

struct PlanChoice {
  int device_blocks = 0;  // lowest blocks with GPU-resident AdamW states
  int keep_layers = 0;    // top decoder layers whose activations are kept
  double gpu_s = 0, cpu_s = 0, host_s = 0, h2d_s = 0, d2h_s = 0;
  double nvme_s = 0;    // the store's reads and writes (0 when no states are on NVMe)
  double held_s = 0;    // the held updates' dependency (0 when updates are not held)
  double update_s = 0;  // its CPU update: max(CPU, the update's host memory traffic)
  double predicted_s = 0;  // the max of the above
  std::string bound;       // the resource that sets it
  int64_t gpu_bytes = 0;   // peak + margin + states + kept activations
  int64_t placed_params = 0;      // parameters of the device_blocks
  double recompute_saved_s = 0;   // recompute time the kept layers no longer spend
  bool feasible = false;
};

// What one CPU-updated parameter moves, from the arena's layout (workers/shard_layout.h) and the
// workers' commands (workers/step_driver.h).
struct ParamTraffic {
  int grad_bytes = 2;        // the staged gradient: 2 (bf16/fp16), 4 (fp32 compute)
  int upload_bytes = 4;      // what the device reads per upload: the fp32 masters it casts (4),
                             // or the 16-bit copy the workers write (2)
  bool weight_copy = false;  // the workers write that 16-bit copy
  int accumulation = 1;      // micro-batches per step: > 1 accumulates into an fp32 buffer
  bool cpu_norm = false;     // held updates whose norm the workers measure (not given by the GPU)
  bool streamed = true;      // weights upload twice per micro-batch; false: once per step
  // The master and both moments per parameter, read and written by each update: 12 exact, 8 with
  // bf16 states, 6.03 with int8 (workers::StateBytesPerParam of the optimizer mode).
  double state_bytes = 12;
};
// Host memory bytes per CPU-updated parameter and step: the update reads the gradient (the fp32
// accumulation buffer with accumulation) and reads and writes the master and both moments (24 B;
// 2 x state_bytes in a compact mode),
// writes the 16-bit copy when kept; a CPU norm reads the gradient once more; accumulation reads
// each micro-batch's staged gradient and writes (first) or reads and writes (later) the buffer.
// 2 + 24 = 26 B by default (bf16, no copy, no accumulation, the norm given by the GPU).
double HostUpdateBytesPerParam(const ParamTraffic& t);
// Sets host_bytes_per_param, h2d_saved_per_param (a placed block's uploads: 2 x accumulation
// streamed, 1 resident, of upload_bytes), d2h_saved_per_param (its gradients, per micro-batch) and
// nvme_state_bytes (state_bytes: what an NVMe block's states take in the store).
void ApplyParamTraffic(const ParamTraffic& t, PlanInputs* in);

// The blocks whose activations `keep` kept layers keep: the top keepable blocks
// (keep_extra_bytes > 0), top first.
std::vector<int> KeptBlocks(const PlanInputs& in, int keep);

// Checks sizes and rates (a clear error naming the field).
Status ValidatePlanInputs(const PlanInputs& in);
// Evaluates one (s, k).
PlanChoice EvaluatePlan(const PlanInputs& in, int device_blocks, int keep_layers);
// The fastest feasible (s, k); ties (within 0.5%) go to fewer kept layers, then more placed
// blocks. What already runs is always allowed: (0, 0), what the first step ran, or
// (fixed_device_blocks, 0).
StatusOr<PlanChoice> SolvePlan(const PlanInputs& in);
// "2 blocks' states on the GPU, 3 layers kept: predicted 1.81 s/step (host memory; GPU 1.59 s,
// CPU 1.45 s, host 1.81 s, H2D 0.63 s, D2H 0.23 s), 23.1 GiB of 24 GiB".
std::string DescribePlan(const PlanChoice& c, int64_t budget_bytes);
// 1.234 -> "1.23 s".
std::string FormatSeconds(double s);

}  // namespace offloadd::trainer
