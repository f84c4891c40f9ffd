#pragma once
// Records one RPC's outcome and latency in DaemonMetrics when it goes out of scope.
//   grpc::Status GetX(...) { RpcRecorder rec(metrics_, "GetX"); return rec.Done(DoIt()); }

#include <chrono>
#include <string>

#include "daemon/metrics/metrics.h"
#include "daemon/server/status_util.h"

namespace offloadd::daemon {

class RpcRecorder {
 public:
  RpcRecorder(DaemonMetrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(std::chrono::steady_clock::now()) {}

  grpc::Status Done(grpc::Status s) {
    if (metrics_ != nullptr) {
      const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
      metrics_->RecordRpc(method_, GrpcCodeName(s), d.count());
    }
    return s;
  }

 private:
  DaemonMetrics* metrics_;
  std::string method_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace offloadd::daemon
