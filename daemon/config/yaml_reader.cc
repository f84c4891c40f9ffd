#include "daemon/config/yaml_reader.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "common/message_text.h"
#include "common/units.h"

namespace offloadd::daemon {
namespace {

bool ValidUtf8(std::string_view s) { return InvalidUtf8At(s) == std::string_view::npos; }

}  // namespace

std::string YamlReader::Path(std::string_view key) const {
  if (prefix_.empty()) return std::string(key);
  return prefix_ + "." + std::string(key);
}

void YamlReader::Error(std::string_view key, std::string_view message) const {
  errors_->push_back(Path(key) + ": " + std::string(message));
}

bool YamlReader::CheckMap(const YAML::Node& node, std::initializer_list<std::string_view> known) const {
  if (!node || node.IsNull()) return false;
  if (!node.IsMap()) {
    errors_->push_back((prefix_.empty() ? std::string("<root>") : prefix_) + ": expected a mapping of keys");
    return false;
  }
  std::string known_list;
  for (std::string_view k : known) {
    if (!known_list.empty()) known_list += ", ";
    known_list += k;
  }
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) {
      errors_->push_back((prefix_.empty() ? std::string("<root>") : prefix_) + ": keys must be plain names");
      continue;
    }
    const std::string name = kv.first.Scalar();
    bool ok = false;
    for (std::string_view k : known) ok = ok || (k == name);
    if (!ok) Error(name, "unknown key (known: " + known_list + ")");
  }
  return true;
}

bool YamlReader::Scalar(const YAML::Node& node, std::string_view key, std::string* text) const {
  const YAML::Node v = node[std::string(key)];
  if (!v || v.IsNull()) return false;
  if (!v.IsScalar()) {
    Error(key, "expected a single value, not a list or mapping");
    return false;
  }
  if (!ValidUtf8(v.Scalar())) {
    // yaml-cpp keeps the bytes, but the effective config printed back would differ from the one
    // in use (fuzz regression daemon_config/non-utf8-socket-path-not-printed-back).
    Error(key, "is not valid UTF-8");
    return false;
  }
  *text = v.Scalar();
  return true;
}

void YamlReader::String(const YAML::Node& node, std::string_view key, std::string* out) const {
  std::string t;
  if (Scalar(node, key, &t)) *out = t;
}

void YamlReader::Bool(const YAML::Node& node, std::string_view key, bool* out) const {
  std::string t;
  if (!Scalar(node, key, &t)) return;
  if (t == "true" || t == "True" || t == "yes" || t == "on") *out = true;
  else if (t == "false" || t == "False" || t == "no" || t == "off") *out = false;
  else Error(key, "expected true or false, got '" + t + "'");
}

void YamlReader::Double(const YAML::Node& node, std::string_view key, double* out, double min,
                        double max) const {
  std::string t;
  if (!Scalar(node, key, &t)) return;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || errno != 0 || !std::isfinite(v)) {
    Error(key, "expected a number, got '" + t + "'");
  } else if (v < min || v > max) {
    Error(key, "must be between " + std::to_string(min) + " and " + std::to_string(max) + ", got " + t);
  } else {
    *out = v;
  }
}

void YamlReader::UInt(const YAML::Node& node, std::string_view key, uint64_t* out, uint64_t min,
                      uint64_t max) const {
  std::string t;
  if (!Scalar(node, key, &t)) return;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(t.c_str(), &end, 10);
  if (t.empty() || t[0] == '-' || end != t.c_str() + t.size() || errno != 0) {
    Error(key, "expected a non-negative integer, got '" + t + "'");
  } else if (v < min || v > max) {
    Error(key, "must be between " + std::to_string(min) + " and " + std::to_string(max) + ", got " + t);
  } else {
    *out = v;
  }
}

void YamlReader::UInt32(const YAML::Node& node, std::string_view key, uint32_t* out, uint32_t min,
                        uint32_t max) const {
  uint64_t v = *out;
  UInt(node, key, &v, min, max);
  *out = static_cast<uint32_t>(v);
}

void YamlReader::Bytes(const YAML::Node& node, std::string_view key, uint64_t* out, uint64_t min,
                       uint64_t max) const {
  std::string t;
  if (!Scalar(node, key, &t)) return;
  auto v = ParseByteSize(t);
  if (!v.ok()) {
    Error(key, v.status().message());
  } else if (*v < min || *v > max) {
    Error(key, "must be between " + FormatByteSize(min) + " and " + FormatByteSize(max) + ", got " + t);
  } else {
    *out = *v;
  }
}

void YamlReader::Mode(const YAML::Node& node, std::string_view key, uint32_t* out) const {
  std::string t;
  if (!Scalar(node, key, &t)) return;
  const std::string digits = (t.size() > 2 && t[0] == '0' && (t[1] == 'o' || t[1] == 'O')) ? t.substr(2) : t;
  char* end = nullptr;
  const unsigned long v = std::strtoul(digits.c_str(), &end, 8);
  if (digits.empty() || end != digits.c_str() + digits.size() || v > 0777) {
    Error(key, "expected an octal file mode such as \"0660\", got '" + t + "'");
  } else {
    *out = static_cast<uint32_t>(v);
  }
}

void YamlReader::StringList(const YAML::Node& node, std::string_view key,
                            std::vector<std::string>* out) const {
  const YAML::Node v = node[std::string(key)];
  if (!v || v.IsNull()) return;
  if (!v.IsSequence()) {
    Error(key, "expected a list");
    return;
  }
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].IsScalar()) {
      Error(std::string(key) + "[" + std::to_string(i) + "]", "expected a string");
      continue;
    }
    if (!ValidUtf8(v[i].Scalar())) {
      Error(std::string(key) + "[" + std::to_string(i) + "]", "is not valid UTF-8");
      continue;
    }
    out->push_back(v[i].Scalar());
  }
}

}  // namespace offloadd::daemon
