#pragma once
// ActivationSpill: activations offloaded to NVMe (ActivationMode::kOffloadNvme), LoHan's swap of
// activations to SSD. A block's saved tensors go device-to-host into a pinned staging buffer,
// then into a dedicated offloadd-store process (its own directory and rings, so activation I/O
// never queues behind the optimizer's state traffic); in backward they are read back into the
// buffer ahead of use (Prefetch) and copied host-to-device for the block's backward (Take).
//
// The staging buffer is one shared segment, pinned for the copy engines and registered with the
// store's io_uring; ranges are handed out first-fit. A range is free again once its write is
// committed and nobody wants the data, or once the host-to-device copy that consumed it has
// completed. Data still in the buffer when backward asks for it (the last layers, whose writes
// may not even have finished) is served from there without a read.
//
// Single-threaded: every call is for the step loop's thread; progress (submitting writes whose
// device-to-host copy has finished, collecting completions, reclaiming ranges) happens inside
// the calls, never on a thread of its own.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "ipc/arena.h"
#include "ipc/shm_segment.h"
#include "job/step_stats.h"
#include "trainer/pipeline/device_streams.h"

namespace offloadd::storage {
class StoreProcess;
}

namespace offloadd::trainer {

struct ActivationSpillOptions {
  std::string store_binary;       // offloadd-store
  std::vector<std::string> dirs;  // store directories (created if missing)
  uint32_t queue_depth = 32;
  uint32_t block_size = 0;  // offloadd-store --block-size; 0: its default
  uint64_t buffer_bytes = 256ull << 20;  // pinned staging buffer
};

struct SpillTotals {  // since the last TakeTotals()
  uint64_t write_bytes = 0, read_bytes = 0;
  double wait_seconds = 0;          // the step loop blocked on spill I/O or buffer space
};

class ActivationSpill {
 public:
  static StatusOr<std::unique_ptr<ActivationSpill>> Create(const ActivationSpillOptions& options,
                                                           DeviceStreams* streams);
  ~ActivationSpill();  // drops the keys it wrote and shuts the store down

  // Copies `saved` (device or CPU tensors; undefined entries allowed) out and writes it to the
  // store behind. Returns a ticket for Prefetch/Take. RESOURCE_EXHAUSTED when the block's
  // tensors exceed the whole buffer.
  StatusOr<uint64_t> Put(int block, const std::vector<at::Tensor>& saved);
  // Starts reading the ticket back when buffer space allows (never blocks).
  Status Prefetch(uint64_t ticket);
  // The tensors again, on `device` (ordered before the compute stream's next work). The ticket is
  // consumed.
  StatusOr<std::vector<at::Tensor>> Take(uint64_t ticket, c10::Device device);

  SpillTotals TakeTotals();
  // Its store as the client sees it (role "activations"), for the per-job metrics.
  void AddRuntime(RuntimeStats* out) const;

 private:
  struct TensorMeta {
    bool defined = false;
    std::vector<int64_t> sizes;
    c10::ScalarType dtype = c10::kFloat;
    uint64_t offset = 0, bytes = 0;  // within the block's record
  };
  struct Record {
    int block = 0;
    std::vector<TensorMeta> tensors;
    uint64_t bytes = 0;      // the record, 4 KiB-aligned parts
    int64_t range = -1;      // buffer offset while the data (or room for it) is in the buffer
    bool in_buffer = false;  // the range holds the data (or will once `copied` completes)
    DeviceStreams::EventPtr copied;  // device-to-host copy into the range
    bool writing = false, on_disk = false, reading = false;
    bool wanted = false;  // prefetched while in the buffer: keep the range after the write
  };
  // A range to free once an event completed and no write is reading from it.
  struct Retired {
    uint64_t offset = 0, bytes = 0;
    DeviceStreams::EventPtr after;
    uint64_t ticket = 0;  // 0, or the record whose write still reads the range
    int block = -1;
  };

  ActivationSpill() = default;
  int64_t Allocate(uint64_t bytes);
  void Free(uint64_t offset, uint64_t bytes);
  // Gets `bytes` of buffer, making progress (blocking) until they are free.
  StatusOr<uint64_t> AllocateWaiting(uint64_t bytes);
  // Submits writes whose copies finished, reclaims ranges, collects completions. With `block`,
  // waits for at least one completion (or copy) when nothing else moved.
  Status Progress(bool block);
  // A write of the record's range to the store, or a read of the block's latest version into it.
  Status Submit(bool write, uint64_t ticket, Record& r);
  Status Collect(int timeout_ms);
  uint64_t Outstanding() const { return static_cast<uint64_t>(io_ticket_.size()); }
  at::Tensor View(const Record& r, const TensorMeta& m) const;

  ActivationSpillOptions options_;
  DeviceStreams* streams_ = nullptr;
  ipc::SharedSegment segment_;
  std::unique_ptr<ipc::Arena> arena_;
  std::unique_ptr<storage::StoreProcess> store_;
  uint64_t base_ = 0, capacity_ = 0;     // the staging region in the arena
  std::map<uint64_t, uint64_t> free_;    // offset -> bytes, coalesced
  std::map<uint64_t, Record> records_;   // by ticket
  std::map<uint64_t, uint64_t> io_ticket_;  // outstanding command id -> ticket
  std::vector<Retired> retired_;
  std::vector<int> written_blocks_;
  uint64_t next_ticket_ = 1, next_io_ = 1, version_ = 0;
  SpillTotals totals_;
};

}  // namespace offloadd::trainer
