// Fuzzes the Jinja chat-template interpreter (text/jinja*, text/chat_template.*): parse, render
// and assistant-span extraction, as dataset encoding and CreateJob validation run them.
// Input: the template source, optionally followed by a NUL byte and a JSON array of messages
// (dataset records are untrusted too); without it a fixed conversation with tools is rendered.
// Checked: assistant spans are ordered and inside the rendered text.
//
// Run with -timeout and -rss_limit_mb (scripts/fuzz.sh does): a template that loops or
// allocates without bound is a finding, not a harness hang.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "text/chat_template.h"

using offloadd::text::ChatTemplate;
using offloadd::text::SpecialTokens;
using ojson = nlohmann::ordered_json;

namespace {

const ojson& DefaultMessages() {
  static const ojson m = ojson::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2? <|im_end|> {{ not a tag }}"},
    {"role": "assistant", "content": "4", "tool_calls": [
      {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
    {"role": "tool", "content": "{\"result\": 4}"},
    {"role": "assistant", "content": "Four."}
  ])");
  return m;
}

const ojson& DefaultTools() {
  static const ojson t = ojson::parse(R"([{"type": "function", "function": {"name": "add",
    "description": "adds", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");
  return t;
}

void CheckSpans(const ChatTemplate::Rendered& r) {
  size_t prev_end = 0;
  for (const auto& [b, e] : r.assistant_spans) {
    FUZZ_CHECK(prev_end <= b && b <= e && e <= r.text.size());
    prev_end = e;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all = offloadd::fuzz::AsText(data, size);
  const size_t nul = all.find('\0');
  std::string_view source = all.substr(0, nul);
  ojson messages = DefaultMessages();
  ojson tools = DefaultTools();
  if (nul != std::string_view::npos) {
    messages = ojson::parse(all.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (messages.is_discarded()) return 0;
    tools = nullptr;
  }

  SpecialTokens tokens;
  tokens.bos_token = "<s>";
  tokens.eos_token = "</s>";
  tokens.unk_token = "<unk>";
  auto tmpl = ChatTemplate::FromString(source, tokens);
  if (!tmpl.ok()) return 0;
  (void)tmpl->Render(messages, /*add_generation_prompt=*/true, tools);
  (void)tmpl->Render(messages, /*add_generation_prompt=*/false, nullptr,
                     ojson{{"date_string", "26 Jul 2024"}, {"custom", {1, 2, 3}}});
  if (auto r = tmpl->RenderWithAssistantSpans(messages, tools); r.ok()) CheckSpans(*r);
  return 0;
}
