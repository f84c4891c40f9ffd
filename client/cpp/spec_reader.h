#pragma once
// Reads a YAML tree into a protobuf message by the message's descriptor, the way job files are
// written: field names as in the .proto (snake_case; lowerCamelCase JSON names are accepted too),
// enum values in full (DATASET_FORMAT_ALPACA) or short (alpaca, any case), byte sizes as 24GiB,
// 500MB or plain bytes (the fields IsByteSizeField names), null as "unset". It does not stop at
// the first problem: every field that cannot be read is reported with its snake_case path
// ("training.max_grad_norm", "dataset.paths[1]", "labels[team]") and skipped, unknown fields with
// a "did you mean" for a near miss and the list of the message's fields. Thread-safe (no state).

#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/message.h>
#include <yaml-cpp/yaml.h>

#include "client/cpp/offloadd_client.h"

namespace offloadd::client {

// Appends one violation per problem; `path` is the path of `node` ("" for the root).
void ReadMessage(const YAML::Node& node, const std::string& path, google::protobuf::Message* msg,
                 std::vector<FieldViolation>* violations);

// The uint64 fields of job.proto that hold byte sizes (full names, "offloadd.v1.AioConfig.block_size").
bool IsByteSizeField(const google::protobuf::FieldDescriptor* field);

// Optimal string alignment distance (Levenshtein with adjacent transpositions).
size_t EditDistance(std::string_view a, std::string_view b);

// The candidate closest to `name` when it is a near miss (the same apart from case and
// underscores, or a few edits away for its length), else "".
std::string NearestName(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace offloadd::client
