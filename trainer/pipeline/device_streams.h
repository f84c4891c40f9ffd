#pragma once
// DeviceStreams: the CUDA side of the schedule — a compute stream, a host-to-device and a
// device-to-host copy stream, events ordering them, page-locking of the arena buffers the copies
// use, the caching allocator's memory cap, and timing spans for the trace. On a CPU device every
// call is a synchronous no-op equivalent (copies are plain copies), so the step loop has one code
// path. Copies and waits may be issued from several threads.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/pipeline/trace.h"  // NowMicros()

namespace offloadd::trainer {

// One timed interval on a track ("gpu compute", "h2d", "d2h", "cpu update", "nvme", "step").
struct Span {
  std::string track, name;
  double start_us = 0, end_us = 0;  // NowMicros() timebase
  // Compute spans on CUDA: the caching allocator's allocated bytes when the span was issued, and
  // its peak while it was issued (the host-side view the allocator keeps: what the span's work
  // needed at once). 0 on a CPU device, and outside a step measured with MeasureSpanMemory.
  int64_t mem_start = 0, mem_peak = 0;
};


class DeviceStreams {
 public:
  // An ordering point on one stream (a CUDA event), shared between threads.
  class Event;
  using EventPtr = std::shared_ptr<Event>;

  static StatusOr<std::unique_ptr<DeviceStreams>> Create(c10::Device device);
  ~DeviceStreams();
  bool cuda() const { return cuda_; }

  // Makes the compute stream current on the calling thread (and the device current).
  void UseCompute() const;
  // Page-locks host memory used as a copy source or destination (cudaHostRegister).
  // A range PinAll registered already is not registered again.
  Status Pin(void* base, size_t bytes);
  // Pin for many ranges at once, on `threads` threads (cudaHostRegister's rate is one core's: a
  // 7B model's 27 GB of weight and gradient buffers took seconds on one thread).
  Status PinAll(const std::vector<std::pair<void*, size_t>>& ranges, uint32_t threads);
  uint64_t PinnedBytes() const;  // what Pin registered
  // Caps the caching allocator at `bytes` (setMemoryFraction); returns the device's total memory.
  StatusOr<int64_t> CapMemory(int64_t bytes);
  int64_t FreeMemory() const;
  // The caching allocator's reserved and allocated peaks since CapMemory (the per-span peak
  // resets of BeginCompute folded in).
  int64_t PeakReservedBytes() const;
  int64_t PeakAllocatedBytes() const;
  // On: each compute span measures the allocator's peak within it (Span::mem_start/mem_peak),
  // resetting the allocator's peak statistics per span; for the step the shape profile records.
  void MeasureSpanMemory(bool on);

  // Host-to-device copy on the copy stream; with after_compute, only after the compute stream's
  // work so far (so memory the compute stream freed may be overwritten). Returns the copy's
  // completion event. A destination of another dtype (fp32 masters into bf16/fp16 weights) is
  // cast on the device, chunk by chunk through a small staging buffer.
  EventPtr CopyToDevice(at::Tensor& dst, const at::Tensor& src, const std::string& name,
                        bool after_compute = true);
  // Lets the caching allocator reuse `t`'s memory only after the copy (and gather) streams' work
  // so far.
  void ReleaseAfterCopies(const at::Tensor& t) const;
  // Device-to-host copy after the compute stream's work so far.
  EventPtr CopyToHost(at::Tensor& dst, const at::Tensor& src, const std::string& name);
  // Runs `fn` with the gather stream (a fourth stream, made on first use) current, after `after`
  // (may be null), and returns the event that follows fn's work there (an all-gather across
  // hosts, HostGather), timed on the "gather" track. On a CPU device fn runs, timed by the host
  // clock, and the event is null.
  StatusOr<EventPtr> OnGatherStream(const EventPtr& after, const std::function<Status()>& fn,
                                    const std::string& name);
  // The compute stream waits for `e` (no host blocking).
  void ComputeWaits(const EventPtr& e) const;
  // Blocks the calling thread until `e` completed.
  static Status Synchronize(const EventPtr& e);
  // True once `e` completed (a null event, as CPU copies return, always has).
  static bool Completed(const EventPtr& e);

  // Timing of compute work for the trace: Begin/End around a block's forward or backward.
  void BeginCompute(const std::string& name);
  void EndCompute();
  // A span of compute-stream work on its own track (e.g. "lsp compress" inside a block's
  // backward): timed by CUDA events on the compute stream, by the host clock on a CPU device. One
  // open at a time, from the step loop's thread; it may lie inside a BeginCompute span.
  void BeginInner(const std::string& track, const std::string& name);
  void EndInner();
  // Marks the start of a step (the base the spans are measured from).
  void MarkStepStart();
  // Waits for all streams, then returns the spans recorded since MarkStepStart with host
  // microseconds, plus busy seconds per track.
  std::vector<Span> TakeSpans(double* compute_s, double* h2d_s, double* d2h_s,
                              uint64_t* h2d_bytes, uint64_t* d2h_bytes);

 private:
  int64_t Peak(bool reserved) const;
  struct Impl;
  DeviceStreams() = default;
  EventPtr Copy(bool to_device, at::Tensor& dst, const at::Tensor& src, const std::string& name,
                bool after_compute);
  static void CastToDevice(Impl& m, at::Tensor& dst, const at::Tensor& src);
  bool cuda_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd::trainer
