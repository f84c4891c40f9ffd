// ActivationOffload: tickets for the activations a step offloaded, to pinned RAM or NVMe.
#include "trainer/pipeline/activation_offload.h"

#include <string>
#include <utility>

namespace offloadd::trainer {

ActivationOffload::ActivationOffload(ActivationSpill* spill, DeviceStreams* streams,
                                     std::vector<bool> to_nvme, c10::Device device)
    : spill_(spill),
      streams_(streams),
      to_nvme_(std::move(to_nvme)),
      device_(device),
      cuda_(device.is_cuda()) {
  callbacks_.offload = [this](int block, std::vector<at::Tensor> saved) {
    return Offload(block, std::move(saved));
  };
  callbacks_.fetch = [this](int block, uint64_t ticket) { return Fetch(block, ticket); };
}

void ActivationOffload::Reset() {
  offloaded_.clear();
  spilled_.clear();
  ticket_of_.clear();
  next_ticket_ = 1;
  spill_status_ = OkStatus();
}

StatusOr<uint64_t> ActivationOffload::Offload(int block, std::vector<at::Tensor> saved) {
  if (to_nvme_[block]) {
    ASSIGN_OR_RETURN(uint64_t st, spill_->Put(block, saved));
    const uint64_t ticket = next_ticket_++;
    ticket_of_[block] = ticket;
    spilled_[ticket] = st;
    return ticket;
  }
  Offloaded o;
  for (auto& t : saved) {
    if (!t.defined() || !cuda_) {
      o.host.push_back(t);
      continue;
    }
    at::Tensor h = at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
    streams_->CopyToHost(h, t, "activations " + std::to_string(block));
    streams_->ReleaseAfterCopies(t);
    o.host.push_back(h);
  }
  const uint64_t ticket = next_ticket_++;
  ticket_of_[block] = ticket;
  offloaded_[ticket] = std::move(o);
  return ticket;
}

void ActivationOffload::Prefetch(int block) {
  auto it = ticket_of_.find(block);
  if (it != ticket_of_.end() && spilled_.count(it->second)) {
    if (spill_status_.ok()) spill_status_ = spill_->Prefetch(spilled_[it->second]);
    return;
  }
  if (!cuda_ || it == ticket_of_.end()) return;
  Offloaded& o = offloaded_[it->second];
  if (!o.device.empty()) return;
  for (auto& h : o.host) {
    if (!h.defined()) {
      o.device.push_back(h);
      continue;
    }
    at::Tensor d = at::empty(h.sizes(), h.options().device(device_).pinned_memory(false));
    // The compute stream waits for the copy when Fetch hands the tensors over, not here: the
    // prefetch overlaps the backward of the block above.
    o.landed.push_back(streams_->CopyToDevice(d, h, "activations " + std::to_string(block)));
    o.device.push_back(d);
  }
}

StatusOr<std::vector<at::Tensor>> ActivationOffload::Fetch(int block, uint64_t ticket) {
  RETURN_IF_ERROR(spill_status_);
  if (auto s = spilled_.find(ticket); s != spilled_.end()) {
    const uint64_t st = s->second;
    spilled_.erase(s);
    ticket_of_.erase(block);
    return spill_->Take(st, device_);
  }
  auto it = offloaded_.find(ticket);
  if (it == offloaded_.end()) return InternalError("no offloaded activations for ticket");
  if (cuda_) {
    Prefetch(block);
    for (const auto& e : it->second.landed) streams_->ComputeWaits(e);
  }
  std::vector<at::Tensor> out = cuda_ ? std::move(it->second.device) : std::move(it->second.host);
  offloaded_.erase(it);
  ticket_of_.erase(block);
  return out;
}

}  // namespace offloadd::trainer
