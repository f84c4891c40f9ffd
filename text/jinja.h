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
//
// Every rendering is bounded (RenderLimits): templates are user input that runs inside the
// daemon's CreateJob, so a loop, a string repetition or a recursive macro must end in an error
// naming the limit, never in a hang or an allocation of gigabytes.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "text/jinja_value.h"

namespace offloadd::text::jinja {

struct Node;

// What one rendering may spend. The defaults are far above what chat templates need for real
// conversations (a few thousand steps and a small multiple of the conversation's bytes per
// message); ChatTemplate raises the byte limits with the size of the conversation.
struct RenderLimits {
  // Evaluated statements and expressions, loop iterations, and elements visited by filters,
  // comparisons, repr() and tojson. About 0.1-1 us each: the default bounds a render to ~2 s.
  uint64_t max_steps = 4'000'000;
  // Bytes of every string and list/dict slot created while rendering, counted cumulatively
  // (so they bound the peak memory too: nothing created is left uncounted).
  uint64_t max_bytes = 128ull << 20;
  // Bytes of the rendered text.
  uint64_t max_output_bytes = 32ull << 20;
  // Nesting of statements, expressions and macro calls being evaluated, and of values printed,
  // compared or serialised (a namespace may hold itself).
  int max_depth = 400;
};

class Template {
 public:
  // Errors: INVALID_ARGUMENT "line N: ..." for syntax errors and unsupported constructs.
  static StatusOr<Template> Parse(std::string_view source);

  // Renders with `context` (a dict of variables). raise_exception(msg) in the template yields
  // FAILED_PRECONDITION with msg; runtime type errors yield INVALID_ARGUMENT "line N: ...";
  // exceeding `limits` yields RESOURCE_EXHAUSTED "line N: ..." naming the limit.
  // With `generation_spans`, also returns the byte ranges of the output produced inside
  // {% generation %} blocks (at top level, not inside macros or set blocks).
  StatusOr<std::string> Render(
      const Value& context,
      std::vector<std::pair<size_t, size_t>>* generation_spans = nullptr,
      const RenderLimits& limits = RenderLimits()) const;
  bool has_generation_blocks() const { return has_generation_blocks_; }

 private:
  std::shared_ptr<const Node> root_;
  bool has_generation_blocks_ = false;
};

}  // namespace offloadd::text::jinja
