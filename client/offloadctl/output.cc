#include "client/offloadctl/output.h"

#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <cctype>
#include <regex>
#include <string>

namespace offloadctl {

std::optional<OutputFormat> ParseOutputFormat(const std::string& name) {
  if (name == "json") return OutputFormat::kJson;
  if (name == "yaml") return OutputFormat::kYaml;
  if (name == "table") return OutputFormat::kTable;
  return std::nullopt;
}

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// An enum value as the table and the SDK spell it: "JOB_STATE_RUNNING" -> "running" (the prefix
// every value of the enum shares, up to its UNSPECIFIED, dropped; what spec_reader reads back).
std::string ShortEnumName(const google::protobuf::EnumDescriptor* e, const std::string& name) {
  std::string prefix = e->value(0)->name();
  const size_t at = prefix.rfind("UNSPECIFIED");
  prefix = at == std::string::npos ? "" : prefix.substr(0, at);
  std::string out = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// One field's JSON value, rewritten in place: enums short and lower-case, 64-bit integers as
// numbers (protobuf's JSON writes them as strings), messages recursively.
void NormalizeValue(nlohmann::ordered_json& v, const FieldDescriptor* f);

void NormalizeMessage(nlohmann::ordered_json& j, const Descriptor* d) {
  // Well-known types (Timestamp, Duration, Struct, ...) have JSON forms of their own.
  if (!j.is_object() || d->file()->package() == "google.protobuf") return;
  for (auto& [key, value] : j.items()) {
    const FieldDescriptor* f = d->FindFieldByName(key);
    if (f == nullptr) continue;
    if (f->is_map()) {
      const FieldDescriptor* vf = f->message_type()->map_value();
      if (value.is_object()) {
        for (auto& [k, item] : value.items()) NormalizeValue(item, vf);
      }
    } else if (f->is_repeated() && value.is_array()) {
      for (auto& item : value) NormalizeValue(item, f);
    } else {
      NormalizeValue(value, f);
    }
  }
}

void NormalizeValue(nlohmann::ordered_json& v, const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_ENUM:
      if (v.is_string() && f->enum_type()->full_name() != "google.protobuf.NullValue") {
        v = ShortEnumName(f->enum_type(), v.get<std::string>());
      }
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      if (v.is_string()) v = std::stoll(v.get<std::string>());
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      if (v.is_string()) v = std::stoull(v.get<std::string>());
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      NormalizeMessage(v, f->message_type());
      break;
    default:
      break;
  }
}

}  // namespace

std::string ToJson(const google::protobuf::Message& m, bool one_line) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;  // a zero is a value, not a missing field
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  auto tree = nlohmann::ordered_json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (tree.is_discarded()) return out + "\n";  // not reached: protobuf wrote it
  NormalizeMessage(tree, m.GetDescriptor());
  // Non-ASCII text as it is (UTF-8), as protobuf's JSON writes it.
  out = tree.dump(one_line ? -1 : 2, ' ', /*ensure_ascii=*/false,
                  nlohmann::ordered_json::error_handler_t::replace);
  return out + "\n";
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
