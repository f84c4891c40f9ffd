#pragma once
// Job files: a JobSpec written as YAML (or JSON) with the field names of job.proto, e.g.
//
//   display_name: alpaca-demo
//   model: {path: /srv/offloadd/models/stories260K}
//   dataset: {paths: [/srv/offloadd/data/alpaca_5000.json], format: DATASET_FORMAT_ALPACA}
//   training: {learning_rate: 3e-4, per_device_train_batch_size: 8, max_steps: 200}
//   offload: {offload_optimizer: {device: OFFLOAD_DEVICE_CPU}}
//   output_dir: /srv/offloadd/out/alpaca-demo
//
// Enum values may be written in full (DATASET_FORMAT_ALPACA) or short (alpaca). Unknown fields
// are errors naming the field; nothing is silently ignored.

#include <string>

#include "common/status.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::client {

StatusOr<offloadd::v1::JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source);
StatusOr<offloadd::v1::JobSpec> LoadJobFile(const std::string& path);

}  // namespace offloadd::client
