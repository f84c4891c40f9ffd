#pragma once
// StepSchedule: the order of one optimizer step's work on the device. For each micro-batch, a
// forward pass block by block (embedding, decoder layers, head), then a backward pass in reverse
// in which each block's gradients are handed to the host optimizer as soon as its backward is
// done (device-to-host into the block's staging buffer; the optimizer thread waits for the copy),
// so CPU updates overlap the rest of backward. The first forward of step k waits for each block's
// update of step k-1. Streamed weights are prefetched WeightResidency::kWindow blocks ahead of use
// and released behind it; offloaded activations are brought back one block ahead of backward.
// Owns the gradient staging views of the host arena and the blocks' saved states; the weights,
// activations and accounting it drives are owned by the trainer.
//
// Single-threaded: for the step loop's thread.

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/model.h"
#include "job/grad_scaler.h"
#include "trainer/pipeline/activation_offload.h"
#include "trainer/pipeline/block_layout.h"
#include "trainer/pipeline/data_parallel.h"
#include "trainer/pipeline/device_optimizer.h"
#include "trainer/pipeline/device_streams.h"
#include "trainer/pipeline/host_optimizer.h"
#include "trainer/pipeline/step_accounting.h"
#include "trainer/pipeline/weight_residency.h"

namespace offloadd::trainer {

class StepSchedule {
 public:
  struct Options {
    engine::Model* model = nullptr;
    const std::vector<BlockLayout>* layout = nullptr;
    std::vector<engine::SaveMode> modes;  // per block: what its forward keeps for backward
    // Per block (may be empty): a recomputed block's checkpoint (its input) waits for the
    // backward in pinned host memory through `activations`, not on the device.
    std::vector<bool> offload_checkpoint;
    WeightResidency* weights = nullptr;
    ActivationOffload* activations = nullptr;
    HostOptimizer* host = nullptr;  // its arena holds the gradient staging buffers
    // The blocks whose optimizer states live on the device (may be null): their gradients stay
    // there; only their norm goes to the host optimizer's decision.
    DeviceOptimizer* device_optimizer = nullptr;
    DeviceStreams* streams = nullptr;
    StepAccounting* accounting = nullptr;
    GradScaler* scaler = nullptr;  // fp16 compute
    c10::Device device = c10::Device(c10::kCPU);
    c10::ScalarType dtype = c10::kFloat;
    uint32_t accumulation_steps = 1;  // micro-batches per step
    // LSP mode (may be empty): what goes into a compressed weight's slot instead of its gradient.
    std::function<at::Tensor(const ParamSlot&, const at::Tensor&)> compress;
    // Data parallel (may be null): each block's gradients are reduce-scattered over the group and
    // this rank's shard lands in its part of the shared staging buffer (HandOffShard).
    DataParallel* dp = nullptr;
    // ZeRO-1 across hosts (with dp): the ranks of one host (this many, numbered host by host;
    // 0: the whole group is one host) share a host optimizer that holds their shards of each
    // block only, contiguous, so a rank's shard lands at its offset within its host's slice.
    int ranks_per_host = 0;
  };
  // Pins the gradient staging buffers.
  static StatusOr<std::unique_ptr<StepSchedule>> Create(const Options& options);

  // Optimizer step `step` begins (1-based).
  void BeginStep(int64_t step);
  // Forward of micro-batch `micro` through every block; returns its loss (fp32 scalar, detached).
  // fp16: sets mb's loss scale, reporting the previous step first when micro is 0.
  StatusOr<at::Tensor> Forward(engine::MicroBatch& mb, uint32_t micro);
  // Evaluation: a forward of `mb` through every block with the current weights, keeping nothing
  // for a backward; returns its loss (fp32 scalar, detached).
  StatusOr<at::Tensor> EvalLoss(engine::MicroBatch& mb);
  // LSP mode's probe: a forward and backward of `mb` that hands nothing to the optimizer. As each
  // block's backward ends (last block first), `sink` gets that block's d loss / d W (fp32) of the
  // compressed weights, by name. On CUDA the blocks recompute their activations, so one block's
  // are held at a time; the CPU keeps them all.
  using ProbeSink = std::function<Status(std::map<std::string, at::Tensor> block_grads)>;
  Status ProbeGradients(engine::MicroBatch& mb, const ProbeSink& sink);
  // Backward of micro-batch `micro` (after its Forward), handing each block's gradients over.
  Status Backward(const engine::MicroBatch& mb, uint32_t micro);
  // Between steps: the blocks `device` owns keep their gradients on the device from now on.
  void SetDeviceOptimizer(DeviceOptimizer* device) { device_opt_ = device; }
  // What block b's forward keeps for backward from the next step on (the step planner).
  void SetMode(int b, engine::SaveMode mode) { options_.modes[b] = mode; }

 private:
  explicit StepSchedule(const Options& options);
  // Block b's gradient buffer, once its staging buffer is free: the staging buffer itself on a
  // CPU device, else a device buffer copied into it by HandOff.
  StatusOr<at::Tensor> GradientBuffer(int b);
  // Block b's backward; its parameter gradients go into `grads`. The tied embedding's gradient
  // (delivered at the head) is held in *tied_grad until block 0's own are in.
  StatusOr<at::Tensor> BackwardBlock(const engine::MicroBatch& mb, int b,
                                     const at::Tensor& grad_out, const at::Tensor& grads,
                                     at::Tensor* tied_grad);
  Status HandOff(int b, uint32_t micro, const at::Tensor& grads);
  // Data parallel: the group's sum of block b's gradients, reduce-scattered; this rank's shard
  // goes into [rank x shard, ...) of the staging buffer, with its ||g||^2 for rank 0's decision.
  Status HandOffShard(int b, uint32_t micro);
  // A device-optimized block's gradients are complete: its norm goes to the host optimizer, and
  // (not held) its update runs now, on the compute stream.
  Status LandOnDevice(int b, uint32_t micro);
  // CUDA: hands block b's micro-batch over once the copy behind `e` has landed, keeping `keep`
  // (the copies' device sources) alive until then.
  Status GradsReadyAfter(int b, uint32_t micro, DeviceStreams::EventPtr e,
                         std::vector<at::Tensor> keep, std::function<double()> sq_norm);
  // Reads block b's ||g||^2 from its pinned norm slot (once its copy has landed).
  std::function<double()> LandedSquaredNorm(int b) const;
  bool OnDevice(int b) const { return device_opt_ != nullptr && device_opt_->owns(b); }

  Options options_;
  const std::vector<BlockLayout>& layout_;
  const int n_;
  const bool cuda_;
  std::map<std::string, std::pair<int, uint64_t>> owner_;  // param name -> (block, offset)
  std::vector<at::Tensor> host_grads_;     // per block, flat view of its staging buffer
  std::vector<at::Tensor> padded_;         // data parallel: per block, its gradients padded to shards
  at::Tensor host_norms_;  // CUDA: per block, its gradients' L2 norm (pinned, fp32)
  std::vector<engine::SavedState> saved_;  // per block, from its forward for its backward
  std::vector<uint64_t> checkpoint_ticket_;  // per block: its offloaded checkpoint (0: none)
  int64_t step_ = 0;
  DeviceOptimizer* device_opt_ = nullptr;  // Options::device_optimizer, or set later
};

}  // namespace offloadd::trainer
