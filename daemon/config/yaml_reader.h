#pragma once
// YamlReader: strict, typed reads from a yaml-cpp tree that collect every problem with its key
// path instead of throwing. Used for the daemon config (and job files) so users see all mistakes
// in one run, e.g.
//   server.tcp.lissten: unknown key (known: listen, tls_cert_file, tls_key_file, auth_token_file)

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace offloadd::daemon {

class YamlReader {
 public:
  // Path of `node` (`prefix` is "" for the root).
  YamlReader(std::vector<std::string>* errors, std::string prefix)
      : errors_(errors), prefix_(std::move(prefix)) {}

  std::string Path(std::string_view key) const;
  void Error(std::string_view key, std::string_view message) const;

  // Reports keys of the map `node` that are not in `known`, and a non-map node.
  // Returns false if `node` is not a map (and not null).
  bool CheckMap(const YAML::Node& node, std::initializer_list<std::string_view> known) const;
  // Child reader for nested map `key`.
  YamlReader Child(std::string_view key) const { return YamlReader(errors_, Path(key)); }

  // Each reads node[key] into *out when present; leaves *out unchanged when absent/null.
  void String(const YAML::Node& node, std::string_view key, std::string* out) const;
  void Bool(const YAML::Node& node, std::string_view key, bool* out) const;
  void Double(const YAML::Node& node, std::string_view key, double* out, double min, double max) const;
  void UInt(const YAML::Node& node, std::string_view key, uint64_t* out, uint64_t min, uint64_t max) const;
  void UInt32(const YAML::Node& node, std::string_view key, uint32_t* out, uint32_t min, uint32_t max) const;
  // A byte size: integer or string with unit ("24GiB").
  void Bytes(const YAML::Node& node, std::string_view key, uint64_t* out, uint64_t min, uint64_t max) const;
  // A file mode written as an octal string ("0660") or integer 0660 in YAML 1.1 octal.
  void Mode(const YAML::Node& node, std::string_view key, uint32_t* out) const;
  void StringList(const YAML::Node& node, std::string_view key, std::vector<std::string>* out) const;

 private:
  bool Scalar(const YAML::Node& node, std::string_view key, std::string* text) const;

  std::vector<std::string>* errors_;
  std::string prefix_;
};

}  // namespace offloadd::daemon
