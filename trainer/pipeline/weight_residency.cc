// WeightResidency: the block weights' uploads, waits and bindings.
#include "trainer/pipeline/weight_residency.h"

#include <chrono>
#include <string>

namespace offloadd::trainer {
namespace {

// Whether block b's host weights are fp32 masters that the device rounds to `dtype` (a 16-bit
// compute): every block when the arena keeps no 16-bit copy (`all`: HostOptimizer::weights_fp32),
// else the blocks that keep none beside a master in RAM (the NVMe tier's blocks whose states stay
// in RAM), whose compute weights are 4 B per parameter.
bool CastsBlock(bool all, const HostOptimizer* host, const BlockLayout& layout,
                c10::ScalarType dtype, int b) {
  if (all) return true;
  return dtype != c10::kFloat && host->compute_weights(b) != nullptr &&
         host->compute_weight_bytes(b) == layout.numel * 4;
}

}  // namespace

WeightResidency::WeightResidency(const Options& options)
    : model_(options.model),
      layout_(*options.layout),
      host_(options.host),
      full_weights_(options.full_weights),
      wait_weights_(options.wait_weights),
      device_opt_(options.device_optimizer),
      streams_(options.streams),
      device_(options.device),
      dtype_(options.dtype),
      cuda_(options.device.is_cuda()),
      resident_(options.resident),
      host_dtype_(options.host->weights_fp32() ? c10::kFloat : options.dtype),
      cast_(host_dtype_ != options.dtype),
      n_(options.model->num_blocks()),
      tied_(!options.model->block(n_ - 1).shared_params().empty()),
      host_weights_(n_),
      device_weights_(n_),
      ready_(n_),
      on_ensured_(options.on_ensured),
      on_released_(options.on_released),
      nvme_(n_),
      versions_(new std::atomic<uint64_t>[static_cast<size_t>(n_)]),
      loaded_(n_, 0),
      buffer_reads_(HostOptimizer::kWeightBuffers) {
  for (int b = 0; b < n_; ++b) {
    nvme_[b] = options.host->weights_on_nvme(b);
    versions_[b].store(1);  // loaded_ 0: never read
  }
}

bool WeightResidency::NvmeStale(int b) const {
  return nvme_[b] && (!device_weights_[b].defined() || loaded_[b] != versions_[b].load());
}

Status WeightResidency::LoadFromNvme(int b) {
  const int buffer = BufferOf(b);
  // Its last upload must have read the buffer before the store writes it again.
  RETURN_IF_ERROR(DeviceStreams::Synchronize(buffer_reads_[buffer]));
  buffer_reads_[buffer] = nullptr;
  const uint64_t version = versions_[b].load();
  ASSIGN_OR_RETURN(const void* src, host_->FetchWeights(b, buffer));
  const int64_t numel = static_cast<int64_t>(layout_[b].numel);
  const at::Tensor fetched = at::from_blob(const_cast<void*>(src), {numel},
                                           at::TensorOptions().dtype(dtype_).device(c10::kCPU));
  if (!cuda_) {
    // A copy of its own: autograd may keep the block's weights until its backward, long after
    // the buffer holds another block's.
    device_weights_[b] = fetched.clone();
  } else {
    streams_->UseCompute();  // the copy is allocated for the compute stream (Create, Reload)
    if (!device_weights_[b].defined())
      device_weights_[b] = at::empty({numel}, at::TensorOptions().dtype(dtype_).device(device_));
    // After the compute stream's work so far: a resident copy may still be in use.
    auto e =
        streams_->CopyToDevice(device_weights_[b], fetched, "weights " + model_->block(b).name());
    buffer_reads_[buffer] = e;
    std::lock_guard<std::mutex> lock(ready_mu_);
    ready_[b] = e;
  }
  layout_[b].Bind(device_weights_[b]);
  loaded_[b] = version;
  return OkStatus();
}

StatusOr<std::unique_ptr<WeightResidency>> WeightResidency::Create(const Options& options) {
  std::unique_ptr<WeightResidency> w(new WeightResidency(options));
  for (int b = 0; b < w->n_; ++b) RETURN_IF_ERROR(w->BindInitial(b));
  return w;
}

Status WeightResidency::BindInitial(int b) {
  if (OnDevice(b)) {
    layout_[b].Bind(device_opt_->weights(b));
    return OkStatus();
  }
  if (nvme_[b]) {  // read ahead of first use (resident: now)
    if (cuda_ && resident_) {
      RETURN_IF_ERROR(LoadFromNvme(b));
      return DeviceStreams::Synchronize(ready_[b]);
    }
    layout_[b].Unbind();
    return OkStatus();
  }
  const int64_t numel = static_cast<int64_t>(layout_[b].numel);
  if (full_weights_ != nullptr) {
    host_weights_[b] = (*full_weights_)[b];
    RETURN_IF_ERROR(streams_->Pin(host_weights_[b].data_ptr(), host_weights_[b].nbytes()));
  } else {
    const bool fp32 = CastsBlock(cast_, host_, layout_[b], dtype_, b) || host_dtype_ == c10::kFloat;
    host_weights_[b] =
        at::from_blob(host_->compute_weights(b), {numel},
                      at::TensorOptions().dtype(fp32 ? c10::kFloat : dtype_).device(c10::kCPU));
    RETURN_IF_ERROR(streams_->Pin(host_->compute_weights(b), host_->compute_weight_bytes(b)));
  }
  if (!cuda_ && host_weights_[b].scalar_type() != dtype_) {
    device_weights_[b] = host_weights_[b].to(dtype_);
    layout_[b].Bind(device_weights_[b]);
  } else if (!cuda_) {
    layout_[b].Bind(host_weights_[b]);
  } else if (resident_) {
    streams_->UseCompute();
    device_weights_[b] = at::empty({numel}, at::TensorOptions().dtype(dtype_).device(device_));
    layout_[b].Bind(device_weights_[b]);
    auto e = streams_->CopyToDevice(device_weights_[b], host_weights_[b],
                                    "weights " + model_->block(b).name(), false);
    RETURN_IF_ERROR(DeviceStreams::Synchronize(e));
  } else {
    layout_[b].Unbind();
  }
  return OkStatus();
}

Status WeightResidency::Ensure(int b, uint64_t wait_step, double* stall) {
  if (OnDevice(b)) return OkStatus();  // updated on the compute stream, in order
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(WaitWeights(b, wait_step));
  // (A CPU head tied to block 0 reads the embedding block 0 keeps: it is never released.)
  if (NvmeStale(b)) RETURN_IF_ERROR(LoadFromNvme(b));
  if (cuda_) {
    if (!resident_ && !device_weights_[b].defined()) Prefetch(b, 0);
    DeviceStreams::EventPtr e;
    {
      std::lock_guard<std::mutex> lock(ready_mu_);
      e = ready_[b];
    }
    streams_->ComputeWaits(e);
    if (tied_ && b == n_ - 1 && b != 0) RETURN_IF_ERROR(Ensure(0, wait_step, stall));
  }
  *stall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (on_ensured_) on_ensured_(b);
  return OkStatus();
}

void WeightResidency::Prefetch(int b, uint64_t wait_step) {
  if (b >= 0 && b < n_ && NvmeStale(b) && !OnDevice(b)) {
    // The read only: Ensure takes it (and uploads it on CUDA) once the block is next.
    if (!WaitWeights(b, wait_step).ok()) return;  // the error surfaces in Ensure
    if (!DeviceStreams::Synchronize(buffer_reads_[BufferOf(b)]).ok()) return;
    buffer_reads_[BufferOf(b)] = nullptr;
    (void)host_->PrefetchWeights(b, BufferOf(b));  // a failed read is read again in Ensure
    return;
  }
  if (b >= 0 && b < n_ && nvme_[b]) return;  // its copy is current
  if (!cuda_ || resident_ || b < 0 || b >= n_ || OnDevice(b) || device_weights_[b].defined()) return;
  if (!WaitWeights(b, wait_step).ok()) return;  // the error surfaces in Ensure
  device_weights_[b] = at::empty({static_cast<int64_t>(layout_[b].numel)},
                                 at::TensorOptions().dtype(dtype_).device(device_));
  layout_[b].Bind(device_weights_[b]);
  auto e = streams_->CopyToDevice(device_weights_[b], host_weights_[b],
                                  "weights " + model_->block(b).name());
  std::lock_guard<std::mutex> lock(ready_mu_);
  ready_[b] = e;
}

void WeightResidency::Release(int b) {
  if (on_released_ && b >= 0 && b < n_) on_released_(b);
  if (b >= 0 && b < n_ && nvme_[b] && !(cuda_ && resident_) && !(tied_ && b == 0)) {
    if (cuda_) streams_->ReleaseAfterCopies(device_weights_[b]);
    device_weights_[b] = at::Tensor();
    layout_[b].Unbind();
    return;
  }
  if (!cuda_ || resident_ || (tied_ && b == 0) || OnDevice(b)) return;
  device_weights_[b] = at::Tensor();
  layout_[b].Unbind();
}

void WeightResidency::OnUpdated(int b, bool after_compute) {
  if (nvme_[b]) {  // read again at the next Ensure (the write-back is in the store by then)
    versions_[b].fetch_add(1);
    return;
  }
  if (!cuda_ && !OnDevice(b) && host_weights_[b].scalar_type() != dtype_) {
    device_weights_[b].copy_(host_weights_[b]);  // as the workers' in-place 16-bit write
    return;
  }
  if (!cuda_ || !resident_ || OnDevice(b)) return;
  auto e = streams_->CopyToDevice(device_weights_[b], host_weights_[b],
                                  "weights " + model_->block(b).name(), after_compute);
  std::lock_guard<std::mutex> lock(ready_mu_);
  ready_[b] = e;
}

at::Tensor WeightResidency::ResidentWeights(int b) const {
  if (!cuda_ || !resident_ || OnDevice(b) || nvme_[b]) return at::Tensor();
  return device_weights_[b];
}

void WeightResidency::SetReady(int b, DeviceStreams::EventPtr e) {
  std::lock_guard<std::mutex> lock(ready_mu_);
  ready_[b] = std::move(e);
}

Status WeightResidency::Reload() {
  for (int b = 0; b < n_; ++b) {
    if (nvme_[b]) versions_[b].fetch_add(1);  // the restore derived them into the store
  }
  if (cuda_ && resident_) {
    for (int b = 0; b < n_; ++b) {
      if (!nvme_[b] || OnDevice(b)) continue;
      RETURN_IF_ERROR(LoadFromNvme(b));
      RETURN_IF_ERROR(DeviceStreams::Synchronize(ready_[b]));
    }
  }
  if (!cuda_) {
    for (int b = 0; b < n_; ++b) {
      if (!OnDevice(b) && !nvme_[b] && host_weights_[b].scalar_type() != dtype_)
        device_weights_[b].copy_(host_weights_[b]);
    }
    return OkStatus();
  }
  if (!cuda_ || !resident_) return OkStatus();
  streams_->UseCompute();
  for (int b = 0; b < n_; ++b) {
    if (OnDevice(b) || nvme_[b]) continue;  // RestoreStates wrote them; NVMe: read above
    auto e = streams_->CopyToDevice(device_weights_[b], host_weights_[b], "weights", false);
    RETURN_IF_ERROR(DeviceStreams::Synchronize(e));
  }
  return OkStatus();
}

void WeightResidency::AdoptDeviceOptimizer(const DeviceOptimizer* device) {
  device_opt_ = device;
  for (int b = 0; b < n_; ++b) {
    if (!OnDevice(b)) continue;
    if (device_weights_[b].defined()) streams_->ReleaseAfterCopies(device_weights_[b]);
    device_weights_[b] = at::Tensor();
    {
      std::lock_guard<std::mutex> lock(ready_mu_);
      ready_[b] = nullptr;
    }
    layout_[b].Bind(device_opt_->weights(b));
  }
}

void WeightResidency::Rebind(int b) {
  if (OnDevice(b)) {
    layout_[b].Bind(device_opt_->weights(b));
  } else if (nvme_[b]) {
    if (device_weights_[b].defined()) {
      layout_[b].Bind(device_weights_[b]);
    } else {
      layout_[b].Unbind();
    }
  } else if (!cuda_) {
    layout_[b].Bind(device_weights_[b].defined() ? device_weights_[b] : host_weights_[b]);
  } else if (device_weights_[b].defined()) {
    layout_[b].Bind(device_weights_[b]);
  } else {
    layout_[b].Unbind();
  }
}

}  // namespace offloadd::trainer
