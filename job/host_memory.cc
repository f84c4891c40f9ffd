#include "job/host_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "common/units.h"
#include "job/arena_layout.h"
#include "job/capacity.h"

namespace offloadd::trainer {

namespace {

// "Key:   123 kB" of a meminfo-style file, in bytes; 0 when absent.
uint64_t MeminfoBytes(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream v(line.substr(key.size() + 1));
    uint64_t n = 0;
    std::string unit;
    v >> n >> unit;
    return unit == "kB" ? n * 1024 : n;
  }
  return 0;
}

// A cgroup v2 file holding one number ("max": 0).
uint64_t CgroupNumber(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(word.c_str(), &end, 10);
  return end != word.c_str() && *end == '\0' ? v : 0;
}

// Whether CAP_IPC_LOCK (bit 14) is effective: then RLIMIT_MEMLOCK does not bound pinning.
bool HasIpcLock(const std::string& proc_root) {
  std::ifstream in(proc_root + "/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    const unsigned long long caps = std::strtoull(line.c_str() + 7, nullptr, 16);
    return (caps >> 14) & 1;
  }
  return false;
}

// The bytes of memory.stat's `keys` summed ("anon 123\nfile 456\n...").
uint64_t CgroupStatSum(const std::string& path, std::initializer_list<std::string_view> keys) {
  std::ifstream in(path);
  std::string key;
  uint64_t value = 0;
  uint64_t sum = 0;
  while (in >> key >> value) {
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) sum += value;
  }
  return sum;
}

}  // namespace

NodeMemory ProbeNodeMemory(const std::string& proc_root, const std::string& cgroup_root) {
  NodeMemory m;
  m.total = MeminfoBytes(proc_root + "/meminfo", "MemTotal");
  m.available = MeminfoBytes(proc_root + "/meminfo", "MemAvailable");
  // cgroup v2: the one line "0::/path"; the nearest memory.max on the way up bounds us.
  std::ifstream cg(proc_root + "/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::string dir = line.substr(3);
    while (true) {
      const std::string at = cgroup_root + (dir == "/" ? "" : dir);
      const uint64_t max = CgroupNumber(at + "/memory.max");
      if (max > 0) {
        m.cgroup_max = max;
        m.cgroup_usage = CgroupNumber(at + "/memory.current");
        m.cgroup_reclaimable = std::min(
            m.cgroup_usage, CgroupStatSum(at + "/memory.stat",
                                          {"active_file", "inactive_file", "slab_reclaimable"}));
        break;
      }
      if (dir.empty() || dir == "/") break;
      const size_t slash = dir.rfind('/');
      dir = slash == 0 || slash == std::string::npos ? "/" : dir.substr(0, slash);
    }
  }
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      !HasIpcLock(proc_root)) {
    m.memlock = lim.rlim_cur;
  }
  return m;
}

uint64_t HostMemoryReserve(uint64_t total_bytes) {
  return std::max(kHostReserveMinBytes, total_bytes / 100 * kHostReservePercent);
}

HostMemoryLimit DefaultHostMemoryLimit(uint64_t configured, const NodeMemory& node) {
  HostMemoryLimit l;
  if (configured > 0) {
    l.bytes = configured;
    l.source = "the daemon's memory.host_memory_limit";
    return l;
  }
  if (node.total == 0) return l;  // nothing known to limit by
  uint64_t can = node.available > 0 ? node.available : node.total;
  std::string what = FormatByteSize(can) + (node.available > 0 ? " available" : " of RAM");
  if (node.cgroup_max > 0) {
    const uint64_t held = node.cgroup_usage - std::min(node.cgroup_usage, node.cgroup_reclaimable);
    const uint64_t room = node.cgroup_max > held ? node.cgroup_max - held : 0;
    if (room < can) {
      can = room;
      what = FormatByteSize(room) + " left under the cgroup's memory.max of " +
             FormatByteSize(node.cgroup_max);
    }
  }
  const uint64_t reserve = HostMemoryReserve(node.total);
  // Nothing left is a limit of 1 byte, which refuses every job, never 0 (no limit).
  l.bytes = can > reserve ? can - reserve : 1;
  l.source = "the default: what this node can give now, " + what + " less a reserve of " +
             FormatByteSize(reserve) + " (the larger of 4 GiB and " +
             std::to_string(kHostReservePercent) + "% of its " + FormatByteSize(node.total) +
             " of RAM)";
  if (node.pinned && node.memlock > 0 && node.memlock < l.bytes) {
    l.bytes = node.memlock;
    l.source =
        "the default: the memlock limit of " + FormatByteSize(node.memlock) +
        " (the arena is pinned; raise it with `ulimit -l unlimited` or LimitMEMLOCK=infinity)";
  }
  return l;
}

HostMemoryPrediction PredictHostMemory(const HostMemoryInputs& in) {
  HostMemoryPrediction p;
  const HostOptimizerOptions& o = in.optimizer;
  p.arena = ArenaBytes(o);
  p.arena_bytes_per_param = ArenaBytesPerParameter(o);
  p.mode = o.mode;
  p.checkpoints = in.checkpoint_bytes;
  p.spill_buffer = in.spill_buffer_bytes;
  // device_fixed_bytes: a CPU device's own weight copy; across hosts (ZeRO-1, where
  // optimizer.block_elements are one host's slice of each block) the whole weights the host's
  // ranks read, one copy per host (Trainer::Impl::full_weights).
  p.device = in.device_batch_bytes + in.device_fixed_bytes;
  p.processes = kTrainerProcessBytes + (in.cuda ? kCudaContextHostBytes : 0) + kCheckpointReaderBytes +
                uint64_t{std::max<uint32_t>(1, o.worker_processes)} * kWorkerProcessBytes;
  if (o.tier == StateTier::kNvme) {
    p.processes += kStoreProcessBytes;
    uint64_t largest = 0;
    for (size_t b = 0; b < o.block_elements.size(); ++b) {
      if (!o.nvme_blocks.empty() && !o.nvme_blocks[b]) continue;  // its states in RAM
      p.nvme_params += o.block_elements[b];
      p.disk_bytes += internal::StoredStateBytes(o.mode, o.block_elements[b]);
      largest = std::max(largest, o.block_elements[b]);
    }
    // The master and states in the mode's bytes (12 B per parameter exact, 6.03 with int8 states),
    // and the new versions in flight: a write takes new extents and the old ones return after its
    // commit (storage/README.md), one per staging slot and one committing.
    p.disk_bytes += internal::StoredStateBytes(o.mode, largest) * (uint64_t{o.nvme_slots} + 1);
    // The 16-bit weights of the blocks that keep them in the store too, and their versions in
    // flight alike.
    uint64_t largest_w = 0;
    for (size_t b = 0; b < o.block_elements.size(); ++b) {
      if (!internal::WeightsOnNvme(o, b)) continue;
      p.nvme_weight_params += o.block_elements[b];
      largest_w = std::max(largest_w, o.block_elements[b]);
    }
    p.disk_bytes += 2 * p.nvme_weight_params + 2 * largest_w * (uint64_t{o.nvme_slots} + 1);
  }
  if (in.spill_disk_bytes > 0 && o.tier != StateTier::kNvme) p.processes += kStoreProcessBytes;
  p.disk_bytes += in.spill_disk_bytes;
  p.total = p.arena + p.checkpoints + p.spill_buffer + p.device + p.processes;
  return p;
}

std::string HostMemoryPrediction::Describe() const {
  std::string s = "host RAM " + FormatByteSize(total) + " (arena " + FormatByteSize(arena);
  if (!mode.Exact()) {
    char per[32];
    std::snprintf(per, sizeof per, "%.3g", arena_bytes_per_param);
    s += std::string(" at ") + per + " B/parameter, " + mode.Describe();
  }
  if (checkpoints > 0) s += ", activation checkpoints in pinned RAM " + FormatByteSize(checkpoints);
  if (spill_buffer > 0) s += ", NVMe activations' staging buffer " + FormatByteSize(spill_buffer);
  if (device > 0) s += ", the device's weights and activations " + FormatByteSize(device);
  s += ", processes " + FormatByteSize(processes) + ")";
  if (disk_bytes == 0) return s + "; disk none";
  s += "; disk " + FormatByteSize(disk_bytes);
  if (nvme_params == 0) return s;
  s += " (" + std::to_string(nvme_params) + " parameters' ";
  s += mode.Exact() ? std::string("fp32 master and AdamW states")
                    : "master and AdamW states in their " +
                          std::string(workers::MasterDtypeName(mode.master)) + "/" +
                          std::string(workers::StateDtypeName(mode.state)) + " bytes";
  if (nvme_weight_params > 0)
    s += ", " + std::to_string(nvme_weight_params) + " parameters' 16-bit weights";
  s += ", and the new versions in flight)";
  return s;
}

double NvmeStepSeconds(uint64_t nvme_params, double read_bytes_per_s, double write_bytes_per_s,
                       double state_bytes_per_param) {
  if (nvme_params == 0 || read_bytes_per_s <= 0 || write_bytes_per_s <= 0) return 0;
  const double bytes = state_bytes_per_param * static_cast<double>(nvme_params);
  // Reads and writes share the drives: their times add.
  return bytes / read_bytes_per_s + bytes / write_bytes_per_s;
}

Status CheckHostMemory(const HostMemoryInputs& in, uint64_t limit, const std::string& limit_source,
                       uint64_t node_limit, const HostMemoryNames& names) {
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
  // Offloaded layer inputs: with a store directory the planner sends the lowest ones to NVMe
  // (trainer/checkpoint_placement.h); offered when all of them there, less their store, would fit.
  if (in.checkpoint_bytes > 0 && !names.nvme_configured &&
      p.total - in.checkpoint_bytes + kStoreProcessBytes < limit) {
    fixes.push_back("the layer inputs on NVMe (" + names.nvme_dir + ")");
  }
  if (in.optimizer.tier == StateTier::kCpu && !names.nvme.empty()) {
    HostMemoryInputs nv = in;
    nv.optimizer.tier = StateTier::kNvme;
    const HostMemoryPrediction q = PredictHostMemory(nv);
    if (q.total <= limit) {
      fixes.push_back("the optimizer states on NVMe (" + names.nvme + "): " + q.Describe() +
                      (names.nvme_configured ? "" : "; this needs a store directory"));
    }
  }
  if (in.optimizer.tier == StateTier::kNvme && !in.nvme_weights_forced &&
      in.optimizer.compute != HostDtype::kFp32 &&
      std::all_of(in.optimizer.nvme_blocks.begin(), in.optimizer.nvme_blocks.end(),
                  [](bool on_nvme) { return on_nvme; })) {
    // Every block's states are on NVMe already: their 16-bit weights may follow.
    HostMemoryInputs w = in;
    w.optimizer.nvme_weight_blocks.assign(w.optimizer.block_elements.size(), false);
    for (size_t b = 0; b < w.optimizer.nvme_weight_blocks.size(); ++b)
      w.optimizer.nvme_weight_blocks[b] =
          !(b < w.optimizer.device_blocks.size() && w.optimizer.device_blocks[b]);
    const HostMemoryPrediction q = PredictHostMemory(w);
    if (q.total <= limit && q.total < p.total)
      fixes.push_back("the 16-bit weights on NVMe too (" + names.param_nvme + "): " + q.Describe());
  }
  // A higher limit only up to what the node can give safely (DefaultHostMemoryLimit).
  if (node_limit == 0 || p.total <= node_limit) {
    fixes.push_back(
        "a host memory limit of at least " + FormatByteSize(p.total) + " (" + names.limit +
        (node_limit > 0 ? "; this node can give " + FormatByteSize(node_limit) : "") + ")");
  }
  // Not exact, so after every exact change: the states in RAM in fewer bytes.
  if (std::optional<std::string> compact = CompactModeFix(in, limit)) fixes.push_back(*compact);
  std::string msg = "the job needs " + p.Describe() + ", more than the host memory limit of " +
                    FormatByteSize(limit) + " (" + limit_source + ")";
  if (fixes.empty()) {
    msg +=
        "; nothing smaller fits: not even with the optimizer states on NVMe (a smaller model, or a "
        "node "
        "with more free RAM)";
  } else {
    msg += "; it would fit with ";
    for (size_t i = 0; i < fixes.size(); ++i) msg += (i == 0 ? "" : ", or ") + fixes[i];
  }
  return ResourceExhaustedError(msg);
}

}  // namespace offloadd::trainer
