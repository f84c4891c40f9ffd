#pragma once
// Machine-readable output of API messages for offloadctl's `-o json|yaml`: JSON with the .proto
// field names, spelt as the table and the Python SDK spell values (`"state": "running"`, not
// JOB_STATE_RUNNING; 64-bit integers as numbers, not strings; fields holding zero present), and
// the same tree as YAML. Job files read these spellings back. Pure functions (no I/O),
// unit-tested.

#include <optional>
#include <string>

#include <google/protobuf/message.h>

namespace offloadctl {

enum class OutputFormat { kTable, kJson, kYaml };

// "json", "yaml" or "table"; nullopt for anything else.
std::optional<OutputFormat> ParseOutputFormat(const std::string& name);

// The message as JSON: indented and ending in a newline, or (`one_line`) one line, for JSON Lines.
// Enum values without their type's prefix, lower-case; int64/uint64 as JSON numbers; scalar
// fields at their default value present.
std::string ToJson(const google::protobuf::Message& m, bool one_line = false);
// The message as a YAML block mapping, ending in a newline. Strings that YAML would read as
// something else (numbers as int64 JSON strings, "true", "null", ...) are quoted.
std::string ToYaml(const google::protobuf::Message& m);
// A JSON text as YAML (what ToYaml does after ToJson); "" when `json` does not parse.
std::string JsonToYaml(const std::string& json);

}  // namespace offloadctl
