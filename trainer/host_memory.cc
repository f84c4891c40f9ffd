#include "trainer/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <vector>

#include "common/units.h"

namespace offloadd::trainer {

uint64_t DefaultHostMemoryLimit(uint64_t configured, uint64_t ram_bytes) {
  if (configured > 0) return configured;
  return ram_bytes / 100 * kDefaultHostMemoryPercent;
}

uint64_t HostRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

HostMemoryPrediction PredictHostMemory(const HostMemoryInputs& in) {
  HostMemoryPrediction p;
  const HostOptimizerOptions& o = in.optimizer;
  p.arena = HostOptimizer::ArenaBytes(o);
  p.checkpoints = in.checkpoint_bytes;
  p.device = in.device_batch_bytes + in.device_fixed_bytes;
  p.processes = kTrainerProcessBytes + (in.cuda ? kCudaContextHostBytes : 0) + kCheckpointReaderBytes +
                uint64_t{std::max<uint32_t>(1, o.worker_processes)} * kWorkerProcessBytes;
  if (o.tier == StateTier::kNvme) {
    p.processes += kStoreProcessBytes;
    uint64_t largest = 0;
    for (size_t b = 0; b < o.block_elements.size(); ++b) {
      if (!o.nvme_blocks.empty() && !o.nvme_blocks[b]) continue;  // its states in RAM
      p.nvme_params += o.block_elements[b];
      largest = std::max(largest, o.block_elements[b]);
    }
    // 12 B per parameter, and the new versions in flight: a write takes new extents and the old
    // ones return after its commit (storage/README.md), one per staging slot and one committing.
    p.disk_bytes = 12 * p.nvme_params + 12 * largest * (uint64_t{o.nvme_slots} + 1);
  }
  if (in.spill_disk_bytes > 0 && o.tier != StateTier::kNvme) p.processes += kStoreProcessBytes;
  p.disk_bytes += in.spill_disk_bytes;
  p.total = p.arena + p.checkpoints + p.device + p.processes;
  return p;
}

std::string HostMemoryPrediction::Describe() const {
  std::string s = "host RAM " + FormatByteSize(total) + " (arena " + FormatByteSize(arena);
  if (checkpoints > 0) s += ", activation checkpoints in pinned RAM " + FormatByteSize(checkpoints);
  if (device > 0) s += ", the CPU device's activations " + FormatByteSize(device);
  s += ", processes " + FormatByteSize(processes) + ")";
  s += disk_bytes > 0 ? "; disk " + FormatByteSize(disk_bytes) +
                            (nvme_params > 0 ? " (" + std::to_string(nvme_params) +
                                                   " parameters' fp32 master and AdamW states, and the "
                                                   "new versions in flight)"
                                             : "")
                      : "; disk none";
  return s;
}

double NvmeStepSeconds(uint64_t nvme_params, double read_bytes_per_s, double write_bytes_per_s) {
  if (nvme_params == 0 || read_bytes_per_s <= 0 || write_bytes_per_s <= 0) return 0;
  const double bytes = 12.0 * static_cast<double>(nvme_params);
  // Reads and writes share the drives: their times add.
  return bytes / read_bytes_per_s + bytes / write_bytes_per_s;
}

Status CheckHostMemory(const HostMemoryInputs& in, uint64_t limit, const std::string& limit_source,
                       uint64_t ram_bytes, const HostMemoryNames& names) {
  const HostMemoryPrediction p = PredictHostMemory(in);
  if (limit == 0 || p.total <= limit) return OkStatus();
  std::vector<std::string> fixes;
  // A lower micro-batch: what scales with it are the checkpoints and a CPU device's activations.
  const uint64_t per_batch = in.checkpoint_bytes + in.device_batch_bytes;
  if (per_batch > 0 && in.micro > 1 && p.total - per_batch < limit) {
    const uint64_t room = limit - (p.total - per_batch);
    const auto m = static_cast<int64_t>(static_cast<double>(room) / static_cast<double>(per_batch) *
                                        static_cast<double>(in.micro));
    if (m >= 1) {
      fixes.push_back("micro-batch " + std::to_string(std::min(m, in.micro - 1)) + " (" + names.batch +
                      ", with gradient accumulation to keep the global batch)");
    }
  }
  if (in.optimizer.tier == StateTier::kCpu) {
    HostMemoryInputs nv = in;
    nv.optimizer.tier = StateTier::kNvme;
    const HostMemoryPrediction q = PredictHostMemory(nv);
    if (q.total <= limit) {
      fixes.push_back("the optimizer states on NVMe (" + names.nvme + "): " + q.Describe() +
                      (names.nvme_configured ? "" : "; this needs a store directory"));
    }
  }
  // A higher limit only while the kernel, the page cache and the daemon keep a tenth of the RAM.
  if (ram_bytes == 0 || p.total <= ram_bytes / 100 * kMaxHostMemoryPercent) {
    fixes.push_back("a host memory limit of at least " + FormatByteSize(p.total) + " (" + names.limit +
                    (ram_bytes > 0 ? "; this node has " + FormatByteSize(ram_bytes) + " of RAM" : "") + ")");
  }
  std::string msg = "the job needs " + p.Describe() + ", more than the host memory limit of " +
                    FormatByteSize(limit) + " (" + limit_source + ")";
  if (fixes.empty()) {
    msg += "; nothing smaller fits: not even with the optimizer states on NVMe (a smaller model, or a node "
           "with more RAM)";
  } else {
    msg += "; it would fit with ";
    for (size_t i = 0; i < fixes.size(); ++i) msg += (i == 0 ? "" : ", or ") + fixes[i];
  }
  return ResourceExhaustedError(msg);
}

}  // namespace offloadd::trainer
