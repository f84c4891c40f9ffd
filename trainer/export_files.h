#pragma once
// The final export's temporary files. The export writes each file of the model (model.safetensors
// or its shards, config.json, the tokenizer files, ...) into output_dir with WriteFileAtomically
// (common/safe_path.h): a hidden ".<name>.tmp-<12 hex digits>" that is fsync'd and renamed over
// <name>. A process killed before the rename leaves that file behind, as large as what it held (a
// whole model). Resuming removes them as it removes a dead checkpoint writer's directory:
// LatestCheckpoint calls RemoveExportTemporaries. While an export writes, it holds an ExportLock
// on output_dir, and the removal leaves a locked directory alone, so a live export's files are
// never taken. Torch-free; POSIX calls only (docs/DEVELOPING.md).

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

}  // namespace offloadd::trainer
