#include "storage/store_metrics.h"

#include <limits>
#include <string>

namespace offloadd::storage {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

ClientMetric Value(MetricType type, double v, std::vector<ClientMetric::Label> labels) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = v;
  } else {
    m.gauge.value = v;
  }
  return m;
}

ClientMetric Histogram(const HistogramSnapshot& h, std::vector<ClientMetric::Label> labels) {
  ClientMetric m;
  m.label = std::move(labels);
  m.histogram.sample_count = h.count;
  m.histogram.sample_sum = h.sum_seconds;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kLatencyBucketsSeconds.size(); ++i) {
    cumulative += h.counts[i];
    m.histogram.bucket.push_back({cumulative, kLatencyBucketsSeconds[i]});
  }
  m.histogram.bucket.push_back({h.count, std::numeric_limits<double>::infinity()});
  return m;
}

}  // namespace

std::vector<MetricFamily> StoreCollector::Collect() const {
  const StoreMetrics s = store_->Metrics();
  auto read_bytes = Family("offloadd_store_read_bytes_total",
                           "Bytes read from the directory's data file.", MetricType::Counter);
  auto written = Family("offloadd_store_written_bytes_total",
                        "Bytes written to the directory's data file.", MetricType::Counter);
  auto read_ops = Family("offloadd_store_read_ops_total",
                         "Read transfers (at most aio.block_size each).", MetricType::Counter);
  auto write_ops = Family("offloadd_store_write_ops_total",
                          "Write transfers (at most aio.block_size each).", MetricType::Counter);
  auto syncs = Family("offloadd_store_syncs_total", "fdatasync calls on the directory's data file.",
                      MetricType::Counter);
  auto errors = Family("offloadd_store_errors_total",
                       "Failed transfers, syncs and checksum checks by kind.", MetricType::Counter);
  auto depth = Family("offloadd_store_queue_depth", "Transfers in flight in the kernel now.",
                      MetricType::Gauge);
  auto file =
      Family("offloadd_store_file_bytes", "Size of the directory's data file.", MetricType::Gauge);
  auto live = Family("offloadd_store_live_bytes",
                     "Bytes of committed tensors held in the directory.", MetricType::Gauge);
  auto latency =
      Family("offloadd_store_io_latency_seconds",
             "Latency of one transfer or sync, submit to completion.", MetricType::Histogram);
  for (const auto& d : s.directories) {
    const ClientMetric::Label dir{"directory", d.path};
    read_bytes.metric.push_back(
        Value(MetricType::Counter, static_cast<double>(d.bytes_read), {dir}));
    written.metric.push_back(
        Value(MetricType::Counter, static_cast<double>(d.bytes_written), {dir}));
    read_ops.metric.push_back(Value(MetricType::Counter, static_cast<double>(d.read_ops), {dir}));
    write_ops.metric.push_back(Value(MetricType::Counter, static_cast<double>(d.write_ops), {dir}));
    syncs.metric.push_back(Value(MetricType::Counter, static_cast<double>(d.syncs), {dir}));
    for (size_t k = 0; k < d.errors.size(); ++k) {
      errors.metric.push_back(
          Value(MetricType::Counter, static_cast<double>(d.errors[k]),
                {dir, {"kind", std::string(ErrorKindName(static_cast<ErrorKind>(k)))}}));
    }
    depth.metric.push_back(Value(MetricType::Gauge, static_cast<double>(d.in_flight), {dir}));
    file.metric.push_back(Value(MetricType::Gauge, static_cast<double>(d.file_bytes), {dir}));
    live.metric.push_back(Value(MetricType::Gauge, static_cast<double>(d.live_bytes), {dir}));
    latency.metric.push_back(Histogram(d.read_latency, {dir, {"op", "read"}}));
    latency.metric.push_back(Histogram(d.write_latency, {dir, {"op", "write"}}));
    latency.metric.push_back(Histogram(d.sync_latency, {dir, {"op", "sync"}}));
  }
  std::vector<MetricFamily> out = {read_bytes, written, read_ops, write_ops, syncs,
                                   errors,     depth,   file,     live,      latency};

  auto stored =
      Family("offloadd_store_stored_bytes", "Bytes of all committed tensors.", MetricType::Gauge);
  stored.metric.push_back(Value(MetricType::Gauge, static_cast<double>(s.stored_bytes), {}));
  auto tensors =
      Family("offloadd_store_tensors", "Keys with a committed version.", MetricType::Gauge);
  tensors.metric.push_back(Value(MetricType::Gauge, static_cast<double>(s.tensors), {}));
  auto commits = Family("offloadd_store_commits_total",
                        "Versions committed since the store opened.", MetricType::Counter);
  commits.metric.push_back(Value(MetricType::Counter, static_cast<double>(s.commits), {}));
  auto manifest =
      Family("offloadd_store_manifest_bytes", "Size of the manifest log.", MetricType::Gauge);
  manifest.metric.push_back(Value(MetricType::Gauge, static_cast<double>(s.manifest_bytes), {}));
  auto commit_latency = Family("offloadd_store_commit_latency_seconds",
                               "Write request to durable commit.", MetricType::Histogram);
  commit_latency.metric.push_back(Histogram(s.commit_latency, {}));
  auto read_latency = Family("offloadd_store_read_latency_seconds",
                             "Read request to verified completion.", MetricType::Histogram);
  read_latency.metric.push_back(Histogram(s.read_latency, {}));
  auto in_progress = Family("offloadd_store_operations_in_progress",
                            "Read and write requests not yet completed.", MetricType::Gauge);
  in_progress.metric.push_back(
      Value(MetricType::Gauge, static_cast<double>(s.reads_in_progress), {{"op", "read"}}));
  in_progress.metric.push_back(
      Value(MetricType::Gauge, static_cast<double>(s.writes_in_progress), {{"op", "write"}}));
  auto info = Family("offloadd_store_info", "The store's I/O engine (io_uring or threads).",
                     MetricType::Gauge);
  info.metric.push_back(Value(MetricType::Gauge, 1, {{"engine", s.engine}}));
  for (auto* f : {&stored, &tensors, &commits, &manifest, &commit_latency, &read_latency,
                  &in_progress, &info}) {
    out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace offloadd::storage
