#pragma once
// multipart/form-data (RFC 7578) as the OpenAI clients send POST /v1/files: a "purpose" field and
// a "file" part with a filename. Parses a whole body held in memory (its size is bounded by the
// HTTP server); every malformed input is an INVALID_ARGUMENT naming what is wrong.

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::daemon::openai {

struct FormPart {
  std::string name;      // Content-Disposition's name
  std::string filename;  // its filename, "" for a plain field
  std::string content_type;
  std::string_view body;  // a view into the parsed body
};

// The boundary of a "multipart/form-data; boundary=..." Content-Type.
StatusOr<std::string> MultipartBoundary(const std::string& content_type);

// The parts of `body` (which must outlive the views), in order.
StatusOr<std::vector<FormPart>> ParseMultipart(std::string_view body, const std::string& boundary);

}  // namespace offloadd::daemon::openai
