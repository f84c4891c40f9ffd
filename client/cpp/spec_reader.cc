#include "client/cpp/spec_reader.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "common/message_text.h"
#include "common/units.h"

namespace offloadd::client {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string Child(const std::string& path, const std::string& name) { return path.empty() ? name : path + "." + name; }

std::string Normalized(std::string_view s) {  // learningRate, Learning_Rate -> learningrate
  std::string out;
  for (char c : s) {
    if (c != '_' && c != '-') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

// Every field name under JobSpec-like roots, with its paths: "packing" -> {"dataset.packing"}, so a
// field written in the wrong section is pointed to where it belongs.
void IndexFields(const Descriptor* d, const std::string& path, int depth,
                 std::map<std::string, std::vector<std::string>>* index) {
  if (depth > 8) return;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    (*index)[f->name()].push_back(Child(path, f->name()));
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map()) {
      IndexFields(f->message_type(), Child(path, f->name()), depth + 1, index);
    }
  }
}

const std::map<std::string, std::vector<std::string>>& FieldIndex(const Descriptor* root) {
  static std::mutex mu;
  static std::map<const Descriptor*, std::map<std::string, std::vector<std::string>>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace(root);
  if (fresh) IndexFields(root, "", 0, &it->second);
  return it->second;
}

class Reader {
 public:
  Reader(const Descriptor* root, std::vector<FieldViolation>* out) : root_(root), out_(out) {}

  void Object(const YAML::Node& node, const std::string& path, google::protobuf::Message* msg) {
    const Descriptor* d = msg->GetDescriptor();
    if (!node.IsMap()) {
      Add(path, "expected a mapping of " + Fields(d) + ", got " + Kind(node));
      return;
    }
    std::set<int> seen;
    for (const auto& kv : node) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      const FieldDescriptor* f = d->FindFieldByName(key);
      for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
        if (d->field(i)->json_name() == key) f = d->field(i);
      }
      if (f == nullptr) {
        Unknown(d, path, key);
        continue;
      }
      const std::string where = Child(path, f->name());
      if (!seen.insert(f->number()).second) {
        Add(where, "given twice");
        continue;
      }
      if (kv.second.IsNull()) continue;  // unset, as in protobuf's JSON
      Field(kv.second, where, f, msg);
    }
  }

 private:
  void Add(const std::string& path, const std::string& description) { out_->push_back({path, description}); }

  static std::string Kind(const YAML::Node& n) {
    if (n.IsMap()) return "a mapping";
    if (n.IsSequence()) return "a list";
    if (n.IsScalar()) return "'" + SafeMessageText(n.Scalar(), 80) + "'";
    return "nothing";
  }

  static std::string Fields(const Descriptor* d) {
    std::vector<std::string> names;
    for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
    return Join(names);
  }

  void Unknown(const Descriptor* d, const std::string& path, const std::string& key) {
    std::vector<std::string> names;
    for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
    std::string hint;
    if (const std::string near = NearestName(key, names); !near.empty()) {
      hint = "; did you mean `" + near + "`?";
    } else {  // a field of another section: say where it belongs
      const auto& index = FieldIndex(root_);
      if (auto it = index.find(key); it != index.end()) hint = "; did you mean `" + it->second.front() + "`?";
    }
    const std::string what = path.empty() ? "the job spec" : path;
    Add(Child(path, SafeMessageText(key, 80)),
        "unknown field" + hint + " (fields of " + what + ": " + Join(names) + ")");
  }

  // A scalar's text, or a violation and false when the node is a mapping or a list.
  bool Scalar(const YAML::Node& n, const std::string& path, const std::string& expected, std::string* text) {
    if (n.IsScalar()) {
      *text = n.Scalar();
      return true;
    }
    Add(path, "expected " + expected + ", got " + Kind(n));
    return false;
  }

  void Field(const YAML::Node& n, const std::string& path, const FieldDescriptor* f, google::protobuf::Message* msg) {
    const Reflection* r = msg->GetReflection();
    if (f->is_map()) {
      if (!n.IsMap()) return Add(path, "expected a mapping, got " + Kind(n));
      const FieldDescriptor* kf = f->message_type()->map_key();
      const FieldDescriptor* vf = f->message_type()->map_value();
      for (const auto& kv : n) {
        const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
        const std::string where = path + "[" + SafeMessageText(key, 80) + "]";
        std::unique_ptr<google::protobuf::Message> entry(
            r->GetMessageFactory()->GetPrototype(f->message_type())->New());
        if (Value(kv.first, where, kf, entry.get()) && Value(kv.second, where, vf, entry.get())) {
          r->AddMessage(msg, f)->CopyFrom(*entry);
        }
      }
      return;
    }
    if (f->is_repeated()) {
      if (!n.IsSequence()) return Add(path, "expected a list, got " + Kind(n));
      for (size_t i = 0; i < n.size(); ++i) Value(n[i], path + "[" + std::to_string(i) + "]", f, msg);
      return;
    }
    Value(n, path, f, msg);
  }

  // One value of `f` (appended when f is repeated). False (with a violation) when it is not one.
  bool Value(const YAML::Node& n, const std::string& path, const FieldDescriptor* f, google::protobuf::Message* msg);
  bool Integer(const std::string& text, const std::string& path, const FieldDescriptor* f,
               google::protobuf::Message* msg);
  bool Enum(const std::string& text, const std::string& path, const FieldDescriptor* f, google::protobuf::Message* msg);

  const Descriptor* root_;
  std::vector<FieldViolation>* out_;
};

bool Reader::Value(const YAML::Node& n, const std::string& path, const FieldDescriptor* f,
                   google::protobuf::Message* msg) {
  const Reflection* r = msg->GetReflection();
  const bool rep = f->is_repeated();
  std::string text;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      google::protobuf::Message* sub = rep ? r->AddMessage(msg, f) : r->MutableMessage(msg, f);
      const size_t before = out_->size();
      Object(n, path, sub);
      return out_->size() == before;
    }
    case FieldDescriptor::CPPTYPE_STRING:
      if (!Scalar(n, path, "a string", &text)) return false;
      // proto3 strings are UTF-8: an invalid byte would serialize into a message nobody can
      // parse back (the daemon, the job store).
      if (const size_t bad = InvalidUtf8At(text); bad != std::string_view::npos) {
        Add(path, "not valid UTF-8 (byte " + std::to_string(bad) + "): '" + SafeMessageText(text, 80) + "'");
        return false;
      }
      rep ? r->AddString(msg, f, text) : r->SetString(msg, f, text);
      return true;
    case FieldDescriptor::CPPTYPE_BOOL: {
      if (!Scalar(n, path, "true or false", &text)) return false;
      std::string lower = Normalized(text);
      if (lower != "true" && lower != "false") {
        Add(path, "expected true or false, got '" + SafeMessageText(text, 80) + "'");
        return false;
      }
      rep ? r->AddBool(msg, f, lower == "true") : r->SetBool(msg, f, lower == "true");
      return true;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      if (!Scalar(n, path, "a number", &text)) return false;
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || errno == ERANGE) {
        Add(path, "expected a number, got '" + SafeMessageText(text, 80) + "'");
        return false;
      }
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
        rep ? r->AddFloat(msg, f, static_cast<float>(v)) : r->SetFloat(msg, f, static_cast<float>(v));
      } else {
        rep ? r->AddDouble(msg, f, v) : r->SetDouble(msg, f, v);
      }
      return true;
    }
    case FieldDescriptor::CPPTYPE_ENUM:
      if (!Scalar(n, path, "a value name", &text)) return false;
      return Enum(text, path, f, msg);
    default:
      if (!Scalar(n, path, IsByteSizeField(f) ? "a byte size" : "an integer", &text)) return false;
      return Integer(text, path, f, msg);
  }
}

bool Reader::Integer(const std::string& text, const std::string& path, const FieldDescriptor* f,
                     google::protobuf::Message* msg) {
  const Reflection* r = msg->GetReflection();
  const bool rep = f->is_repeated();
  if (IsByteSizeField(f)) {
    auto bytes = ParseByteSize(text);
    if (!bytes.ok()) {
      Add(path, bytes.status().message());
      return false;
    }
    rep ? r->AddUInt64(msg, f, *bytes) : r->SetUInt64(msg, f, *bytes);
    return true;
  }
  // Integers may be written 1000, 1e3 or 1000.0, as protobuf's JSON reads them.
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(text.c_str(), &end);
  const bool whole = !text.empty() && end == text.c_str() + text.size() && std::isfinite(d) && d == std::floor(d);
  if (!whole) {
    Add(path, "expected a whole number, got '" + SafeMessageText(text, 80) + "'");
    return false;
  }
  // Written as a plain integer: read exactly (a double holds 53 bits).
  errno = 0;
  const bool negative = text.find('-') != std::string::npos;
  const long long exact = std::strtoll(text.c_str(), &end, 10);
  const bool plain = end == text.c_str() + text.size() && errno == 0;
  errno = 0;
  const unsigned long long uexact = negative ? 0 : std::strtoull(text.c_str(), &end, 10);
  const bool uplain = !negative && end == text.c_str() + text.size() && errno == 0;
  const auto in = [&](double lo, double hi) {
    if (d >= lo && d <= hi) return true;
    Add(path, "'" + SafeMessageText(text, 80) + "' is out of range for " + f->cpp_type_name());
    return false;
  };
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      if (!in(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max())) return false;
      rep ? r->AddInt32(msg, f, static_cast<int32_t>(d)) : r->SetInt32(msg, f, static_cast<int32_t>(d));
      return true;
    case FieldDescriptor::CPPTYPE_UINT32:
      if (!in(0, std::numeric_limits<uint32_t>::max())) return false;
      rep ? r->AddUInt32(msg, f, static_cast<uint32_t>(d)) : r->SetUInt32(msg, f, static_cast<uint32_t>(d));
      return true;
    case FieldDescriptor::CPPTYPE_INT64: {
      if (!plain && !in(-9.2e18, 9.2e18)) return false;
      const int64_t v = plain ? exact : static_cast<int64_t>(d);
      rep ? r->AddInt64(msg, f, v) : r->SetInt64(msg, f, v);
      return true;
    }
    default: {  // UINT64
      if (!uplain && !in(0, 1.8e19)) return false;
      const uint64_t v = uplain ? uexact : static_cast<uint64_t>(d);
      rep ? r->AddUInt64(msg, f, v) : r->SetUInt64(msg, f, v);
      return true;
    }
  }
}

bool Reader::Enum(const std::string& text, const std::string& path, const FieldDescriptor* f,
                  google::protobuf::Message* msg) {
  const Reflection* r = msg->GetReflection();
  const EnumDescriptor* e = f->enum_type();
  // The prefix every value shares (DATASET_FORMAT_): short names are written without it.
  std::string prefix = e->value(0)->name();
  prefix = prefix.substr(0, prefix.rfind("UNSPECIFIED"));
  std::string upper;
  for (char c : text) upper.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  const EnumValueDescriptor* v = e->FindValueByName(upper);
  if (v == nullptr) v = e->FindValueByName(prefix + upper);
  if (v == nullptr) {
    char* end = nullptr;
    const long n = std::strtol(text.c_str(), &end, 10);
    if (!text.empty() && end == text.c_str() + text.size()) v = e->FindValueByNumber(static_cast<int>(n));
  }
  if (v == nullptr) {
    std::vector<std::string> names;
    for (int i = 0; i < e->value_count(); ++i) {
      std::string name = e->value(i)->name();
      if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
      if (name == "UNSPECIFIED") continue;
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      names.push_back(name);
    }
    const std::string near = NearestName(text, names);
    Add(path, "unknown value '" + SafeMessageText(text, 80) + "'" +
                  (near.empty() ? "" : "; did you mean `" + near + "`?") +
                  " (one of " + Join(names) + ")");
    return false;
  }
  f->is_repeated() ? r->AddEnumValue(msg, f, v->number()) : r->SetEnumValue(msg, f, v->number());
  return true;
}

}  // namespace

void ReadMessage(const YAML::Node& node, const std::string& path, google::protobuf::Message* msg,
                 std::vector<FieldViolation>* violations) {
  Reader(msg->GetDescriptor(), violations).Object(node, path, msg);
}

bool IsByteSizeField(const FieldDescriptor* field) {
  static const std::set<std::string> kSizes = {"offloadd.v1.ResourceLimits.gpu_memory_limit",
                                               "offloadd.v1.ResourceLimits.host_memory_limit",
                                               "offloadd.v1.AioConfig.block_size"};
  return field->cpp_type() == FieldDescriptor::CPPTYPE_UINT64 && kSizes.count(field->full_name()) > 0;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);  // adjacent transposition
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string NearestName(std::string_view name, const std::vector<std::string>& candidates) {
  if (name.size() > 200) return "";
  const std::string norm = Normalized(name);
  // A few edits for the length: 1 up to 4 characters, 2 up to 8, else 3.
  const size_t allowed = norm.size() <= 4 ? 1 : norm.size() <= 8 ? 2 : 3;
  std::string best;
  size_t best_distance = allowed + 1;
  for (const std::string& c : candidates) {
    const size_t dist = EditDistance(norm, Normalized(c));
    if (dist < best_distance) {
      best = c;
      best_distance = dist;
    }
  }
  return best;
}

}  // namespace offloadd::client
