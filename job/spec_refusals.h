#pragma once
// Checks of a job spec that refuse at CreateJob what used to pass validation and then fail once
// the job ran, or train nothing and SUCCEED. ValidateJobSpec
// (job_validator.h) calls them; combinations of settings the trainer does not build are listed in
// unsupported_options.h instead. Each problem names its field. Thread-safe: pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "jobspec/field_violation.h"
#include "offloadd/v1/job.pb.h"
#include "text/dataset.h"

namespace offloadd::daemon {

// A NUL byte in any path of `spec`: the C library would cut the path there ("out\0x" is "out").
void CheckPathBytes(const offloadd::v1::JobSpec& spec, std::vector<FieldViolation>* out);

// output_dir equal to model.path (the job wrote checkpoints into the model it read, then failed
// at its export), inside it, or containing it. Both paths canonical.
void CheckOutputApartFromModel(const std::string& output_dir, const std::string& model_dir,
                               std::vector<FieldViolation>* out);

// An empty element of a JSON array dataset (text::SplitRecords yields "" for a trailing comma
// "[{...},]" or two commas in a row): INVALID_ARGUMENT naming path:line.
Status CheckArrayElements(const std::string& path, const std::vector<text::RawRecord>& records);

// The labels the trainer takes a loss on in `doc` cut to max_seq_length: position t's target is
// labels[t + 1] (trainer/data_source.cc), so labels[0] never trains.
int64_t TrainedTokens(const text::Document& doc, int64_t max_seq_length);

// What the previews of a spec's training files found.
struct DataPreviewSummary {
  bool whole = true;           // every file was previewed to its end (it has few records)
  int64_t trained_tokens = 0;  // TrainedTokens over the previewed records
};

// A dataset that trains no token (every label masked: prompts only under mask_prompt, labels all
// -100, completions beyond max_seq_length) made a job that SUCCEEDED and exported the model
// unchanged. Known only when the previews read every record; `clean`: the files raised no other
// problem (then nothing is added).
void CheckSomethingTrains(const offloadd::v1::DatasetSpec& dataset, const DataPreviewSummary& data,
                          bool clean, std::vector<FieldViolation>* out);

}  // namespace offloadd::daemon
