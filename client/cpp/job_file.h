#pragma once
// Job files: a JobSpec written as YAML (or JSON) with the field names of job.proto, e.g.
//
//   display_name: alpaca-demo
//   model: {path: /srv/offloadd/models/stories260K}
//   dataset: {paths: [/srv/offloadd/data/alpaca_5000.json], format: DATASET_FORMAT_ALPACA}
//   training: {learning_rate: 3e-4, per_device_train_batch_size: 8, max_steps: 200, bf16: true}
//   offload: {offload_optimizer: {device: OFFLOAD_DEVICE_CPU}}
//   resources: {gpu_memory_limit: 24GiB}
//   output_dir: /srv/offloadd/out/alpaca-demo
//
// Read as spec_reader.h describes (short enum names, byte sizes as 24GiB/500MB/bytes, every
// problem reported at once with its snake_case path and a "did you mean" for near misses). One
// rule of transformers v5 is applied here: a `training.warmup_steps` below 1 written as a
// fraction is warmup_ratio. Nothing is silently ignored.

#include <string>
#include <vector>

#include "client/cpp/offloadd_client.h"
#include "common/status.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::client {

// A job file read as far as it could be: the fields that read, and what is wrong with the rest.
struct JobFileContents {
  offloadd::v1::JobSpec spec;
  std::vector<FieldViolation> violations;  // empty when the whole file read
};

// INVALID_ARGUMENT only when the text is not a YAML mapping at all (or expands beyond the bounds
// below); problems with fields are the result's violations.
StatusOr<JobFileContents> ReadJobSpec(const std::string& yaml_text, const std::string& source);

// The spec, or INVALID_ARGUMENT listing every violation, one per line: "<source>: N problems in
// the job spec:\n  training.max_grad_norm: ...".
StatusOr<offloadd::v1::JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source);
StatusOr<offloadd::v1::JobSpec> LoadJobFile(const std::string& path);

// The client's violations of a job file followed by the daemon's for the part that read
// (CreateJob with validate_only), so one run reports both. A daemon violation on a field the
// client reported, or on a field above or below one, is dropped: the daemon saw that field unset.
std::vector<FieldViolation> MergeViolations(std::vector<FieldViolation> client,
                                            const std::vector<FieldViolation>& daemon);

// The violations as ParseJobSpec's message lists them.
std::string DescribeViolations(const std::string& source, const std::vector<FieldViolation>& violations);

}  // namespace offloadd::client
