#pragma once
// A Jinja2 interpreter for the subset of the language that Hugging Face chat templates use,
// configured like transformers' environment (trim_blocks, lstrip_blocks, loop controls).
//
// Statements: {% if/elif/else %}, {% for x in xs [if cond] %} ... {% else %} (with loop.index,
// index0, revindex, revindex0, first, last, length, previtem, nextitem, cycle), {% set %}
// (names, tuples, namespace attributes, and {% set x %}...{% endset %} blocks), {% macro %},
// {% break %}, {% continue %}, {% generation %} (rendered transparently; Render can report
// the spans it produced, like transformers' return_assistant_tokens_mask), {# comments #},
// whitespace control with '-'.
// Expressions: literals (strings, numbers, lists, dicts, tuples, true/false/none), attribute
// and item access, slices, calls, filters, tests (is / is not), not/and/or, comparisons, in,
// + - * / // % **, ~ concatenation, conditional expressions.
// Globals: raise_exception, namespace, range, dict, strftime_now; filters: trim, tojson, length,
// count, upper, lower, title, capitalize, first, last, join, default/d, string, int, float,
// list, items, replace, selectattr, rejectattr, map, reverse, sort, unique, abs, round, indent,
// safe, e/escape; string methods strip/lstrip/rstrip/split/startswith/endswith/upper/lower/
// title/replace/find/count/join/format-free; dict methods items/keys/values/get.
// Anything outside the subset is a parse error naming the construct and the line.
//
// A Template is immutable after Parse and may be rendered concurrently.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "text/jinja_value.h"

namespace offloadd::text::jinja {

struct Node;

class Template {
 public:
  // Errors: INVALID_ARGUMENT "line N: ..." for syntax errors and unsupported constructs.
  static StatusOr<Template> Parse(std::string_view source);

  // Renders with `context` (a dict of variables). raise_exception(msg) in the template yields
  // FAILED_PRECONDITION with msg; runtime type errors yield INVALID_ARGUMENT "line N: ...".
  // With `generation_spans`, also returns the byte ranges of the output produced inside
  // {% generation %} blocks (at top level, not inside macros or set blocks).
  StatusOr<std::string> Render(
      const Value& context,
      std::vector<std::pair<size_t, size_t>>* generation_spans = nullptr) const;
  bool has_generation_blocks() const { return has_generation_blocks_; }

 private:
  std::shared_ptr<const Node> root_;
  bool has_generation_blocks_ = false;
};

}  // namespace offloadd::text::jinja
