#pragma once
// ActivationOffload: the engine's activation offloading hooks (SaveMode::kOffload) for one
// optimizer step. A block's saved tensors go to pinned host memory (device-to-host on the copy
// stream; kept as they are on a CPU device) or, for blocks planned for NVMe, to the
// ActivationSpill; backward gets them back through the same ticket, ideally after a Prefetch
// one block ahead. Owns the step's tickets and the host copies; Reset() forgets them for the
// next step.
//
// Single-threaded: every call, and the callbacks, are for the step loop's thread.

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <vector>

#include "common/status.h"
#include "engine/model.h"
#include "trainer/pipeline/activation_spill.h"
#include "trainer/pipeline/device_streams.h"

namespace offloadd::trainer {

class ActivationOffload {
 public:
  // to_nvme: per block, whether its activations go to `spill` (which must then exist) rather
  // than to pinned RAM.
  ActivationOffload(ActivationSpill* spill, DeviceStreams* streams, std::vector<bool> to_nvme,
                    c10::Device device);
  ActivationOffload(const ActivationOffload&) = delete;  // the callbacks point at this object
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // For Block::Forward and Block::Backward.
  const engine::OffloadCallbacks* callbacks() const { return &callbacks_; }
  // Starts bringing `block`'s activations back (NVMe read, or host-to-device copy that the
  // compute stream will wait for); no-op for a block that offloaded nothing.
  void Prefetch(int block);
  // Drops every ticket: a new step starts.
  void Reset();

 private:
  struct Offloaded {
    std::vector<at::Tensor> host, device;
    std::vector<DeviceStreams::EventPtr> landed;  // the host-to-device copies of `device`
  };
  StatusOr<uint64_t> Offload(int block, std::vector<at::Tensor> saved);
  StatusOr<std::vector<at::Tensor>> Fetch(int block, uint64_t ticket);

  ActivationSpill* spill_;
  DeviceStreams* streams_;
  const std::vector<bool> to_nvme_;
  const c10::Device device_;
  const bool cuda_;
  engine::OffloadCallbacks callbacks_;
  std::map<uint64_t, Offloaded> offloaded_;  // by ticket: in pinned RAM (or on a CPU device)
  std::map<uint64_t, uint64_t> spilled_;     // ticket -> ActivationSpill ticket
  std::map<int, uint64_t> ticket_of_;        // block -> its ticket in this step
  uint64_t next_ticket_ = 1;
  Status spill_status_;  // a failed NVMe prefetch, reported by the next fetch
};

}  // namespace offloadd::trainer
