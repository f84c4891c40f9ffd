#pragma once
// Internal to the Jinja subset (jinja_eval.cc): the filters (`value | name(args)`), one small
// handler each, found by name in one table. A filter reaches the evaluator only through
// FilterHost: its budget, error wording, iteration, attribute access and `is` tests, so that a
// filter charges and fails exactly as the rest of the template does.

#include <string>
#include <vector>

#include "common/status.h"
#include "text/jinja_ast.h"
#include "text/jinja_limits.h"
#include "text/jinja_value.h"

namespace offloadd::text::jinja {

// What the evaluator lends a filter. Not thread-safe: one rendering's evaluator.
class FilterHost {
 public:
  virtual ~FilterHost() = default;
  virtual Budget* budget() = 0;
  // INVALID_ARGUMENT "line N: msg".
  virtual Status Err(const Node& n, const std::string& msg) const = 0;
  // The first limit exceeded, with the node's line, when the budget is exhausted; else `s`.
  virtual Status Checked(const Node& n, Status s) const = 0;
  // The items of a list, a dict's keys, a string's characters; charged to the budget.
  virtual StatusOr<List> Iterate(const Node& n, const Value& v) = 0;
  virtual StatusOr<Value> GetAttr(const Node& n, const Value& obj, const std::string& name) = 0;
  // A new list (or tuple) whose slots and strings are charged to the budget.
  virtual StatusOr<Value> MakeList(const Node& n, List items, bool tuple) = 0;
  // `v is name(args)`, errors with the node's line.
  virtual StatusOr<bool> Test(const Node& n, const std::string& name, const Value& v,
                              const std::vector<Value>& args) = 0;
};

// One application of a filter: `in | name(args, kwargs)` at node `n`.
struct FilterCall {
  FilterHost& host;
  const Node& n;
  const std::string& name;
  const Value& in;
  std::vector<Value>& args;
  KwArgs& kwargs;
};

// Applies the filter `call.name`; "unsupported filter 'name'" for one the subset lacks.
StatusOr<Value> ApplyFilter(const FilterCall& call);

}  // namespace offloadd::text::jinja
