#include "trainer/state_placement.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>

#include "common/units.h"

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
  return out.empty() ? "no blocks" : out;
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

StatusOr<StatePlacement> PlaceStatesUnderLimit(HostMemoryInputs* in, uint64_t limit,
                                               uint64_t disk_free) {
  HostOptimizerOptions& o = in->optimizer;
  o.nvme_blocks.clear();
  const HostMemoryPrediction all = PredictHostMemory(*in);  // every block's states on NVMe
  const uint64_t ram_left = all.total < limit ? limit - all.total : 0;
  std::vector<BlockStateBytes> blocks;
  for (uint64_t n : o.block_elements) {
    BlockStateBytes b;
    // HostOptimizer::ArenaBytes: three regions (and their rounding) in the arena; with fp32
    // compute an NVMe block's fp32 compute copy goes away.
    b.ram =
        3 * RoundUp(n * 4) + 2 * kPage * 3 - (o.compute == HostDtype::kFp32 ? RoundUp(n * 4) : 0);
    b.disk = 12 * n;
    blocks.push_back(b);
  }
  // The disk is checked below, with what is in flight beside the states for this placement (the
  // new versions of its largest NVMe block, not of the model's largest).
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
  const HostMemoryPrediction placed = PredictHostMemory(*in);
  if (placed.disk_bytes > disk_free) {
    const uint64_t nvme_blocks = blocks.size() - static_cast<size_t>(p.ram_blocks());
    const Status refused = ResourceExhaustedError(
        "the optimizer states need " + FormatByteSize(placed.disk_bytes) + " on NVMe (" +
        std::to_string(nvme_blocks) + " of " + std::to_string(blocks.size()) + " blocks, " +
        FormatByteSize(p.disk_bytes) + " of states and the new versions in flight) beside " +
        FormatByteSize(p.ram_bytes) + " in RAM, but the store directories have " +
        FormatByteSize(disk_free) +
        " free; free disk space, add a store directory or raise the host memory limit");
    o.nvme_blocks.clear();
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
