#include "client/cpp/job_file.h"

#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace offloadd::client {
namespace {

// Short enum spellings: the value name without its type prefix, case-insensitive.
const char* const kEnumPrefixes[] = {"DATASET_FORMAT_", "OFFLOAD_DEVICE_", "ACTIVATION_MODE_", "COMPRESSION_TYPE_",
                                     "COMPUTE_DTYPE_", "DROPOUT_MODE_"};

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out + "\"";
}

bool LooksNumeric(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && errno == 0 && s != "inf" && s != "nan";
}

// Field names whose values are enums, with the prefix of their values.
std::string EnumPrefixFor(const std::string& key) {
  if (key == "format") return "DATASET_FORMAT_";
  if (key == "device") return "OFFLOAD_DEVICE_";
  if (key == "mode" || key == "layer_overrides") return "ACTIVATION_MODE_";
  if (key == "type") return "COMPRESSION_TYPE_";
  if (key == "compute_dtype") return "COMPUTE_DTYPE_";
  if (key == "dropout") return "DROPOUT_MODE_";
  return "";
}

// A job file is small; aliases can make a few hundred bytes of YAML expand into billions of nodes
// (a "billion laughs" alias bomb made offloadctl abort). Expansion stops at these bounds.
constexpr size_t kMaxJobFileValues = 100000;
constexpr int kMaxJobFileDepth = 64;

struct Budget {
  size_t values_left = kMaxJobFileValues;
  bool exceeded = false;
};

std::string ToJson(const YAML::Node& n, const std::string& key, int depth, Budget* budget) {
  if (budget->exceeded) return "null";
  if (budget->values_left == 0 || depth > kMaxJobFileDepth) {
    budget->exceeded = true;
    return "null";
  }
  --budget->values_left;
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return "null";
    case YAML::NodeType::Sequence: {
      std::string out = "[";
      for (size_t i = 0; i < n.size() && !budget->exceeded; ++i) {
        out += (i ? "," : "") + ToJson(n[i], key, depth + 1, budget);
      }
      return out + "]";
    }
    case YAML::NodeType::Map: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : n) {
        if (budget->exceeded) break;
        const std::string k = kv.first.Scalar();
        out += (first ? "" : ",") + JsonQuote(k) + ":" +
               ToJson(kv.second, key == "layer_overrides" ? key : k, depth + 1, budget);
        first = false;
      }
      return out + "}";
    }
    case YAML::NodeType::Scalar: break;
  }
  const std::string v = n.Scalar();
  const bool quoted = n.Tag() == "!";
  if (!quoted && (v == "true" || v == "false")) return v;
  const std::string prefix = EnumPrefixFor(key);
  if (!prefix.empty() && !quoted && !LooksNumeric(v)) {
    std::string upper;
    for (char c : v) upper.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
    bool full = false;
    for (const char* p : kEnumPrefixes) full = full || upper.rfind(p, 0) == 0;
    return JsonQuote(full ? upper : prefix + upper);
  }
  if (!quoted && LooksNumeric(v)) return v;
  return JsonQuote(v);
}

}  // namespace

StatusOr<offloadd::v1::JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(source + ": not valid YAML: " + e.what());
  }
  if (!root.IsMap()) return InvalidArgumentError(source + ": a job file must be a mapping of JobSpec fields");
  offloadd::v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  Budget budget;
  const std::string json = ToJson(root, "", 0, &budget);
  if (budget.exceeded) {
    return InvalidArgumentError(source + ": the job file expands to more than " + std::to_string(kMaxJobFileValues) +
                                " values or " + std::to_string(kMaxJobFileDepth) +
                                " levels of nesting (YAML aliases?); a job spec is far smaller");
  }
  const auto st = google::protobuf::util::JsonStringToMessage(json, &spec, opts);
  if (!st.ok()) return InvalidArgumentError(source + ": " + std::string(st.message()));
  return spec;
}

StatusOr<offloadd::v1::JobSpec> LoadJobFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoError(errno, "cannot read job file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseJobSpec(ss.str(), path);
}

}  // namespace offloadd::client
