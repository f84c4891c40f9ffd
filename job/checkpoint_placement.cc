#include "job/checkpoint_placement.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/units.h"

namespace offloadd::trainer {
namespace {

constexpr uint64_t kRecordAlign = 4096;  // ActivationSpill's parts
constexpr uint64_t kSpillRecords = 5;    // records the staging buffer holds
constexpr uint64_t kKeepBufferMin = 64ull << 20;

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

// "0-5", "3", "0-2, 7".
std::string Ranges(const std::vector<int>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(layers[i]);
    if (j > i) out += "-" + std::to_string(layers[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

uint64_t SpillRecordBytes(uint64_t bytes) {
  return (std::max<uint64_t>(bytes, 1) + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}

uint64_t ActivationSpillBufferBytes(uint64_t largest_keep_record, uint64_t largest_checkpoint) {
  uint64_t b = 0;
  if (largest_keep_record > 0) b = std::max(kKeepBufferMin, kSpillRecords * largest_keep_record);
  if (largest_checkpoint > 0) b = std::max(b, kSpillRecords * SpillRecordBytes(largest_checkpoint));
  return b;
}

CheckpointPlacement PlaceCheckpoints(const CheckpointPlacementInputs& in) {
  CheckpointPlacement p;
  const int n = static_cast<int>(in.bytes.size());
  p.to_nvme.assign(n, false);
  for (uint64_t c : in.bytes) p.ram_bytes += c;
  const uint64_t base_buffer = ActivationSpillBufferBytes(in.largest_keep_record, 0);
  if (in.ram_over > 0 && in.nvme_configured) {
    uint64_t largest = 0;
    for (int b = 0; b < n; ++b) {  // lowest first: written first, read back last
      if (in.bytes[b] == 0) continue;
      p.to_nvme[b] = true;
      ++p.moved;
      p.ram_bytes -= in.bytes[b];
      p.nvme_bytes += in.bytes[b];
      p.disk_bytes += SpillRecordBytes(in.bytes[b]);
      largest = std::max(largest, in.bytes[b]);
      p.buffer_bytes = ActivationSpillBufferBytes(in.largest_keep_record, largest);
      const uint64_t added = p.buffer_bytes - base_buffer;
      if (p.nvme_bytes > added && p.nvme_bytes - added >= in.ram_over) break;
    }
    // Each key's new version takes new extents before the old one returns: at most the buffer's
    // records are in flight.
    if (p.moved > 0) p.disk_bytes += kSpillRecords * SpillRecordBytes(largest);
  }
  const double A = std::max(1, in.accumulation);
  if (p.moved > 0 && in.write_bytes_per_s > 0 && in.read_bytes_per_s > 0) {
    uint64_t largest = 0;
    for (int b = 0; b < n; ++b) {
      if (p.to_nvme[b]) largest = std::max(largest, in.bytes[b]);
    }
    auto io = [&](double bytes) {
      return A * (bytes / in.write_bytes_per_s + bytes / in.read_bytes_per_s);
    };
    p.nvme_seconds = io(static_cast<double>(p.nvme_bytes));
    p.per_layer_seconds = io(static_cast<double>(largest));
  }
  return p;
}

std::string CheckpointPlacement::Describe(const CheckpointPlacementInputs& in) const {
  std::vector<int> nvme, ram;
  // Decoder layer l is block l + 1.
  for (size_t b = 0; b < in.bytes.size(); ++b) {
    if (in.bytes[b] == 0) continue;
    (to_nvme[b] ? nvme : ram).push_back(static_cast<int>(b) - 1);
  }
  std::ostringstream o;
  o << "layer inputs: ";
  if (!nvme.empty()) {
    o << (nvme.size() == 1 ? "layer " : "layers ") << Ranges(nvme) << " on NVMe ("
      << FormatByteSize(nvme_bytes) << " written and read per micro-batch, staging buffer "
      << FormatByteSize(buffer_bytes) << " pinned, disk " << FormatByteSize(disk_bytes);
    if (nvme_seconds > 0) {
      o << "; " << Seconds(per_layer_seconds) << " per layer and " << Seconds(nvme_seconds)
        << " per step at the store's rates";
      if (in.compute_seconds > 0) {
        o << " against " << Seconds(in.compute_seconds) << " of compute ("
          << (nvme_seconds <= in.compute_seconds ? "hidden behind it" : "the disk bounds the step")
          << ")";
      }
    } else {
      o << "; the store's rates not measured";
    }
    o << ")";
  }
  if (!ram.empty()) {
    o << (nvme.empty() ? "" : ", ") << (ram.size() == 1 ? "layer " : "layers ") << Ranges(ram)
      << " in pinned RAM (" << FormatByteSize(ram_bytes) << ")";
  }
  return o.str();
}

Status CheckCheckpointDisk(const CheckpointPlacement& p, uint64_t other_disk_bytes,
                           uint64_t disk_free) {
  if (p.moved == 0 || p.disk_bytes + other_disk_bytes <= disk_free) return OkStatus();
  return ResourceExhaustedError(
      "the layer inputs that the host memory limit sends to NVMe need " +
      FormatByteSize(p.disk_bytes) + " of disk (" + std::to_string(p.disk_bytes) +
      " bytes: " + std::to_string(p.moved) + " layers' inputs of " + FormatByteSize(p.nvme_bytes) +
      " in all, and the versions in flight)" +
      (other_disk_bytes > 0 ? " beside the store's " + FormatByteSize(other_disk_bytes) : "") +
      ", but the store directories have " + FormatByteSize(disk_free) +
      " free; free disk space, raise the host memory limit, or lower max_seq_length or "
      "per_device_train_batch_size");
}

}  // namespace offloadd::trainer
