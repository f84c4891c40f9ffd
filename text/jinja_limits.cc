#include "text/jinja_limits.h"

#include <algorithm>
#include <vector>

#include "text/unicode.h"

namespace offloadd::text::jinja {

namespace {

thread_local Budget* current_budget = nullptr;
thread_local RequestBudget* current_request_budget = nullptr;

std::string Mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

bool RequestBudget::Charge(uint64_t steps) {
  const uint64_t total = steps_.fetch_add(steps, std::memory_order_relaxed) + steps;
  if (total > max_steps_) return false;
  return !Stopped();
}

bool RequestBudget::Stopped() {
  if (stopped_.load(std::memory_order_relaxed)) return true;
  if (stop_ && stop_()) stopped_.store(true, std::memory_order_relaxed);
  return stopped_.load(std::memory_order_relaxed);
}

ScopedRequestBudget::ScopedRequestBudget(RequestBudget* budget)
    : previous_(current_request_budget) {
  current_request_budget = budget;
}
ScopedRequestBudget::~ScopedRequestBudget() { current_request_budget = previous_; }

RequestBudget* CurrentRequestBudget() { return current_request_budget; }

Budget::Budget(const RenderLimits& limits) : limits_(limits), request_(current_request_budget) {}

Budget::~Budget() {
  if (request_ != nullptr && unflushed_ > 0) request_->Charge(unflushed_);
}

bool Budget::Fail(std::string what) {
  if (error_.ok()) error_ = ResourceExhaustedError("chat template rendering stopped: " + what);
  return false;
}

bool Budget::FlushToRequest() {
  const uint64_t n = unflushed_;
  unflushed_ = 0;
  if (request_->Charge(n)) return true;
  if (request_->spent()) {
    return Fail("the request's renderings together took more than " +
                std::to_string(request_->max_steps()) +
                " steps (every record and file it checks shares one budget)");
  }
  if (error_.ok())
    error_ = CancelledError(
        "chat template rendering stopped: the request was "
        "cancelled or passed its deadline");
  return false;
}

bool Budget::Step(uint64_t n) {
  if (exhausted()) return false;
  steps_ += n;
  if (request_ != nullptr && (unflushed_ += n) >= kFlushSteps && !FlushToRequest()) return false;
  if (steps_ <= limits_.max_steps) return true;
  return Fail("more than " + std::to_string(limits_.max_steps) +
              " steps (loop iterations, evaluated expressions and elements visited); is there an "
              "unbounded loop?");
}

bool Budget::Alloc(uint64_t bytes) {
  if (exhausted()) return false;
  bytes_ = bytes > UINT64_MAX - bytes_ ? UINT64_MAX : bytes_ + bytes;
  if (bytes_ <= limits_.max_bytes) return true;
  return Fail("it would build more than " + Mib(limits_.max_bytes) +
              " of strings and lists in one rendering");
}

bool Budget::Output(uint64_t total) {
  if (exhausted()) return false;
  if (total <= limits_.max_output_bytes) return true;
  return Fail("the rendered text would exceed " + Mib(limits_.max_output_bytes) +
              " of output bytes");
}

bool Budget::Enter() {
  if (exhausted()) return false;
  if (++depth_ <= limits_.max_depth) return true;
  return Fail("nested too deep (more than " + std::to_string(limits_.max_depth) +
              " levels of statements, expressions, macro calls or values; a recursive macro "
              "or a namespace holding itself?)");
}

Budget* CurrentBudget() { return current_budget; }

ScopedBudget::ScopedBudget(Budget* b) : previous_(current_budget) { current_budget = b; }
ScopedBudget::~ScopedBudget() { current_budget = previous_; }

bool ChargeSteps(uint64_t n) { return current_budget == nullptr || current_budget->Step(n); }
bool ChargeBytes(uint64_t bytes) {
  return current_budget == nullptr || current_budget->Alloc(bytes);
}

ValueDepthGuard::ValueDepthGuard(int depth) : budget_(current_budget) {
  if (budget_ != nullptr) {
    ok_ = budget_->Enter() && budget_->Step();
  } else {
    ok_ = depth <= RenderLimits().max_depth;
  }
}

ValueDepthGuard::~ValueDepthGuard() {
  if (budget_ != nullptr) budget_->Leave();
}

size_t FindSub(std::string_view hay, std::string_view needle, size_t from) {
  if (from > hay.size()) return std::string_view::npos;
  // Short needles: the library search is at most |needle| comparisons per position.
  if (needle.size() <= 32) return hay.find(needle, from);
  // Long needles: Knuth-Morris-Pratt, linear in |hay| + |needle| whatever the text.
  if (!ChargeBytes(needle.size() * sizeof(uint32_t))) return std::string_view::npos;
  std::vector<uint32_t> fail(needle.size(), 0);
  for (size_t i = 1, k = 0; i < needle.size(); ++i) {
    while (k > 0 && needle[i] != needle[k]) k = fail[k - 1];
    if (needle[i] == needle[k]) ++k;
    fail[i] = static_cast<uint32_t>(k);
  }
  for (size_t i = from, k = 0; i < hay.size(); ++i) {
    while (k > 0 && hay[i] != needle[k]) k = fail[k - 1];
    if (hay[i] == needle[k]) ++k;
    if (k == needle.size()) return i + 1 - k;
  }
  return std::string_view::npos;
}

size_t CountCodePoints(std::string_view s) {
  size_t n = 0;
  for (size_t pos = 0; pos < s.size(); ++n) pos += Utf8SeqLen(static_cast<unsigned char>(s[pos]));
  return n;
}

}  // namespace offloadd::text::jinja
