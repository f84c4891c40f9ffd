#include "job/state_placement.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <set>

#include "common/units.h"
#include "job/arena_layout.h"
#include "job/capacity.h"

namespace offloadd::trainer {
namespace {

constexpr uint64_t kPage = 4096;
uint64_t RoundUp(uint64_t v) { return (v + kPage - 1) / kPage * kPage; }

// "0-11, 14" for the blocks whose tier is `tier`.
std::string Ranges(const std::vector<BlockTier>& tiers, BlockTier tier) {
  std::string out;
  const int n = static_cast<int>(tiers.size());
  for (int b = 0; b < n;) {
    if (tiers[b] != tier) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < n && tiers[e + 1] == tier) ++e;
    if (!out.empty()) out += ", ";
    out += std::to_string(b) + (e > b ? "-" + std::to_string(e) : "");
    b = e + 1;
  }
  return out;
}

}  // namespace

int StatePlacement::ram_blocks() const {
  int n = 0;
  for (BlockTier t : tiers) n += t == BlockTier::kRam ? 1 : 0;
  return n;
}

std::vector<bool> StatePlacement::nvme_blocks() const {
  std::vector<bool> out(tiers.size());
  for (size_t b = 0; b < tiers.size(); ++b) out[b] = tiers[b] == BlockTier::kNvme;
  return out;
}

std::vector<bool> StatePlacement::nvme_weight_blocks() const {
  std::vector<bool> out(weight_tiers.size());
  for (size_t b = 0; b < weight_tiers.size(); ++b) out[b] = weight_tiers[b] == BlockTier::kNvme;
  return out;
}

std::string StatePlacement::Describe() const {
  const int ram = ram_blocks();
  const int nvme = static_cast<int>(tiers.size()) - ram;
  std::string out;
  if (ram > 0)
    out +=
        "blocks " + Ranges(tiers, BlockTier::kRam) + " in RAM (" + FormatByteSize(ram_bytes) + ")";
  if (nvme > 0) {
    out += (ram > 0 ? ", " : "blocks ") + Ranges(tiers, BlockTier::kNvme) + " on NVMe (" +
           FormatByteSize(disk_bytes) + ")";
  }
  if (out.empty()) return "no blocks";
  if (weight_disk_bytes > 0) out += "; " + DescribeWeights();
  return out;
}

std::string StatePlacement::DescribeWeights() const {
  if (weight_disk_bytes == 0) return "";
  return "16-bit weights of blocks " + Ranges(weight_tiers, BlockTier::kNvme) + " on NVMe (" +
         FormatByteSize(weight_disk_bytes) + ")";
}

StatusOr<StatePlacement> PlaceBlockStates(const std::vector<BlockStateBytes>& blocks,
                                          uint64_t ram_available, uint64_t disk_free) {
  StatePlacement p;
  p.tiers.assign(blocks.size(), BlockTier::kNvme);
  std::vector<size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return blocks[a].ram > blocks[b].ram; });
  uint64_t ram_left = ram_available;
  for (size_t b : order) {
    if (blocks[b].ram <= ram_left) {
      p.tiers[b] = BlockTier::kRam;
      ram_left -= blocks[b].ram;
      p.ram_bytes += blocks[b].ram;
    } else {
      p.disk_bytes += blocks[b].disk;
    }
  }
  if (p.disk_bytes > disk_free) {
    return ResourceExhaustedError(
        "the optimizer states need " + FormatByteSize(p.disk_bytes) + " on NVMe (" +
        std::to_string(blocks.size() - static_cast<size_t>(p.ram_blocks())) + " of " +
        std::to_string(blocks.size()) + " blocks) beside " + FormatByteSize(p.ram_bytes) +
        " in RAM, but the store directories have " + FormatByteSize(disk_free) +
        " free; free disk space, add a store directory or raise the host memory limit");
  }
  return p;
}

namespace {

// PlaceStatesUnderLimit without the disk check: the placement under `limit` and the prediction
// with it (in->optimizer.nvme_blocks set to it).
StatusOr<StatePlacement> PlaceInRam(HostMemoryInputs* in, uint64_t limit) {
  HostOptimizerOptions& o = in->optimizer;
  o.nvme_blocks.clear();
  const HostMemoryPrediction all = PredictHostMemory(*in);  // every block's states on NVMe
  const uint64_t ram_left = all.total < limit ? limit - all.total : 0;
  std::vector<BlockStateBytes> blocks;
  HostOptimizerOptions in_ram = o;  // each block as it would be in RAM
  in_ram.nvme_blocks.assign(o.block_elements.size(), false);
  for (size_t i = 0; i < o.block_elements.size(); ++i) {
    const uint64_t n = o.block_elements[i];
    BlockStateBytes b;
    // ArenaBytes: three regions in the mode's formats (and their rounding) in the arena; the
    // compute copy the block has on NVMe (fp32 compute's master, a bf16 master's half) goes away,
    // and with 16-bit compute and an fp32 master its 16-bit copy, where the device reads the
    // master in RAM instead (internal::BlockWeightsFp32).
    b.ram = internal::ArenaStateBytes(o.mode, n) + 2 * kPage * 3 -
            RoundUp(internal::NvmeComputeCopyBytes(o, i)) -
            (o.compute != HostDtype::kFp32 && internal::BlockWeightsFp32(in_ram, i) ? RoundUp(n * 2)
                                                                                    : 0);
    b.disk = internal::StoredStateBytes(o.mode, n);
    blocks.push_back(b);
  }
  // The disk is checked by the caller, with what is in flight beside the states for this
  // placement (the new versions of its largest NVMe block, not of the model's largest).
  ASSIGN_OR_RETURN(StatePlacement p,
                   PlaceBlockStates(blocks, ram_left, std::numeric_limits<uint64_t>::max()));
  o.nvme_blocks = p.nvme_blocks();
  // The staging slots were sized for the largest block; with it in RAM they shrink, and the RAM
  // they free takes more blocks (in block order).
  for (bool moved = true; moved && p.ram_blocks() < static_cast<int>(blocks.size());) {
    const uint64_t total = PredictHostMemory(*in).total;
    uint64_t left = total < limit ? limit - total : 0;
    moved = false;
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (p.tiers[b] != BlockTier::kNvme || blocks[b].ram > left) continue;
      p.tiers[b] = BlockTier::kRam;
      left -= blocks[b].ram;
      p.ram_bytes += blocks[b].ram;
      p.disk_bytes -= blocks[b].disk;
      moved = true;
    }
    o.nvme_blocks = p.nvme_blocks();
  }
  return p;
}

}  // namespace

// The disk a placement needs only falls as the limit rises (more blocks in RAM), so a bisection
// finds the smallest limit.
uint64_t SmallestHostLimitForDisk(const HostMemoryInputs& in, uint64_t limit, uint64_t disk_free) {
  constexpr uint64_t kStep = uint64_t{1} << 20;
  HostMemoryInputs t = in;
  t.optimizer.nvme_weight_blocks.clear();  // the weights in RAM: the least disk
  auto fits = [&](uint64_t l) {
    return PlaceInRam(&t, l).ok() && PredictHostMemory(t).disk_bytes <= disk_free;
  };
  // Every block in RAM needs no disk for the states (the spilled activations' disk no limit
  // changes). The placement reaches it once the limit also holds, while the last NVMe block is
  // placed, the staging slots that block still has: three regions of the largest block per slot
  // (in the mode's formats).
  uint64_t largest = 0;
  for (uint64_t n : t.optimizer.block_elements) largest = std::max(largest, n);
  const uint64_t slots = std::max<uint32_t>(2, t.optimizer.nvme_slots);
  t.optimizer.nvme_blocks.assign(t.optimizer.block_elements.size(), false);
  uint64_t hi = PredictHostMemory(t).total +
                slots * internal::ArenaStateBytes(t.optimizer.mode, largest) + kStep;
  if (!fits(hi)) return 0;
  if (limit >= hi || fits(limit)) return limit;
  uint64_t lo = limit;  // does not fit
  while (hi - lo > kStep) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? hi : lo) = mid;
  }
  return (hi + kStep - 1) / kStep * kStep;
}

namespace {

// States first, then weights (PlaceStatesUnderLimit): while the prediction is above `limit`, the
// 16-bit weights of one more NVMe block go to the store: the smallest first (the slots' and
// buffers' weight regions grow to the largest such block), equal ones from the last block down.
void PlaceWeights(HostMemoryInputs* in, uint64_t limit, StatePlacement* p) {
  HostOptimizerOptions& o = in->optimizer;
  const size_t n = o.block_elements.size();
  o.nvme_weight_blocks.assign(n, false);
  p->weight_tiers.assign(n, BlockTier::kRam);
  p->weight_disk_bytes = 0;
  const bool forced = in->nvme_weights_forced;
  if (o.compute == HostDtype::kFp32 || (!forced && PredictHostMemory(*in).total <= limit)) {
    o.nvme_weight_blocks.clear();
    return;
  }
  std::vector<size_t> order;
  for (size_t b = n; b-- > 0;) {
    const bool on_device = b < o.device_blocks.size() && o.device_blocks[b];
    if (p->tiers[b] == BlockTier::kNvme && !on_device) order.push_back(b);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return o.block_elements[a] < o.block_elements[b]; });
  for (size_t b : order) {
    if (!forced && PredictHostMemory(*in).total <= limit) break;
    o.nvme_weight_blocks[b] = true;
    p->weight_tiers[b] = BlockTier::kNvme;
    p->weight_disk_bytes += 2 * o.block_elements[b];
  }
}

}  // namespace

StatePlacement PlaceWeightsOnNvme(HostMemoryInputs* in, uint64_t limit) {
  StatePlacement p;
  const std::vector<bool>& nvme = in->optimizer.nvme_blocks;
  const size_t n = in->optimizer.block_elements.size();
  p.tiers.assign(n, BlockTier::kNvme);
  for (size_t b = 0; b < n && !nvme.empty(); ++b) {
    if (!nvme[b]) p.tiers[b] = BlockTier::kRam;
  }
  if (in->optimizer.tier != StateTier::kNvme || !in->nvme_weights_allowed) {
    in->optimizer.nvme_weight_blocks.clear();
    p.weight_tiers.assign(n, BlockTier::kRam);
    return p;
  }
  PlaceWeights(in, limit, &p);
  return p;
}

StatusOr<StatePlacement> PlaceStatesUnderLimit(HostMemoryInputs* in, uint64_t limit,
                                               uint64_t disk_free) {
  in->optimizer.nvme_weight_blocks.clear();
  ASSIGN_OR_RETURN(StatePlacement p, PlaceInRam(in, limit));
  if (in->nvme_weights_allowed) PlaceWeights(in, limit, &p);
  const HostMemoryPrediction placed = PredictHostMemory(*in);
  if (placed.disk_bytes > disk_free) {
    const size_t n = in->optimizer.block_elements.size();
    const uint64_t nvme_blocks = n - static_cast<size_t>(p.ram_blocks());
    std::string fixes = FormatByteSize(placed.disk_bytes - disk_free) +
                        " more free disk (free disk space or add a store directory)";
    const uint64_t smallest = SmallestHostLimitForDisk(*in, limit, disk_free);
    if (smallest > 0) {
      fixes += ", or a host memory limit of at least " + FormatByteSize(smallest) +
               " (more blocks' states in RAM)";
    }
    if (std::optional<std::string> compact = CompactModeFix(*in, limit))
      fixes += ", or " + *compact;
    const Status refused = ResourceExhaustedError(
        "the optimizer states need " + FormatByteSize(placed.disk_bytes) + " on NVMe (" +
        std::to_string(nvme_blocks) + " of " + std::to_string(n) + " blocks, " +
        FormatByteSize(p.disk_bytes) + " of states" +
        (p.weight_disk_bytes > 0 ? ", " + FormatByteSize(p.weight_disk_bytes) + " of 16-bit weights"
                                 : "") +
        " and the new versions in flight) beside " + FormatByteSize(p.ram_bytes) +
        " in RAM, but the store directories have " + FormatByteSize(disk_free) +
        " free (under the host memory limit of " + FormatByteSize(limit) + "); it would fit with " +
        fixes);
    in->optimizer.nvme_blocks.clear();
    in->optimizer.nvme_weight_blocks.clear();
    return refused;
  }
  return p;
}

uint64_t StoreDirsFreeBytes(const std::vector<std::string>& dirs) {
  std::set<unsigned long> seen;  // file systems counted
  uint64_t free_bytes = 0;
  bool any = false;
  for (std::string d : dirs) {
    struct statvfs fs;
    struct stat st;
    bool found = false;
    while (!d.empty()) {
      if (::statvfs(d.c_str(), &fs) == 0 && ::stat(d.c_str(), &st) == 0) {
        found = true;
        break;
      }
      const size_t slash = d.find_last_of('/');  // the parent: "a/b" -> "a", "/a" -> "/"
      d = slash == std::string::npos || d == "/" ? "" : slash == 0 ? "/" : d.substr(0, slash);
    }
    if (!found) continue;
    any = true;
    if (!seen.insert(static_cast<unsigned long>(st.st_dev)).second) continue;
    free_bytes += static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  }
  return any ? free_bytes : std::numeric_limits<uint64_t>::max();
}

}  // namespace offloadd::trainer
