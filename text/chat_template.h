#pragma once
// Chat templates: render a conversation ({role, content} messages, optional tools) to text with
// the tokenizer's own Jinja template, exactly as transformers' apply_chat_template does, and find
// which characters belong to assistant turns so that prompt tokens can be masked.
//
// Where the template comes from (ChatTemplate::FromDirectory):
//   1. `chat_template.jinja` in the directory, if present;
//   2. else the "chat_template" key of `tokenizer_config.json` (a string, or a list of
//      {name, template} from which "default" is taken);
//   3. else NOT_FOUND; callers then use ChatTemplate::BuiltIn(), documented below.
// The special-token variables (bos_token, eos_token, unk_token, pad_token) come from
// tokenizer_config.json (strings or {"content": ...} objects).
//
// Immutable after construction; Render may be called from several threads.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "text/jinja.h"

namespace offloadd::text {

class Tokenizer;

// The largest chat template accepted, from any source. Real ones are a few KiB (Llama-3.1 with
// tools, Mistral's tool templates: under 20 KiB); parsing costs ~200 bytes of AST per source byte,
// so an 8 MB template cost 1.5 GB of memory per CreateJob.
inline constexpr size_t kMaxChatTemplateBytes = 256 << 10;

struct SpecialTokens {
  std::string bos_token, eos_token, unk_token, pad_token;
  bool add_bos_token = false;  // tokenizer_config.json "add_bos_token" (informational)

  // Reads tokenizer_config.json. NOT_FOUND when the file does not exist.
  static StatusOr<SpecialTokens> FromTokenizerConfig(const std::string& path);
  // Best effort when there is no tokenizer_config.json: eos (and bos) from the usual names of
  // the tokenizer's special tokens: "</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>".
  static SpecialTokens Guess(const Tokenizer& tokenizer);
};

class ChatTemplate {
 public:
  static StatusOr<ChatTemplate> FromDirectory(const std::string& dir);
  // INVALID_ARGUMENT for a source over kMaxChatTemplateBytes (before it is parsed).
  static StatusOr<ChatTemplate> FromString(std::string_view source, SpecialTokens tokens);
  // The built-in template, used when a tokenizer has none:
  //   {bos_token}[### Tools:\n{tools|tojson}\n\n]
  //   ### System:\n{content}\n\n          for system messages
  //   ### User:\n{content}\n\n            for user messages
  //   ### Assistant:\n{content}{eos_token}\n\n   for assistant messages
  //   ### Tool result:\n{content}\n\n     for tool messages
  //   ### Assistant:\n                    when add_generation_prompt
  static ChatTemplate BuiltIn(SpecialTokens tokens);
  static const char* BuiltInSource();

  // Renders `messages` (a JSON array). `tools` may be null. `extra` (an object, may be null)
  // adds template variables, like apply_chat_template's **kwargs.
  // Each rendering is bounded (jinja::RenderLimits, raised in proportion to the size of the
  // messages, tools and extra): a template that loops or allocates without bound gets
  // RESOURCE_EXHAUSTED naming the limit; input nested over 128 levels is INVALID_ARGUMENT.
  StatusOr<std::string> Render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& tools = nullptr,
                               const nlohmann::ordered_json& extra = nullptr) const;

  // The rendered conversation plus the byte spans of the assistant turns. When the template
  // marks them with {% generation %} blocks, those blocks are the spans (as transformers'
  // return_assistant_tokens_mask). Otherwise, for assistant message k the span starts where
  // Render(messages[:k], add_generation_prompt=true) ends (which must be a prefix of the full text)
  // and ends where Render(messages[:k+1]) stops agreeing with the full text, so it covers the reply
  // (its tool calls included) and the template's end-of-turn markup (e.g. "<|end|>\n" or
  // "</s>"). Where the template renders the last message differently (Qwen3's empty "<think>"
  // block on the final turn only), the span ends, if that reaches further, after the longest tail
  // of Render(messages[:k+1]) that the full text continues with at the span's start. Templates
  // whose partial renderings are not prefixes of the full text are rejected with
  // FAILED_PRECONDITION.
  struct Rendered {
    std::string text;
    std::vector<std::pair<size_t, size_t>> assistant_spans;
    // The message index of each span when the spans were found message by message (templates
    // without generation blocks); empty when the template's {% generation %} blocks gave them.
    std::vector<size_t> span_messages;
  };
  StatusOr<Rendered> RenderWithAssistantSpans(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& tools = nullptr) const;

  const SpecialTokens& special_tokens() const { return tokens_; }
  const std::string& source() const { return source_; }
  // Whether the template reads messages' "tool_calls" at all: one that does not would render an
  // assistant turn carrying only calls as empty, and the calls would not be trained.
  bool reads_tool_calls() const { return source_.find("tool_calls") != std::string::npos; }

 private:
  ChatTemplate(jinja::Template t, std::string source, SpecialTokens tokens)
      : template_(std::move(t)), source_(std::move(source)), tokens_(std::move(tokens)) {}
  jinja::Template template_;
  std::string source_;
  SpecialTokens tokens_;
};

}  // namespace offloadd::text
