#include "client/cpp/job_file.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "client/cpp/spec_reader.h"
#include "common/message_text.h"

namespace offloadd::client {
namespace {

// A job file is small; aliases can make a few hundred bytes of YAML expand into billions of nodes
// (a "billion laughs" alias bomb made offloadctl abort). Counting stops at these bounds, before
// anything reads the tree.
constexpr size_t kMaxJobFileValues = 100000;
constexpr int kMaxJobFileDepth = 64;

bool WithinBounds(const YAML::Node& n, int depth, size_t* values_left) {
  if (*values_left == 0 || depth > kMaxJobFileDepth) return false;
  --*values_left;
  if (n.IsSequence()) {
    for (const auto& item : n) {
      if (!WithinBounds(item, depth + 1, values_left)) return false;
    }
  } else if (n.IsMap()) {
    for (const auto& kv : n) {
      if (!WithinBounds(kv.second, depth + 1, values_left)) return false;
    }
  }
  return true;
}

// transformers v5 reads a warmup_steps below 1 as the fraction of the total steps (what
// warmup_ratio says). The fraction moves to warmup_ratio; a fraction of 1 or more is no whole
// number of steps and is refused (transformers would truncate it).
void MoveWarmupFraction(YAML::Node root, std::vector<FieldViolation>* out) {
  YAML::Node training = root["training"];
  if (!training.IsMap() || !training["warmup_steps"].IsScalar()) return;
  const std::string text = training["warmup_steps"].Scalar();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v == std::floor(v)) return;
  training.remove("warmup_steps");
  if (v <= 0 || v >= 1) {
    out->push_back({"training.warmup_steps", "must be a whole number of steps, or a fraction in (0, 1) of the total "
                                             "steps (as transformers v5 reads it), got " + SafeMessageText(text, 80)});
  } else if (training["warmup_ratio"] && !training["warmup_ratio"].IsNull()) {
    out->push_back({"training.warmup_steps", "a fraction (" + text + ", the warmup ratio as transformers v5 reads it) "
                                             "and warmup_ratio are both set; set one"});
  } else {
    training["warmup_ratio"] = text;
  }
}

// per_device_train_batch_size: auto (as DeepSpeed configs write it) is transformers'
// auto_find_batch_size: true, with the micro-batch left to its default cap.
void MoveAutoBatchSize(YAML::Node root, std::vector<FieldViolation>* out) {
  YAML::Node training = root["training"];
  if (!training.IsMap() || !training["per_device_train_batch_size"].IsScalar() ||
      training["per_device_train_batch_size"].Scalar() != "auto") {
    return;
  }
  training.remove("per_device_train_batch_size");
  const YAML::Node flag = training["auto_find_batch_size"];
  if (flag && flag.IsScalar() && flag.Scalar() != "true" && flag.Scalar() != "True") {
    out->push_back({"training.per_device_train_batch_size",
                    "auto contradicts auto_find_batch_size: " + SafeMessageText(flag.Scalar(), 40) + "; set one of them"});
    return;
  }
  training["auto_find_batch_size"] = true;
}

}  // namespace

StatusOr<JobFileContents> ReadJobSpec(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(source + ": not valid YAML: " + e.what());
  }
  if (!root.IsMap()) return InvalidArgumentError(source + ": a job file must be a mapping of JobSpec fields");
  size_t values_left = kMaxJobFileValues;
  if (!WithinBounds(root, 0, &values_left)) {
    return InvalidArgumentError(source + ": the job file expands to more than " + std::to_string(kMaxJobFileValues) +
                                " values or " + std::to_string(kMaxJobFileDepth) +
                                " levels of nesting (YAML aliases?); a job spec is far smaller");
  }
  JobFileContents out;
  try {
    MoveWarmupFraction(root, &out.violations);
    MoveAutoBatchSize(root, &out.violations);
    ReadMessage(root, "", &out.spec, &out.violations);
  } catch (const YAML::Exception& e) {  // yaml-cpp reports a malformed tree only when it is walked
    return InvalidArgumentError(source + ": not valid YAML: " + e.what());
  }
  return out;
}

namespace {
bool SameOrBelow(const std::string& path, const std::string& root) {
  return path.rfind(root, 0) == 0 &&
         (path.size() == root.size() || path[root.size()] == '.' || path[root.size()] == '[');
}
}  // namespace

std::vector<FieldViolation> MergeViolations(std::vector<FieldViolation> client,
                                            const std::vector<FieldViolation>& daemon) {
  const size_t own = client.size();
  for (const FieldViolation& d : daemon) {
    bool overlaps = false;
    for (size_t i = 0; i < own && !overlaps; ++i) {
      overlaps = SameOrBelow(d.field, client[i].field) || SameOrBelow(client[i].field, d.field);
    }
    if (!overlaps) client.push_back(d);
  }
  return client;
}

std::string DescribeViolations(const std::string& source, const std::vector<FieldViolation>& violations) {
  std::string out = source + ": " + std::to_string(violations.size()) +
                    (violations.size() == 1 ? " problem" : " problems") + " in the job spec:";
  for (const FieldViolation& v : violations) out += "\n  " + v.field + ": " + v.description;
  return out;
}

StatusOr<offloadd::v1::JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source) {
  ASSIGN_OR_RETURN(JobFileContents read, ReadJobSpec(yaml_text, source));
  if (!read.violations.empty()) return InvalidArgumentError(DescribeViolations(source, read.violations));
  return std::move(read.spec);
}

StatusOr<offloadd::v1::JobSpec> LoadJobFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoError(errno, "cannot read job file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseJobSpec(ss.str(), path);
}

}  // namespace offloadd::client
