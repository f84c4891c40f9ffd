#pragma once
// StoreCollector: exposes TensorStore::Metrics() to Prometheus (prometheus-cpp Collectable),
// snapshotting at scrape time. All names are declared here, in one place:
//   offloadd_store_read_bytes_total{directory}           counter
//   offloadd_store_written_bytes_total{directory}        counter
//   offloadd_store_read_ops_total{directory}             counter (block_size transfers)
//   offloadd_store_write_ops_total{directory}            counter
//   offloadd_store_syncs_total{directory}                counter (fdatasync of the data file)
//   offloadd_store_errors_total{directory,kind}          counter, kind in
//   io|no_space|checksum|short_transfer|other offloadd_store_queue_depth{directory} gauge,
//   transfers in flight now offloadd_store_file_bytes{directory}                 gauge, data file
//   size offloadd_store_live_bytes{directory}                 gauge, committed tensor bytes held
//   offloadd_store_io_latency_seconds{directory,op}      histogram, op in read|write|sync
//   offloadd_store_stored_bytes / offloadd_store_tensors gauges
//   offloadd_store_commits_total                         counter
//   offloadd_store_manifest_bytes                        gauge
//   offloadd_store_commit_latency_seconds                histogram (Write call to durable commit)
//   offloadd_store_read_latency_seconds                  histogram (Read call to completion)
//   offloadd_store_operations_in_progress{op}            gauge, op in read|write
//   offloadd_store_info{engine}                          gauge, 1
// Thread-safe; borrows the store, which must outlive the collector's registration.

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

#include "storage/tensor_store.h"

namespace offloadd::storage {

class StoreCollector : public prometheus::Collectable {
 public:
  explicit StoreCollector(const TensorStore* store) : store_(store) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const TensorStore* store_;
};

}  // namespace offloadd::storage
