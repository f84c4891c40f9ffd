#pragma once
// Store metrics as plain values. The store updates them with relaxed atomics on its I/O paths;
// TensorStore::Metrics() returns a consistent-enough snapshot (each counter read once) that the
// daemon (or offloadd-store's own exposer) turns into Prometheus series:
//   offloadd_store_read_bytes_total{dir}, offloadd_store_written_bytes_total{dir},
//   offloadd_store_read_ops_total{dir}, offloadd_store_write_ops_total{dir},
//   offloadd_store_errors_total{dir,kind}, offloadd_store_io_latency_seconds{dir,op} (histogram),
//   offloadd_store_queue_depth{dir}, offloadd_store_stored_bytes, offloadd_store_tensors, ...
// Thread-safe.

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace offloadd::storage {

enum class ErrorKind : int { kIo = 0, kNoSpace, kChecksum, kShortTransfer, kOther, kCount };
std::string_view ErrorKindName(ErrorKind kind);  // "io", "no_space", "checksum", ...

// Latency buckets in seconds (upper bounds); the last bucket is +Inf.
inline constexpr std::array<double, 14> kLatencyBucketsSeconds = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3, 5e-3,
    10e-3, 25e-3,  50e-3,  100e-3, 250e-3, 1.0,    5.0};

struct HistogramSnapshot {
  std::array<uint64_t, kLatencyBucketsSeconds.size() + 1> counts{};  // per bucket, not cumulative
  uint64_t count = 0;
  double sum_seconds = 0;
};

class LatencyHistogram {
 public:
  void Record(double seconds);
  HistogramSnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kLatencyBucketsSeconds.size() + 1> counts_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

struct DirectoryMetrics {
  std::string path;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t read_ops = 0;  // transfers (block_size or less each)
  uint64_t write_ops = 0;
  uint64_t syncs = 0;       // fdatasync of the data file
  uint64_t in_flight = 0;   // transfers in the kernel now (the live queue depth)
  uint64_t file_bytes = 0;  // size of the data file (allocated, including free extents)
  uint64_t live_bytes = 0;  // bytes of committed tensors held here
  std::array<uint64_t, static_cast<int>(ErrorKind::kCount)> errors{};
  HistogramSnapshot read_latency;  // per transfer, submit to completion
  HistogramSnapshot write_latency;
  HistogramSnapshot sync_latency;
};

struct StoreMetrics {
  std::string engine;  // "io_uring" or "threads"
  std::vector<DirectoryMetrics> directories;
  uint64_t tensors = 0;       // keys with a committed version
  uint64_t stored_bytes = 0;  // sum of their sizes
  uint64_t commits = 0;       // versions committed since open
  uint64_t manifest_bytes = 0;
  uint64_t reads_in_progress = 0;    // Read() calls not yet completed
  uint64_t writes_in_progress = 0;   // Write() calls not yet committed or failed
  HistogramSnapshot commit_latency;  // Write() call to commit (data + manifest durable)
  HistogramSnapshot read_latency;    // Read() call to completion
};

}  // namespace offloadd::storage
