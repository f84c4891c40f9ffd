#include "trainer/pipeline/activation_spill.h"

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/units.h"
#include "storage/format.h"
#include "storage/store_client.h"
#include "trainer/pipeline/host_optimizer.h"

namespace offloadd::trainer {
namespace {

constexpr uint64_t kAlign = 4096;  // O_DIRECT-friendly parts
uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// mkdir -p.
Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i != path.size() && path[i] != '/') continue;
    const std::string prefix = path.substr(0, i);
    if (::mkdir(prefix.c_str(), 0750) != 0 && errno != EEXIST) {
      return InternalError("cannot create " + prefix + ": " + std::strerror(errno));
    }
  }
  return OkStatus();
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StatusOr<std::unique_ptr<ActivationSpill>> ActivationSpill::Create(const ActivationSpillOptions& options,
                                                                   DeviceStreams* streams) {
  if (options.dirs.empty()) {
    return InvalidArgumentError("activations offloaded to NVMe need a store directory (nvme_path)");
  }
  std::unique_ptr<ActivationSpill> s(new ActivationSpill());
  s->options_ = options;
  s->streams_ = streams;
  s->capacity_ = AlignUp(std::max<uint64_t>(options.buffer_bytes, kAlign));
  ipc::SegmentOptions so;
  so.name = "offloadd-activations";
  // Room for the rings and the region table beside the staging buffer.
  ASSIGN_OR_RETURN(s->segment_, ipc::SharedSegment::Create(s->capacity_ + (8ull << 20), so));
  ipc::ArenaOptions ao;
  ao.max_regions = 16;
  ASSIGN_OR_RETURN(ipc::Arena arena, ipc::Arena::Format(&s->segment_, ao));
  s->arena_ = std::make_unique<ipc::Arena>(std::move(arena));
  ASSIGN_OR_RETURN(ipc::Region r,
                   s->arena_->Allocate("activations", ipc::RegionKind::kIoBuffer, s->capacity_));
  s->base_ = r.offset;
  s->free_[0] = s->capacity_;
  RETURN_IF_ERROR(streams->Pin(s->arena_->At<void>(s->base_), s->capacity_));
  storage::StoreProcessOptions po;
  po.binary = options.store_binary;
  for (const auto& d : options.dirs) {
    RETURN_IF_ERROR(MakeDirs(d));
    po.args.push_back("--dir=" + d);
  }
  po.args.push_back("--queue-depth=" + std::to_string(options.queue_depth));
  if (options.block_size > 0) po.args.push_back("--block-size=" + std::to_string(options.block_size));
  auto store = storage::StoreProcess::Launch(s->segment_, s->arena_.get(), po);
  if (!store.ok()) return store.status().WithContext("starting the activation store");
  s->store_ = std::move(*store);
  // Versions grow per key, also across runs over the same directories.
  s->version_ = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch() /
                                      std::chrono::nanoseconds(1));
  return s;
}

ActivationSpill::~ActivationSpill() {
  if (!store_) return;
  // Finish what is in flight, then forget what was written: activations are scratch.
  while (Outstanding() > 0 && Collect(-1).ok()) {
  }
  for (int block : written_blocks_) {
    storage::StoreCommand c;
    c.layer = static_cast<uint32_t>(block);
    c.kind = static_cast<uint32_t>(storage::TensorKind::kActivation);
    const uint64_t id = next_io_++;
    if (!store_->Submit(storage::StoreOp::kDrop, id, c).ok()) break;
    io_ticket_[id] = 0;
  }
  while (Outstanding() > 0 && Collect(-1).ok()) {
  }
  (void)store_->Shutdown();
}

int64_t ActivationSpill::Allocate(uint64_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const uint64_t off = it->first, left = it->second - bytes;
    free_.erase(it);
    if (left > 0) free_[off + bytes] = left;
    return static_cast<int64_t>(off);
  }
  return -1;
}

void ActivationSpill::Free(uint64_t offset, uint64_t bytes) {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_[offset] = bytes;
}

at::Tensor ActivationSpill::View(const Record& r, const TensorMeta& m) const {
  void* p = arena_->At<uint8_t>(base_ + static_cast<uint64_t>(r.range) + m.offset);
  return at::from_blob(p, m.sizes, at::TensorOptions().dtype(m.dtype).device(c10::kCPU));
}

StatusOr<uint64_t> ActivationSpill::AllocateWaiting(uint64_t bytes) {
  if (bytes > capacity_) {
    return ResourceExhaustedError("a block's activations take " + FormatByteSize(bytes) +
                                  " but the NVMe activation buffer holds " + FormatByteSize(capacity_));
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    RETURN_IF_ERROR(Progress(false));
    const int64_t off = Allocate(bytes);
    if (off >= 0) {
      if (Since(t0) > 1e-4) totals_.wait_seconds += Since(t0);
      return static_cast<uint64_t>(off);
    }
    RETURN_IF_ERROR(Progress(true));
  }
}

StatusOr<uint64_t> ActivationSpill::Put(int block, const std::vector<at::Tensor>& saved) {
  Record r;
  r.block = block;
  for (const auto& t : saved) {
    TensorMeta m;
    m.defined = t.defined();
    if (m.defined) {
      m.sizes = t.sizes().vec();
      m.dtype = t.scalar_type();
      m.offset = r.bytes;
      m.bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
      r.bytes += AlignUp(std::max<uint64_t>(m.bytes, 1));
    }
    r.tensors.push_back(std::move(m));
  }
  ASSIGN_OR_RETURN(uint64_t off, AllocateWaiting(std::max<uint64_t>(r.bytes, kAlign)));
  r.range = static_cast<int64_t>(off);
  r.bytes = std::max<uint64_t>(r.bytes, kAlign);
  r.in_buffer = true;
  for (size_t i = 0; i < saved.size(); ++i) {
    if (!r.tensors[i].defined) continue;
    at::Tensor host = View(r, r.tensors[i]);
    r.copied = streams_->CopyToHost(host, saved[i], "activations " + std::to_string(block) + " to nvme");
    streams_->ReleaseAfterCopies(saved[i]);
  }
  const uint64_t ticket = next_ticket_++;
  records_.emplace(ticket, std::move(r));
  RETURN_IF_ERROR(Progress(false));
  return ticket;
}

Status ActivationSpill::Submit(bool write, uint64_t ticket, Record& r) {
  storage::StoreCommand c;
  c.layer = static_cast<uint32_t>(r.block);
  c.kind = static_cast<uint32_t>(storage::TensorKind::kActivation);
  c.version = write ? ++version_ : storage::kLatestVersion;
  c.offset = base_ + static_cast<uint64_t>(r.range);
  c.bytes = r.bytes;
  const uint64_t id = next_io_++;
  RETURN_IF_ERROR(store_->Submit(write ? storage::StoreOp::kWrite : storage::StoreOp::kRead, id, c)
                      .WithContext("activation store"));
  io_ticket_[id] = ticket;
  (write ? r.writing : r.reading) = true;
  (write ? totals_.write_bytes : totals_.read_bytes) += r.bytes;
  if (write && std::find(written_blocks_.begin(), written_blocks_.end(), r.block) == written_blocks_.end())
    written_blocks_.push_back(r.block);
  return OkStatus();
}

Status ActivationSpill::Collect(int timeout_ms) {
  auto c = store_->NextCompletion(timeout_ms);
  if (!c.ok()) {
    if (timeout_ms >= 0 && c.status().code() == StatusCode::kDeadlineExceeded) return OkStatus();
    return c.status().WithContext("activation store");
  }
  auto it = io_ticket_.find(c->id);
  if (it == io_ticket_.end()) return InternalError("activation store: unexpected completion");
  const uint64_t ticket = it->second;
  io_ticket_.erase(it);
  RETURN_IF_ERROR(c->status().WithContext("activation store I/O"));
  auto rec = records_.find(ticket);
  if (ticket == 0 || rec == records_.end()) {
    // A write whose record was already taken from the buffer: its range may go now.
    for (auto& x : retired_) {
      if (x.ticket == ticket) x.ticket = 0;
    }
    return OkStatus();
  }
  Record& r = rec->second;
  if (r.writing) {
    r.writing = false;
    r.on_disk = true;
    if (!r.wanted) {  // nobody asked for it yet: the buffer range goes back
      Free(static_cast<uint64_t>(r.range), r.bytes);
      r.range = -1;
      r.in_buffer = false;
    }
  } else if (r.reading) {
    r.reading = false;
    r.in_buffer = true;
  }
  return OkStatus();
}

Status ActivationSpill::Progress(bool block) {
  bool moved = false;
  // Writes whose device-to-host copy finished, one in flight per key (block).
  for (auto& [ticket, r] : records_) {
    if (!r.in_buffer || r.writing || r.on_disk || !DeviceStreams::Completed(r.copied)) continue;
    bool busy = false;  // another write of this key in flight: versions commit in order
    for (const auto& [t2, r2] : records_) busy |= t2 != ticket && r2.block == r.block && r2.writing;
    for (const auto& x : retired_) busy |= x.ticket != 0 && x.block == r.block;
    if (busy) continue;
    RETURN_IF_ERROR(Submit(true, ticket, r));
    moved = true;
  }
  // Ranges whose consumer finished.
  for (auto it = retired_.begin(); it != retired_.end();) {
    if (it->ticket == 0 && DeviceStreams::Completed(it->after)) {
      Free(it->offset, it->bytes);
      it = retired_.erase(it);
      moved = true;
    } else {
      ++it;
    }
  }
  while (Outstanding() > 0) {
    const size_t before = io_ticket_.size();
    RETURN_IF_ERROR(Collect(0));
    if (io_ticket_.size() == before) break;
    moved = true;
  }
  if (!block || moved) return OkStatus();
  // Nothing moved: wait for the oldest copy or I/O.
  if (Outstanding() > 0) return Collect(-1);
  for (auto& x : retired_) {
    if (!DeviceStreams::Completed(x.after)) return DeviceStreams::Synchronize(x.after);
  }
  for (auto& [ticket, r] : records_) {
    if (r.in_buffer && !DeviceStreams::Completed(r.copied)) return DeviceStreams::Synchronize(r.copied);
  }
  return InternalError("activation buffer full with nothing in flight (fragmented)");
}

Status ActivationSpill::Prefetch(uint64_t ticket) {
  RETURN_IF_ERROR(Progress(false));
  auto it = records_.find(ticket);
  if (it == records_.end()) return InternalError("no spilled activations for ticket " + std::to_string(ticket));
  Record& r = it->second;
  if (r.in_buffer) {
    r.wanted = true;  // still here (its write may be running): keep it for Take
    return OkStatus();
  }
  if (r.reading) return OkStatus();
  const int64_t off = Allocate(r.bytes);
  if (off < 0) return OkStatus();  // no room yet: Take reads it
  r.range = off;
  return Submit(false, ticket, r);
}

StatusOr<std::vector<at::Tensor>> ActivationSpill::Take(uint64_t ticket, c10::Device device) {
  auto it = records_.find(ticket);
  if (it == records_.end()) return InternalError("no spilled activations for ticket " + std::to_string(ticket));
  const auto t0 = std::chrono::steady_clock::now();
  bool waited = false;
  it->second.wanted = true;
  for (;;) {
    Record& r = it->second;
    if (r.in_buffer && !r.reading) break;
    if (r.reading) {
      RETURN_IF_ERROR(Collect(-1));
    } else {  // on disk only
      ASSIGN_OR_RETURN(uint64_t off, AllocateWaiting(r.bytes));
      it = records_.find(ticket);
      it->second.range = static_cast<int64_t>(off);
      RETURN_IF_ERROR(Submit(false, ticket, it->second));
    }
    waited = true;
    it = records_.find(ticket);
  }
  RETURN_IF_ERROR(DeviceStreams::Synchronize(it->second.copied));  // no-op unless it was just copied
  if (waited) totals_.wait_seconds += Since(t0);
  Record r = std::move(it->second);
  records_.erase(it);
  std::vector<at::Tensor> out;
  DeviceStreams::EventPtr last;
  for (const auto& m : r.tensors) {
    if (!m.defined) {
      out.emplace_back();
      continue;
    }
    at::Tensor host = View(r, m);
    if (device.is_cpu()) {
      out.push_back(host.clone());
      continue;
    }
    at::Tensor d = at::empty(m.sizes, at::TensorOptions().dtype(m.dtype).device(device));
    last = streams_->CopyToDevice(d, host, "activations " + std::to_string(r.block) + " from nvme");
    streams_->ComputeWaits(last);
    out.push_back(d);
  }
  // The range goes back once the copies out of it and any write still reading it are done.
  // A write not yet submitted never will be (the record is gone).
  retired_.push_back({static_cast<uint64_t>(r.range), r.bytes, last, r.writing ? ticket : 0, r.block});
  RETURN_IF_ERROR(Progress(false));
  return out;
}

void ActivationSpill::AddRuntime(RuntimeStats* out) const {
  if (store_) out->stores.push_back(StoreRuntimeStats(*store_, "activations"));
}

SpillTotals ActivationSpill::TakeTotals() {
  SpillTotals t = totals_;
  totals_ = {};
  return t;
}

}  // namespace offloadd::trainer
