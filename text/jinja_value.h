#pragma once
// Values of the Jinja subset used by chat templates (see jinja.h). Python semantics where
// templates can observe them: truthiness, str() / repr() rendering, ==, ordering, and
// `tojson` output identical to transformers' filter (json.dumps(ensure_ascii=False, ...),
// insertion-ordered keys). Lists and dicts are shared by reference, like Python objects.
// Not thread-safe: a Value graph belongs to one rendering.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace offloadd::text::jinja {

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, string keys
using KwArgs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<StatusOr<Value>(std::vector<Value>& args, KwArgs& kwargs)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value NewList(List items = {});
  // A list that prints as a Python tuple: "(1, 2)".
  static Value NewTuple(List items);
  static Value NewDict(Dict items = {});
  // A dict whose attributes can be assigned with {% set ns.key = ... %}.
  static Value NewNamespace(Dict items = {});
  static Value NewFunction(Function fn);
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && namespace_; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool bool_value() const { return b_; }
  int64_t int_value() const { return i_; }
  double number() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& str() const { return s_; }
  List& list() const { return *list_; }
  Dict& dict() const { return *dict_; }
  const Function& function() const { return *fn_; }

  // Dict lookup; nullptr when absent (or not a dict).
  Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v) const;
  // Empties a namespace (shared by every copy): breaks the reference cycles a template can build
  // (`{% set ns.me = ns %}`) once the rendering that made them is over.
  void ClearNamespace() const;

  bool Truthy() const;
  // Python str(): what {{ value }} prints (undefined and none print "" and "None").
  std::string ToString() const;
  // Python repr(), used inside containers.
  std::string Repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent, separators=...). `indent` < 0: none.
  StatusOr<std::string> ToJson(int indent, const std::string& item_sep, const std::string& key_sep,
                               bool sort_keys) const;

  // Inside a rendering, Repr/ToString/ToJson/==/Compare charge the rendering's budget
  // (jinja_limits.h) for every element visited and stop early once it is exhausted.
  friend bool operator==(const Value& a, const Value& b);
  // Python ordering between numbers, strings or lists; error for other kinds.
  static StatusOr<int> Compare(const Value& a, const Value& b);

 private:
  void AppendRepr(int depth, std::string* out) const;
  static bool Equal(const Value& a, const Value& b, int depth);
  static StatusOr<int> CompareAt(const Value& a, const Value& b, int depth);

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool namespace_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

std::string KindName(Value::Kind kind);
// Python repr() of a float ("1.0", "0.1", "1e-05").
std::string FloatRepr(double d);
// Number of code points / the code points of a UTF-8 string (Python len / indexing).
std::vector<std::string> SplitCodePoints(const std::string& s);

}  // namespace offloadd::text::jinja
