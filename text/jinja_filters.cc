// The filters of the Jinja subset as a table: each filter a small handler, found by name.

#include "text/jinja_filters.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <unordered_map>

#include "text/jinja_builtins.h"
#include "text/unicode.h"

namespace offloadd::text::jinja {
namespace {

using Filter = StatusOr<Value> (*)(const FilterCall& c);

const Value* Arg(const FilterCall& c, size_t pos, const char* name) {
  return jinja::Arg(c.args, c.kwargs, pos, name);
}

// The evaluator's limit error when the budget ran out (OK otherwise, which callers never see:
// they call it only after a charge failed).
Status OverBudget(const FilterCall& c) { return c.host.Checked(c.n, OkStatus()); }

StatusOr<Value> Trim(const FilterCall& c) {
  // jinja2 trims str(value): a list of content parts prints as its repr (Llama 3.1).
  return Value::String(Strip(c.in.ToString(), Arg(c, 0, "chars"), true, true));
}

StatusOr<Value> ToJson(const FilterCall& c) {
  auto j = ToJsonFilter(c.in, c.args, c.kwargs);
  if (!j.ok()) return c.host.Err(c.n, j.status().message());
  return Value::String(*j);
}

StatusOr<Value> Length(const FilterCall& c) {  // also `count`
  if (c.in.is_string()) return Value::Int(static_cast<int64_t>(CountCodePoints(c.in.str())));
  if (c.in.is_list()) return Value::Int(static_cast<int64_t>(c.in.list().size()));
  if (c.in.is_dict()) return Value::Int(static_cast<int64_t>(c.in.dict().size()));
  if (c.in.is_undefined()) return Value::Int(0);
  return c.host.Err(c.n, "length of " + KindName(c.in.kind()));
}

StatusOr<Value> Upper(const FilterCall& c) {
  return Value::String(AsciiCase(c.in.ToString(), true));
}
StatusOr<Value> Lower(const FilterCall& c) {
  return Value::String(AsciiCase(c.in.ToString(), false));
}
StatusOr<Value> TitleFilter(const FilterCall& c) { return Value::String(Title(c.in.ToString())); }

StatusOr<Value> Capitalize(const FilterCall& c) {
  std::string out = AsciiCase(c.in.ToString(), false);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return Value::String(out);
}

StatusOr<Value> First(const FilterCall& c) {
  ASSIGN_OR_RETURN(List items, c.host.Iterate(c.n, c.in));
  if (items.empty()) return Value();
  return items.front();
}
StatusOr<Value> Last(const FilterCall& c) {
  ASSIGN_OR_RETURN(List items, c.host.Iterate(c.n, c.in));
  if (items.empty()) return Value();
  return items.back();
}

StatusOr<Value> Join(const FilterCall& c) {
  ASSIGN_OR_RETURN(List items, c.host.Iterate(c.n, c.in));
  const Value* sep = Arg(c, 0, "d");
  const Value* attr = Arg(c, 1, "attribute");
  const std::string separator = sep ? sep->ToString() : "";
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (attr) {
      ASSIGN_OR_RETURN(item, c.host.GetAttr(c.n, item, attr->ToString()));
    }
    const std::string text = item.ToString();
    if (!c.host.budget()->Alloc((i ? separator.size() : 0) + text.size())) return OverBudget(c);
    if (i) out += separator;
    out += text;
  }
  return Value::String(out);
}

StatusOr<Value> Default(const FilterCall& c) {  // also `d`
  const Value* dflt = Arg(c, 0, "default_value");
  const Value* boolean = Arg(c, 1, "boolean");
  const bool use_default = c.in.is_undefined() || (boolean && boolean->Truthy() && !c.in.Truthy());
  return use_default ? (dflt ? *dflt : Value::String("")) : c.in;
}

StatusOr<Value> String(const FilterCall& c) {
  return c.in.is_string() ? c.in : Value::String(c.in.ToString());
}
StatusOr<Value> Safe(const FilterCall& c) { return c.in; }
StatusOr<Value> Escape(const FilterCall& c) {  // also `e`
  return Value::String(HtmlEscape(c.in.ToString()));
}

StatusOr<Value> Int(const FilterCall& c) {
  if (c.in.kind() == Value::Kind::kInt) return c.in;
  if (c.in.is_number()) {
    auto i = FloatToInt(c.in.number());
    if (!i.ok()) return c.host.Err(c.n, i.status().message());
    return Value::Int(*i);
  }
  if (c.in.is_string()) {
    try {
      return Value::Int(std::stoll(c.in.str()));
    } catch (...) {
      return Value::Int(0);
    }
  }
  return Value::Int(c.in.Truthy() ? 1 : 0);
}

StatusOr<Value> Float(const FilterCall& c) {
  if (c.in.is_number()) return Value::Float(c.in.number());
  try {
    return Value::Float(std::stod(c.in.ToString()));
  } catch (...) {
    return Value::Float(0);
  }
}

StatusOr<Value> Abs(const FilterCall& c) {
  if (!c.in.is_number()) return c.host.Err(c.n, "abs of " + KindName(c.in.kind()));
  if (c.in.kind() == Value::Kind::kInt && c.in.int_value() == INT64_MIN)
    return c.host.Err(c.n, "integer overflow in abs");
  return c.in.kind() == Value::Kind::kInt ? Value::Int(std::llabs(c.in.int_value()))
                                          : Value::Float(std::fabs(c.in.number()));
}

StatusOr<Value> Round(const FilterCall& c) {
  const Value* prec = Arg(c, 0, "precision");
  const double p = std::pow(10.0, prec ? prec->number() : 0);
  return Value::Float(std::round(c.in.number() * p) / p);
}

StatusOr<Value> ListFilter(const FilterCall& c) {
  ASSIGN_OR_RETURN(List items, c.host.Iterate(c.n, c.in));
  return Value::NewList(std::move(items));
}

StatusOr<Value> Items(const FilterCall& c) {
  if (!c.in.is_dict()) return c.host.Err(c.n, "items needs a dict");
  List out;
  for (const auto& [k, v] : c.in.dict()) {
    if (!c.host.budget()->Alloc(3 * sizeof(Value) + k.size())) return OverBudget(c);
    out.push_back(Value::NewList({Value::String(k), v}));
  }
  return c.host.MakeList(c.n, std::move(out), false);
}

StatusOr<Value> Replace(const FilterCall& c) {
  if (c.args.size() < 2) return c.host.Err(c.n, "replace needs two arguments");
  const int64_t count =
      c.args.size() > 2 && c.args[2].kind() == Value::Kind::kInt ? c.args[2].int_value() : -1;
  return Value::String(
      ReplaceStr(c.in.ToString(), c.args[0].ToString(), c.args[1].ToString(), count));
}

StatusOr<Value> Reverse(const FilterCall& c) {
  if (c.in.is_string()) {
    if (!c.host.budget()->Alloc(CountCodePoints(c.in.str()) * 40)) return OverBudget(c);
    auto cps = SplitCodePoints(c.in.str());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return Value::String(out);
  }
  ASSIGN_OR_RETURN(List items, c.host.Iterate(c.n, c.in));
  std::reverse(items.begin(), items.end());
  return c.host.MakeList(c.n, std::move(items), false);
}

StatusOr<Value> Sort(const FilterCall& c) {
  ASSIGN_OR_RETURN(List items, c.host.Iterate(c.n, c.in));
  const Value* reverse = Arg(c, 0, "reverse");
  const Value* attr = Arg(c, 2, "attribute");
  Status err;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    Value x = a, y = b;
    if (attr) {
      x = a.Find(attr->ToString()) ? *a.Find(attr->ToString()) : Value();
      y = b.Find(attr->ToString()) ? *b.Find(attr->ToString()) : Value();
    }
    auto cmp = Value::Compare(x, y);
    if (!cmp.ok()) {
      err = cmp.status();
      return false;
    }
    return *cmp < 0;
  });
  if (c.host.budget()->exhausted()) return OverBudget(c);
  if (!err.ok()) return c.host.Err(c.n, err.message());
  if (reverse && reverse->Truthy()) std::reverse(items.begin(), items.end());
  return c.host.MakeList(c.n, std::move(items), false);
}

StatusOr<Value> Unique(const FilterCall& c) {
  ASSIGN_OR_RETURN(List items, c.host.Iterate(c.n, c.in));
  List out;
  for (const auto& v : items) {
    // Quadratic: every comparison is a step (operator== charges the budget).
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    if (c.host.budget()->exhausted()) return OverBudget(c);
  }
  return c.host.MakeList(c.n, std::move(out), false);
}

StatusOr<Value> Indent(const FilterCall& c) {
  const Value* width = Arg(c, 0, "width");
  const Value* first = Arg(c, 1, "first");
  const Value* blank = Arg(c, 2, "blank");
  const double w = width && !width->is_string() ? width->number() : 4;
  if (!(w >= 0 && w <= (1 << 20))) return c.host.Err(c.n, "indent width must be 0 to 1048576");
  const std::string pad =
      width && width->is_string() ? width->str() : std::string(static_cast<size_t>(w), ' ');
  std::string s = c.in.ToString(), out;
  size_t start = 0;
  bool first_line = true;
  while (true) {
    const size_t nl = s.find('\n', start);
    const std::string line =
        s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    const bool indent_line = (!first_line || (first && first->Truthy())) &&
                             (!line.empty() || (blank && blank->Truthy()));
    if (!c.host.budget()->Alloc((indent_line ? pad.size() : 0) + line.size() + 1))
      return OverBudget(c);
    out += (indent_line ? pad : "") + line;
    if (nl == std::string::npos) break;
    out += "\n";
    start = nl + 1;
    first_line = false;
  }
  return Value::String(out);
}

StatusOr<Value> Map(const FilterCall& c) {
  ASSIGN_OR_RETURN(List items, c.host.Iterate(c.n, c.in));
  const Value* attr = Arg(c, 99, "attribute");
  List out;
  for (const auto& item : items) {
    if (attr) {
      ASSIGN_OR_RETURN(Value v, c.host.GetAttr(c.n, item, attr->ToString()));
      out.push_back(v);
    } else if (!c.args.empty() && c.args[0].is_string()) {
      std::vector<Value> rest(c.args.begin() + 1, c.args.end());
      KwArgs none;
      ASSIGN_OR_RETURN(Value v, ApplyFilter({c.host, c.n, c.args[0].str(), item, rest, none}));
      out.push_back(v);
    } else {
      return c.host.Err(c.n, "map needs attribute= or a filter name");
    }
  }
  return c.host.MakeList(c.n, std::move(out), false);
}

// select/reject test the item itself (Llama 3.1: builtin_tools | reject('equalto', ...)),
// selectattr/rejectattr one of its attributes.
StatusOr<Value> Select(const FilterCall& c) {
  ASSIGN_OR_RETURN(List items, c.host.Iterate(c.n, c.in));
  const size_t test_arg = c.name.ends_with("attr") ? 1 : 0;
  if (test_arg == 1 && c.args.empty()) return c.host.Err(c.n, c.name + " needs an attribute name");
  List out;
  for (const auto& item : items) {
    Value v = item;
    if (test_arg == 1) {
      ASSIGN_OR_RETURN(v, c.host.GetAttr(c.n, item, c.args[0].ToString()));
    }
    bool ok;
    if (c.args.size() > test_arg) {
      std::vector<Value> targs(c.args.begin() + test_arg + 1, c.args.end());
      ASSIGN_OR_RETURN(ok, c.host.Test(c.n, c.args[test_arg].ToString(), v, targs));
    } else {
      ok = v.Truthy();
    }
    if (ok == c.name.starts_with("select")) out.push_back(item);
  }
  return c.host.MakeList(c.n, std::move(out), false);
}

const std::unordered_map<std::string_view, Filter>& Filters() {
  static const auto* table = new std::unordered_map<std::string_view, Filter>{
      {"trim", Trim},         {"tojson", ToJson},
      {"length", Length},     {"count", Length},
      {"upper", Upper},       {"lower", Lower},
      {"title", TitleFilter}, {"capitalize", Capitalize},
      {"first", First},       {"last", Last},
      {"join", Join},         {"default", Default},
      {"d", Default},         {"string", String},
      {"safe", Safe},         {"e", Escape},
      {"escape", Escape},     {"int", Int},
      {"float", Float},       {"abs", Abs},
      {"round", Round},       {"list", ListFilter},
      {"items", Items},       {"replace", Replace},
      {"reverse", Reverse},   {"sort", Sort},
      {"unique", Unique},     {"indent", Indent},
      {"map", Map},           {"select", Select},
      {"reject", Select},     {"selectattr", Select},
      {"rejectattr", Select},
  };
  return *table;
}

}  // namespace

StatusOr<Value> ApplyFilter(const FilterCall& call) {
  const auto it = Filters().find(call.name);
  if (it == Filters().end()) return call.host.Err(call.n, "unsupported filter '" + call.name + "'");
  return it->second(call);
}

}  // namespace offloadd::text::jinja
