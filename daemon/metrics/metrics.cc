#include "daemon/metrics/metrics.h"

#include "daemon/metrics/process_collector.h"

namespace offloadd::daemon {

std::string MetricsListenWarning(const std::string& listen) {
  if (listen.empty()) return "";
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) return "";
  return "metrics.listen " + listen +
         " is not a loopback address: /metrics has no authentication, " +
         "so anyone who reaches this port reads the daemon's job ids and training metrics; listen "
         "on " +
         "127.0.0.1 (Prometheus on this host), or restrict the port with a firewall";
}

StatusOr<std::unique_ptr<DaemonMetrics>> DaemonMetrics::Start(const std::string& listen,
                                                              const BuildLabels& build) {
  std::unique_ptr<DaemonMetrics> m(new DaemonMetrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  auto& r = *m->registry_;

  prometheus::BuildGauge()
      .Name("offloadd_build_info")
      .Help("Build of the running offloadd; the value is always 1.")
      .Register(r)
      .Add({{"version", build.version},
            {"revision", build.revision},
            {"torch_version", build.torch_version},
            {"flavour", build.flavour}})
      .Set(1);
  m->serving_ = &prometheus::BuildGauge()
                     .Name("offloadd_serving")
                     .Help("1 while the daemon accepts requests (health SERVING), 0 while draining.")
                     .Register(r)
                     .Add({});
  m->rpc_total_ = &prometheus::BuildCounter()
                       .Name("offloadd_grpc_requests_total")
                       .Help("Finished gRPC calls by method and status code.")
                       .Register(r);
  m->rpc_seconds_ = &prometheus::BuildHistogram()
                         .Name("offloadd_grpc_request_duration_seconds")
                         .Help("Time from receiving a gRPC call to sending its status.")
                         .Register(r);

  if (!listen.empty()) {
    auto exposer = MetricsExposer::Start(listen);
    if (!exposer.ok()) {
      return UnavailableError("cannot serve metrics on metrics.listen=" + listen + ": " +
                              exposer.status().message());
    }
    m->exposer_ = std::move(*exposer);
    m->exposer_->RegisterCollectable(m->registry_);
    m->process_collector_ = std::make_shared<ProcessCollector>();
    m->exposer_->RegisterCollectable(m->process_collector_);
    m->port_ = m->exposer_->port();
  }
  return m;
}

void DaemonMetrics::RecordRpc(const std::string& method, const std::string& code, double seconds) {
  rpc_total_->Add({{"method", method}, {"code", code}}).Increment();
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  rpc_seconds_->Add({{"method", method}}, kBuckets).Observe(seconds);
}

}  // namespace offloadd::daemon
