// offloadd-chat: renders Jinja templates and chat templates over JSON lines, for scripts and the
// parity tests against Python jinja2 / transformers.
//
//   offloadd-chat < requests.jsonl > replies.jsonl
//
// Requests:
//   {"template": "...", "context": {...}}                      -> {"text": "..."}
//   {"builtin_source": true}                                   -> {"text": built-in template}
//   {"dir": "TOKENIZER_DIR" | "builtin": true, "messages": [...], "tools": [...]?,
//    "add_generation_prompt": false, "spans": false}          -> {"text": "...", "spans": [[b,e]]}
// A failing request yields {"error": "..."}; the tool keeps going.

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "text/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;
using offloadd::text::ChatTemplate;

ojson Handle(const ojson& req, std::map<std::string, ChatTemplate>* cache) {
  ojson reply;
  if (req.value("builtin_source", false)) return {{"text", ChatTemplate::BuiltInSource()}};
  if (req.contains("template")) {
    auto t = offloadd::text::jinja::Template::Parse(req["template"].get<std::string>());
    if (!t.ok()) return {{"error", t.status().ToString()}};
    auto text =
        t->Render(offloadd::text::jinja::Value::FromJson(req.value("context", ojson::object())));
    if (!text.ok()) return {{"error", text.status().ToString()}};
    reply["text"] = *text;
    return reply;
  }
  const std::string key = req.value("builtin", false) ? "<builtin>" : req.value("dir", "");
  auto it = cache->find(key);
  if (it == cache->end()) {
    if (key == "<builtin>") {
      offloadd::text::SpecialTokens tokens;
      tokens.bos_token = req.value("bos_token", "");
      tokens.eos_token = req.value("eos_token", "");
      it = cache->emplace(key, ChatTemplate::BuiltIn(tokens)).first;
    } else {
      auto t = ChatTemplate::FromDirectory(key);
      if (!t.ok()) return {{"error", t.status().ToString()}};
      it = cache->emplace(key, std::move(*t)).first;
    }
  }
  const ojson tools = req.value("tools", ojson());
  if (req.value("spans", false)) {
    auto r = it->second.RenderWithAssistantSpans(req.value("messages", ojson::array()), tools);
    if (!r.ok()) return {{"error", r.status().ToString()}};
    reply["text"] = r->text;
    reply["spans"] = r->assistant_spans;
    return reply;
  }
  auto text = it->second.Render(req.value("messages", ojson::array()),
                                req.value("add_generation_prompt", false), tools,
                                req.value("extra", ojson()));
  if (!text.ok()) return {{"error", text.status().ToString()}};
  reply["text"] = *text;
  return reply;
}

}  // namespace

int main() {
  std::map<std::string, ChatTemplate> cache;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    ojson req = ojson::parse(line, nullptr, false);
    ojson reply;
    try {
      reply = req.is_object() ? Handle(req, &cache) : ojson{{"error", "not a JSON object"}};
    } catch (const nlohmann::json::exception& e) {
      reply = {{"error", std::string("bad request: ") + e.what()}};
    }
    std::cout << reply.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
  }
  return 0;
}
