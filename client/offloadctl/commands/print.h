#pragma once
// How commands print a response in the chosen -o format.

#include <cstdio>
#include <string>

#include <google/protobuf/message.h>

#include "client/offloadctl/output.h"
#include "client/offloadctl/render.h"

namespace offloadctl {

// `m` as JSON or YAML, or `table` (the human rendering) for -o table. The renderers escape each
// free-text field; TerminalLines here also covers any they do not (node facts, for one), so no
// control character of the daemon's reaches the terminal. JSON and YAML escape by their own rules.
inline void Print(const google::protobuf::Message& m, OutputFormat format, const std::string& table) {
  const std::string text = format == OutputFormat::kJson   ? ToJson(m)
                           : format == OutputFormat::kYaml ? ToYaml(m)
                                                           : TerminalLines(table);
  std::fputs(text.c_str(), stdout);
}

}  // namespace offloadctl
