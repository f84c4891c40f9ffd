#pragma once
// How commands print a response in the chosen -o format.

#include <cstdio>
#include <string>

#include <google/protobuf/message.h>

#include "client/offloadctl/output.h"

namespace offloadctl {

// `m` as JSON or YAML, or `table` (the human rendering) for -o table.
inline void Print(const google::protobuf::Message& m, OutputFormat format, const std::string& table) {
  const std::string text = format == OutputFormat::kJson   ? ToJson(m)
                           : format == OutputFormat::kYaml ? ToYaml(m)
                                                           : table;
  std::fputs(text.c_str(), stdout);
}

}  // namespace offloadctl
