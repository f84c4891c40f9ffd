#pragma once
// offloadd-train's job file: a job spec as offloadctl submits it (client/cpp/job_file.h: YAML or
// JSON with job.proto's field names), with --set overrides, read, validated and turned into the
// trainer's TrainConfig along the daemon's own path: ReadJobSpec, ValidateJobSpec (every path
// allowed, this node probed as the daemon probes it), MakeTrainConfig and ResumePoint. A job file
// that the daemon would refuse is refused here with the same messages.
//
// Torch-free and compiled apart from offloadd-train's LibTorch sources: LibTorch's include
// directory carries an older protobuf whose headers would shadow the ones job.pb.h needs, so this
// header names no proto type. Thread-safe (no shared state beyond the node probe's).

#include <string>
#include <vector>

#include "common/status.h"
#include "job/train_config.h"

namespace offloadd::trainer {

// The job file's YAML with each "KEY=VALUE" of `sets` applied: KEY is a dotted job.proto field
// path ("training.max_steps", "resources.gpu_memory_limit", "labels.team"), VALUE is YAML read as
// that field's type by the job file reader (24GiB, OFFLOAD_DEVICE_CPU or cpu, [a.json, b.json]).
// INVALID_ARGUMENT naming the assignment for a missing '=', a key that is not a field of JobSpec
// (with the fields its message has), or a value that is not YAML.
StatusOr<std::string> ApplySetOverrides(const std::string& yaml_text,
                                        const std::vector<std::string>& sets);

// Binaries the job's trainer starts (offloadd-worker, offloadd-store).
struct JobFileBinaries {
  std::string worker_binary, store_binary;
};

// The TrainConfig the daemon's executor would train the job in `path` with, on this node; the
// checkpoint it continues from in resume_from. INVALID_ARGUMENT listing every violation of the
// spec, one per line, as `offloadctl submit` shows them.
StatusOr<TrainConfig> TrainConfigFromJobFile(const std::string& path,
                                             const std::vector<std::string>& sets,
                                             const JobFileBinaries& binaries);

}  // namespace offloadd::trainer
