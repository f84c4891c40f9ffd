#pragma once
// Conversions between offloadd::Status and grpc::Status (same canonical code numbers).

#include <grpcpp/support/status.h>

#include "common/message_text.h"
#include "common/status.h"

namespace offloadd::daemon {

inline grpc::Status ToGrpcStatus(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // Messages echo users' paths and values: valid UTF-8 and bounded (common/message_text.h).
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), SafeMessageText(s.message(), 8192));
}

// Short upper-case code name for metrics labels ("OK", "UNIMPLEMENTED").
inline std::string GrpcCodeName(const grpc::Status& s) {
  return std::string(StatusCodeName(static_cast<StatusCode>(s.error_code())));
}

}  // namespace offloadd::daemon
