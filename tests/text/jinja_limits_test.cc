// Hostile templates: every rendering is bounded in steps, bytes and depth,
// and number literals or arithmetic that overflow are errors, never exceptions, traps or hangs.
// Each case must end with a clear error within a second or two and without a large allocation.

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <string>

#include "text/chat_template.h"
#include "text/jinja.h"

namespace offloadd::text::jinja {
namespace {

using Clock = std::chrono::steady_clock;

// Peak resident memory of this process so far, in MiB.
long PeakRssMib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

Status RenderStatus(const std::string& src) {
  auto t = Template::Parse(src);
  if (!t.ok()) return t.status();
  auto out = t->Render(Value::NewDict());
  return out.ok() ? OkStatus() : out.status();
}

// Renders `src` and expects an error whose message mentions `what`, within `seconds`.
// The limits are step and byte counts; the time they take depends on the build, and the 3 s bound
// is asserted on the release build. Sanitized builds (cmake/Sanitize.cmake) compile at -O1 instead
// of -O2 and add ASan+UBSan with stack-use-after-return (measured here: 7.6x the release time for
// UnboundedLoopsStopAtTheStepLimit, alone on the machine) or TSan (5-15x by its documentation, on
// top of -O1); the factor leaves room for a 2-core CI machine running two suites at once.
#if defined(__SANITIZE_THREAD__)
constexpr double kSlowdown = 40;
#elif defined(__SANITIZE_ADDRESS__)
constexpr double kSlowdown = 16;
#else
constexpr double kSlowdown = 1;
#endif

void ExpectBounded(const std::string& src, const std::string& what, double seconds = 3) {
  seconds *= kSlowdown;
  const auto t0 = Clock::now();
  Status s = RenderStatus(src);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_FALSE(s.ok()) << src;
  EXPECT_NE(s.message().find(what), std::string::npos) << src << " -> " << s.ToString();
  EXPECT_LT(took, seconds) << src;
  // The test binary itself stays small; a hostile template used to reach gigabytes.
  EXPECT_LT(PeakRssMib(), 1024) << src;
}

TEST(JinjaLimits, HugeNumberLiteralsAreParseErrors) {
  for (const char* src : {"{{ 99999999999999999999 }}", "{{ 1e999 }}", "{{ x.99999999999999999999 }}",
                          "{{ -99999999999999999999 }}"}) {
    Status s = RenderStatus(src);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << src << " -> " << s.ToString();
    EXPECT_NE(s.message().find("out of range"), std::string::npos) << s.ToString();
  }
  EXPECT_TRUE(RenderStatus("{{ 9223372036854775807 }}{{ 1e308 }}{{ 1e-999 }}").ok());
}

TEST(JinjaLimits, IntegerOverflowIsAnErrorNotATrap) {
  for (const char* src : {"{{ (-9223372036854775807 - 1) // -1 }}",
                          "{{ (-9223372036854775807 - 1) % -1 }}",
                          "{{ 9223372036854775807 + 1 }}", "{{ 9223372036854775807 * 2 }}",
                          "{{ -(-9223372036854775807 - 1) }}", "{{ 2 ** 64 }}",
                          "{{ (-9223372036854775807 - 1) | abs }}", "{{ 1e300 * 1e300 | int }}"}) {
    Status s = RenderStatus(src);
    EXPECT_FALSE(s.ok()) << src;
    EXPECT_NE(s.message().find("overflow"), std::string::npos) << src << " -> " << s.ToString();
  }
  // INT64_MIN % -1 traps on x86; the answer is known without dividing.
  auto t = Template::Parse("{{ (-9223372036854775807 - 1) is divisibleby(-1) }}");
  ASSERT_TRUE(t.ok());
  auto out = t->Render(Value::NewDict());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "True");
}

TEST(JinjaLimits, UnboundedLoopsStopAtTheStepLimit) {
  ExpectBounded(
      "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
      "steps");
  ExpectBounded(
      "{% macro f(n) %}{% for i in range(1000) %}{{ f(n + 1) if n < 3 }}{% endfor %}{% endmacro %}"
      "{{ f(0) }}{{ f(1) }}{{ f(2) }}{% for i in range(10000) %}{{ f(0) }}{% endfor %}",
      "steps");
}

TEST(JinjaLimits, MemoryIsBoundedPerRendering) {
  ExpectBounded("{{ range(10**12) | length }}", "MiB of strings and lists");
  ExpectBounded("{{ range(9000000) | list | length }}", "MiB of strings and lists");
  ExpectBounded("{{ ('x' * 60000000) | length }}{{ ('x' * 60000000) | length }}", "MiB of strings and lists");
  ExpectBounded(
      "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s | length }}",
      "MiB of strings and lists");
  ExpectBounded(
      "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}{{ ns.l | length }}",
      "MiB of strings and lists");
  ExpectBounded("{% set s = 'x' * 100000 %}{{ s.replace('x', s) | length }}", "MiB of strings and lists");
  ExpectBounded("{% set s = 'x' * 100000 %}{{ s | replace('x', s) | length }}", "MiB of strings and lists");
  ExpectBounded("{{ 'a\nb' | indent(10**15) }}", "indent width");
  ExpectBounded("{{ 'a\nb' | indent(-1) }}", "indent width");
  ExpectBounded("{{ ('a\n' * 1000000) | indent(1000) | length }}", "MiB of strings and lists");
  ExpectBounded("{{ range(100000) | join('x' * 10000) | length }}", "MiB of strings and lists");
  ExpectBounded("{% set s = 'x' * 8000000 %}{{ s | list | length }}", "MiB of strings and lists");
  // Many references to one large string: copies add up.
  ExpectBounded(
      "{% set s = 'x' * 1000000 %}{% set ns = namespace(l=[]) %}"
      "{% for i in range(10000) %}{% set ns.l = [ns.l, s] %}{% endfor %}{{ ns.l | length }}",
      "MiB of strings and lists");
}

TEST(JinjaLimits, OutputIsBounded) {
  ExpectBounded("{% set s = 'x' * 100000 %}{% for i in range(1000) %}{{ s }}{% endfor %}",
                "output bytes");
}

TEST(JinjaLimits, SelfReferenceAndSharedStructuresAreBounded) {
  // A namespace holding itself: repr, tojson and == would recurse forever.
  ExpectBounded("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", "deep");
  ExpectBounded("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}", "deep");
  ExpectBounded(
      "{% set ns = namespace() %}{% set ns.me = ns %}{% set o = namespace() %}{% set o.me = o %}"
      "{{ ns == o }}",
      "deep");
  // A list that doubles by sharing: printing it would take 2^80 steps.
  ExpectBounded(
      "{% set ns = namespace(x=[1]) %}{% for i in range(80) %}{% set ns.x = [ns.x, ns.x] %}"
      "{% endfor %}{{ ns.x }}",
      "");
  ExpectBounded(
      "{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(80) %}{% set ns.x = [ns.x, ns.x] %}"
      "{% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x == ns.y }}",
      "steps");
}

TEST(JinjaLimits, RecursionDepthIsBounded) {
  ExpectBounded("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "deep");
  ExpectBounded(
      "{% macro f(n) %}{% for i in [1] %}{% if true %}{{ f(n + 1) }}{% endif %}{% endfor %}"
      "{% endmacro %}{{ f(0) }}",
      "deep");
}

TEST(JinjaLimits, StringSearchIsLinear) {
  // A needle of N 'a's and a 'b' in 2N 'a's: the naive search compares N^2 characters.
  for (const char* src : {"{% set a = 'a' * 2000000 %}{{ (a ~ 'b') in (a ~ a) }}",
                          "{% set a = 'a' * 2000000 %}{{ (a ~ a).find(a ~ 'b') }}",
                          "{% set a = 'a' * 2000000 %}{{ (a ~ a).count(a ~ 'b') }}",
                          "{% set a = 'a' * 2000000 %}{{ (a ~ a).replace(a ~ 'b', '') | length }}"}) {
    const auto t0 = Clock::now();
    auto t = Template::Parse(src);
    ASSERT_TRUE(t.ok());
    auto out = t->Render(Value::NewDict());
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3) << src;
  }
}

TEST(JinjaLimits, LimitsCanBeTightenedAndNameTheLimit) {
  auto t = Template::Parse("{% for i in range(100) %}{{ i }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  RenderLimits limits;
  limits.max_steps = 50;
  auto out = t->Render(Value::NewDict(), nullptr, limits);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(out.status().message().find("50 steps"), std::string::npos) << out.status().ToString();
  limits = RenderLimits{};
  limits.max_output_bytes = 10;
  out = t->Render(Value::NewDict(), nullptr, limits);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("output"), std::string::npos) << out.status().ToString();
  EXPECT_TRUE(t->Render(Value::NewDict()).ok());
}

// The renderings of one request share a RequestBudget. Each rendering below is
// well within its own RenderLimits, but together they pass the request's steps.
TEST(RequestBudgetTest, RenderingsOfOneRequestShareOneStepBudget) {
  auto t = Template::Parse("{% for i in range(20000) %}{% endfor %}ok");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  RequestBudget request(100'000);
  ScopedRequestBudget scoped(&request);
  int rendered = 0;
  Status last;
  for (int i = 0; i < 100 && last.ok(); ++i) {
    auto out = t->Render(Value::NewDict());
    if (out.ok()) {
      EXPECT_EQ(*out, "ok");
      ++rendered;
    } else {
      last = out.status();
    }
  }
  EXPECT_GE(rendered, 1) << "one rendering fits the request's budget";
  EXPECT_LT(rendered, 10) << "the request's budget ends the renderings";
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted) << last.ToString();
  EXPECT_NE(last.message().find("the request's renderings together took more than 100000 steps"),
            std::string::npos)
      << last.ToString();
  // Without a request budget the same template renders as often as asked.
  ScopedRequestBudget none(nullptr);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(t->Render(Value::NewDict()).ok());
}

// The request's stop() (its client cancelled or its deadline passed) ends a long rendering within
// a few thousand steps instead of at the 4M-step limit.
TEST(RequestBudgetTest, StopEndsALongRenderingEarly) {
  auto t = Template::Parse(
      "{% for i in range(3000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  int asked = 0;
  RequestBudget request(UINT64_MAX, [&] { return ++asked >= 3; });
  ScopedRequestBudget scoped(&request);
  const auto t0 = Clock::now();
  auto out = t->Render(Value::NewDict());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kCancelled) << out.status().ToString();
  EXPECT_LT(request.steps(), 20'000u) << "stopped at the third check, every 4096 steps";
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.5 * kSlowdown);
  EXPECT_TRUE(request.Stopped()) << "stays stopped";
}

// An 8 MB template cost 1.5 GB of memory to parse: sources over
// kMaxChatTemplateBytes are refused before parsing, from a string or a directory.
TEST(RequestBudgetTest, OversizedChatTemplatesAreRefusedBeforeParsing) {
  const std::string big(kMaxChatTemplateBytes + 1, 'x');
  const long before = PeakRssMib();
  auto t = ChatTemplate::FromString(big, SpecialTokens{});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("more than the 262144 allowed"), std::string::npos)
      << t.status().ToString();
  EXPECT_LT(PeakRssMib() - before, 16);
  EXPECT_TRUE(
      ChatTemplate::FromString(std::string(kMaxChatTemplateBytes, 'x'), SpecialTokens{}).ok());
}

}  // namespace
}  // namespace offloadd::text::jinja
