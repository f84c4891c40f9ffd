#pragma once
// Bearer-token authentication for the TCP listener: every call must carry
// "authorization: Bearer <token>" matching the token file. The Unix socket relies on file
// permissions instead.

#include <grpcpp/security/auth_metadata_processor.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace offloadd::daemon {

// Reads the token file (first line, surrounding whitespace trimmed). Errors if it is missing,
// empty, or readable by group/others.
StatusOr<std::string> ReadTokenFile(const std::string& path);

std::shared_ptr<grpc::AuthMetadataProcessor> MakeTokenAuthProcessor(std::string token);

}  // namespace offloadd::daemon
