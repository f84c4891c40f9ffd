#include "storage/metrics.h"

#include <algorithm>

namespace offloadd::storage {

std::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kIo:
      return "io";
    case ErrorKind::kNoSpace:
      return "no_space";
    case ErrorKind::kChecksum:
      return "checksum";
    case ErrorKind::kShortTransfer:
      return "short_transfer";
    case ErrorKind::kOther:
      return "other";
    case ErrorKind::kCount:
      break;
  }
  return "unknown";
}

void LatencyHistogram::Record(double seconds) {
  const auto it =
      std::lower_bound(kLatencyBucketsSeconds.begin(), kLatencyBucketsSeconds.end(), seconds);
  counts_[static_cast<size_t>(it - kLatencyBucketsSeconds.begin())].fetch_add(
      1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}

HistogramSnapshot LatencyHistogram::Snapshot() const {
  HistogramSnapshot s;
  for (size_t i = 0; i < counts_.size(); ++i)
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
  s.count = count_.load(std::memory_order_relaxed);
  s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

}  // namespace offloadd::storage
