#include "client/offloadctl/output.h"

#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <regex>

namespace offloadctl {

std::optional<OutputFormat> ParseOutputFormat(const std::string& name) {
  if (name == "json") return OutputFormat::kJson;
  if (name == "yaml") return OutputFormat::kYaml;
  if (name == "table") return OutputFormat::kTable;
  return std::nullopt;
}

std::string ToJson(const google::protobuf::Message& m, bool one_line) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = !one_line;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  if (out.empty() || out.back() != '\n') out += '\n';
  return out;
}

namespace {

// Whether `s` may be written as a plain YAML scalar and read back as the same string by a
// YAML 1.1 or 1.2 reader (PyYAML reads "yes", "on", "1e3", "0x1f" as non-strings).
bool PlainIsSafe(const std::string& s) {
  static const std::regex kPlain("[A-Za-z_/][A-Za-z0-9_./+-]*");
  static const std::regex kSpecial(
      "y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF|"
      "null|Null|NULL|[.]?(inf|Inf|INF|nan|NaN|NAN)");
  return std::regex_match(s, kPlain) && !std::regex_match(s, kSpecial);
}

void Emit(const nlohmann::ordered_json& j, YAML::Emitter& out) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [key, value] : j.items()) {
        out << YAML::Key << key << YAML::Value;
        Emit(value, out);
      }
      out << YAML::EndMap;
      break;
    case nlohmann::ordered_json::value_t::array:
      out << YAML::BeginSeq;
      for (const auto& value : j) Emit(value, out);
      out << YAML::EndSeq;
      break;
    case nlohmann::ordered_json::value_t::string: {
      const auto& s = j.get_ref<const std::string&>();
      if (PlainIsSafe(s)) out << s;
      else out << YAML::DoubleQuoted << s;
      break;
    }
    case nlohmann::ordered_json::value_t::boolean: out << (j.get<bool>() ? "true" : "false"); break;
    case nlohmann::ordered_json::value_t::null: out << YAML::Null; break;
    default: out << j.dump(); break;  // numbers, written as JSON writes them
  }
}

}  // namespace

std::string JsonToYaml(const std::string& json) {
  const auto tree = nlohmann::ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (tree.is_discarded()) return "";
  if (tree.is_object() && tree.empty()) return "{}\n";
  YAML::Emitter out;
  Emit(tree, out);
  return std::string(out.c_str()) + "\n";
}

std::string ToYaml(const google::protobuf::Message& m) { return JsonToYaml(ToJson(m, true)); }

}  // namespace offloadctl
