#pragma once
// Internal to the Jinja subset: the budget of one rendering (see RenderLimits in jinja.h) and
// the overflow-checked, linear-time helpers that hostile templates cannot turn into a hang.
//
// The evaluator owns a Budget and installs it for the rendering thread (ScopedBudget), so that
// the recursive operations on values (repr, tojson, ==, ordering) and the builtins charge the
// same budget without threading it through every signature. Once a limit is exceeded the
// budget stays exhausted: every later charge fails, those operations stop early with a partial
// result, and the evaluator turns the first violation into RESOURCE_EXHAUSTED.
// A Budget belongs to one thread; there is no sharing.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "text/jinja.h"

namespace offloadd::text::jinja {

class Budget {
 public:
  // Also charges the thread's RequestBudget (ScopedRequestBudget), if any, every kFlushSteps.
  explicit Budget(const RenderLimits& limits);
  ~Budget();  // hands the steps not yet flushed to the RequestBudget
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  // Each returns false once any limit has been exceeded (now or before).
  bool Step(uint64_t n = 1);
  bool Alloc(uint64_t bytes);
  // `total` is the size the rendered text is about to reach.
  bool Output(uint64_t total);
  bool Enter();  // one level deeper; pair with Leave, also when it returns false
  void Leave() { --depth_; }

  bool exhausted() const { return !error_.ok(); }
  // RESOURCE_EXHAUSTED naming the first limit exceeded (CANCELLED when the RequestBudget's
  // `stop` fired); OK while none is.
  const Status& error() const { return error_; }

 private:
  bool Fail(std::string what);
  bool FlushToRequest();

  // Steps are handed to the shared RequestBudget in batches: an atomic add and a `stop` check per
  // few thousand steps (about a millisecond of rendering) rather than per step.
  static constexpr uint64_t kFlushSteps = 4096;

  RenderLimits limits_;
  RequestBudget* request_;
  uint64_t unflushed_ = 0;
  uint64_t steps_ = 0;
  uint64_t bytes_ = 0;
  int depth_ = 0;
  Status error_;
};

// The budget installed on this thread, or nullptr outside a rendering.
Budget* CurrentBudget();
// The request budget installed on this thread (ScopedRequestBudget), or nullptr.
RequestBudget* CurrentRequestBudget();

class ScopedBudget {
 public:
  explicit ScopedBudget(Budget* b);
  ~ScopedBudget();
  ScopedBudget(const ScopedBudget&) = delete;
  ScopedBudget& operator=(const ScopedBudget&) = delete;

 private:
  Budget* previous_;
};

// Charges the current budget, if any. False when it is exhausted.
bool ChargeSteps(uint64_t n);
bool ChargeBytes(uint64_t bytes);

// Enter/Leave on the current budget for the recursive operations on values; without a budget
// only a fixed depth (RenderLimits' default) is enforced.
class ValueDepthGuard {
 public:
  explicit ValueDepthGuard(int depth);
  ~ValueDepthGuard();
  bool ok() const { return ok_; }

 private:
  Budget* budget_;
  bool ok_;
};

// std::string::find, but linear in the haystack whatever the needle (Boyer-Moore for long
// needles): "a"*N in ("a"*N + "a"*N) is quadratic with the naive search.
size_t FindSub(std::string_view hay, std::string_view needle, size_t from = 0);

// Number of UTF-8 code points (Python len of a str).
size_t CountCodePoints(std::string_view s);

}  // namespace offloadd::text::jinja
