#pragma once
// MetricsExposer: serves Prometheus collectables at http://<listen>/metrics in the text
// exposition format, from one Boost.Asio thread.
//
// Why not prometheus-cpp's civetweb Exposer: civetweb starts its threads with a fixed 100 KiB
// stack, and glibc places every loaded library's static TLS on each new thread's stack. LibTorch
// with CUDA carries more static TLS than that, so in the CUDA build pthread_create fails with
// EINVAL and the civetweb Exposer cannot start at all. This server uses default-sized threads.
//
// The protocol surface is the part a scraper needs: GET and HEAD of /metrics (any query string),
// HTTP/1.0 and 1.1, keep-alive, 404 for other paths, 405 for other methods, 400 for malformed
// requests, 431 for request heads over 16 KiB, and an idle timeout so no client pins a connection.

#include <prometheus/collectable.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace offloadd {

class MetricsExposer {
 public:
  // Binds `listen` ("host:port", "[v6]:port"; port 0 picks a free one) and starts serving.
  // An address that cannot be parsed, resolved or bound is an error naming it and the reason.
  static StatusOr<std::unique_ptr<MetricsExposer>> Start(const std::string& listen);
  ~MetricsExposer();  // stops the thread and closes every connection
  MetricsExposer(const MetricsExposer&) = delete;
  MetricsExposer& operator=(const MetricsExposer&) = delete;

  // Collected on every scrape while the collectable is alive (held weakly, as prometheus-cpp's
  // Exposer does: the owner keeps it alive).
  void RegisterCollectable(const std::weak_ptr<prometheus::Collectable>& collectable);

  uint16_t port() const;

  // Tuning for tests: how long a connection may sit without a complete request.
  void set_idle_timeout_ms(int ms);

 private:
  struct Impl;
  explicit MetricsExposer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd
