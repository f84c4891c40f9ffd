#pragma once
// `offloadctl convert`: a Hugging Face TrainingArguments JSON, a TRL SFTConfig, an Axolotl or
// LLaMA-Factory YAML, or a DeepSpeed ds_config.json, turned into an offloadd job file. Every key
// of the inputs either maps onto a job-spec setting (docs/hf-names.md, docs/convert.md) or is
// dropped with the reason, in one of three groups: what changes the training, how their run is
// driven, and library internals; keys left at an "off" value (null, false, "", [], {}, "no",
// "none") are counted, not listed, since nothing is lost with them. A value the job file could
// not be validated with (an optimizer offloadd does not implement, a Hub id where a local path is
// needed, pin_memory: false, an unknown chat template) fails the conversion naming the input and
// key. Torch-free and daemon-free: the result is text that ReadJobSpec (job_file.h) reads, and
// that the daemon then validates as usual (offloadctl convert --validate asks it).

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::client {

enum class ConfigKind { kAuto, kHuggingFace, kAxolotl, kDeepSpeed, kLlamaFactory };

// "hf" (TrainingArguments / TRL SFTConfig), "axolotl", "deepspeed", "llamafactory"; "auto"
// guesses per input.
StatusOr<ConfigKind> ParseConfigKind(const std::string& name);
const char* ConfigKindName(ConfigKind kind);

struct ConfigInput {
  std::string source;  // a file name, for messages
  std::string text;    // JSON or YAML
};

struct DroppedKey {
  std::string source, key, value, reason;
};

// A file the job file refers to, written beside it (a chat template).
struct SideFile {
  std::string path, text;
};

struct ConvertedJob {
  std::string job_yaml;                  // the job file, with a header naming the inputs
  std::vector<std::string> kinds;        // per input: "hf", "axolotl", "deepspeed", "llamafactory"
  std::vector<DroppedKey> dropped;       // set to something offloadd has no setting for: the run differs
  std::vector<DroppedKey> operational;   // how theirs is driven (data loading, saving, eval cadence)
  std::vector<DroppedKey> internals;     // library internals, logging, hub and reporting
  std::vector<SideFile> files;           // to write beside the job file before it is used
  int unset_keys = 0;                    // left at an off value: dropped, nothing lost
  std::vector<std::string> notes;        // how a mapping read (e.g. DeepSpeed "auto" values)
  std::vector<std::string> missing;      // required job fields no input gave
  // Job field path -> the input and key that set it ("sft.yaml `cutoff_len`"), to name the key
  // behind a problem the daemon finds.
  std::map<std::string, std::string> set_by;
};

// What the user gives on the command line (offloadctl convert --model/--dataset/--output-dir):
// each replaces what the configurations say. `job_file` (--out) is where the job file goes: side
// files are written beside it; without it a configuration that needs one is refused.
struct ConvertOverrides {
  std::string model_path, output_dir, job_file;
  std::vector<std::string> dataset_paths;
};

// INVALID_ARGUMENT naming the input and key for a text that is not a mapping, a value of the wrong
// type for a key that maps, two inputs giving one setting different values, and every value the
// converted job could not be validated with.
StatusOr<ConvertedJob> ConvertConfigs(const std::vector<ConfigInput>& inputs, ConfigKind kind,
                                      const ConvertOverrides& overrides);

}  // namespace offloadd::client
