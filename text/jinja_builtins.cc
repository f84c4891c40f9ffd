// Built-in functions of the Jinja subset: Python string and dict methods, tests (`is ...`),
// globals (raise_exception, namespace, dict, range, strftime_now) and string helpers.

#include "text/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "text/jinja_limits.h"
#include "text/unicode.h"

namespace offloadd::text::jinja {

namespace {

bool IsPySpace(uint32_t cp) { return IsUnicodeWhitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

}  // namespace

std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  // Walks code points in place: splitting a long string into one std::string per code point
  // would cost ~40 bytes per byte.
  auto strip_cp = [&](size_t pos, size_t len) {
    const std::string_view ch(s.data() + pos, len);
    if (chars != nullptr && chars->is_string()) return chars->str().find(ch) != std::string::npos;
    size_t p = 0;
    return IsPySpace(NextCodePoint(ch, &p));
  };
  auto cp_len = [&](size_t pos) {
    return std::min(s.size() - pos, Utf8SeqLen(static_cast<unsigned char>(s[pos])));
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && strip_cp(b, cp_len(b))) b += cp_len(b);
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;  // back to the lead byte of the last code point
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      if (!strip_cp(start, e - start)) break;
      e = start;
    }
  }
  return s.substr(b, e - b);
}

// Python str.upper()/lower(): full Unicode case mapping (through ICU for non-ASCII text).
std::string AsciiCase(std::string s, bool upper) {
  for (unsigned char c : s) {
    if (c >= 0x80) {
      auto r = upper ? Uppercase(s) : Lowercase(s);
      if (r.ok()) return *r;
      break;
    }
  }
  for (char& c : s)
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool prev_letter = false;
  for (char& c : out) {
    const bool letter = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (letter) c = static_cast<char>(prev_letter ? std::tolower(c) : std::toupper(c));
    prev_letter = letter || (static_cast<unsigned char>(c) >= 0x80);
  }
  return out;
}

std::vector<std::string> PySplit(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep == nullptr || sep->is_none() || sep->is_undefined()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back())))
          rest.pop_back();
        out.push_back(rest);
        break;
      }
      size_t e = i;
      while (e < s.size() && !std::isspace(static_cast<unsigned char>(s[e]))) ++e;
      out.push_back(s.substr(i, e - i));
      i = e;
    }
    return out;
  }
  const std::string& d = sep->str();
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t pos = d.empty() ? std::string::npos : s.find(d, start);
    if (pos == std::string::npos) break;
    out.push_back(s.substr(start, pos - start));
    start = pos + d.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::string ReplaceStr(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  if (from.empty()) return s;
  // Size the result first: 'x' * 10**5 replacing 'x' by itself would build 10 GB.
  uint64_t hits = 0;
  for (size_t pos = FindSub(s, from); pos != std::string::npos && (count < 0 || hits < static_cast<uint64_t>(count));
       pos = FindSub(s, from, pos + from.size()))
    ++hits;
  if (!to.empty() && hits > (uint64_t{1} << 62) / to.size()) {
    ChargeBytes(UINT64_MAX);
    return "";
  }
  const uint64_t size = s.size() - hits * from.size() + hits * to.size();
  if (!ChargeBytes(size)) return "";
  std::string out;
  out.reserve(static_cast<size_t>(size));
  size_t start = 0;
  for (uint64_t n = 0; n < hits; ++n) {
    const size_t pos = FindSub(s, from, start);
    out.append(s, start, pos - start);
    out += to;
    start = pos + from.size();
  }
  out.append(s, start);
  return out;
}

const Value* Arg(const std::vector<Value>& args, const KwArgs& kwargs, size_t pos,
                 const char* name) {
  for (const auto& [k, v] : kwargs) {
    if (k == name) return &v;
  }
  return pos < args.size() ? &args[pos] : nullptr;
}

std::optional<Value> DictMethod(const Value& obj, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return Value::NewFunction([obj, name](std::vector<Value>&, KwArgs&) -> StatusOr<Value> {
      List out;
      for (const auto& [k, v] : obj.dict()) {
        if (name == "items")
          out.push_back(Value::NewList({Value::String(k), v}));
        else if (name == "keys")
          out.push_back(Value::String(k));
        else
          out.push_back(v);
      }
      return Value::NewList(std::move(out));
    });
  }
  if (name == "get") {
    return Value::NewFunction([obj](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
      if (args.empty() || !args[0].is_string()) return InvalidArgumentError("dict.get needs a key");
      if (Value* v = obj.Find(args[0].str())) return *v;
      return args.size() > 1 ? args[1] : Value::None();
    });
  }
  return std::nullopt;
}

std::optional<Value> StringMethod(const std::string& s, const std::string& name) {
  auto fn = [](auto f) { return Value::NewFunction(f); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return fn([s, name](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
      return Value::String(
          Strip(s, args.empty() ? nullptr : &args[0], name != "rstrip", name != "lstrip"));
    });
  }
  if (name == "upper" || name == "lower") {
    return fn([s, name](std::vector<Value>&, KwArgs&) -> StatusOr<Value> {
      return Value::String(AsciiCase(s, name == "upper"));
    });
  }
  if (name == "title") {
    return fn(
        [s](std::vector<Value>&, KwArgs&) -> StatusOr<Value> { return Value::String(Title(s)); });
  }
  if (name == "capitalize") {
    return fn([s](std::vector<Value>&, KwArgs&) -> StatusOr<Value> {
      std::string out = AsciiCase(s, false);
      if (!out.empty())
        out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
      return Value::String(out);
    });
  }
  if (name == "startswith" || name == "endswith") {
    return fn([s, name](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
      if (args.empty()) return InvalidArgumentError(name + " needs an argument");
      List options = args[0].is_list() ? args[0].list() : List{args[0]};
      for (const auto& o : options) {
        if (!o.is_string()) return InvalidArgumentError(name + " needs strings");
        const std::string& p = o.str();
        const bool hit =
            name == "startswith"
                ? s.compare(0, p.size(), p) == 0
                : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
        if (hit) return Value::Bool(true);
      }
      return Value::Bool(false);
    });
  }
  if (name == "split") {
    return fn([s](std::vector<Value>& args, KwArgs& kwargs) -> StatusOr<Value> {
      const Value* sep = Arg(args, kwargs, 0, "sep");
      const Value* maxsplit = Arg(args, kwargs, 1, "maxsplit");
      if (!ChargeBytes(s.size())) return Value::NewList();
      List out;
      for (auto& part : PySplit(
               s, sep,
               maxsplit && maxsplit->kind() == Value::Kind::kInt ? maxsplit->int_value() : -1)) {
        if (!ChargeBytes(sizeof(Value))) return Value::NewList();
        out.push_back(Value::String(part));
      }
      return Value::NewList(std::move(out));
    });
  }
  if (name == "replace") {
    return fn([s](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
      if (args.size() < 2 || !args[0].is_string() || !args[1].is_string()) {
        return InvalidArgumentError("replace needs two strings");
      }
      const int64_t count =
          args.size() > 2 && args[2].kind() == Value::Kind::kInt ? args[2].int_value() : -1;
      return Value::String(ReplaceStr(s, args[0].str(), args[1].str(), count));
    });
  }
  if (name == "find" || name == "count") {
    return fn([s, name](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
      if (args.empty() || !args[0].is_string())
        return InvalidArgumentError(name + " needs a string");
      const std::string& sub = args[0].str();
      if (name == "find") {
        const size_t pos = FindSub(s, sub);
        if (pos == std::string::npos) return Value::Int(-1);
        return Value::Int(static_cast<int64_t>(CountCodePoints(std::string_view(s).substr(0, pos))));
      }
      int64_t c = 0;
      for (size_t pos = FindSub(s, sub); pos != std::string::npos && !sub.empty();
           pos = FindSub(s, sub, pos + sub.size()))
        ++c;
      return Value::Int(c);
    });
  }
  if (name == "join") {
    return fn([s](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
      if (args.empty() || !args[0].is_list()) return InvalidArgumentError("join needs a list");
      std::string out;
      for (size_t i = 0; i < args[0].list().size(); ++i) {
        const std::string item = args[0].list()[i].ToString();
        if (!ChargeBytes((i ? s.size() : 0) + item.size())) return Value::String("");
        if (i) out += s;
        out += item;
      }
      return Value::String(out);
    });
  }
  return std::nullopt;
}

StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const std::vector<Value>& args) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.bool_value();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.bool_value();
  if (name == "mapping") return v.is_dict();
  if (name == "sequence") return v.is_list() || v.is_string() || v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_string() || v.is_dict();
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even") {
    if (v.kind() != Value::Kind::kInt) return InvalidArgumentError(name + " test needs an integer");
    return (v.int_value() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    if (args.empty() || args[0].kind() != Value::Kind::kInt || args[0].int_value() == 0) {
      return InvalidArgumentError("divisibleby needs a non-zero integer");
    }
    if (args[0].int_value() == -1) return v.kind() == Value::Kind::kInt;  // INT64_MIN % -1 traps
    return v.kind() == Value::Kind::kInt && v.int_value() % args[0].int_value() == 0;
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") {
    if (args.empty()) return InvalidArgumentError(name + " test needs an argument");
    return v == args[0];
  }
  if (name == "ne" || name == "!=") return !args.empty() && !(v == args[0]);
  if (name == "lt" || name == "gt" || name == "le" || name == "ge") {
    if (args.empty()) return InvalidArgumentError(name + " test needs an argument");
    auto c = Value::Compare(v, args[0]);
    if (!c.ok()) return InvalidArgumentError(c.status().message());
    if (name == "lt") return *c < 0;
    if (name == "gt") return *c > 0;
    if (name == "le") return *c <= 0;
    return *c >= 0;
  }
  if (name == "in") {
    if (args.empty()) return InvalidArgumentError("in test needs an argument");
    const Value& c = args[0];
    if (c.is_list()) return std::find(c.list().begin(), c.list().end(), v) != c.list().end();
    if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
    if (c.is_dict()) return v.is_string() && c.Find(v.str()) != nullptr;
    return false;
  }
  return InvalidArgumentError("unsupported test '" + name + "'");
}

StatusOr<Value> Arithmetic(const std::string& op, const Value& x, const Value& y) {
  const bool ints = x.kind() == Value::Kind::kInt && y.kind() == Value::Kind::kInt;
  const int64_t a = x.int_value(), b = y.int_value();
  int64_t r = 0;
  // Python integers do not overflow; ours are 64-bit, so overflow is an error rather than
  // undefined behaviour (and INT64_MIN // -1 a SIGFPE).
  const Status overflow = InvalidArgumentError("integer overflow in " + op);
  if (op == "+" || op == "-" || op == "*") {
    if (!ints) {
      const double u = x.number(), v = y.number();
      return Value::Float(op == "+" ? u + v : op == "-" ? u - v : u * v);
    }
    const bool bad = op == "+"   ? __builtin_add_overflow(a, b, &r)
                     : op == "-" ? __builtin_sub_overflow(a, b, &r)
                                 : __builtin_mul_overflow(a, b, &r);
    if (bad) return overflow;
    return Value::Int(r);
  }
  if (op == "**") {
    if (ints && b >= 0) {
      int64_t acc = 1, base = a;
      for (int64_t e = b; e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) return overflow;
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow;
      }
      return Value::Int(acc);
    }
    return Value::Float(std::pow(x.number(), y.number()));
  }
  if (y.number() == 0) return InvalidArgumentError("division by zero");
  if (op == "/") return Value::Float(x.number() / y.number());
  if (ints && b == -1 && a == INT64_MIN) return overflow;
  if (op == "//") {
    if (ints) {
      int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
      return Value::Int(q);
    }
    return Value::Float(std::floor(x.number() / y.number()));
  }
  if (op == "%") {
    if (ints) {
      r = a % b;
      if (r != 0 && ((r < 0) != (b < 0))) r += b;
      return Value::Int(r);
    }
    return Value::Float(x.number() - y.number() * std::floor(x.number() / y.number()));
  }
  return InvalidArgumentError("unknown operator " + op);
}

StatusOr<int64_t> FloatToInt(double d) {
  // static_cast of a NaN, an infinity or anything beyond 2^63 is undefined behaviour.
  if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0)) {
    return InvalidArgumentError("integer overflow converting " + FloatRepr(d) + " to int");
  }
  return static_cast<int64_t>(d);
}

void InstallGlobals(std::unordered_map<std::string, Value>* globals, std::vector<Value>* namespaces) {
  (*globals)["raise_exception"] =
      Value::NewFunction([](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
        return FailedPreconditionError(args.empty() ? "raise_exception" : args[0].ToString());
      });
  (*globals)["namespace"] =
      Value::NewFunction([namespaces](std::vector<Value>& args, KwArgs& kwargs) -> StatusOr<Value> {
        Value ns = Value::NewNamespace();
        if (!args.empty() && args[0].is_dict()) {
          for (const auto& [k, v] : args[0].dict()) ns.Set(k, v);
        }
        for (const auto& [k, v] : kwargs) ns.Set(k, v);
        if (namespaces != nullptr) namespaces->push_back(ns);
        return ns;
      });
  (*globals)["dict"] =
      Value::NewFunction([](std::vector<Value>& args, KwArgs& kwargs) -> StatusOr<Value> {
        Value d = Value::NewDict();
        if (!args.empty() && args[0].is_dict()) {
          for (const auto& [k, v] : args[0].dict()) d.Set(k, v);
        }
        for (const auto& [k, v] : kwargs) d.Set(k, v);
        return d;
      });
  (*globals)["range"] =
      Value::NewFunction([](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
        for (const auto& a : args) {
          if (a.kind() != Value::Kind::kInt) return InvalidArgumentError("range needs integers");
        }
        int64_t start = 0, stop = 0, step = 1;
        if (args.size() == 1)
          stop = args[0].int_value();
        else if (args.size() >= 2) {
          start = args[0].int_value();
          stop = args[1].int_value();
          if (args.size() > 2) step = args[2].int_value();
        } else {
          return InvalidArgumentError("range needs 1 to 3 arguments");
        }
        if (step == 0) return InvalidArgumentError("range step cannot be zero");
        // The length first, in 128 bits: range(10**12) must fail before allocating.
        // The length first, in unsigned arithmetic: range(10**12) must fail before allocating.
        const bool up = step > 0;
        const uint64_t span = (up ? stop > start : start > stop)
                                  ? (up ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start)
                                        : static_cast<uint64_t>(start) - static_cast<uint64_t>(stop))
                                  : 0;
        const uint64_t mag = up ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
        const uint64_t count = span == 0 ? 0 : (span - 1) / mag + 1;
        if (count > (uint64_t{1} << 40) || !ChargeBytes(count * sizeof(Value))) {
          ChargeBytes(UINT64_MAX);
          return InvalidArgumentError("range of " + std::to_string(count) +
                                        " elements is too large");
        }
        List out;
        out.reserve(count);
        for (uint64_t k = 0; k < count; ++k) {
          out.push_back(Value::Int(static_cast<int64_t>(static_cast<uint64_t>(start) +
                                                        k * static_cast<uint64_t>(step))));
        }
        return Value::NewList(std::move(out));
      });
  (*globals)["strftime_now"] =
      Value::NewFunction([](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
        if (args.empty() || !args[0].is_string())
          return InvalidArgumentError("strftime_now needs a format");
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[256];
        const size_t len = std::strftime(buf, sizeof(buf), args[0].str().c_str(), &tm);
        return Value::String(std::string(buf, len));
      });
}

StatusOr<std::string> ToJsonFilter(const Value& in, const std::vector<Value>& args,
                                   const KwArgs& kwargs) {
  const Value* indent = Arg(args, kwargs, 0, "indent");
  const Value* sort = Arg(args, kwargs, 99, "sort_keys");
  const Value* seps = Arg(args, kwargs, 99, "separators");
  const int ind =
      indent && indent->kind() == Value::Kind::kInt ? static_cast<int>(indent->int_value()) : -1;
  std::string item_sep = ind >= 0 ? "," : ", ", key_sep = ": ";
  if (seps && seps->is_list() && seps->list().size() == 2) {
    item_sep = seps->list()[0].ToString();
    key_sep = seps->list()[1].ToString();
  }
  return in.ToJson(ind, item_sep, key_sep, sort && sort->Truthy());
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace offloadd::text::jinja
