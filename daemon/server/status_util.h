#pragma once
// Conversions between offloadd::Status and grpc::Status (same canonical code numbers).

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace offloadd::daemon {

inline grpc::Status ToGrpcStatus(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

// Short upper-case code name for metrics labels ("OK", "UNIMPLEMENTED").
inline std::string GrpcCodeName(const grpc::Status& s) {
  return std::string(StatusCodeName(static_cast<StatusCode>(s.error_code())));
}

}  // namespace offloadd::daemon
