#include "text/chat_template.h"

#include <sys/stat.h>

#include <algorithm>
#include <sstream>
#include <vector>

#include "common/file.h"
#include "text/json_guard.h"
#include "text/tokenizer.h"

namespace offloadd::text {

namespace {

using ojson = nlohmann::ordered_json;

// stat(), not std::filesystem: this code runs inside LibTorch-linked binaries (the daemon, the
// trainer), where the CUDA libtorch.so interposes its own std::filesystem (docs/DEVELOPING.md).
bool Exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

std::string TokenString(const ojson& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}

constexpr const char* kBuiltIn =
    "{{- bos_token -}}\n"
    "{%- if tools -%}{{ '### Tools:\\n' + tools | tojson + '\\n\\n' }}{%- endif -%}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] == 'system' -%}{{ '### System:\\n' + message['content'] + '\\n\\n' }}\n"
    "{%- elif message['role'] == 'user' -%}{{ '### User:\\n' + message['content'] + '\\n\\n' }}\n"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ '### Assistant:\\n' + message['content'] + eos_token + '\\n\\n' }}\n"
    "{%- elif message['role'] == 'tool' -%}{{ '### Tool result:\\n' + message['content'] + "
    "'\\n\\n' }}\n"
    "{%- else -%}{{ raise_exception('unsupported role: ' ~ message['role']) }}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{ '### Assistant:\\n' }}{%- endif -%}\n";

}  // namespace

StatusOr<SpecialTokens> SpecialTokens::FromTokenizerConfig(const std::string& path) {
  return GuardJson(path, [&]() -> StatusOr<SpecialTokens> {
    ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    ojson j = ojson::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return InvalidArgumentError(path + ": not a JSON object");
    SpecialTokens t;
    t.bos_token = TokenString(j.value("bos_token", ojson()));
    t.eos_token = TokenString(j.value("eos_token", ojson()));
    t.unk_token = TokenString(j.value("unk_token", ojson()));
    t.pad_token = TokenString(j.value("pad_token", ojson()));
    t.add_bos_token = j.value("add_bos_token", false);
    return t;
  });
}

SpecialTokens SpecialTokens::Guess(const Tokenizer& tokenizer) {
  SpecialTokens t;
  for (const char* eos : {"</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>"}) {
    if (tokenizer.TokenToId(eos)) {
      t.eos_token = eos;
      break;
    }
  }
  for (const char* bos : {"<s>", "<|begin_of_text|>"}) {
    if (tokenizer.TokenToId(bos)) {
      t.bos_token = bos;
      break;
    }
  }
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::FromString(std::string_view source, SpecialTokens tokens) {
  if (source.size() > kMaxChatTemplateBytes) {
    return InvalidArgumentError("chat template is " + std::to_string(source.size()) +
                                " bytes, more than the " + std::to_string(kMaxChatTemplateBytes) +
                                " allowed (real templates are a few KiB)");
  }
  auto t = jinja::Template::Parse(source);
  if (!t.ok()) return t.status().WithContext("chat template");
  return ChatTemplate(std::move(*t), std::string(source), std::move(tokens));
}

ChatTemplate ChatTemplate::BuiltIn(SpecialTokens tokens) {
  auto t = FromString(kBuiltIn, std::move(tokens));
  // The built-in source is a constant known to parse (tests cover it).
  return std::move(*t);
}

const char* ChatTemplate::BuiltInSource() { return kBuiltIn; }

StatusOr<ChatTemplate> ChatTemplate::FromDirectory(const std::string& dir) {
  return GuardJson(dir, [&]() -> StatusOr<ChatTemplate> {
    const std::string config_path = dir + "/tokenizer_config.json";
    SpecialTokens tokens;
    std::string source;
    if (Exists(config_path)) {
      ASSIGN_OR_RETURN(tokens, SpecialTokens::FromTokenizerConfig(config_path));
      ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
      ojson j = ojson::parse(text, nullptr, false);
      const ojson& ct = j.value("chat_template", ojson());
      if (ct.is_string()) {
        source = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const auto& entry : ct) {
          if (entry.is_object() && entry.value("name", "") == "default" &&
              entry.contains("template")) {
            source = entry["template"].get<std::string>();
          }
        }
        if (source.empty())
          return InvalidArgumentError(config_path + ": chat_template list has no \"default\"");
      }
    }
    const std::string jinja_path = dir + "/chat_template.jinja";
    if (Exists(jinja_path)) {
      ASSIGN_OR_RETURN(source, ReadFile(jinja_path));
    }
    if (source.empty()) return NotFoundError("no chat template in " + dir);
    auto t = FromString(source, std::move(tokens));
    if (!t.ok()) return t.status().WithContext(dir);
    return t;
  });
}

namespace {

// Conversations nest a few levels (messages / content parts / tool schemas); a record nested
// thousands deep would overflow the stack in Value::FromJson.
constexpr int kMaxInputDepth = 128;

// Adds the bytes and JSON nodes of `j` to the totals; INVALID_ARGUMENT when nested too deeply.
Status MeasureInput(const ojson& j, int depth, uint64_t* bytes, uint64_t* nodes) {
  if (depth > kMaxInputDepth) {
    return InvalidArgumentError("chat messages are nested more than " +
                                std::to_string(kMaxInputDepth) + " levels deep");
  }
  ++*nodes;
  if (j.is_string()) *bytes += j.get_ref<const std::string&>().size();
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      *bytes += it.key().size();
      RETURN_IF_ERROR(MeasureInput(*it, depth + 1, bytes, nodes));
    }
  } else if (j.is_array()) {
    for (const auto& e : j) RETURN_IF_ERROR(MeasureInput(e, depth + 1, bytes, nodes));
  }
  return OkStatus();
}

// The limits of one rendering grow with the conversation: a template copies each message a few
// times and visits each JSON node a few dozen times. The fixed parts alone are far above what
// real templates (Llama-3, Qwen2 with tools, Mistral, Phi-3, Gemma) need for long conversations
// (tests/text/jinja_real_templates_test.cc), and bound a hostile template to ~2 s and ~128 MiB.
StatusOr<jinja::RenderLimits> LimitsFor(const ojson& messages, const ojson& tools,
                                        const ojson& extra) {
  uint64_t bytes = 0, nodes = 0;
  RETURN_IF_ERROR(MeasureInput(messages, 0, &bytes, &nodes));
  RETURN_IF_ERROR(MeasureInput(tools, 0, &bytes, &nodes));
  RETURN_IF_ERROR(MeasureInput(extra, 0, &bytes, &nodes));
  jinja::RenderLimits limits;
  limits.max_steps += 64 * nodes;
  limits.max_bytes += 16 * bytes;
  limits.max_output_bytes += 4 * bytes;
  return limits;
}

jinja::Value Context(const SpecialTokens& tokens, const ojson& messages, bool add_generation_prompt,
                     const ojson& tools, const ojson& extra) {
  jinja::Value ctx = jinja::Value::NewDict();
  ctx.Set("messages", jinja::Value::FromJson(messages));
  if (!tools.is_null()) ctx.Set("tools", jinja::Value::FromJson(tools));
  ctx.Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  ctx.Set("bos_token", jinja::Value::String(tokens.bos_token));
  ctx.Set("eos_token", jinja::Value::String(tokens.eos_token));
  ctx.Set("unk_token", jinja::Value::String(tokens.unk_token));
  ctx.Set("pad_token", jinja::Value::String(tokens.pad_token));
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      ctx.Set(it.key(), jinja::Value::FromJson(*it));
    }
  }
  return ctx;
}

// Some templates render the final message differently from the same message followed by more:
// Qwen3 opens the last assistant turn with "<think>\n\n</think>\n\n" and drops it once a tool
// result follows, so Render(messages[:k+1]) and the whole conversation part (almost) right where
// reply k begins. The reply is then the longest tail of its rendering as the last message that the
// whole text continues with at `start`; the length of that tail (0 if none) is returned. The tail
// includes the turn's end markup, exactly as for the other templates.
size_t LastTurnTail(const std::string& with_reply, const std::string& full, size_t start) {
  // The longest suffix of W = with_reply[start:] that is a prefix of F = full[start:], in linear
  // time (a reply of one repeated character would make the direct search quadratic): the prefix
  // function of F[:|W|] + sentinel + W ends with that length.
  if (with_reply.size() <= start || full.size() < start) return 0;
  const size_t w = with_reply.size() - start;
  const size_t f = std::min(full.size() - start, w);
  std::vector<int> seq;
  seq.reserve(f + 1 + w);
  for (size_t i = 0; i < f; ++i) seq.push_back(static_cast<unsigned char>(full[start + i]));
  seq.push_back(256);  // no byte: a match never crosses it
  for (size_t i = 0; i < w; ++i) seq.push_back(static_cast<unsigned char>(with_reply[start + i]));
  std::vector<size_t> pi(seq.size(), 0);
  for (size_t i = 1; i < seq.size(); ++i) {
    size_t k = pi[i - 1];
    while (k > 0 && seq[i] != seq[k]) k = pi[k - 1];
    pi[i] = seq[i] == seq[k] ? k + 1 : k;
  }
  size_t n = pi.back();
  while (n >= w && n > 0) n = pi[n - 1];  // a proper tail: the reply's own rendering differs
  return n;
}

}  // namespace

StatusOr<std::string> ChatTemplate::Render(const ojson& messages, bool add_generation_prompt,
                                           const ojson& tools, const ojson& extra) const {
  ASSIGN_OR_RETURN(jinja::RenderLimits limits, LimitsFor(messages, tools, extra));
  return template_.Render(Context(tokens_, messages, add_generation_prompt, tools, extra), nullptr,
                          limits);
}

StatusOr<ChatTemplate::Rendered> ChatTemplate::RenderWithAssistantSpans(const ojson& messages,
                                                                        const ojson& tools) const {
  if (!messages.is_array()) return InvalidArgumentError("messages must be a JSON array");
  Rendered r;
  if (template_.has_generation_blocks()) {
    ASSIGN_OR_RETURN(jinja::RenderLimits limits, LimitsFor(messages, tools, nullptr));
    ASSIGN_OR_RETURN(r.text, template_.Render(Context(tokens_, messages, false, tools, nullptr),
                                              &r.assistant_spans, limits));
    return r;
  }
  ASSIGN_OR_RETURN(r.text, Render(messages, false, tools));
  for (size_t k = 0; k < messages.size(); ++k) {
    const ojson& m = messages[k];
    if (!m.is_object() || m.value("role", "") != "assistant") continue;
    ojson before = ojson::array(), upto = ojson::array();
    for (size_t i = 0; i < k; ++i) before.push_back(messages[i]);
    upto = before;
    upto.push_back(m);
    ASSIGN_OR_RETURN(std::string prefix, Render(before, true, tools));
    ASSIGN_OR_RETURN(std::string with_reply, Render(upto, false, tools));
    if (r.text.compare(0, prefix.size(), prefix) != 0) {
      return FailedPreconditionError(
          "chat template is not prefix-stable: rendering the first " + std::to_string(k) +
          " messages with add_generation_prompt is not a prefix of the whole conversation, so "
          "assistant turns cannot be located for prompt masking");
    }
    size_t end = 0;
    while (end < with_reply.size() && end < r.text.size() && with_reply[end] == r.text[end]) ++end;
    if (end < with_reply.size()) {
      end = std::max(end, prefix.size() + LastTurnTail(with_reply, r.text, prefix.size()));
    }
    if (end > prefix.size()) {
      r.assistant_spans.emplace_back(prefix.size(), end);
      r.span_messages.push_back(k);
    }
  }
  return r;
}

}  // namespace offloadd::text
