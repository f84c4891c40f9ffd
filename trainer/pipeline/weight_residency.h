#pragma once
// WeightResidency: where each block's compute-dtype weights are for the device to use. On a CPU
// device the blocks compute straight from the host arena (or, when the arena holds fp32 masters
// and the compute is 16-bit, from a copy cast after each update). On CUDA they are either resident
// (one device copy per block, refreshed host-to-device right behind each CPU update) or streamed (a
// block is uploaded ahead of use, Prefetch, and dropped after, Release; the tied embedding stays
// while the head needs it). Owns the host views of the arena's compute weights, the device
// copies and each block's upload event; the compute stream waits on that event before using the
// block (Ensure).
//
// A block whose 16-bit weights live in the NVMe store (HostOptimizer::weights_on_nvme, offload_
// param: nvme) has none in the arena: Prefetch issues its read into one of the two weight buffers
// (block parity picks it, so the next block's read, forward or backward, overlaps this one's
// compute), and Ensure takes it (HostOptimizer::FetchWeights) into a copy of its own: on a CPU
// device a host tensor, on CUDA the device copy uploaded from the buffer. The copy is read again
// after each update of the block (OnUpdated counts them) and after a restore (Reload), and dropped
// at Release (the tied embedding stays while the head needs it).
//
// Thread-safety: OnUpdated runs on the optimizer thread; everything else is for the step loop's
// thread. The upload events are shared between the two under a mutex.

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "engine/model.h"
#include "trainer/pipeline/block_layout.h"
#include "trainer/pipeline/device_optimizer.h"
#include "trainer/pipeline/device_streams.h"
#include "trainer/pipeline/host_optimizer.h"

namespace offloadd::trainer {

class WeightResidency {
 public:
  static constexpr int kWindow = 2;  // streamed: blocks uploaded ahead of use

  struct Options {
    engine::Model* model = nullptr;
    const std::vector<BlockLayout>* layout = nullptr;
    HostOptimizer* host = nullptr;  // its arena holds the compute weights
    DeviceStreams* streams = nullptr;
    c10::Device device = c10::Device(c10::kCPU);
    c10::ScalarType dtype = c10::kFloat;
    bool resident = true;  // CUDA: all blocks stay on the device (else they are streamed)
    // Blocks whose optimizer states live on the device (may be null) compute with that
    // optimizer's weights, updated in place on the compute stream: always there, never uploaded.
    const DeviceOptimizer* device_optimizer = nullptr;
    // Called on the step loop's thread once block b's weights are usable on the compute stream
    // (Ensure), and when the block is released (every Release, resident or not): LSP mode builds
    // and frees its effective weights there.
    std::function<void(int)> on_ensured, on_released;
    // ZeRO-1 across hosts (may be null): per block, its whole weights in the host's dtype, which
    // the trainer all-gathers from the hosts' slices (the host optimizer's arena holds only this
    // host's slice); read instead of host->compute_weights.
    const std::vector<at::Tensor>* full_weights = nullptr;
    // Across hosts (may be empty): blocks until block b's weights of update `step` are gathered
    // (HostGather::WaitGathered); Ensure and Prefetch wait there instead of on the host's update.
    std::function<Status(int b, uint64_t step)> wait_weights;
  };
  // Pins the arena's weights and binds them: to the Params (CPU), to device copies uploaded now
  // (resident) or to nothing until first use (streamed).
  static StatusOr<std::unique_ptr<WeightResidency>> Create(const Options& options);

  bool resident() const { return resident_; }

  // The compute stream may use block b's weights as of update `wait_step` (0: no update to wait
  // for); streams it in if needed. Adds the time blocked to *stall.
  Status Ensure(int b, uint64_t wait_step, double* stall);
  // Streamed: starts uploading block b (no-op when out of range, resident or already there).
  void Prefetch(int b, uint64_t wait_step);
  // Streamed: drops block b's device copy (the tied embedding stays).
  void Release(int b);
  // Optimizer thread: block b's new weights are in the arena (resident: upload them now).
  // after_compute: the copy waits for the compute stream's work so far (a block the step loop
  // may still be computing with, as the LSP projector check's).
  void OnUpdated(int b, bool after_compute = false);
  // Across hosts, the gather thread: resident on CUDA, block b's device weights (the all-gather
  // writes them in place; undefined otherwise), and the event after which they hold the
  // gathered update (the next Ensure makes the compute stream wait for it).
  at::Tensor ResidentWeights(int b) const;
  void SetReady(int b, DeviceStreams::EventPtr e);
  // Resident: uploads every block again (after the arena was restored from a checkpoint).
  Status Reload();
  // Binds block b's compute weights again (after something else was bound, e.g. fp32 masters).
  void Rebind(int b);
  // Between steps: the blocks `device` owns compute with its weights from now on (their own
  // device copies are dropped once the copy streams are done with them).
  void AdoptDeviceOptimizer(const DeviceOptimizer* device);

 private:
  explicit WeightResidency(const Options& options);
  Status BindInitial(int b);
  bool OnDevice(int b) const { return device_opt_ != nullptr && device_opt_->owns(b); }
  // Weights on NVMe: whether block b's copy is missing or older than its last update, and reading
  // it (FetchWeights) into that copy.
  bool NvmeStale(int b) const;
  Status LoadFromNvme(int b);
  static int BufferOf(int b) { return b % HostOptimizer::kWeightBuffers; }

  engine::Model* model_;
  const std::vector<BlockLayout>& layout_;
  HostOptimizer* host_;
  const std::vector<at::Tensor>* full_weights_;
  const std::function<Status(int, uint64_t)> wait_weights_;
  Status WaitWeights(int b, uint64_t step) const {
    return wait_weights_ ? wait_weights_(b, step) : host_->WaitUpdated(b, step);
  }
  const DeviceOptimizer* device_opt_;
  DeviceStreams* streams_;
  const c10::Device device_;
  const c10::ScalarType dtype_;
  const bool cuda_, resident_;
  // The arena's weights are fp32 masters, the compute 16-bit (HostOptimizer::weights_fp32): every
  // upload casts on the device (DeviceStreams::CopyToDevice); a CPU device casts into a copy.
  const c10::ScalarType host_dtype_;
  const bool cast_;
  const int n_;
  const bool tied_;                         // the head uses block 0's embedding matrix
  std::vector<at::Tensor> host_weights_;    // per block, flat view of the arena's compute weights
  // CUDA: per block flat weights while on the device; CPU with cast_: the cast copy.
  std::vector<at::Tensor> device_weights_;
  std::mutex ready_mu_;
  std::vector<DeviceStreams::EventPtr> ready_;  // per block: its weights' upload (CUDA)
  std::function<void(int)> on_ensured_, on_released_;
  // Weights on NVMe, per block: whether they are there, the updates (and restores) seen
  // (OnUpdated, Reload) and the one the copy holds.
  std::vector<bool> nvme_;
  std::unique_ptr<std::atomic<uint64_t>[]> versions_;
  std::vector<uint64_t> loaded_;
  // CUDA: per weight buffer, the upload reading it (the next read into it waits for that).
  std::vector<DeviceStreams::EventPtr> buffer_reads_;
};

}  // namespace offloadd::trainer
