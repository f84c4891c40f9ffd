// Job validation's dataset checks: each named file is previewed as the job will read it (JSON
// Lines, JSON, Parquet, Arrow, save_to_disk), within the request's preview budget, and its
// records must encode and train (job_validator_checks.h).
#include "job/job_validator_checks.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "common/file.h"
#include "common/message_text.h"
#include "common/safe_path.h"
#include "common/units.h"
#include "engine/model_config.h"
#include "job/dataset_mixture_checks.h"
#include "job/hf_names.h"
#include "job/job_validator_checks.h"
#include "job/sequence_positions.h"
#include "job/spec_refusals.h"
#include "job/state_placement.h"
#include "job/train_job_config.h"
#include "job/unsupported_options.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/gzip_reader.h"
#include "text/jinja.h"
#include "text/tokenizer.h"
#include "trainer/state/checkpoint.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;

constexpr uint64_t kMaxDatasetPreviewBytes = 64ull << 20;

text::DatasetFormat ToTextFormat(v1::DatasetFormat f) {
  switch (f) {
    case v1::DATASET_FORMAT_ALPACA:
      return text::DatasetFormat::kAlpaca;
    case v1::DATASET_FORMAT_SHAREGPT:
      return text::DatasetFormat::kShareGpt;
    case v1::DATASET_FORMAT_TEXT:
      return text::DatasetFormat::kText;
    case v1::DATASET_FORMAT_MESSAGES:
      return text::DatasetFormat::kMessages;
    case v1::DATASET_FORMAT_PROMPT_COMPLETION:
      return text::DatasetFormat::kPromptCompletion;
    case v1::DATASET_FORMAT_PRETOKENIZED:
      return text::DatasetFormat::kPretokenized;
    default:
      return text::DatasetFormat::kAuto;
  }
}

// What the dataset previews of one request may still spend (ValidationOptions), shared by all its
// files.
struct PreviewBudget {
  text::jinja::RequestBudget* render = nullptr;  // also carries the request's stop()
  uint64_t bytes_left = 0;
  int records_per_file = kDatasetPreviewRecords;
  std::set<std::string> seen;   // resolved paths already checked: a repeated path is checked once
  bool steps_reported = false;  // the render budget's violation was added
};

// The records a preview read, and whether they are the whole file (it was read to its end and
// holds no more than the records it may preview).
struct Preview {
  std::vector<text::RawRecord> records;
  bool whole_file = false;
};

// The first `budget->records_per_file` records of a dataset file. JSON Lines are read in 1 MiB
// pieces only until enough whole lines are in (each CreateJob used to allocate 64 MiB per dataset
// path whatever the file's size: 150 concurrent calls on a 52-byte dataset peaked at 2.3 GB); a
// JSON array must be read whole and is refused beyond kMaxDatasetPreviewBytes. Opened as the job
// opens it: confined, a regular file only, never blocking (common/safe_path.h).
// Reads charge budget->bytes_left; when it runs out first, *skipped is set and no records are
// returned (the file is then checked only when the job loads it).
StatusOr<Preview> PreviewRecords(const std::string& path, PreviewBudget* budget, bool* skipped) {
  *skipped = false;
  ASSIGN_OR_RETURN(OwnedFd owned, OpenConfined(path, O_RDONLY | O_NONBLOCK, Access::kRead));
  const int fd = owned.get();
  // A gzip-compressed file (*.jsonl.gz) is previewed in its inflated text (text/gzip_reader.h).
  ASSIGN_OR_RETURN(const bool gzipped, text::IsGzipFile(fd, path));
  std::unique_ptr<text::GzipReader> gz;
  if (gzipped) {
    ASSIGN_OR_RETURN(gz, text::GzipReader::Open(std::move(owned), path));
  }
  constexpr size_t kPiece = 1 << 20;
  const auto max_records = static_cast<size_t>(budget->records_per_file);
  std::string data;
  bool eof = false;
  size_t newlines = 0;
  while (!eof) {
    if (budget->render->Stopped()) return CancelledError("validation stopped");
    const size_t want =
        std::min<size_t>({kPiece, kMaxDatasetPreviewBytes - data.size(), budget->bytes_left});
    if (want == 0) break;
    const size_t old = data.size();
    data.resize(old + want);
    ssize_t n = 0;
    if (gz) {
      ASSIGN_OR_RETURN(const size_t got, gz->Read(data.data() + old, want));
      n = static_cast<ssize_t>(got);
    } else {
      n = read(fd, data.data() + old, want);
    }
    if (n < 0) return ErrnoError(errno, "cannot read " + path);
    data.resize(old + static_cast<size_t>(n));
    budget->bytes_left -= static_cast<uint64_t>(n);
    eof = n == 0;
    const size_t first = data.find_first_not_of(" \t\r\n");
    const bool array = first != std::string::npos && data[first] == '[';
    newlines += static_cast<size_t>(
        std::count(data.begin() + static_cast<ptrdiff_t>(old), data.end(), '\n'));
    if (!array && newlines > max_records) break;
  }
  const size_t first = data.find_first_not_of(" \t\r\n");
  const bool array = first != std::string::npos && data[first] == '[';
  const bool out_of_bytes = !eof && budget->bytes_left == 0 && (array || newlines <= max_records);
  if (array && !eof) {
    if (out_of_bytes) {
      *skipped = true;
      return Preview{};
    }
    return InvalidArgumentError(path + " is a JSON array larger than " +
                                FormatByteSize(kMaxDatasetPreviewBytes) +
                                "; use JSON Lines (one record per line) for large datasets");
  }
  if (!eof)
    data.resize(data.rfind('\n') == std::string::npos ? 0 : data.rfind('\n') + 1);  // whole lines
  ASSIGN_OR_RETURN(auto records, text::SplitRecords(data, path));
  if (records.empty() && out_of_bytes) {
    *skipped = true;
    return Preview{};
  }
  if (records.empty()) return InvalidArgumentError(path + " holds no records");
  RETURN_IF_ERROR(CheckArrayElements(path, records));
  Preview preview;
  preview.whole_file = eof && records.size() <= max_records;
  if (records.size() > max_records) records.resize(max_records);
  preview.records = std::move(records);
  return preview;
}

// The first records of a Parquet or Arrow file, or a directory (Parquet shards, save_to_disk), as
// the job reads them (text/dataset.h): rows are decoded a row group or record batch at a time.
StatusOr<Preview> PreviewColumnarRecords(const std::string& path, const PreviewBudget& budget) {
  const auto max_records = static_cast<size_t>(budget.records_per_file);
  Preview preview;
  preview.whole_file = true;
  const Status s = text::ForEachDatasetRecord(path, [&](const text::RawRecord& r) -> Status {
    if (preview.records.size() == max_records) {
      preview.whole_file = false;
      return CancelledError("preview complete");
    }
    if (!r.error.empty())
      return InvalidArgumentError(path + ":" + std::to_string(r.line) + ": " + r.error);
    preview.records.push_back(r);
    return OkStatus();
  });
  if (!s.ok() && !(s.code() == StatusCode::kCancelled && !preview.whole_file)) return s;
  if (preview.records.empty()) return InvalidArgumentError(path + " holds no records");
  return preview;
}

// A data file of the spec (training or held-out): under an allowed root, a file, and (when the
// tokenizer loaded) its first records encode into the model's vocabulary. Returns the resolved
// path, or "" when it cannot be used.
std::string CheckDataFile(const PathPolicy& paths, const text::Tokenizer* tokenizer,
                          const text::ChatTemplate* chat, const engine::ModelConfig* config,
                          const v1::DatasetSpec& ds, Checker& c, const std::string& field,
                          const std::string& path, PreviewBudget& budget,
                          DataPreviewSummary* summary) {
  DataPreviewSummary unused;
  DataPreviewSummary& sum = summary != nullptr ? *summary : unused;
  auto real = paths.ResolveExisting(path);
  if (c.Fails(field, real.status())) return "";
  const bool columnar = text::IsColumnarDataset(*real);
  struct stat st {};
  if (::stat(real->c_str(), &st) == 0 && S_ISDIR(st.st_mode) && !columnar) {
    c.Add(field,
          "'" + *real +
              "' is a directory; give the JSON, JSON Lines or Parquet file, or a directory of "
              "Parquet shards");
    return "";
  }
  const bool whole_so_far = sum.whole;
  sum.whole = false;                      // until the preview below shows every record of the file
  if (!tokenizer || !chat) return *real;  // reported above; records cannot be encoded without them
  // Checked once per file, however often it is listed; and not at all once the request's render
  // budget is spent (that is reported once) or the request stopped.
  if (!budget.seen.insert(*real).second || budget.render->spent() || budget.render->Stopped())
    return *real;
  bool skipped = false;
  auto preview =
      columnar ? PreviewColumnarRecords(*real, budget) : PreviewRecords(*real, &budget, &skipped);
  if (budget.render->Stopped()) return *real;
  if (c.Fails(field, preview.status())) return *real;
  text::DatasetOptions opts;
  opts.format = ToTextFormat(ds.format());
  opts.mask_prompt = ds.mask_prompt();
  auto encoder = text::RecordEncoder::Create(*tokenizer, chat, opts);
  if (c.Fails(field, encoder.status())) return *real;
  bool all_read = preview->whole_file;
  for (const auto& rec : preview->records) {
    const std::string where = *real + ":" + std::to_string(rec.line);
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(rec.text);
    } catch (const nlohmann::json::exception& e) {
      c.Add(field, where + ": not valid JSON: " + e.what());
      all_read = false;
      break;
    }
    auto doc = encoder->Encode(j);
    if (budget.render->Stopped()) break;  // nobody waits for the answer
    if (budget.render->spent()) {  // whatever skip_bad_records says: the request's budget is gone
      if (!budget.steps_reported) {
        c.Add(field,
              where +
                  ": validation stopped: rendering the chat template for the records checked took "
                  "more than " +
                  std::to_string(budget.render->max_steps()) +
                  " steps in all (the budget of one CreateJob, shared by every record and file)");
        budget.steps_reported = true;
      }
      break;
    }
    if (!doc.ok()) {
      if (!ds.skip_bad_records()) {
        c.Add(field, where + ": " + doc.status().message());
        all_read = false;
        break;
      }
    } else if (doc->input_ids.empty()) {  // the trainer refused it only once the job ran
      c.Add(
          field,
          where + ": the record has no tokens (empty input_ids); every record needs at least one");
      all_read = false;
      break;
    } else {
      bool outside = false;
      for (int32_t id : doc->input_ids) {
        if (config && (id < 0 || id >= config->vocab_size)) {
          c.Add(field, where + ": token id " + std::to_string(id) +
                           " is outside the model's vocabulary of " +
                           std::to_string(config->vocab_size) +
                           " (tokenizer and model do not match)");
          outside = true;
          break;
        }
      }
      // A tokenizer that does not match the model fails every record alike: said once per file.
      if (outside) {
        all_read = false;
        break;
      }
      sum.trained_tokens += TrainedTokens(*doc, ds.max_seq_length());
    }
  }
  sum.whole = whole_so_far && all_read;
  return *real;
}

}  // namespace

// dataset.paths and eval_paths: each distinct file resolves, and its first records parse and
// encode, within the request's preview budget; something trains.
void CheckDatasets(v1::JobSpec& spec, const PathPolicy& paths, const TokenizerCheck& tok,
                   const text::ChatTemplate* chat, const engine::ModelConfig* config,
                   const ValidationOptions& options, text::jinja::RequestBudget* render_budget,
                   Checker& c, ValidationResult* r) {
  const auto& ds = spec.dataset();
  // The preview records are shared among the distinct files named (as given; symlinks to one file
  // are found when resolved): a few files get kDatasetPreviewRecords each, 512 get one.
  std::set<std::string> named(ds.paths().begin(), ds.paths().end());
  named.insert(ds.eval_paths().begin(), ds.eval_paths().end());
  for (const v1::DatasetSource& d : ds.datasets()) named.insert(d.paths().begin(), d.paths().end());
  PreviewBudget preview;
  preview.render = render_budget;
  preview.bytes_left = options.max_preview_bytes;
  preview.records_per_file =
      std::clamp(options.max_preview_records / std::max<int>(1, static_cast<int>(named.size())), 1,
                 kDatasetPreviewRecords);
  DataPreviewSummary train_data;
  const size_t violations_before_data = r->violations.size();
  for (int i = 0; i < ds.paths_size(); ++i) {
    const std::string real = CheckDataFile(paths, tok.tokenizer.get(), chat, config, ds, c,
                                           "dataset.paths[" + std::to_string(i) + "]", ds.paths(i),
                                           preview, &train_data);
    if (!real.empty()) spec.mutable_dataset()->set_paths(i, real);
  }
  CheckSomethingTrains(ds, train_data, r->violations.size() == violations_before_data,
                       &r->violations);
  // A mixture's datasets: each read with its own format and mask_prompt, and each must train.
  for (int i = 0; i < ds.datasets_size(); ++i) {
    const std::string where = "dataset.datasets[" + std::to_string(i) + "]";
    const v1::DatasetSpec one = MixtureSourceSpec(ds, ds.datasets(i));
    DataPreviewSummary data;
    std::vector<FieldViolation> none_trains;
    const size_t before = r->violations.size();
    for (int j = 0; j < one.paths_size(); ++j) {
      const std::string real =
          CheckDataFile(paths, tok.tokenizer.get(), chat, config, one, c,
                        where + ".paths[" + std::to_string(j) + "]", one.paths(j), preview, &data);
      if (!real.empty()) spec.mutable_dataset()->mutable_datasets(i)->set_paths(j, real);
    }
    CheckSomethingTrains(one, data, r->violations.size() == before, &none_trains);
    for (FieldViolation& v : none_trains) c.Add(where + ".paths", v.description);
  }
  for (int i = 0; i < ds.eval_paths_size(); ++i) {
    const std::string real = CheckDataFile(paths, tok.tokenizer.get(), chat, config, ds, c,
                                           "dataset.eval_paths[" + std::to_string(i) + "]",
                                           ds.eval_paths(i), preview, nullptr);
    if (!real.empty()) spec.mutable_dataset()->set_eval_paths(i, real);
  }
}

}  // namespace offloadd::daemon
