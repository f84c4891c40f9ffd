#pragma once
// LatestCheckpoint (trainer/state/checkpoint.h) that also says which checkpoints it passed over,
// and why, so a resumed job can put the reasons in its own events. Declared apart from
// checkpoint.h, which most of the trainer includes.

#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::trainer {

// As LatestCheckpoint(output_dir); each checkpoint skipped as invalid or corrupt is also added to
// `skipped` (when not null) as "skipped <dir>: <reason>".
StatusOr<std::string> LatestCheckpoint(const std::string& output_dir, std::vector<std::string>* skipped);

}  // namespace offloadd::trainer
