#pragma once
// The final export's temporary files. The export writes each file of the model (model.safetensors
// or its shards, config.json, the tokenizer files, ...) into output_dir with WriteFileAtomically
// (common/safe_path.h): a hidden ".<name>.tmp-<12 hex digits>" that is fsync'd and renamed over
// <name>. A process killed before the rename leaves that file behind, as large as what it held (a
// whole model). Resuming removes them as it removes a dead checkpoint writer's directory:
// LatestCheckpoint calls RemoveExportTemporaries. While an export writes, it holds an ExportLock
// on output_dir, and the removal leaves a locked directory alone, so a live export's files are
// never taken. Torch-free; POSIX calls only (docs/DEVELOPING.md).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/safe_path.h"
#include "common/status.h"

namespace offloadd::trainer {

// Whether `name` is a WriteFileAtomically temporary: "." + a file name + ".tmp-" + 12 lowercase
// hex digits.
bool IsExportTemporaryName(std::string_view name);

// An exclusive flock on output_dir (created if absent, confined like every job path) for as long
// as the object lives. Waits for another export into the same directory to finish.
class ExportLock {
 public:
  static StatusOr<ExportLock> Acquire(const std::string& output_dir);

 private:
  explicit ExportLock(OwnedFd fd) : fd_(std::move(fd)) {}
  OwnedFd fd_;  // closing it drops the lock
};

// Removes output_dir's export temporaries (regular files only, never through a symlink) and
// returns their paths, each also logged. Removes nothing while an export holds the ExportLock.
// A missing output_dir has none (an empty list).
StatusOr<std::vector<std::string>> RemoveExportTemporaries(const std::string& output_dir);

// What the model card of an exported model says (ModelCard).
struct ModelCardFacts {
  std::string model_dir;    // the base model's directory, as the job named it
  std::string config_json;  // its config.json text ("" when unread): `_name_or_path` names the base
  std::vector<std::string> datasets;  // dataset.paths
  std::vector<std::string> eval_datasets;
  // Hugging Face TrainingArguments names and values, in the order to list them.
  std::vector<std::pair<std::string, std::string>> hyperparameters;
  int64_t steps = 0;
  int64_t tokens = 0;
  std::optional<double> final_loss;  // none before the first step
  std::optional<double> eval_loss;   // the last evaluation's, when the job had eval data
  std::string offloadd_version = OffloaddVersion();
  static std::string OffloaddVersion();
};

// The README.md Hugging Face's Trainer writes beside an exported model (its model card): YAML
// front matter with library_name, base_model and tags (what the Hub and huggingface_hub's
// ModelCard read), then the base model, data, hyperparameters, steps, the final training loss
// and eval loss, and offloadd's version. base_model is config.json's `_name_or_path` when that
// is a Hub id (owner/name), else the model directory's name. Pure.
std::string ModelCard(const ModelCardFacts& facts);

}  // namespace offloadd::trainer
