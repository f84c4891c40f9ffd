#include "text/dataset.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <string_view>

#include "common/safe_path.h"
#include "text/arrow_ipc_reader.h"
#include "text/batcher.h"
#include "text/chat_template.h"
#include "text/gzip_reader.h"
#include "text/json_guard.h"
#include "text/parquet_reader.h"
#include "text/tokenizer.h"

namespace offloadd::text {

namespace {

using ojson = nlohmann::ordered_json;

bool IsWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool Has(const ojson& r, const char* key) { return r.contains(key) && !r[key].is_null(); }

StatusOr<std::string> StringField(const ojson& r, const char* key, bool required) {
  if (!Has(r, key)) {
    if (required) return InvalidArgumentError("missing \"" + std::string(key) + "\"");
    return std::string();
  }
  if (!r[key].is_string())
    return InvalidArgumentError("\"" + std::string(key) + "\" must be a string");
  return r[key].get<std::string>();
}

DatasetFormat Detect(const ojson& r) {
  if (r.contains("input_ids")) return DatasetFormat::kPretokenized;
  if (r.contains("messages")) return DatasetFormat::kMessages;
  if (r.contains("conversations")) return DatasetFormat::kShareGpt;
  if (r.contains("instruction")) return DatasetFormat::kAlpaca;
  if (r.contains("prompt") && r.contains("completion")) return DatasetFormat::kPromptCompletion;
  if (r.contains("text")) return DatasetFormat::kText;
  return DatasetFormat::kAuto;
}

// A tool given as a bare function schema {name, description, parameters} (ShareGPT files, e.g.
// Glaive via LLaMA-Factory) becomes OpenAI's {"type": "function", "function": schema}: the form
// transformers' get_json_schema produces, which templates read as tool.function (gpt-oss, Llama
// 3.1, Mistral) or print whole (Qwen). Tools that already have a "type" are kept as given.
ojson WrapTools(ojson tools) {
  for (ojson& t : tools) {
    if (t.is_object() && !t.contains("type") && t.contains("name")) {
      t = ojson{{"type", "function"}, {"function", std::move(t)}};
    }
  }
  return tools;
}

// "tools" may be a list or a JSON-encoded string (ShareGPT files store it as a string).
StatusOr<ojson> ParseTools(const ojson& r) {
  if (!Has(r, "tools")) return ojson();
  const ojson& t = r["tools"];
  if (t.is_string()) {
    if (t.get<std::string>().empty()) return ojson();
    ojson parsed = ojson::parse(t.get<std::string>(), nullptr, false);
    if (parsed.is_discarded()) return InvalidArgumentError("\"tools\" is a string but not JSON");
    if (!parsed.is_array()) return InvalidArgumentError("\"tools\" must encode a list");
    return parsed.empty() ? ojson() : WrapTools(std::move(parsed));
  }
  if (t.is_array()) return t.empty() ? ojson() : WrapTools(t);
  return InvalidArgumentError("\"tools\" must be a list or a JSON string");
}

// One tool call in transformers' form, {"type": "function", "function": {"name", "arguments"}},
// from that form or a bare {"name", "arguments"} (ShareGPT's function_call turns). Arguments
// given as a JSON-encoded object string (OpenAI's API form) are decoded: templates print them
// with tojson (Llama 3.1, gpt-oss, Mistral) or iterate them (Qwen3.6, GLM), so a string would be
// encoded twice or refused.
StatusOr<ojson> NormalizeToolCall(ojson call, const std::string& where) {
  if (!call.is_object()) return InvalidArgumentError(where + " must be an object");
  if (!call.contains("function")) {
    if (!call.contains("name")) {
      return InvalidArgumentError(where + " needs \"function\" or \"name\"");
    }
    ojson fn = ojson::object();
    fn["name"] = call["name"];
    if (call.contains("arguments")) fn["arguments"] = call["arguments"];
    ojson wrapped = ojson::object();
    if (call.contains("id")) wrapped["id"] = call["id"];
    wrapped["type"] = "function";
    wrapped["function"] = std::move(fn);
    call = std::move(wrapped);
  }
  ojson& fn = call["function"];
  if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) {
    return InvalidArgumentError(where + ".function needs a string \"name\"");
  }
  if (fn.contains("arguments") && fn["arguments"].is_string()) {
    ojson args = ojson::parse(fn["arguments"].get<std::string>(), nullptr, false);
    if (args.is_discarded() || !args.is_object()) {
      return InvalidArgumentError(where + ".function.arguments is a string but not a JSON object");
    }
    fn["arguments"] = std::move(args);
  }
  return call;
}

// The tool calls of assistant messages (OpenAI's "tool_calls"), normalized as above.
StatusOr<ojson> NormalizeMessages(ojson messages) {
  if (!messages.is_array()) return messages;
  for (size_t i = 0; i < messages.size(); ++i) {
    ojson& m = messages[i];
    if (!m.is_object() || !m.contains("tool_calls") || m["tool_calls"].is_null()) continue;
    const std::string where = "messages[" + std::to_string(i) + "].tool_calls";
    if (!m["tool_calls"].is_array()) return InvalidArgumentError(where + " must be a list");
    for (size_t j = 0; j < m["tool_calls"].size(); ++j) {
      ojson& call = m["tool_calls"][j];
      const std::string at = where + "[" + std::to_string(j) + "]";
      ASSIGN_OR_RETURN(call, NormalizeToolCall(std::move(call), at));
    }
  }
  return messages;
}

StatusOr<ojson> ShareGptToMessages(const ojson& r, bool template_reads_tool_calls) {
  const ojson& conv = r["conversations"];
  if (!conv.is_array()) return InvalidArgumentError("\"conversations\" must be a list");
  ojson messages = ojson::array();
  ASSIGN_OR_RETURN(std::string system, StringField(r, "system", false));
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  for (size_t i = 0; i < conv.size(); ++i) {
    const ojson& turn = conv[i];
    if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
        !turn.contains("value") || !turn["value"].is_string()) {
      return InvalidArgumentError("conversations[" + std::to_string(i) +
                                  "] needs string \"from\" and \"value\"");
    }
    const std::string from = turn["from"].get<std::string>();
    std::string role;
    if (from == "human" || from == "user")
      role = "user";
    else if (from == "gpt" || from == "assistant")
      role = "assistant";
    else if (from == "function_call")
      role = "function_call";
    else if (from == "system")
      role = "system";
    else if (from == "observation" || from == "tool")
      role = "tool";
    else
      return InvalidArgumentError("conversations[" + std::to_string(i) + "]: unknown \"from\": \"" +
                                  from + "\"");
    if (role == "function_call" && !template_reads_tool_calls) {
      // A template without tool-call syntax: the call is trained as the assistant's JSON text.
      messages.push_back({{"role", "assistant"}, {"content", turn["value"]}});
      continue;
    }
    if (role == "function_call") {
      // LLaMA-Factory's function_call turn: {"name", "arguments"} or a list of them (parallel
      // calls), rendered by the template as an assistant message with tool_calls.
      const std::string where = "conversations[" + std::to_string(i) + "]";
      ojson value = ojson::parse(turn["value"].get<std::string>(), nullptr, false);
      if (value.is_discarded() || !(value.is_object() || value.is_array())) {
        return InvalidArgumentError(where + ": a function_call value must be a JSON object "
                                    "{\"name\", \"arguments\"} or a list of them");
      }
      if (value.is_object()) value = ojson::array({std::move(value)});
      ojson calls = ojson::array();
      for (size_t j = 0; j < value.size(); ++j) {
        ASSIGN_OR_RETURN(ojson call, NormalizeToolCall(std::move(value[j]),
                                                       where + "[" + std::to_string(j) + "]"));
        calls.push_back(std::move(call));
      }
      messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}});
      continue;
    }
    messages.push_back({{"role", role}, {"content", turn["value"]}});
  }
  return messages;
}

StatusOr<ojson> AlpacaToMessages(const ojson& r) {
  ASSIGN_OR_RETURN(std::string instruction, StringField(r, "instruction", true));
  ASSIGN_OR_RETURN(std::string input, StringField(r, "input", false));
  ASSIGN_OR_RETURN(std::string output, StringField(r, "output", true));
  ASSIGN_OR_RETURN(std::string system, StringField(r, "system", false));
  ojson messages = ojson::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  if (Has(r, "history")) {
    const ojson& h = r["history"];
    if (!h.is_array())
      return InvalidArgumentError("\"history\" must be a list of [user, assistant]");
    for (size_t i = 0; i < h.size(); ++i) {
      if (!h[i].is_array() || h[i].size() != 2 || !h[i][0].is_string() || !h[i][1].is_string()) {
        return InvalidArgumentError("history[" + std::to_string(i) + "] must be [user, assistant]");
      }
      messages.push_back({{"role", "user"}, {"content", h[i][0]}});
      messages.push_back({{"role", "assistant"}, {"content", h[i][1]}});
    }
  }
  messages.push_back(
      {{"role", "user"}, {"content", input.empty() ? instruction : instruction + "\n" + input}});
  messages.push_back({{"role", "assistant"}, {"content", output}});
  return messages;
}

Status CheckMessages(const ojson& messages) {
  if (!messages.is_array() || messages.empty())
    return InvalidArgumentError("\"messages\" must be a non-empty list");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return InvalidArgumentError("messages[" + std::to_string(i) + "] needs a string \"role\"");
    }
  }
  return OkStatus();
}

// OpenAI's per-message "weight" (fine-tuning format): 0 or 1 on assistant messages; those with 0
// are not trained. Anything else is an error naming the message.
StatusOr<std::vector<bool>> ZeroWeightMessages(const ojson& messages) {
  std::vector<bool> zero(messages.size(), false);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.contains("weight")) continue;
    const ojson& w = m["weight"];
    const std::string where = "messages[" + std::to_string(i) + "].weight";
    if (m.value("role", "") != "assistant") {
      return InvalidArgumentError(where + ": a weight applies to assistant messages only");
    }
    if (!w.is_number() || (w.get<double>() != 0 && w.get<double>() != 1)) {
      return InvalidArgumentError(where + " must be 0 or 1, got " + w.dump().substr(0, 64));
    }
    zero[i] = w.get<double>() == 0;
  }
  return zero;
}

}  // namespace

StatusOr<DatasetFormat> ParseDatasetFormat(std::string_view name) {
  if (name == "auto") return DatasetFormat::kAuto;
  if (name == "alpaca") return DatasetFormat::kAlpaca;
  if (name == "messages") return DatasetFormat::kMessages;
  if (name == "sharegpt") return DatasetFormat::kShareGpt;
  if (name == "text") return DatasetFormat::kText;
  if (name == "prompt_completion") return DatasetFormat::kPromptCompletion;
  if (name == "pretokenized") return DatasetFormat::kPretokenized;
  return InvalidArgumentError("unknown dataset format \"" + std::string(name) +
                              "\" (auto, alpaca, messages, sharegpt, text, prompt_completion, "
                              "pretokenized)");
}

StatusOr<RecordEncoder> RecordEncoder::Create(const Tokenizer& tokenizer,
                                              const ChatTemplate* chat_template,
                                              const DatasetOptions& options) {
  std::shared_ptr<const ChatTemplate> tmpl;
  if (chat_template != nullptr) {
    tmpl = std::make_shared<ChatTemplate>(*chat_template);
  } else {
    tmpl = std::make_shared<ChatTemplate>(ChatTemplate::BuiltIn(SpecialTokens::Guess(tokenizer)));
  }
  std::optional<int32_t> eos;
  const std::string& eos_token = tmpl->special_tokens().eos_token;
  if (!eos_token.empty()) {
    eos = tokenizer.TokenToId(eos_token);
    if (!eos)
      return InvalidArgumentError("eos_token \"" + eos_token + "\" is not in the tokenizer");
  }
  // Without an EOS token only chat records work; text / prompt-completion fail clearly.
  return RecordEncoder(tokenizer, std::move(tmpl), options, eos);
}

StatusOr<Document> RecordEncoder::EncodeChat(const ojson& raw_messages, const ojson& tools) const {
  RETURN_IF_ERROR(CheckMessages(raw_messages));
  ASSIGN_OR_RETURN(const ojson messages, NormalizeMessages(raw_messages));
  if (!template_->reads_tool_calls()) {
    for (size_t i = 0; i < messages.size(); ++i) {
      const ojson& m = messages[i];
      if (m.is_object() && m.contains("tool_calls") && m["tool_calls"].is_array() &&
          !m["tool_calls"].empty()) {
        return InvalidArgumentError(
            "messages[" + std::to_string(i) +
            "] has tool_calls, but the chat template never reads tool_calls, so the calls would "
            "not be rendered or trained; use a template with tool-call syntax (the model's own), "
            "or give the call as the message's content");
      }
    }
  }
  ASSIGN_OR_RETURN(const std::vector<bool> skipped, ZeroWeightMessages(messages));
  ASSIGN_OR_RETURN(ChatTemplate::Rendered r, template_->RenderWithAssistantSpans(messages, tools));
  // The spans of assistant messages with weight 0 (OpenAI's fine-tuning format): never trained.
  std::vector<std::pair<size_t, size_t>> excluded;
  if (std::find(skipped.begin(), skipped.end(), true) != skipped.end()) {
    std::vector<size_t> owner = r.span_messages;
    if (owner.empty()) {  // generation blocks: one per assistant message, in order, or no mapping
      for (size_t k = 0; k < messages.size(); ++k) {
        if (messages[k].value("role", "") == "assistant") owner.push_back(k);
      }
      if (owner.size() != r.assistant_spans.size()) {
        return FailedPreconditionError(
            "a message has \"weight\": 0, but the chat template's generation blocks (" +
            std::to_string(r.assistant_spans.size()) + ") do not map one to one onto the " +
            std::to_string(owner.size()) + " assistant messages, so the weighted turns cannot be located");
      }
    }
    for (size_t j = 0; j < r.assistant_spans.size(); ++j) {
      if (skipped[owner[j]]) excluded.push_back(r.assistant_spans[j]);
    }
  }
  ASSIGN_OR_RETURN(Encoding enc, tokenizer_->EncodeWithOffsets(r.text, false));
  Document doc;
  doc.labels.resize(enc.ids.size(), kIgnoreIndex);
  auto inside = [&](size_t start, const std::vector<std::pair<size_t, size_t>>& spans) {
    return std::any_of(spans.begin(), spans.end(), [&](const auto& s) { return start >= s.first && start < s.second; });
  };
  for (size_t i = 0; i < enc.ids.size(); ++i) {
    const bool trained = (!options_.mask_prompt || inside(enc.starts[i], r.assistant_spans)) &&
                         !inside(enc.starts[i], excluded);
    if (trained) doc.labels[i] = enc.ids[i];
  }
  doc.input_ids = std::move(enc.ids);
  doc.chat = true;
  return doc;
}

StatusOr<Document> RecordEncoder::EncodeText(const std::string& prompt,
                                             const std::string& completion,
                                             bool masked_prompt) const {
  if (options_.add_eos && !eos_id_) {
    return FailedPreconditionError("add_eos is set but the tokenizer has no known EOS token");
  }
  ASSIGN_OR_RETURN(Encoding enc, tokenizer_->EncodeWithOffsets(prompt + completion, true));
  Document doc;
  doc.labels.resize(enc.ids.size());
  for (size_t i = 0; i < enc.ids.size(); ++i) {
    const bool in_prompt = masked_prompt && enc.starts[i] < prompt.size();
    doc.labels[i] = in_prompt ? kIgnoreIndex : enc.ids[i];
  }
  doc.input_ids = std::move(enc.ids);
  if (options_.add_eos && (doc.input_ids.empty() || doc.input_ids.back() != *eos_id_)) {
    doc.input_ids.push_back(*eos_id_);
    doc.labels.push_back(*eos_id_);
  }
  return doc;
}

StatusOr<Document> RecordEncoder::Encode(const ojson& record) const {
  return GuardJson(std::string("record"), [&]() -> StatusOr<Document> {
    if (!record.is_object()) return InvalidArgumentError("record is not a JSON object");
    DatasetFormat format = options_.format;
    if (format == DatasetFormat::kAuto) {
      format = Detect(record);
      if (format == DatasetFormat::kAuto) {
        std::string keys;
        for (auto it = record.begin(); it != record.end(); ++it)
          keys += (keys.empty() ? "" : ", ") + it.key();
        return InvalidArgumentError("cannot tell the record format from its keys [" + keys + "]");
      }
    }
    switch (format) {
      case DatasetFormat::kPretokenized: {
        if (!record.contains("input_ids") || !record["input_ids"].is_array()) {
          return InvalidArgumentError("\"input_ids\" must be a list of token ids");
        }
        Document doc;
        for (const auto& v : record["input_ids"]) {
          if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
              v.get<int64_t>() >= tokenizer_->vocab_size()) {
            return InvalidArgumentError("input_ids: " + v.dump() + " is not a token id below " +
                                        std::to_string(tokenizer_->vocab_size()));
          }
          doc.input_ids.push_back(v.get<int32_t>());
        }
        if (Has(record, "labels")) {
          const ojson& l = record["labels"];
          if (!l.is_array() || l.size() != doc.input_ids.size()) {
            return InvalidArgumentError("\"labels\" must be a list as long as input_ids");
          }
          for (const auto& v : l) {
            if (!v.is_number_integer() ||
                (v.get<int64_t>() != kIgnoreIndex &&
                 (v.get<int64_t>() < 0 || v.get<int64_t>() >= tokenizer_->vocab_size()))) {
              return InvalidArgumentError("labels: " + v.dump() +
                                          " is neither -100 nor a token id");
            }
            doc.labels.push_back(v.get<int32_t>());
          }
        } else {
          doc.labels = doc.input_ids;
        }
        return doc;
      }
      case DatasetFormat::kMessages: {
        ASSIGN_OR_RETURN(ojson tools, ParseTools(record));
        return EncodeChat(record.value("messages", ojson()), tools);
      }
      case DatasetFormat::kShareGpt: {
        if (!record.contains("conversations"))
          return InvalidArgumentError("missing \"conversations\"");
        ASSIGN_OR_RETURN(ojson messages,
                         ShareGptToMessages(record, template_->reads_tool_calls()));
        ASSIGN_OR_RETURN(ojson tools, ParseTools(record));
        return EncodeChat(messages, tools);
      }
      case DatasetFormat::kAlpaca: {
        ASSIGN_OR_RETURN(ojson messages, AlpacaToMessages(record));
        return EncodeChat(messages, ojson());
      }
      case DatasetFormat::kPromptCompletion: {
        // contains() first: a const operator[] on a missing key is undefined (the dataset fuzzer).
        const bool listed = record.contains("prompt") && record["prompt"].is_array();
        const bool completion_listed = record.contains("completion") && record["completion"].is_array();
        if (listed != completion_listed) {
          return InvalidArgumentError("\"prompt\" and \"completion\" must both be strings (standard) or both "
                                      "lists of messages (TRL's conversational prompt/completion)");
        }
        if (listed) {
          // TRL's conversational form: the conversation is prompt + completion. With mask_prompt
          // (completion_only_loss), only the completion's assistant turns are trained: an assistant
          // turn inside the prompt is rendered with weight 0.
          ojson messages = ojson::array();
          for (ojson m : record["prompt"]) {
            if (options_.mask_prompt && m.is_object() && m.value("role", "") == "assistant") m["weight"] = 0;
            messages.push_back(std::move(m));
          }
          for (const ojson& m : record["completion"]) messages.push_back(m);
          ASSIGN_OR_RETURN(ojson tools, ParseTools(record));
          return EncodeChat(messages, tools);
        }
        ASSIGN_OR_RETURN(std::string prompt, StringField(record, "prompt", true));
        ASSIGN_OR_RETURN(std::string completion, StringField(record, "completion", true));
        return EncodeText(prompt, completion, options_.mask_prompt);
      }
      case DatasetFormat::kText: {
        ASSIGN_OR_RETURN(std::string text, StringField(record, "text", true));
        return EncodeText("", text, false);
      }
      case DatasetFormat::kAuto:
        break;
    }
    return InternalError("unreachable dataset format");
  });
}

StatusOr<std::vector<RawRecord>> SplitRecords(std::string_view s, const std::string& path) {
  std::vector<RawRecord> out;
  size_t i = 0, line = 1;
  auto skip_ws = [&] {
    while (i < s.size() && IsWs(s[i])) line += s[i++] == '\n';
  };
  skip_ws();
  if (i >= s.size()) return out;
  if (s[i] != '[') {
    // JSON lines.
    size_t start = 0;
    line = 1;
    while (start <= s.size()) {
      size_t end = s.find('\n', start);
      if (end == std::string_view::npos) end = s.size();
      std::string_view l = s.substr(start, end - start);
      size_t k = 0;
      while (k < l.size() && IsWs(l[k])) ++k;
      if (k < l.size()) out.push_back({line, std::string(l), {}});
      ++line;
      if (end == s.size()) break;
      start = end + 1;
    }
    return out;
  }
  ++i;  // '['
  while (true) {
    skip_ws();
    if (i >= s.size())
      return InvalidArgumentError(path + ":" + std::to_string(line) + ": unterminated JSON array");
    if (s[i] == ']' && out.empty()) {
      ++i;
      break;
    }
    const size_t start = i, start_line = line;
    int depth = 0;
    bool in_string = false;
    for (; i < s.size(); ++i) {
      const char c = s[i];
      if (c == '\n') ++line;
      if (in_string) {
        if (c == '\\') {
          ++i;
        } else if (c == '"') {
          in_string = false;
        }
        continue;
      }
      if (c == '"')
        in_string = true;
      else if (c == '{' || c == '[')
        ++depth;
      else if (c == '}' || c == ']') {
        if (depth == 0) break;
        --depth;
      } else if (c == ',' && depth == 0) {
        break;
      }
    }
    if (i >= s.size()) {
      return InvalidArgumentError(path + ":" + std::to_string(start_line) +
                                  ": unterminated JSON array (record starting here never ends)");
    }
    size_t end = i;
    while (end > start && IsWs(s[end - 1])) --end;
    out.push_back({start_line, std::string(s.substr(start, end - start)), {}});
    if (s[i] == ']') {
      ++i;
      break;
    }
    ++i;  // ','
  }
  skip_ws();
  if (i < s.size()) {
    return InvalidArgumentError(path + ":" + std::to_string(line) +
                                ": unexpected data after the JSON array");
  }
  return out;
}

namespace {

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The *.parquet files of a directory (confined for reading), in name order: a sharded dataset.
StatusOr<std::vector<std::string>> ParquetShards(const std::string& dir) {
  ASSIGN_OR_RETURN(OwnedFd fd, OpenConfined(dir, O_RDONLY | O_DIRECTORY, Access::kRead));
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return ErrnoError(errno, dir);
  fd.release();  // closedir closes it
  std::vector<std::string> out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name[0] != '.' && EndsWith(name, ".parquet")) out.push_back(dir + "/" + name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  if (out.empty()) {
    return InvalidArgumentError(dir +
                                ": a directory without *.parquet files (a dataset directory holds "
                                "Parquet shards)");
  }
  return out;
}

// Rows of a Parquet or Arrow file as records (JSON text, as the other formats give them).
template <typename ForEachRow>
Status ForEachRowRecord(ForEachRow for_each_row, const std::string& path,
                        const std::function<Status(const RawRecord&)>& each) {
  return for_each_row(path, [&](size_t row, ojson record) -> Status {
    RawRecord raw{row, {}, {}};
    try {
      raw.text = record.dump();
    } catch (const nlohmann::json::exception&) {
      raw.error = "a string column holds invalid UTF-8";
    }
    return each(raw);
  });
}

Status ForEachParquetRecord(const std::string& path,
                            const std::function<Status(const RawRecord&)>& each) {
  return ForEachRowRecord(ForEachParquetRow, path, each);
}

Status ForEachArrowRecord(const std::string& path,
                          const std::function<Status(const RawRecord&)>& each) {
  return ForEachRowRecord(ForEachArrowRow, path, each);
}

bool IsSaveToDiskDirectory(const std::string& path) {
  for (const char* marker : {"/dataset_info.json", "/state.json", "/dataset_dict.json"}) {
    if (::access((path + marker).c_str(), F_OK) == 0) return true;
  }
  return false;
}

// A path that cannot be read as a file: a Hugging Face save_to_disk directory (its Arrow files)
// or a directory of Parquet shards.
Status ForEachInDirectory(const std::string& path, const Status& read_error,
                          const std::function<Status(const RawRecord&)>& each) {
  struct stat st {};
  // Not for a path outside the allowed roots: its refusal stands, and says nothing of what is there.
  if (read_error.code() != StatusCode::kPermissionDenied && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    if (IsSaveToDiskDirectory(path)) {
      ASSIGN_OR_RETURN(std::vector<std::string> files, SaveToDiskFiles(path));
      for (const std::string& file : files) RETURN_IF_ERROR(ForEachArrowRecord(file, each));
      return OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<std::string> shards, ParquetShards(path));
    for (const std::string& shard : shards) RETURN_IF_ERROR(ForEachParquetRecord(shard, each));
    return OkStatus();
  }
  return read_error.WithContext("dataset file");
}

// gzip-compressed JSON Lines (or a JSON array) streamed through zlib: JSON Lines are split and
// encoded a piece of whole lines at a time, so only the current piece of text is held; a JSON
// array must be whole and is refused beyond kMaxGzipArrayBytes of text.
constexpr size_t kGzipPiece = 1 << 20;
constexpr size_t kMaxGzipArrayBytes = size_t{1} << 30;

Status ForEachGzipRecord(GzipReader& gz, const std::function<Status(const RawRecord&)>& each) {
  const std::string& path = gz.path();
  std::string text;
  size_t line = 1;     // JSON Lines: the line of text's first character
  size_t records = 0;  // records handed out
  bool array = false, decided = false, eof = false;
  while (!eof) {
    const size_t old = text.size();
    text.resize(old + kGzipPiece);
    StatusOr<size_t> got = gz.Read(text.data() + old, kGzipPiece);
    if (!got.ok()) {
      return Status(got.status().code(), got.status().message() + " (after record " +
                                             std::to_string(records) + " of the file)");
    }
    text.resize(old + *got);
    eof = *got == 0;
    if (!decided) {
      const size_t first = text.find_first_not_of(" \t\r\n");
      if (first == std::string::npos && !eof) continue;
      decided = true;
      array = first != std::string::npos && text[first] == '[';
    }
    if (array) {
      if (text.size() > kMaxGzipArrayBytes) {
        return InvalidArgumentError(path +
                                    " is a gzip-compressed JSON array larger than 1 GiB "
                                    "of text; use JSON Lines (one record per line) for large "
                                    "datasets");
      }
      continue;
    }
    // JSON Lines, as SplitRecords reads them: every whole line that is not blank is a record.
    size_t start = 0;
    while (true) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) {
        if (!eof || start >= text.size()) break;
        end = text.size();
      }
      const std::string_view l = std::string_view(text).substr(start, end - start);
      if (l.find_first_not_of(" \t\r\n") != std::string_view::npos) {
        ++records;
        RETURN_IF_ERROR(each(RawRecord{line, std::string(l), {}}));
      }
      ++line;
      start = end + 1;
      if (end == text.size()) break;
    }
    text.erase(0, std::min(start, text.size()));
  }
  if (!array) return OkStatus();
  ASSIGN_OR_RETURN(std::vector<RawRecord> raws, SplitRecords(text, path));
  for (const RawRecord& raw : raws) RETURN_IF_ERROR(each(raw));
  return OkStatus();
}

// Calls `each` with every record of a dataset file, plain or gzip-compressed.
Status ForEachRecord(const std::string& path, const std::function<Status(const RawRecord&)>& each) {
  // Not an ifstream: a FIFO given as a dataset would block its open for good. This opens
  // O_NONBLOCK and refuses anything but a regular file (confined to the allowed roots, if set).
  StatusOr<OwnedFd> fd = OpenConfined(path, O_RDONLY | O_NONBLOCK, Access::kRead);
  if (!fd.ok()) return ForEachInDirectory(path, fd.status(), each);
  ASSIGN_OR_RETURN(bool gzipped, IsGzipFile(fd->get(), path));
  if (gzipped) {
    ASSIGN_OR_RETURN(std::unique_ptr<GzipReader> gz, GzipReader::Open(std::move(*fd), path));
    return ForEachGzipRecord(*gz, each);
  }
  char head[8] = {};
  const ssize_t got = ::pread(fd->get(), head, sizeof(head), 0);
  const std::string_view magic(head, got > 0 ? static_cast<size_t>(got) : 0);
  if (HasParquetMagic(magic) || EndsWith(path, ".parquet")) {
    fd->reset();
    return ForEachParquetRecord(path, each);
  }
  if (HasArrowMagic(magic) || EndsWith(path, ".arrow") || EndsWith(path, ".feather")) {
    fd->reset();
    return ForEachArrowRecord(path, each);
  }
  fd->reset();
  auto read = ReadFileConfined(path);
  if (!read.ok()) return ForEachInDirectory(path, read.status(), each);
  const std::string contents = std::move(*read);
  ASSIGN_OR_RETURN(std::vector<RawRecord> records, SplitRecords(contents, path));
  for (const RawRecord& raw : records) RETURN_IF_ERROR(each(raw));
  return OkStatus();
}

}  // namespace

Status ForEachDatasetRecord(const std::string& path,
                            const std::function<Status(const RawRecord&)>& each) {
  return ForEachRecord(path, each);
}

bool IsColumnarDataset(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  if (S_ISDIR(st.st_mode)) return true;
  if (EndsWith(path, ".parquet") || EndsWith(path, ".arrow") || EndsWith(path, ".feather"))
    return true;
  StatusOr<OwnedFd> fd = OpenConfined(path, O_RDONLY | O_NONBLOCK, Access::kRead);
  if (!fd.ok()) return false;
  char head[8] = {};
  const ssize_t got = ::pread(fd->get(), head, sizeof(head), 0);
  const std::string_view magic(head, got > 0 ? static_cast<size_t>(got) : 0);
  return HasParquetMagic(magic) || HasArrowMagic(magic);
}

std::vector<size_t> HeldOutIndices(size_t n, double fraction, uint64_t seed) {
  if (n < 2 || !(fraction > 0)) return {};
  constexpr uint64_t kEvalSplitSalt = 0x6576616c73706c74;  // "evalsplt": not the epoch-0 shuffle
  const auto want =
      static_cast<size_t>(std::ceil(static_cast<double>(n) * std::min(fraction, 1.0)));
  const size_t k = std::clamp<size_t>(want, 1, n - 1);
  const std::vector<uint32_t> order = Batcher::EpochOrder(n, seed ^ kEvalSplitSalt, 0, true);
  std::vector<size_t> out(order.begin(), order.begin() + static_cast<ptrdiff_t>(k));
  std::sort(out.begin(), out.end());
  return out;
}

StatusOr<std::vector<Document>> SplitHeldOut(const std::vector<Document>& docs, double fraction,
                                             uint64_t seed, bool held_out) {
  const std::vector<size_t> held = HeldOutIndices(docs.size(), fraction, seed);
  if (held.empty()) {
    return InvalidArgumentError(
        "eval_split needs at least 2 records to hold one out; the "
        "dataset has " +
        std::to_string(docs.size()));
  }
  std::vector<Document> out;
  out.reserve(held_out ? held.size() : docs.size() - held.size());
  size_t h = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const bool is_held = h < held.size() && held[h] == i;
    h += is_held ? 1 : 0;
    if (is_held == held_out) out.push_back(docs[i]);
  }
  return out;
}

StatusOr<DatasetReader> DatasetReader::Load(const std::vector<std::string>& paths,
                                            const Tokenizer& tokenizer,
                                            const ChatTemplate* chat_template,
                                            const DatasetOptions& options) {
  ASSIGN_OR_RETURN(RecordEncoder encoder, RecordEncoder::Create(tokenizer, chat_template, options));
  DatasetReader reader;
  if (paths.empty()) return InvalidArgumentError("no dataset files given");
  for (const std::string& path : paths) {
    RETURN_IF_ERROR(ForEachRecord(path, [&](const RawRecord& raw) -> Status {
      ++reader.stats_.records;
      ojson record = raw.error.empty() ? ojson::parse(raw.text, nullptr, false) : ojson();
      StatusOr<Document> doc =
          !raw.error.empty()      ? StatusOr<Document>(InvalidArgumentError(raw.error))
          : record.is_discarded() ? StatusOr<Document>(InvalidArgumentError("not valid JSON"))
                                  : encoder.Encode(record);
      if (!doc.ok()) {
        const std::string msg =
            path + ":" + std::to_string(raw.line) + ": " + doc.status().message();
        if (!options.skip_bad_records) return Status(doc.status().code(), msg);
        ++reader.stats_.skipped;
        if (reader.stats_.first_errors.size() < 10) reader.stats_.first_errors.push_back(msg);
        return OkStatus();
      }
      reader.stats_.tokens += doc->input_ids.size();
      reader.stats_.chat_records += doc->chat ? 1 : 0;
      for (int32_t l : doc->labels) reader.stats_.trained_tokens += l != kIgnoreIndex;
      reader.documents_->push_back(std::move(*doc));
      return OkStatus();
    }));
  }
  if (reader.documents_->empty()) {
    return InvalidArgumentError("dataset has no usable records (" +
                                std::to_string(reader.stats_.skipped) + " skipped)");
  }
  return reader;
}

}  // namespace offloadd::text
