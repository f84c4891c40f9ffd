#pragma once
// Training datasets: JSON array or JSON-lines files (plain or gzip-compressed, gzip_reader.h),
// Parquet files and directories of them (parquet_reader.h: a row is a record of its columns),
// Arrow IPC files and Hugging Face save_to_disk directories (arrow_ipc_reader.h),
// whose records are rendered and tokenized into documents {input_ids, labels}. The training
// engine turns them into tensors later.
//
// Record formats (DatasetFormat::kAuto picks one per record from its keys, in this order):
//   pretokenized       {"input_ids": [...], "labels": [...]?}  labels default to input_ids
//   messages           {"messages": [{"role", "content", ...}], "tools": [...]?}; an assistant
//                      message may carry OpenAI's "weight": 0 (rendered, not trained) or 1
//   sharegpt           {"conversations": [{"from", "value"}], "tools": "<json>"?, "system"?}
//                      from: human|user -> user, gpt|assistant -> assistant, system -> system,
//                      function_call -> assistant, observation|tool -> tool
//   alpaca             {"instruction", "input"?, "output", "history"?: [[user, assistant]...],
//                      "system"?} -> messages; the user turn is instruction + "\n" + input
//                      (just instruction when input is empty)
//   prompt/completion  {"prompt", "completion"}: strings, or (TRL's conversational form) lists of
//                      messages rendered as one conversation; with mask_prompt only the
//                      completion's assistant turns are trained
//   text               {"text"}
// Chat-like records are rendered with the chat template (the tokenizer's, else the built-in one,
// see chat_template.h) and tokenized as one text without extra special tokens, exactly like
// transformers' apply_chat_template(tokenize=True). With mask_prompt, only tokens that start
// inside an assistant turn are trained (others get kIgnoreIndex). prompt/completion is tokenized
// as one text prompt+completion (with the tokenizer's special tokens) and, with mask_prompt,
// tokens starting inside the prompt are ignored; EOS is appended and trained. text: the whole
// text (with special tokens) plus EOS is trained.
//
// Errors: a malformed record is an error "file:line: what" (line of the record's first
// character; a Parquet file's row), unless skip_bad_records, which skips and counts it
// (stats().skipped and the first messages in stats().first_errors).

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::text {

class Tokenizer;
class ChatTemplate;

inline constexpr int32_t kIgnoreIndex = -100;

enum class DatasetFormat {
  kAuto,
  kAlpaca,
  kMessages,
  kShareGpt,
  kText,
  kPromptCompletion,
  kPretokenized
};
// "auto", "alpaca", "messages", "sharegpt", "text", "prompt_completion", "pretokenized".
StatusOr<DatasetFormat> ParseDatasetFormat(std::string_view name);

struct DatasetOptions {
  DatasetFormat format = DatasetFormat::kAuto;
  bool mask_prompt = true;        // train only on responses / completions / assistant turns
  bool skip_bad_records = false;  // skip and count malformed records instead of failing
  bool add_eos = true;            // text and prompt/completion: append (and train) EOS
};

struct Document {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // same length; kIgnoreIndex where no loss is taken
  bool chat = false;            // rendered with the chat template
};

struct DatasetStats {
  size_t records = 0;   // records read (good and bad)
  size_t skipped = 0;   // bad records skipped (skip_bad_records)
  uint64_t tokens = 0;  // total input tokens
  uint64_t trained_tokens = 0;
  size_t chat_records = 0;  // records rendered with the chat template
  std::vector<std::string> first_errors;  // up to 10 "file:line: what" messages
};

// Renders and tokenizes records. Thread-compatible; the tokenizer and template must outlive it.
class RecordEncoder {
 public:
  // `chat_template` may be null: the built-in template with SpecialTokens::Guess is used.
  static StatusOr<RecordEncoder> Create(const Tokenizer& tokenizer,
                                        const ChatTemplate* chat_template,
                                        const DatasetOptions& options);
  StatusOr<Document> Encode(const nlohmann::ordered_json& record) const;

 private:
  RecordEncoder(const Tokenizer& tokenizer, std::shared_ptr<const ChatTemplate> chat_template,
                const DatasetOptions& options, std::optional<int32_t> eos_id)
      : tokenizer_(&tokenizer),
        template_(std::move(chat_template)),
        options_(options),
        eos_id_(eos_id) {}
  StatusOr<Document> EncodeChat(const nlohmann::ordered_json& messages,
                                const nlohmann::ordered_json& tools) const;
  StatusOr<Document> EncodeText(const std::string& prompt, const std::string& completion,
                                bool masked_prompt) const;

  const Tokenizer* tokenizer_;
  std::shared_ptr<const ChatTemplate> template_;
  DatasetOptions options_;
  std::optional<int32_t> eos_id_;
};

// All documents of one or more files, loaded eagerly (datasets for fine-tuning fit in memory).
class DatasetReader {
 public:
  static StatusOr<DatasetReader> Load(const std::vector<std::string>& paths,
                                      const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                                      const DatasetOptions& options);
  size_t size() const { return documents_->size(); }
  const Document& document(size_t i) const { return (*documents_)[i]; }
  std::shared_ptr<const std::vector<Document>> documents() const { return documents_; }
  const DatasetStats& stats() const { return stats_; }

 private:
  std::shared_ptr<std::vector<Document>> documents_ = std::make_shared<std::vector<Document>>();
  DatasetStats stats_;
};

// The held-out records of an eval split: ceil(n * fraction) of the n indices (at least 1, at most
// n - 1; none when n < 2), chosen by a seeded permutation (Batcher::EpochOrder of seed ^
// kEvalSplitSalt), in ascending order. Deterministic in (n, fraction, seed).
std::vector<size_t> HeldOutIndices(size_t n, double fraction, uint64_t seed);
// The held-out documents (held_out) or the rest, each in dataset order. INVALID_ARGUMENT when
// fewer than 2 documents leave nothing to hold out.
StatusOr<std::vector<Document>> SplitHeldOut(const std::vector<Document>& docs, double fraction,
                                             uint64_t seed, bool held_out);

// One record of a JSON array or JSON-lines file, with its 1-based line.
struct RawRecord {
  size_t line = 0;  // for a Parquet file, the row (1-based)
  std::string text;
  std::string error;  // set: the record is bad for this reason (text is not read)
};
// Calls `each` with every record of a dataset path as DatasetReader::Load reads it: a JSON or
// JSON Lines file (plain or gzip), a Parquet or Arrow file, a directory of Parquet shards or a
// save_to_disk directory. A status
// `each` returns ends the walk and is returned (CANCELLED to stop early, e.g. after a preview).
Status ForEachDatasetRecord(const std::string& path,
                            const std::function<Status(const RawRecord&)>& each);
// Whether `path` is read as rows, not lines of text: a Parquet or Arrow file (by name or magic),
// or a directory (Parquet shards, or a Hugging Face save_to_disk directory).
bool IsColumnarDataset(const std::string& path);

// Splits a file's contents into records: a top-level JSON array is split into its elements,
// anything else is read as JSON lines (blank lines skipped). Errors name path:line.
StatusOr<std::vector<RawRecord>> SplitRecords(std::string_view contents, const std::string& path);

}  // namespace offloadd::text
