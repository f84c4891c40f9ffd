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
// list, items, replace, select, reject, selectattr, rejectattr, map, reverse, sort, unique,
// abs, round, indent, safe, e/escape (others are refused when parsed, as are unknown tests);
// string methods strip/lstrip/rstrip/split/startswith/endswith/upper/lower/
// title/replace/find/count/join/format-free; dict methods items/keys/values/get.
// Anything outside the subset is a parse error naming the construct and the line.
//
// A Template is immutable after Parse and may be rendered concurrently.
//
// Every rendering is bounded (RenderLimits): templates are user input that runs inside the
// daemon's CreateJob, so a loop, a string repetition or a recursive macro must end in an error
// naming the limit, never in a hang or an allocation of gigabytes.

#include <atomic>
#include <cstdint>
#include <functional>
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

// What all the renderings of one request may spend together (a CreateJob that
// renders 8 records of each of 512 files, each rendering within RenderLimits, ran for an hour), and
// a way to stop them early: `stop` is asked every few thousand steps and ends the rendering once
// it returns true (the caller's client went away or its deadline passed). Installed for the
// rendering thread with ScopedRequestBudget; every Template::Render on that thread, whatever
// calls it (ChatTemplate, the dataset encoder), charges its steps here as well as to its own
// RenderLimits. Thread-safe (renderings on several threads may share one).
class RequestBudget {
 public:
  explicit RequestBudget(uint64_t max_steps, std::function<bool()> stop = {})
      : max_steps_(max_steps), stop_(std::move(stop)) {}
  RequestBudget(const RequestBudget&) = delete;
  RequestBudget& operator=(const RequestBudget&) = delete;

  // Adds `steps`; false once the total passes max_steps or `stop` has returned true.
  bool Charge(uint64_t steps);
  // Asks `stop` now (also between renderings): true once it has returned true.
  bool Stopped();
  bool spent() const { return steps_.load(std::memory_order_relaxed) > max_steps_; }
  uint64_t steps() const { return steps_.load(std::memory_order_relaxed); }
  uint64_t max_steps() const { return max_steps_; }

 private:
  const uint64_t max_steps_;
  const std::function<bool()> stop_;
  std::atomic<uint64_t> steps_{0};
  std::atomic<bool> stopped_{false};
};

// Makes `budget` (may be null) the request budget of this thread's renderings while in scope.
class ScopedRequestBudget {
 public:
  explicit ScopedRequestBudget(RequestBudget* budget);
  ~ScopedRequestBudget();
  ScopedRequestBudget(const ScopedRequestBudget&) = delete;
  ScopedRequestBudget& operator=(const ScopedRequestBudget&) = delete;

 private:
  RequestBudget* previous_;
};

class Template {
 public:
  // Errors: INVALID_ARGUMENT "line N: ..." for syntax errors and unsupported constructs.
  static StatusOr<Template> Parse(std::string_view source);

  // Renders with `context` (a dict of variables). raise_exception(msg) in the template yields
  // FAILED_PRECONDITION with msg; runtime type errors yield INVALID_ARGUMENT "line N: ...";
  // exceeding `limits` or the thread's RequestBudget yields RESOURCE_EXHAUSTED "line N: ..."
  // naming the limit; a RequestBudget whose `stop` fired yields CANCELLED.
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
