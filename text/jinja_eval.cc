// Tree-walking evaluator for the Jinja subset (see jinja.h). Python/Jinja2 semantics are kept
// where chat templates can observe them: scoping (loop bodies get their own scope, so templates
// use namespace() to carry state out of loops), undefined values (print as "", are falsy,
// iterate as empty, fail on attribute access) and str()/repr() rendering.

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "text/jinja.h"
#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"
#include "text/jinja_filters.h"
#include "text/jinja_limits.h"
#include "text/unicode.h"

namespace offloadd::text::jinja {

namespace {

enum class Flow { kNormal, kBreak, kContinue };

StatusOr<int64_t> NormalizeIndex(int64_t i, size_t n) {
  return i < 0 ? i + static_cast<int64_t>(n) : i;
}

class Interpreter final : public FilterHost {
 public:
  Interpreter(const Value& context, const std::string* root_out,
              std::vector<std::pair<size_t, size_t>>* generation_spans, const RenderLimits& limits)
      : root_out_(root_out), generation_spans_(generation_spans), budget_(limits) {
    scopes_.emplace_back();
    if (context.is_dict()) {
      for (const auto& [k, v] : context.dict()) scopes_.back()[k] = v;
    }
    InstallGlobals(&globals_, &namespaces_);
  }
  ~Interpreter() {
    for (const Value& ns : namespaces_) ns.ClearNamespace();
  }
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  Budget* budget() override { return &budget_; }

  // Every statement and expression costs a step and a level of depth; a string result is
  // charged for its bytes (a copy or a new string each time).
  Status Exec(const Node& n, std::string* out, Flow* flow) {
    Status s = budget_.Enter() && budget_.Step() ? ExecNode(n, out, flow) : OkStatus();
    budget_.Leave();
    return Checked(n, std::move(s));
  }

  StatusOr<Value> Eval(const Node& n) {
    StatusOr<Value> r = InvalidArgumentError("");
    if (budget_.Enter() && budget_.Step()) {
      r = EvalNode(n);
      if (r.ok() && r->is_string()) budget_.Alloc(r->str().size());
    }
    budget_.Leave();
    if (budget_.exhausted()) return Checked(n, r.ok() ? OkStatus() : r.status());
    return r;
  }

 private:
  // The first limit exceeded, with the innermost node's line; other errors pass through.
  Status Checked(const Node& n, Status s) const override {
    const StatusCode code = budget_.error().code();  // CANCELLED when the request was stopped
    if (!budget_.exhausted() || s.code() == code) return s;
    return Status(code, "line " + std::to_string(n.line) + ": " + budget_.error().message());
  }

  Status Append(const Node& n, std::string* out, const std::string& piece) {
    if (!budget_.Alloc(piece.size()) ||
        (out == root_out_ && !budget_.Output(out->size() + piece.size()))) {
      return Checked(n, OkStatus());
    }
    *out += piece;
    return OkStatus();
  }

  // A new list or tuple: its slots and the strings copied into it are charged.
  StatusOr<Value> MakeList(const Node& n, List items, bool tuple = false) override {
    if (!ChargeItems(items)) return Checked(n, OkStatus());
    return tuple ? Value::NewTuple(std::move(items)) : Value::NewList(std::move(items));
  }

  bool ChargeItems(const List& items) {
    uint64_t bytes = items.size() * sizeof(Value);
    for (const auto& v : items) bytes += v.is_string() ? v.str().size() : 0;
    return budget_.Step(items.size() / 16) && budget_.Alloc(bytes);
  }

  Status ExecNode(const Node& n, std::string* out, Flow* flow) {
    switch (n.type) {
      case Node::Type::kBody:
        for (const auto& child : n.children) {
          RETURN_IF_ERROR(Exec(*child, out, flow));
          if (*flow != Flow::kNormal) return OkStatus();
        }
        return OkStatus();
      case Node::Type::kText:
        return Append(n, out, n.literal.str());
      case Node::Type::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.children[0]));
        const std::string text = v.ToString();
        return Append(n, out, text);
      }
      case Node::Type::kIf: {
        const size_t pairs = (n.children.size() - (n.has_else ? 1 : 0)) / 2;
        for (size_t i = 0; i < pairs; ++i) {
          ASSIGN_OR_RETURN(Value c, Eval(*n.children[2 * i]));
          if (c.Truthy()) return Exec(*n.children[2 * i + 1], out, flow);
        }
        if (n.has_else) return Exec(*n.children.back(), out, flow);
        return OkStatus();
      }
      case Node::Type::kFor:
        return ExecFor(n, out, flow);
      case Node::Type::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.children[0]));
        return Assign(n, n.targets, v);
      }
      case Node::Type::kSetBlock: {
        std::string captured;
        Flow f = Flow::kNormal;
        RETURN_IF_ERROR(Exec(*n.children[0], &captured, &f));
        scopes_.back()[n.targets[0]] = Value::String(std::move(captured));
        return OkStatus();
      }
      case Node::Type::kMacro:
        DefineMacro(n);
        return OkStatus();
      case Node::Type::kGeneration: {
        const size_t begin = out->size();
        RETURN_IF_ERROR(Exec(*n.children[0], out, flow));
        if (generation_spans_ != nullptr && out == root_out_ && out->size() > begin) {
          generation_spans_->emplace_back(begin, out->size());
        }
        return OkStatus();
      }
      case Node::Type::kBreak:
        *flow = Flow::kBreak;
        return OkStatus();
      case Node::Type::kContinue:
        *flow = Flow::kContinue;
        return OkStatus();
      default:
        return Err(n, "not a statement");
    }
  }

  StatusOr<Value> EvalNode(const Node& n) {
    switch (n.type) {
      case Node::Type::kLiteral:
        return n.literal;
      case Node::Type::kName:
        return Lookup(n.name);
      case Node::Type::kGetAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*n.children[0]));
        return GetAttr(n, obj, n.name);
      }
      case Node::Type::kGetItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*n.children[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*n.children[1]));
        return GetItem(n, obj, key);
      }
      case Node::Type::kSlice:
        return EvalSlice(n);
      case Node::Type::kCall: {
        ASSIGN_OR_RETURN(Value callee, Eval(*n.children[0]));
        if (!callee.is_function()) {
          return Err(n,
                     "calling a value of type " + KindName(callee.kind()) +
                         (n.children[0]->name.empty() ? "" : " ('" + n.children[0]->name + "')"));
        }
        std::vector<Value> args;
        KwArgs kwargs;
        RETURN_IF_ERROR(EvalArgs(n, 1, &args, &kwargs));
        auto r = callee.function()(args, kwargs);
        // Errors from builtins get the call's line; macro errors already carry theirs.
        if (!r.ok() && r.status().code() == StatusCode::kInvalidArgument &&
            r.status().message().rfind("line ", 0) != 0) {
          return r.status().WithContext("line " + std::to_string(n.line));
        }
        return r;
      }
      case Node::Type::kFilter: {
        ASSIGN_OR_RETURN(Value input, Eval(*n.children[0]));
        std::vector<Value> args;
        KwArgs kwargs;
        RETURN_IF_ERROR(EvalArgs(n, 1, &args, &kwargs));
        return ApplyFilter({*this, n, n.name, input, args, kwargs});
      }
      case Node::Type::kTest: {
        ASSIGN_OR_RETURN(Value input, Eval(*n.children[0]));
        std::vector<Value> args;
        KwArgs kwargs;
        RETURN_IF_ERROR(EvalArgs(n, 1, &args, &kwargs));
        ASSIGN_OR_RETURN(bool r, Test(n, n.name, input, args));
        return Value::Bool(r != n.negated);
      }
      case Node::Type::kUnary: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.children[0]));
        if (!v.is_number()) return Err(n, "unary " + n.name + " on " + KindName(v.kind()));
        if (n.name == "+") return v;
        if (v.kind() == Value::Kind::kInt && v.int_value() == INT64_MIN)
          return Err(n, "integer overflow in unary -");
        return v.kind() == Value::Kind::kInt ? Value::Int(-v.int_value())
                                             : Value::Float(-v.number());
      }
      case Node::Type::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.children[0]));
        return Value::Bool(!v.Truthy());
      }
      case Node::Type::kAnd: {
        ASSIGN_OR_RETURN(Value l, Eval(*n.children[0]));
        if (!l.Truthy()) return l;
        return Eval(*n.children[1]);
      }
      case Node::Type::kOr: {
        ASSIGN_OR_RETURN(Value l, Eval(*n.children[0]));
        if (l.Truthy()) return l;
        return Eval(*n.children[1]);
      }
      case Node::Type::kCondExpr: {
        ASSIGN_OR_RETURN(Value c, Eval(*n.children[0]));
        if (c.Truthy()) return Eval(*n.children[1]);
        if (n.children[2]) return Eval(*n.children[2]);
        return Value();
      }
      case Node::Type::kBinary:
        return EvalBinary(n);
      case Node::Type::kListLit:
      case Node::Type::kTupleLit: {
        List items;
        for (const auto& c : n.children) {
          ASSIGN_OR_RETURN(Value v, Eval(*c));
          items.push_back(v);
        }
        return MakeList(n, std::move(items), n.type == Node::Type::kTupleLit);
      }
      case Node::Type::kDictLit: {
        Value d = Value::NewDict();
        for (size_t i = 0; i + 1 < n.children.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*n.children[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*n.children[i + 1]));
          if (!k.is_string()) return Err(n, "dict keys must be strings");
          if (!budget_.Alloc(sizeof(Value) + k.str().size() + (v.is_string() ? v.str().size() : 0)))
            return Checked(n, OkStatus());
          d.Set(k.str(), v);
        }
        return d;
      }
      default:
        return Err(n, "not an expression");
    }
  }

  Status Err(const Node& n, const std::string& msg) const override {
    return InvalidArgumentError("line " + std::to_string(n.line) + ": " + msg);
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    auto g = globals_.find(name);
    return g != globals_.end() ? g->second : Value();
  }

  Status Assign(const Node& n, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      const size_t dot = targets[0].find('.');
      if (dot != std::string::npos) {
        Value ns = Lookup(targets[0].substr(0, dot));
        if (!ns.is_namespace()) {
          return Err(
              n, "cannot assign attribute of non-namespace '" + targets[0].substr(0, dot) + "'");
        }
        ns.Set(targets[0].substr(dot + 1), v);
        return OkStatus();
      }
      scopes_.back()[targets[0]] = v;
      return OkStatus();
    }
    if (!v.is_list() || v.list().size() != targets.size()) {
      return Err(n, "cannot unpack " + KindName(v.kind()) + " into " +
                        std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = v.list()[i];
    return OkStatus();
  }

  StatusOr<List> Iterate(const Node& n, const Value& v) override {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return List{};
      case Value::Kind::kList:
        if (!ChargeItems(v.list())) return Checked(n, OkStatus());
        return v.list();
      case Value::Kind::kDict: {
        List keys;
        for (const auto& [k, x] : v.dict()) keys.push_back(Value::String(k));
        if (!ChargeItems(keys)) return Checked(n, OkStatus());
        return keys;
      }
      case Value::Kind::kString: {
        // One Value per code point: charged before it is built (~40 bytes per byte).
        if (!budget_.Alloc(CountCodePoints(v.str()) * (sizeof(Value) + 8)))
          return Checked(n, OkStatus());
        List chars;
        for (auto& c : SplitCodePoints(v.str())) chars.push_back(Value::String(c));
        return chars;
      }
      default:
        return Err(n, "cannot iterate over " + KindName(v.kind()));
    }
  }

  Status ExecFor(const Node& n, std::string* out, Flow* flow) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*n.children[0]));
    const NodePtr& filter = n.children[3];
    // A list is iterated in place (lists are never mutated; `iterable` keeps it alive): nested
    // loops over `messages` would otherwise copy it once per outer iteration.
    List storage;
    if (!iterable.is_list() || filter) {
      ASSIGN_OR_RETURN(storage, Iterate(n, iterable));
    }
    const List& all = iterable.is_list() && !filter ? iterable.list() : storage;
    List filtered;
    if (filter) {
      for (const auto& item : all) {
        scopes_.emplace_back();
        Status s = Assign(n, n.targets, item);
        auto keep = s.ok() ? Eval(*filter) : StatusOr<Value>(s);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) filtered.push_back(item);
      }
    }
    const List& items = filter ? filtered : all;
    if (items.empty()) {
      if (n.children[2]) return Exec(*n.children[2], out, flow);
      return OkStatus();
    }
    const int64_t len = static_cast<int64_t>(items.size());
    scopes_.emplace_back();
    Status status;
    for (int64_t i = 0; i < len; ++i) {
      // Building `loop` costs about as much as four expressions; it is freed each iteration,
      // so only time is charged.
      if (!budget_.Step(4)) {
        status = Checked(n, OkStatus());
        break;
      }
      Value loop = Value::NewDict({
          {"index", Value::Int(i + 1)},
          {"index0", Value::Int(i)},
          {"revindex", Value::Int(len - i)},
          {"revindex0", Value::Int(len - i - 1)},
          {"first", Value::Bool(i == 0)},
          {"last", Value::Bool(i == len - 1)},
          {"length", Value::Int(len)},
          {"previtem", i > 0 ? items[i - 1] : Value()},
          {"nextitem", i + 1 < len ? items[i + 1] : Value()},
      });
      loop.Set("cycle",
               Value::NewFunction([i](std::vector<Value>& args, KwArgs&) -> StatusOr<Value> {
                 if (args.empty()) return InvalidArgumentError("loop.cycle needs arguments");
                 return args[static_cast<size_t>(i) % args.size()];
               }));
      scopes_.back()["loop"] = loop;
      status = Assign(n, n.targets, items[i]);
      if (!status.ok()) break;
      Flow f = Flow::kNormal;
      status = Exec(*n.children[1], out, &f);
      if (!status.ok() || f == Flow::kBreak) break;
    }
    scopes_.pop_back();
    *flow = Flow::kNormal;
    return status;
  }

  void DefineMacro(const Node& n) {
    const Node* node = &n;
    scopes_.back()[n.name] = Value::NewFunction(
        [this, node](std::vector<Value>& args, KwArgs& kwargs) -> StatusOr<Value> {
          if (scopes_.size() > kMaxScopes) {
            return InvalidArgumentError("line " + std::to_string(node->line) + ": macro '" +
                                        node->name + "' recursion too deep");
          }
          scopes_.emplace_back();
          for (size_t i = 0; i < node->targets.size(); ++i) {
            Value v;
            if (i < args.size()) {
              v = args[i];
            } else if (node->children[i + 1]) {
              auto d = Eval(*node->children[i + 1]);
              if (!d.ok()) {
                scopes_.pop_back();
                return d.status();
              }
              v = *d;
            }
            scopes_.back()[node->targets[i]] = v;
          }
          for (auto& [k, v] : kwargs) scopes_.back()[k] = v;
          std::string out;
          Flow f = Flow::kNormal;
          Status s = Exec(*node->children[0], &out, &f);
          scopes_.pop_back();
          if (!s.ok()) return s;
          return Value::String(std::move(out));
        });
  }

  Status EvalArgs(const Node& n, size_t first, std::vector<Value>* args, KwArgs* kwargs) {
    const size_t total = n.children.size() - first;
    const size_t positional = total - n.kwarg_names.size();
    for (size_t i = 0; i < total; ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*n.children[first + i]));
      if (i < positional)
        args->push_back(v);
      else
        kwargs->emplace_back(n.kwarg_names[i - positional], v);
    }
    return OkStatus();
  }

  StatusOr<Value> GetAttr(const Node& n, const Value& obj, const std::string& name) override {
    if (obj.is_undefined()) {
      std::string what =
          n.children[0]->type == Node::Type::kName ? "'" + n.children[0]->name + "' " : "value ";
      return Err(n, "cannot read attribute '" + name + "' of undefined " + what);
    }
    if (obj.is_dict()) {
      if (Value* v = obj.Find(name)) return *v;
      if (!obj.is_namespace()) {
        if (auto m = DictMethod(obj, name)) return *m;
      }
      return Value();
    }
    if (obj.is_string()) {
      if (auto m = StringMethod(obj.str(), name)) return *m;
    }
    return Value();
  }

  StatusOr<Value> GetItem(const Node& n, const Value& obj, const Value& key) {
    if (obj.is_undefined()) return Err(n, "cannot index an undefined value");
    if (obj.is_dict()) {
      if (!key.is_string()) return Value();
      if (Value* v = obj.Find(key.str())) return *v;
      return Value();
    }
    if (obj.is_list() || obj.is_string()) {
      if (key.is_string()) return GetAttr(n, obj, key.str());
      if (key.kind() != Value::Kind::kInt) return Err(n, "list indices must be integers");
      if (obj.is_list()) {
        ASSIGN_OR_RETURN(int64_t i, NormalizeIndex(key.int_value(), obj.list().size()));
        if (i < 0 || i >= static_cast<int64_t>(obj.list().size())) return Value();
        return obj.list()[static_cast<size_t>(i)];
      }
      const std::string& str = obj.str();
      ASSIGN_OR_RETURN(int64_t i, NormalizeIndex(key.int_value(), CountCodePoints(str)));
      if (i < 0) return Value();
      for (size_t pos = 0; pos < str.size(); --i) {
        const size_t len = std::min(str.size() - pos, Utf8SeqLen(static_cast<unsigned char>(str[pos])));
        if (i == 0) return Value::String(str.substr(pos, len));
        pos += len;
      }
      return Value();
    }
    return Value();
  }

  StatusOr<Value> EvalSlice(const Node& n) {
    ASSIGN_OR_RETURN(Value obj, Eval(*n.children[0]));
    std::optional<int64_t> idx[3];
    for (int k = 0; k < 3; ++k) {
      if (!n.children[k + 1]) continue;
      ASSIGN_OR_RETURN(Value v, Eval(*n.children[k + 1]));
      if (v.is_none()) continue;
      if (v.kind() != Value::Kind::kInt) return Err(n, "slice indices must be integers");
      idx[k] = v.int_value();
    }
    std::vector<Value> items;
    std::vector<std::string> cps;
    if (obj.is_list()) {
      items = obj.list();
    } else if (obj.is_string()) {
      if (!budget_.Alloc(CountCodePoints(obj.str()) * 40)) return Checked(n, OkStatus());
      cps = SplitCodePoints(obj.str());
    } else {
      return Err(n, "cannot slice " + KindName(obj.kind()));
    }
    const int64_t len = static_cast<int64_t>(obj.is_list() ? items.size() : cps.size());
    const int64_t step = idx[2].value_or(1);
    if (step == 0) return Err(n, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + len : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, len);
      return std::clamp<int64_t>(x, -1, len - 1);
    };
    const int64_t start = clamp(idx[0], step > 0 ? 0 : len - 1);
    const int64_t stop = clamp(idx[1], step > 0 ? len : -1);
    List out_list;
    std::string out_str;
    // Counted, not `i += step`: a step near INT64_MAX would overflow.
    const int64_t span = step > 0 ? stop - start : start - stop;
    const uint64_t mag = step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
    const uint64_t count = span <= 0 ? 0 : (static_cast<uint64_t>(span) + mag - 1) / mag;
    for (uint64_t k = 0; k < count; ++k) {
      const size_t i = static_cast<size_t>(start + static_cast<int64_t>(k * mag) * (step > 0 ? 1 : -1));
      if (obj.is_list())
        out_list.push_back(items[i]);
      else
        out_str += cps[i];
    }
    if (obj.is_list()) return MakeList(n, std::move(out_list));
    return Value::String(std::move(out_str));
  }

  StatusOr<Value> EvalBinary(const Node& n) {
    ASSIGN_OR_RETURN(Value a, Eval(*n.children[0]));
    ASSIGN_OR_RETURN(Value b, Eval(*n.children[1]));
    const std::string& op = n.name;
    if (op == "~") {
      std::string l = a.ToString(), r = b.ToString();
      if (!budget_.Alloc(l.size() + r.size())) return Checked(n, OkStatus());
      return Value::String(l + r);
    }
    if (op == "==") return Value::Bool(a == b);
    if (op == "!=") return Value::Bool(!(a == b));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      auto c = Value::Compare(a, b);
      if (!c.ok()) return Err(n, c.status().message());
      if (op == "<") return Value::Bool(*c < 0);
      if (op == ">") return Value::Bool(*c > 0);
      if (op == "<=") return Value::Bool(*c <= 0);
      return Value::Bool(*c >= 0);
    }
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string()) {
        if (!a.is_string()) return Err(n, "'in <string>' requires a string on the left");
        found = FindSub(b.str(), a.str()) != std::string::npos;
      } else if (b.is_list()) {
        found = std::find(b.list().begin(), b.list().end(), a) != b.list().end();
      } else if (b.is_dict()) {
        found = a.is_string() && b.Find(a.str()) != nullptr;
      } else if (!b.is_undefined()) {
        return Err(n, "'in' needs a string, list or dict on the right, got " + KindName(b.kind()));
      }
      return Value::Bool(found == (op == "in"));
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        if (!budget_.Alloc(a.str().size() + b.str().size())) return Checked(n, OkStatus());
        return Value::String(a.str() + b.str());
      }
      if (a.is_list() && b.is_list()) {
        if (!ChargeItems(a.list()) || !ChargeItems(b.list())) return Checked(n, OkStatus());
        List items = a.list();
        items.insert(items.end(), b.list().begin(), b.list().end());
        return Value::NewList(std::move(items));
      }
    }
    if (op == "*" && ((a.is_string() || a.is_list()) && b.kind() == Value::Kind::kInt)) {
      // Charged before it is built: 'x' * 10**9 must not allocate a gigabyte first.
      const int64_t times = std::max<int64_t>(b.int_value(), 0);
      uint64_t unit = a.is_string() ? a.str().size() : a.list().size() * sizeof(Value);
      if (a.is_list()) {
        for (const auto& v : a.list()) unit += v.is_string() ? v.str().size() : 0;
      }
      if (unit > 0 && static_cast<uint64_t>(times) > (uint64_t{1} << 62) / unit)
        return Err(n, "repetition result too large");
      if (!budget_.Alloc(unit * static_cast<uint64_t>(times)) ||
          !budget_.Step(a.is_list() ? a.list().size() * static_cast<uint64_t>(times) / 16 : 0))
        return Checked(n, OkStatus());
      if (a.is_string()) {
        std::string s;
        s.reserve(a.str().size() * static_cast<size_t>(times));
        for (int64_t i = 0; i < times; ++i) s += a.str();
        return Value::String(s);
      }
      List items;
      for (int64_t i = 0; i < times; ++i)
        items.insert(items.end(), a.list().begin(), a.list().end());
      return Value::NewList(std::move(items));
    }
    auto num = [](const Value& v) {
      return v.kind() == Value::Kind::kBool ? Value::Int(v.bool_value()) : v;
    };
    const Value x = num(a), y = num(b);
    if (!x.is_number() || !y.is_number()) {
      return Err(n, "unsupported operand types for " + op + ": " + KindName(a.kind()) + " and " +
                        KindName(b.kind()));
    }
    auto r = Arithmetic(op, x, y);
    if (!r.ok()) return Err(n, r.status().message());
    return r;
  }

  StatusOr<bool> Test(const Node& n, const std::string& name, const Value& v,
                      const std::vector<Value>& args) override {
    auto r = ApplyTest(name, v, args);
    if (!r.ok()) return Err(n, r.status().message());
    return r;
  }

  const std::string* root_out_;
  std::vector<std::pair<size_t, size_t>>* generation_spans_;
  static constexpr size_t kMaxScopes = 512;            // loop nesting + macro calls
  Budget budget_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::unordered_map<std::string, Value> globals_;
  std::vector<Value> namespaces_;  // every namespace() of this rendering, cleared at its end
};

}  // namespace

StatusOr<std::string> Template::Render(const Value& context,
                                       std::vector<std::pair<size_t, size_t>>* spans,
                                       const RenderLimits& limits) const {
  std::string out;
  Interpreter interp(context, &out, spans, limits);
  ScopedBudget scoped(interp.budget());
  Flow flow = Flow::kNormal;
  RETURN_IF_ERROR(interp.Exec(*root_, &out, &flow));
  return out;
}

}  // namespace offloadd::text::jinja
