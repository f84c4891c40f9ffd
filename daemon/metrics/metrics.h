#pragma once
// All of the daemon's own Prometheus metrics, declared in one place, and the /metrics endpoint on
// its own port. Thread-safe: prometheus-cpp metrics are atomic.
//
// Names follow the Prometheus rules: offloadd_ prefix, base units, counters end in _total,
// histograms (never summaries), bounded label values. Process metrics use the standard
// process_* names that Prometheus client libraries export.

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "common/metrics_exposer.h"
#include "common/status.h"

namespace offloadd::daemon {

// The warning for a metrics.listen that other hosts can reach, or "" for a loopback address
// (127.0.0.0/8, ::1, localhost) or an empty one (metrics off). /metrics has no authentication: what
// it shows (job ids, step rates, memory) is then open to the network. Startup logs it and
// --validate-config prints it (CheckStartup).
std::string MetricsListenWarning(const std::string& listen);

struct BuildLabels {
  std::string version;
  std::string revision;
  std::string torch_version;
  std::string flavour;  // "cuda" | "cpu"
};

class DaemonMetrics {
 public:
  // Creates the registry and, when `listen` is non-empty, serves it at http://listen/metrics.
  // A listen address that cannot be bound is an error naming it.
  static StatusOr<std::unique_ptr<DaemonMetrics>> Start(const std::string& listen,
                                                        const BuildLabels& build);

  // The bound port (useful when listen asked for port 0); 0 when not serving.
  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }

  // One finished RPC: method is the short name ("GetNodeInfo"), code the gRPC status name.
  void RecordRpc(const std::string& method, const std::string& code, double seconds);
  void SetServing(bool serving) { serving_->Set(serving ? 1 : 0); }

 private:
  DaemonMetrics() = default;

  // The exposer keeps only weak references to collectables: they are owned here.
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> process_collector_;
  std::unique_ptr<MetricsExposer> exposer_;
  int port_ = 0;
  prometheus::Family<prometheus::Counter>* rpc_total_ = nullptr;
  prometheus::Family<prometheus::Histogram>* rpc_seconds_ = nullptr;
  prometheus::Gauge* serving_ = nullptr;
};

}  // namespace offloadd::daemon
