#include "trainer/state_placement.h"

#include "common/units.h"

namespace offloadd::trainer {
namespace {

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
  if (ram > 0) out += "blocks " + Ranges(tiers, BlockTier::kRam) + " in RAM (" + FormatByteSize(ram_bytes) + ")";
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
  uint64_t ram_left = ram_available;
  for (size_t b = 0; b < blocks.size(); ++b) {
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

}  // namespace offloadd::trainer
