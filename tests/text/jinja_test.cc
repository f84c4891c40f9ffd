// Unit tests of the Jinja subset. Parity with Python jinja2 on many more constructs lives in
// tests/python/text/test_chat_template.py.

#include "text/jinja.h"

#include <gtest/gtest.h>

#include "text/chat_template.h"

namespace offloadd::text::jinja {
namespace {

using ojson = nlohmann::ordered_json;

std::string Render(const std::string& src, const ojson& ctx = ojson::object()) {
  auto t = Template::Parse(src);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return "<parse error>";
  auto out = t->Render(Value::FromJson(ctx));
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : "<render error>";
}

Status RenderError(const std::string& src, const ojson& ctx = ojson::object()) {
  auto t = Template::Parse(src);
  if (!t.ok()) return t.status();
  auto out = t->Render(Value::FromJson(ctx));
  return out.ok() ? OkStatus() : out.status();
}

TEST(Jinja, LoopVariablesAndFilters) {
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index0 }}{{ x | upper }}{% if not loop.last %},{% "
                   "endif %}{% endfor %}",
                   {{"xs", {"a", "b"}}}),
            "0A,1B");
  EXPECT_EQ(Render("{{ xs | length }} {{ 'ab' ~ 1 }} {{ ' x ' | trim }}", {{"xs", {1, 2, 3}}}),
            "3 ab1 x");
}

TEST(Jinja, NamespaceCarriesStateOutOfLoops) {
  EXPECT_EQ(Render("{% set ns = namespace(found=false) %}{% for m in ms %}{% if m == 2 %}"
                   "{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}",
                   {{"ms", {1, 2}}}),
            "True");
  // A plain set inside a loop does not leak (Jinja scoping).
  EXPECT_EQ(
      Render("{% set x = 1 %}{% for m in ms %}{% set x = 2 %}{% endfor %}{{ x }}", {{"ms", {1}}}),
      "1");
}

TEST(Jinja, TrimBlocksAndLstripBlocksLikeTransformers) {
  EXPECT_EQ(Render("{% if true %}\n  a\n{% endif %}\nb"), "  a\nb");
  EXPECT_EQ(Render("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif %}"), "ab");
}

TEST(Jinja, TojsonMatchesPythonJsonDumps) {
  EXPECT_EQ(Render("{{ d | tojson }}", {{"d", {{"b", 1}, {"a", {true, nullptr, "é\n"}}}}}),
            "{\"b\": 1, \"a\": [true, null, \"é\\n\"]}");
}

TEST(Jinja, ErrorsNameTheLineAndRaiseExceptionMessage) {
  Status s = RenderError("{{ raise_exception('bad roles') }}");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "bad roles");
  s = RenderError("a\nb\n{% if x %}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("endif"), std::string::npos);
  s = RenderError("\n{% include 'x' %}");
  EXPECT_NE(s.message().find("line 2"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("include"), std::string::npos);
  s = RenderError("{{ 1 + 'a' }}");
  EXPECT_NE(s.message().find("unsupported operand"), std::string::npos);
  s = RenderError("{{ missing.attr }}");
  EXPECT_NE(s.message().find("undefined"), std::string::npos);
}

TEST(ChatTemplate, AssistantSpansCoverRepliesAndEndMarkup) {
  auto t = ChatTemplate::FromString(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}",
      {});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ojson msgs = ojson::parse(R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},
                                {"role":"user","content":"q"},{"role":"assistant","content":"a"}])");
  auto r = t->RenderWithAssistantSpans(msgs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->assistant_spans.size(), 2u);
  auto span = [&](size_t i) {
    return r->text.substr(r->assistant_spans[i].first,
                          r->assistant_spans[i].second - r->assistant_spans[i].first);
  };
  EXPECT_EQ(span(0), "yo</assistant>");
  EXPECT_EQ(span(1), "a</assistant>");
}

// Qwen3's way: the final assistant turn opens with an empty <think> block that the same turn
// followed by more does not have. The span of an earlier reply is still the whole reply (its tool
// call included) with its end markup: the longest tail of its last-message rendering that the
// conversation continues with.
TEST(ChatTemplate, AssistantSpansWhereTheLastTurnRendersDifferently) {
  auto t = ChatTemplate::FromString(
      "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' and loop.last %}"
      "<think></think>{% endif %}{{ m.content }}{% if m.tool_calls %}<call>"
      "{{ m.tool_calls[0].function.name }}</call>{% endif %}</{{ m.role }}>{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}",
      {});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ojson msgs = ojson::parse(R"([{"role":"user","content":"hi"},
      {"role":"assistant","content":"","tool_calls":[{"function":{"name":"f"}}]},
      {"role":"tool","content":"42"},{"role":"assistant","content":"<a>"}])");
  auto r = t->RenderWithAssistantSpans(msgs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->assistant_spans.size(), 2u);
  auto span = [&](size_t i) {
    return r->text.substr(r->assistant_spans[i].first,
                          r->assistant_spans[i].second - r->assistant_spans[i].first);
  };
  // The first reply starts with '<' like "<think>": the common prefix alone would stop there.
  EXPECT_EQ(span(0), "<call>f</call></assistant>");
  EXPECT_EQ(span(1), "<think></think><a></assistant>");
}

// A long reply of one repeated character whose end markup differs as the last message (gpt-oss's
// <|return|> against <|end|>): the tail search stays linear, and the span is the common part.
TEST(ChatTemplate, AssistantSpanSearchIsLinearInTheReply) {
  auto t = ChatTemplate::FromString(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
      "{% if m.role == 'assistant' %}{{ '!' if loop.last else '?' }}{% endif %}"
      "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
      {});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::string reply(400000, 'a');
  ojson msgs = ojson::array({ojson{{"role", "user"}, {"content", "q"}},
                             ojson{{"role", "assistant"}, {"content", reply}},
                             ojson{{"role", "user"}, {"content", "r"}}});
  auto r = t->RenderWithAssistantSpans(msgs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->assistant_spans.size(), 1u);
  EXPECT_EQ(r->assistant_spans[0].second - r->assistant_spans[0].first, reply.size());
}

TEST(ChatTemplate, GenerationBlocksAreTheAssistantSpans) {
  auto t = ChatTemplate::FromString(
      "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
      {});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto r = t->RenderWithAssistantSpans(
      ojson::parse(R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}])"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, "<user>hi<assistant>yo!");
  ASSERT_EQ(r->assistant_spans.size(), 1u);
  EXPECT_EQ(r->assistant_spans[0], std::make_pair(size_t{19}, size_t{22}));
}

TEST(ChatTemplate, BuiltInParsesAndRenders) {
  SpecialTokens tokens;
  tokens.eos_token = "</s>";
  ChatTemplate t = ChatTemplate::BuiltIn(tokens);
  auto text = t.Render(ojson::parse(R"([{"role":"user","content":"U"}])"), true);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "### User:\nU\n\n### Assistant:\n");
}

}  // namespace
}  // namespace offloadd::text::jinja
