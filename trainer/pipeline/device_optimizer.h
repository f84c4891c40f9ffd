#pragma once
// DeviceOptimizer: the blocks whose optimizer states live on the device (ZeRO-Offload++'s
// "Twin-Flow": part of the update on the GPU while the CPU workers update the rest). For each
// such block it holds the fp32 master weights, exp_avg and exp_avg_sq, the compute-dtype weights
// the block computes with (the master itself in fp32), and the gradient buffer its backward
// writes into (plus an fp32 accumulator with gradient accumulation). The update is ATen's fused
// AdamW (the kernel torch.optim.AdamW(fused=True) runs) on the gradients multiplied by the step's
// grad_scale, the same product the CPU workers apply (clip coefficient x 1 / loss scale), so a
// block computes the same update wherever its states are: the host optimizer's StepDriver decides
// clipping and fp16 overflow skips over every block's norm, device blocks included.
//
// In a compact optimizer mode (workers/adamw_compact.h) a block holds its master and states as
// the CPU workers do, one byte region each (workers::MasterRegionBytes / StateRegionBytes: bf16
// or int8 states with their block scales, a bf16 master with its compensation, which is then the
// block's bf16 weights), and is stepped by the same arithmetic: on the GPU by the CUDA kernel
// (cuda/compact_adamw.h, the workers' bits), on a CPU device by workers::CompactAdamW itself. The
// stochastic-rounding seed is the block's index and the counter the element's index in the block,
// as the workers count them when a block is one shard.
//
// On a CPU device the same code runs with its tensors in process memory (the CI path).
// Everything runs on the calling thread's current stream (the step loop's compute stream), so an
// update is ordered before the next forward's use of the block without any event.
//
// Not thread-safe: for the step loop's thread.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "job/train_config.h"
#include "trainer/pipeline/block_layout.h"
#include "workers/adamw_compact.h"

namespace offloadd::trainer {

class DeviceOptimizer {
 public:
  struct Options {
    const std::vector<BlockLayout>* layout = nullptr;
    std::vector<bool> blocks;  // per block: its states live on the device
    c10::Device device = c10::Device(c10::kCPU);
    c10::ScalarType dtype = c10::kFloat;  // compute dtype (weights, gradients)
    OptimConfig optim;
    uint32_t accumulation_steps = 1;
    // Updates wait for the step's decision (clipping, fp16 overflow): else each block is
    // updated as soon as its gradients are complete.
    bool held = false;
    workers::OptimizerMode mode = {};  // the master's and states' formats
  };
  // Device memory one block of `numel` parameters needs here (master and states in `mode`,
  // weights, gradients): 12 bytes per parameter of master and states exact, 6.03 with int8 states.
  static int64_t BlockBytes(uint64_t numel, c10::ScalarType dtype, uint32_t accumulation_steps,
                            workers::OptimizerMode mode = {});
  // Transient device memory of an update (the fp32 gradients of one chunk).
  static int64_t UpdateWorkspaceBytes();

  // Allocates every owned block's tensors (moments zero; masters set by Initialize).
  static StatusOr<std::unique_ptr<DeviceOptimizer>> Create(const Options& options);

  bool owns(int b) const {
    return b >= 0 && b < static_cast<int>(options_.blocks.size()) && options_.blocks[b];
  }
  int count() const { return count_; }
  uint64_t params() const { return params_; }
  bool held() const { return options_.held; }

  // The weights block b computes with (bind them to its Params).
  const at::Tensor& weights(int b) const { return state_[b].weights; }
  // Block b's gradient buffer for its backward (compute dtype, on the device).
  const at::Tensor& GradientBuffer(int b) const { return state_[b].grads; }
  // Block b's backward of micro-batch `micro` wrote GradientBuffer(b). With accumulation it is
  // added (fp32) to the block's accumulator. At the last micro-batch returns the L2 norm of the
  // step's gradients (an fp32 tensor of one element, on the device); before it, an undefined one.
  at::Tensor Land(int b, uint32_t micro);

  // Step settings: lr, the AdamW step an update of this step applies, and (not held) the grad
  // scale it is applied with.
  void BeginStep(double lr, uint64_t adam_step, float grad_scale);
  // Updates block b with the step's gradients times `grad_scale`, AdamW step `adam_step`.
  Status Update(int b, float grad_scale, uint64_t adam_step);
  // Not held: updates block b with BeginStep's settings.
  Status UpdateNow(int b) { return Update(b, grad_scale_, adam_step_); }

  // Checkpoints and export: block b's fp32 states to / from host buffers of numel floats. In a
  // compact mode exp_avg and exp_avg_sq must be null (the regions below carry the states); a bf16
  // master is read as master + compensation (exact) and restored by rounding (EncodeBf16Master).
  Status ReadStates(int b, float* master, float* exp_avg, float* exp_avg_sq) const;
  Status RestoreStates(int b, const float* master, const float* exp_avg, const float* exp_avg_sq);
  // Compact modes: block b's regions byte for byte, as HostOptimizer's ReadMasterRegion /
  // ReadStateRegions give them (master_region only with a bf16 master; null skips it).
  Status ReadRegions(int b, uint8_t* master_region, uint8_t* exp_avg, uint8_t* exp_avg_sq) const;
  Status RestoreRegions(int b, const uint8_t* master_region, const uint8_t* exp_avg,
                        const uint8_t* exp_avg_sq);
  const workers::OptimizerMode& mode() const { return options_.mode; }

 private:
  struct BlockState {
    at::Tensor master, exp_avg, exp_avg_sq, weights, grads, accum, step;
    // Compact modes: the workers' regions (uint8), in place of master / exp_avg / exp_avg_sq.
    at::Tensor master_region, m_region, v_region;
  };
  // device_optimizer_compact.cc: the compact modes.
  static void CreateRegions(const Options& options, uint64_t numel, BlockState* s);
  Status UpdateCompact(int b, float grad_scale, uint64_t adam_step);
  Status ReadCompactMaster(int b, float* master, const float* exp_avg,
                           const float* exp_avg_sq) const;
  Status RestoreCompactMaster(int b, const float* master, const float* exp_avg,
                              const float* exp_avg_sq);
  explicit DeviceOptimizer(const Options& options) : options_(options) {}
  // The step's gradients of block b (the accumulator, or the gradient buffer).
  const at::Tensor& StepGradients(int b) const {
    return options_.accumulation_steps > 1 ? state_[b].accum : state_[b].grads;
  }

  Options options_;
  std::vector<BlockState> state_;
  int count_ = 0;
  uint64_t params_ = 0;
  double lr_ = 0;
  uint64_t adam_step_ = 1;
  float grad_scale_ = 1.0f;
};

}  // namespace offloadd::trainer
