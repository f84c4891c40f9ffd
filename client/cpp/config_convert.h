#pragma once
// `offloadctl convert` (issue #17 item 1): a Hugging Face TrainingArguments JSON, a TRL SFTConfig
// or Axolotl YAML, or a DeepSpeed ds_config.json, turned into an offloadd job file. Every key of
// the inputs either maps onto a job-spec setting (docs/hf-names.md, docs/convert.md) or is listed
// as dropped with the reason; keys left at an "off" value (null, false, "", [], {}, "no", "none")
// are counted, not listed, since nothing is lost with them. Torch-free and daemon-free: the result
// is text that ReadJobSpec (job_file.h) reads, and that the daemon then validates as usual.

#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::client {

enum class ConfigKind { kAuto, kHuggingFace, kAxolotl, kDeepSpeed };

// "hf" (TrainingArguments / TRL SFTConfig), "axolotl", "deepspeed"; "auto" guesses per input.
StatusOr<ConfigKind> ParseConfigKind(const std::string& name);
const char* ConfigKindName(ConfigKind kind);

struct ConfigInput {
  std::string source;  // a file name, for messages
  std::string text;    // JSON or YAML
};

struct DroppedKey {
  std::string source, key, value, reason;
};

struct ConvertedJob {
  std::string job_yaml;                  // the job file, with a header naming the inputs
  std::vector<std::string> kinds;        // per input: "hf", "axolotl", "deepspeed"
  std::vector<DroppedKey> dropped;       // set to something offloadd has no setting for: the run differs
  std::vector<DroppedKey> operational;   // how theirs is driven or reported (logging, hub, data loading)
  int unset_keys = 0;                    // left at an off value: dropped, nothing lost
  std::vector<std::string> notes;        // how a mapping read (e.g. DeepSpeed "auto" values)
  std::vector<std::string> missing;      // required job fields no input gave
};

// What the user adds on the command line (offloadctl convert --model/--dataset/--output-dir).
struct ConvertOverrides {
  std::string model_path, output_dir;
  std::vector<std::string> dataset_paths;
};

// INVALID_ARGUMENT naming the input and key for a text that is not a mapping, a value of the wrong
// type for a key that maps, and two inputs giving one setting different values.
StatusOr<ConvertedJob> ConvertConfigs(const std::vector<ConfigInput>& inputs, ConfigKind kind,
                                      const ConvertOverrides& overrides);

}  // namespace offloadd::client
