#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "text/jinja_limits.h"
#include "text/unicode.h"

namespace offloadd::text::jinja {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}
Value Value::NewList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::NewTuple(List items) {
  Value v = NewList(std::move(items));
  v.tuple_ = true;
  return v;
}
Value Value::NewDict(Dict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::NewNamespace(Dict items) {
  Value v = NewDict(std::move(items));
  v.namespace_ = true;
  return v;
}
Value Value::NewFunction(Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Int(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(FromJson(e));
      return NewList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), FromJson(*it));
      return NewDict(std::move(items));
    }
    default:
      return Value();
  }
}

Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::Set(const std::string& key, Value v) const {
  if (Value* existing = Find(key)) {
    *existing = std::move(v);
  } else {
    dict_->emplace_back(key, std::move(v));
  }
}

void Value::ClearNamespace() const {
  if (is_namespace()) dict_->clear();
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, end);
  // Python uses exponent notation outside [1e-4, 1e16) and always shows a fractional part.
  const double a = std::fabs(d);
  if (a != 0 && (a < 1e-4 || a >= 1e16)) {
    auto [e2, ec2] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
    s.assign(buf, e2);
    const size_t e = s.find('e');
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    const bool neg = exp[0] == '-';
    if (exp[0] == '+' || exp[0] == '-') exp = exp.substr(1);
    while (exp.size() < 2) exp = "0" + exp;
    return mant + "e" + (neg ? "-" : "+") + exp;
  }
  if (s.find_first_of(".e") == std::string::npos) {
    auto [e3, ec3] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::fixed);
    s.assign(buf, e3);
    if (s.find('.') == std::string::npos) s += ".0";
  }
  return s;
}

namespace {

std::string PyStringRepr(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  out += q;
  return out;
}

void JsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          *out += buf;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

Status JsonDumpNode(const Value& v, int indent, int depth, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, std::string* out);

Status JsonDump(const Value& v, int indent, int depth, const std::string& item_sep,
                const std::string& key_sep, bool sort_keys, std::string* out) {
  // Shared sub-lists make a value's tree exponentially larger than its memory, and a namespace
  // may hold itself: every node visited and byte written is charged.
  ValueDepthGuard guard(depth);
  const size_t before = out->size();
  if (!guard.ok()) return InvalidArgumentError("tojson: value nested too deeply");
  Status s = JsonDumpNode(v, indent, depth, item_sep, key_sep, sort_keys, out);
  if (s.ok() && !ChargeBytes(out->size() - before)) return InvalidArgumentError("tojson: too large");
  return s;
}

Status JsonDumpNode(const Value& v, int indent, int depth, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, std::string* out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return OkStatus();
    case Value::Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return OkStatus();
    case Value::Kind::kInt:
      *out += std::to_string(v.int_value());
      return OkStatus();
    case Value::Kind::kFloat:
      if (std::isnan(v.number()))
        *out += "NaN";
      else if (std::isinf(v.number()))
        *out += v.number() > 0 ? "Infinity" : "-Infinity";
      else
        *out += FloatRepr(v.number());
      return OkStatus();
    case Value::Kind::kString:
      JsonString(v.str(), out);
      return OkStatus();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        RETURN_IF_ERROR(
            JsonDump(v.list()[i], indent, depth + 1, item_sep, key_sep, sort_keys, out));
      }
      newline(depth);
      out->push_back(']');
      return OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.dict().empty()) {
        *out += "{}";
        return OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict()) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        JsonString(items[i]->first, out);
        *out += key_sep;
        RETURN_IF_ERROR(
            JsonDump(items[i]->second, indent, depth + 1, item_sep, key_sep, sort_keys, out));
      }
      newline(depth);
      out->push_back('}');
      return OkStatus();
    }
    case Value::Kind::kUndefined:
    case Value::Kind::kFunction:
      return InvalidArgumentError("tojson: cannot serialize a value of type " + KindName(v.kind()));
  }
  return OkStatus();
}

bool BudgetExhausted() { return CurrentBudget() != nullptr && CurrentBudget()->exhausted(); }

}  // namespace

std::string Value::Repr() const {
  std::string out;
  AppendRepr(0, &out);
  return out;
}

// Charges the budget for each node and byte: a list holding one sub-list twice per level prints
// 2^depth elements, and a namespace may hold itself. Stops early once the budget is exhausted.
void Value::AppendRepr(int depth, std::string* out) const {
  ValueDepthGuard guard(depth);
  if (!guard.ok()) {
    *out += "...";
    return;
  }
  const size_t before = out->size();
  switch (kind_) {
    case Kind::kString:
      *out += PyStringRepr(s_);
      break;
    case Kind::kList:
      *out += tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size() && !BudgetExhausted(); ++i) {
        if (i) *out += ", ";
        (*list_)[i].AppendRepr(depth + 1, out);
      }
      if (tuple_ && list_->size() == 1) *out += ",";
      *out += tuple_ ? ")" : "]";
      break;
    case Kind::kDict:
      *out += "{";
      for (size_t i = 0; i < dict_->size() && !BudgetExhausted(); ++i) {
        if (i) *out += ", ";
        *out += PyStringRepr((*dict_)[i].first) + ": ";
        (*dict_)[i].second.AppendRepr(depth + 1, out);
      }
      *out += "}";
      break;
    default:
      *out += ToString();
  }
  if (kind_ != Kind::kList && kind_ != Kind::kDict) ChargeBytes(out->size() - before);
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return FloatRepr(f_);
    case Kind::kString:
      return s_;
    case Kind::kList:
    case Kind::kDict:
      return Repr();
    case Kind::kFunction:
      return "<function>";
  }
  return "";
}

StatusOr<std::string> Value::ToJson(int indent, const std::string& item_sep,
                                    const std::string& key_sep, bool sort_keys) const {
  std::string out;
  RETURN_IF_ERROR(JsonDump(*this, indent, 0, item_sep, key_sep, sort_keys, &out));
  return out;
}

bool operator==(const Value& a, const Value& b) { return Value::Equal(a, b, 0); }

bool Value::Equal(const Value& a, const Value& b, int depth) {
  ValueDepthGuard guard(depth);
  if (!guard.ok()) return false;  // the budget now reports the limit
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt) {
      return a.int_value() == b.int_value();
    }
    return a.number() == b.number();
  }
  if (a.kind() == Value::Kind::kBool && b.is_number())
    return (a.bool_value() ? 1 : 0) == b.number();
  if (b.kind() == Value::Kind::kBool && a.is_number())
    return (b.bool_value() ? 1 : 0) == a.number();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
      return a.bool_value() == b.bool_value();
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      if (a.list_ == b.list_) return true;
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equal(a.list()[i], b.list()[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict_ == b.dict_) return true;
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict()) {
        const Value* other = b.Find(k);
        if (other == nullptr || !Equal(*other, v, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kFunction:
      return a.fn_ == b.fn_;
    default:
      return false;
  }
}

StatusOr<int> Value::Compare(const Value& a, const Value& b) { return CompareAt(a, b, 0); }

StatusOr<int> Value::CompareAt(const Value& a, const Value& b, int depth) {
  ValueDepthGuard guard(depth);
  if (!guard.ok()) return InvalidArgumentError("comparison nested too deeply");
  if (a.is_number() && b.is_number()) {
    return a.number() < b.number() ? -1 : (a.number() > b.number() ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str() ? -1 : (a.str() > b.str() ? 1 : 0);
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < std::min(a.list().size(), b.list().size()); ++i) {
      ASSIGN_OR_RETURN(int c, CompareAt(a.list()[i], b.list()[i], depth + 1));
      if (c != 0) return c;
    }
    return a.list().size() < b.list().size() ? -1 : (a.list().size() > b.list().size() ? 1 : 0);
  }
  return InvalidArgumentError("cannot order " + KindName(a.kind()) + " and " + KindName(b.kind()));
}

std::string KindName(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kFunction:
      return "function";
  }
  return "?";
}

std::vector<std::string> SplitCodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < s.size();) {
    const size_t b = pos;
    pos += Utf8SeqLen(static_cast<unsigned char>(s[pos]));
    if (pos > s.size()) pos = s.size();
    out.push_back(s.substr(b, pos - b));
  }
  return out;
}

}  // namespace offloadd::text::jinja
