#include "trainer/pipeline/device_streams.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>

#include "engine/torch_boundary.h"

#if OFFLOADD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "ipc/cuda_host_register.h"
#endif

namespace offloadd::trainer {

#if OFFLOADD_WITH_CUDA
class DeviceStreams::Event {
 public:
  at::cuda::CUDAEvent event{cudaEventDisableTiming};
};

struct DeviceStreams::Impl {
  c10::DeviceIndex index = 0;
  // Set by Create for a CUDA device only (touching CUDA on a CPU run would need a driver).
  std::optional<at::cuda::CUDAStream> compute_, h2d_, d2h_, gather_;
  at::cuda::CUDAStream& compute() { return *compute_; }
  at::cuda::CUDAStream& h2d() { return *h2d_; }
  at::cuda::CUDAStream& d2h() { return *d2h_; }
  std::vector<ipc::CudaHostRegistration> pins;
  uint64_t pinned_bytes = 0;
  std::mutex mu;
  // Host-to-device copies into another dtype (CastToDevice): one fp32 staging buffer on the h2d
  // stream, its users serialised (the optimizer thread's uploads and the step loop's prefetches).
  std::mutex cast_mu;
  at::Tensor cast_stage;
  struct Timed {
    std::string track, name;
    std::unique_ptr<at::cuda::CUDAEvent> start, end;
    uint64_t bytes = 0;
    int64_t mem_start = 0, mem_peak = 0;
  };
  std::vector<Timed> timed;
  std::unique_ptr<at::cuda::CUDAEvent> base;
  double base_us = 0;
  std::unique_ptr<at::cuda::CUDAEvent> open_start;
  std::string open_name;
  int64_t open_mem_start = 0;
  // Peaks before the last resetPeakStats (BeginCompute resets them to measure each span while
  // span_memory is on: the profiled step).
  int64_t peak_reserved = 0, peak_allocated = 0;
  bool span_memory = false;
  std::vector<Span> spans;  // CPU device
  double compute_start = 0;
  std::string compute_name;
  std::unique_ptr<at::cuda::CUDAEvent> inner_start;
  double inner_start_us = 0;  // CPU device
  std::string inner_track, inner_name;

  std::unique_ptr<at::cuda::CUDAEvent> Mark(const at::cuda::CUDAStream& s) {
    auto e = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
    e->record(s);
    return e;
  }
};
#else
class DeviceStreams::Event {};
struct DeviceStreams::Impl {
  std::mutex mu;
  std::vector<Span> spans;
  uint64_t pinned_bytes = 0;  // nothing is pinned without CUDA
  double compute_start = 0;
  std::string compute_name;
  double inner_start_us = 0;
  std::string inner_track, inner_name;
};
#endif

DeviceStreams::~DeviceStreams() = default;

StatusOr<std::unique_ptr<DeviceStreams>> DeviceStreams::Create(c10::Device device) {
  std::unique_ptr<DeviceStreams> d(new DeviceStreams());
  d->impl_ = std::make_unique<Impl>();
  if (device.is_cpu()) return d;
#if OFFLOADD_WITH_CUDA
  if (!device.is_cuda()) return InvalidArgumentError("unsupported device " + device.str());
  d->cuda_ = true;
  // Weights and gradients come and go in block-sized pieces: expandable segments keep the caching
  // allocator from fragmenting under the memory cap (read when the allocator initialises).
  setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", /*overwrite=*/0);
  Impl& m = *d->impl_;
  m.index = device.has_index() ? device.index() : 0;
  c10::cuda::CUDAGuard guard(m.index);
  m.compute_ = at::cuda::getStreamFromPool(/*isHighPriority=*/true, m.index);
  m.h2d_ = at::cuda::getStreamFromPool(false, m.index);
  m.d2h_ = at::cuda::getStreamFromPool(false, m.index);
  return d;
#else
  return FailedPreconditionError("this build of offloadd has no CUDA support (device " +
                                 device.str() + ")");
#endif
}

void DeviceStreams::UseCompute() const {
#if OFFLOADD_WITH_CUDA
  if (!cuda_) return;
  c10::cuda::set_device(impl_->index);
  at::cuda::setCurrentCUDAStream(impl_->compute());
#endif
}

Status DeviceStreams::Pin(void* base, size_t bytes) {
#if OFFLOADD_WITH_CUDA
  if (!cuda_ || bytes == 0) return OkStatus();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& p : impl_->pins) {
      if (p.base() == base && p.bytes() == bytes) return OkStatus();  // PinAll did
    }
  }
  ASSIGN_OR_RETURN(ipc::CudaHostRegistration r, ipc::CudaHostRegistration::Register(base, bytes));
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->pins.push_back(std::move(r));
  impl_->pinned_bytes += bytes;
#else
  (void)base;
  (void)bytes;
#endif
  return OkStatus();
}

Status DeviceStreams::PinAll(const std::vector<std::pair<void*, size_t>>& ranges,
                             uint32_t threads) {
  if (!cuda_ || ranges.empty()) return OkStatus();
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error;
  auto run = [&] {
#if OFFLOADD_WITH_CUDA
    c10::cuda::set_device(impl_->index);  // a new thread's current device is 0
#endif
    for (size_t i = next++; i < ranges.size(); i = next++) {
      Status st = Pin(ranges[i].first, ranges[i].second);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = st;
        next = ranges.size();
      }
    }
  };
  std::vector<std::thread> pool;
  const uint32_t n =
      std::max<uint32_t>(1, std::min<uint32_t>(threads, static_cast<uint32_t>(ranges.size())));
  for (uint32_t t = 1; t < n; ++t) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
  return first_error;
}

uint64_t DeviceStreams::PinnedBytes() const { return impl_->pinned_bytes; }

StatusOr<int64_t> DeviceStreams::CapMemory(int64_t bytes) {
#if OFFLOADD_WITH_CUDA
  if (!cuda_) return int64_t{0};
  size_t free_b = 0, total_b = 0;
  c10::cuda::CUDAGuard guard(impl_->index);
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
    return InternalError("cudaMemGetInfo failed");
  // The caching allocator of a device exists after its first allocation.
  (void)at::empty({1}, at::TensorOptions().device(c10::Device(c10::kCUDA, impl_->index)));
  const double fraction = std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_b));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, impl_->index);
  c10::cuda::CUDACachingAllocator::resetPeakStats(impl_->index);
  impl_->peak_reserved = impl_->peak_allocated = 0;
  return static_cast<int64_t>(total_b);
#else
  (void)bytes;
  return int64_t{0};
#endif
}

int64_t DeviceStreams::FreeMemory() const {
#if OFFLOADD_WITH_CUDA
  if (!cuda_) return 0;
  size_t free_b = 0, total_b = 0;
  c10::cuda::CUDAGuard guard(impl_->index);
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  return static_cast<int64_t>(free_b);
#else
  return 0;
#endif
}

int64_t DeviceStreams::PeakReservedBytes() const { return Peak(/*reserved=*/true); }
int64_t DeviceStreams::PeakAllocatedBytes() const { return Peak(/*reserved=*/false); }

int64_t DeviceStreams::Peak(bool reserved) const {
#if OFFLOADD_WITH_CUDA
  if (!cuda_) return 0;
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(impl_->index);
  return reserved ? std::max(impl_->peak_reserved, stats.reserved_bytes[0].peak)
                  : std::max(impl_->peak_allocated, stats.allocated_bytes[0].peak);
#else
  (void)reserved;
  return 0;
#endif
}

void DeviceStreams::MeasureSpanMemory(bool on) { impl_->span_memory = on; }

void DeviceStreams::ReleaseAfterCopies(const at::Tensor& t) const {
#if OFFLOADD_WITH_CUDA
  if (cuda_ && t.defined() && t.is_cuda()) {
    t.record_stream(impl_->d2h().unwrap());
    t.record_stream(impl_->h2d().unwrap());
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->gather_) t.record_stream(impl_->gather_->unwrap());
  }
#else
  (void)t;
#endif
}

#if OFFLOADD_WITH_CUDA
// fp32 host weights (the masters) into a bf16/fp16 device tensor, on the current (h2d) stream:
// chunk by chunk through one fp32 staging buffer, each chunk rounded there by ATen's cast kernel
// (c10::BFloat16/Half on CUDA: round to nearest even, denormals kept; the host kernels' rounding,
// workers/adamw_kernel.h). PCIe carries 4 bytes per parameter instead of 2; the device holds
// kCastChunk fp32 elements beyond the destination.
void DeviceStreams::CastToDevice(Impl& m, at::Tensor& dst, const at::Tensor& src) {
  constexpr int64_t kCastChunk = int64_t{8} << 20;  // 32 MiB of fp32: 0.6 ms at 52 GB/s
  std::lock_guard<std::mutex> lock(m.cast_mu);
  const int64_t n = src.numel();
  if (!m.cast_stage.defined() || m.cast_stage.scalar_type() != src.scalar_type()) {
    m.cast_stage = at::empty({std::min(n, kCastChunk)},
                             at::TensorOptions().dtype(src.scalar_type()).device(dst.device()));
  } else if (m.cast_stage.numel() < std::min(n, kCastChunk)) {
    m.cast_stage = at::empty({std::min(n, kCastChunk)}, m.cast_stage.options());
  }
  at::Tensor d = dst.view({-1});
  const at::Tensor s = src.view({-1});
  for (int64_t i = 0; i < n; i += kCastChunk) {
    const int64_t len = std::min(kCastChunk, n - i);
    at::Tensor stage = m.cast_stage.narrow(0, 0, len);
    stage.copy_(s.narrow(0, i, len), /*non_blocking=*/true);
    d.narrow(0, i, len).copy_(stage, /*non_blocking=*/true);
  }
}
#endif

DeviceStreams::EventPtr DeviceStreams::Copy(bool to_device, at::Tensor& dst, const at::Tensor& src,
                                            const std::string& name, bool after_compute) {
  const char* track = to_device ? "h2d" : "d2h";
#if OFFLOADD_WITH_CUDA
  if (cuda_) {
    Impl& m = *impl_;
    c10::cuda::CUDAGuard guard(m.index);
    at::cuda::CUDAStream& stream = to_device ? m.h2d() : m.d2h();
    if (after_compute) {
      at::cuda::CUDAEvent after(cudaEventDisableTiming);
      after.record(m.compute());
      after.block(stream);
    }
    Impl::Timed t{track, name, m.Mark(stream), nullptr, static_cast<uint64_t>(src.nbytes())};
    {
      c10::cuda::CUDAStreamGuard sg(stream);
      if (to_device && dst.scalar_type() != src.scalar_type()) {
        CastToDevice(m, dst, src);
      } else {
        dst.copy_(src, /*non_blocking=*/true);
      }
    }
    t.end = m.Mark(stream);
    auto done = std::make_shared<Event>();
    done->event.record(stream);
    std::lock_guard<std::mutex> lock(m.mu);
    m.timed.push_back(std::move(t));
    return done;
  }
#endif
  (void)after_compute;
  const double t0 = static_cast<double>(NowMicros());
  dst.copy_(src);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->spans.push_back({track, name, t0, static_cast<double>(NowMicros())});
  return nullptr;
}

DeviceStreams::EventPtr DeviceStreams::CopyToDevice(at::Tensor& dst, const at::Tensor& src,
                                                    const std::string& name, bool after_compute) {
  return Copy(/*to_device=*/true, dst, src, name, after_compute);
}

DeviceStreams::EventPtr DeviceStreams::CopyToHost(at::Tensor& dst, const at::Tensor& src,
                                                  const std::string& name) {
  return Copy(/*to_device=*/false, dst, src, name, /*after_compute=*/true);
}

StatusOr<DeviceStreams::EventPtr> DeviceStreams::OnGatherStream(const EventPtr& after,
                                                                const std::function<Status()>& fn,
                                                                const std::string& name) {
#if OFFLOADD_WITH_CUDA
  if (cuda_) {
    Impl& m = *impl_;
    c10::cuda::CUDAGuard guard(m.index);
    {
      std::lock_guard<std::mutex> lock(m.mu);
      if (!m.gather_) m.gather_ = at::cuda::getStreamFromPool(false, m.index);
    }
    at::cuda::CUDAStream& stream = *m.gather_;
    if (after) after->event.block(stream);
    Impl::Timed t{"gather", name, m.Mark(stream), nullptr, 0};
    {
      c10::cuda::CUDAStreamGuard sg(stream);
      RETURN_IF_ERROR(fn());
    }
    t.end = m.Mark(stream);
    auto done = std::make_shared<Event>();
    done->event.record(stream);
    std::lock_guard<std::mutex> lock(m.mu);
    m.timed.push_back(std::move(t));
    return done;
  }
#endif
  (void)after;
  const double t0 = static_cast<double>(NowMicros());
  RETURN_IF_ERROR(fn());
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->spans.push_back({"gather", name, t0, static_cast<double>(NowMicros())});
  return EventPtr();
}

void DeviceStreams::ComputeWaits(const EventPtr& e) const {
#if OFFLOADD_WITH_CUDA
  if (cuda_ && e) e->event.block(impl_->compute());
#else
  (void)e;
#endif
}

bool DeviceStreams::Completed(const EventPtr& e) {
#if OFFLOADD_WITH_CUDA
  return !e || e->event.query();
#else
  (void)e;
  return true;
#endif
}

Status DeviceStreams::Synchronize(const EventPtr& e) {
#if OFFLOADD_WITH_CUDA
  if (e) return engine::RunTorch("CUDA: synchronizing an event", [&] { e->event.synchronize(); });
#else
  (void)e;
#endif
  return OkStatus();
}

void DeviceStreams::BeginCompute(const std::string& name) {
#if OFFLOADD_WITH_CUDA
  if (cuda_) {
    Impl& m = *impl_;
    m.open_start = m.Mark(m.compute());
    m.open_name = name;
    if (!m.span_memory) return;
    // The span's own peak: fold the peaks so far into the running ones, then restart them.
    using c10::cuda::CUDACachingAllocator::getDeviceStats;
    const auto stats = getDeviceStats(m.index);
    m.peak_reserved = std::max(m.peak_reserved, stats.reserved_bytes[0].peak);
    m.peak_allocated = std::max(m.peak_allocated, stats.allocated_bytes[0].peak);
    m.open_mem_start = stats.allocated_bytes[0].current;
    c10::cuda::CUDACachingAllocator::resetPeakStats(m.index);
    return;
  }
#endif
  impl_->compute_start = static_cast<double>(NowMicros());
  impl_->compute_name = name;
}

void DeviceStreams::EndCompute() {
#if OFFLOADD_WITH_CUDA
  if (cuda_) {
    Impl& m = *impl_;
    int64_t mem_start = 0, mem_peak = 0;
    if (m.span_memory) {
      mem_start = m.open_mem_start;
      mem_peak = c10::cuda::CUDACachingAllocator::getDeviceStats(m.index).allocated_bytes[0].peak;
    }
    Impl::Timed t{"gpu compute", m.open_name, std::move(m.open_start), m.Mark(m.compute()), 0, mem_start, mem_peak};
    std::lock_guard<std::mutex> lock(m.mu);
    m.timed.push_back(std::move(t));
    return;
  }
#endif
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->spans.push_back({"gpu compute", impl_->compute_name, impl_->compute_start, static_cast<double>(NowMicros())});
}

void DeviceStreams::BeginInner(const std::string& track, const std::string& name) {
  Impl& m = *impl_;
  m.inner_track = track;
  m.inner_name = name;
#if OFFLOADD_WITH_CUDA
  if (cuda_) {
    m.inner_start = m.Mark(m.compute());
    return;
  }
#endif
  m.inner_start_us = static_cast<double>(NowMicros());
}

void DeviceStreams::EndInner() {
  Impl& m = *impl_;
#if OFFLOADD_WITH_CUDA
  if (cuda_) {
    Impl::Timed t{m.inner_track, m.inner_name, std::move(m.inner_start), m.Mark(m.compute()), 0, 0, 0};
    std::lock_guard<std::mutex> lock(m.mu);
    m.timed.push_back(std::move(t));
    return;
  }
#endif
  std::lock_guard<std::mutex> lock(m.mu);
  m.spans.push_back({m.inner_track, m.inner_name, m.inner_start_us, static_cast<double>(NowMicros())});
}

void DeviceStreams::MarkStepStart() {
#if OFFLOADD_WITH_CUDA
  if (cuda_) {
    Impl& m = *impl_;
    std::lock_guard<std::mutex> lock(m.mu);
    m.base = m.Mark(m.compute());
    m.base_us = static_cast<double>(NowMicros());
    m.timed.clear();
  }
#endif
}

std::vector<Span> DeviceStreams::TakeSpans(double* compute_s, double* h2d_s, double* d2h_s,
                                           uint64_t* h2d_bytes, uint64_t* d2h_bytes) {
  std::vector<Span> out;
  *compute_s = *h2d_s = *d2h_s = 0;
  *h2d_bytes = *d2h_bytes = 0;
  auto add = [&](const Span& s, uint64_t bytes) {
    const double d = (s.end_us - s.start_us) * 1e-6;
    if (s.track == "gpu compute") *compute_s += d;
    if (s.track == "h2d") {
      *h2d_s += d;
      *h2d_bytes += bytes;
    }
    if (s.track == "d2h") {
      *d2h_s += d;
      *d2h_bytes += bytes;
    }
    out.push_back(s);
  };
#if OFFLOADD_WITH_CUDA
  if (cuda_) {
    Impl& m = *impl_;
    std::vector<Impl::Timed> timed;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      timed.swap(m.timed);
    }
    if (!m.base) return out;
    for (auto& t : timed) {
      if (!t.start || !t.end) continue;
      t.end->synchronize();
      const double s = m.base_us + 1000.0 * m.base->elapsed_time(*t.start);
      const double e = m.base_us + 1000.0 * m.base->elapsed_time(*t.end);
      add(Span{t.track, t.name, s, e, t.mem_start, t.mem_peak}, t.bytes);
    }
    return out;
  }
#endif
  std::vector<Span> spans;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    spans.swap(impl_->spans);
  }
  for (const auto& s : spans) add(s, 0);
  return out;
}

}  // namespace offloadd::trainer
