#pragma once
// Job settings the API defines but the training pipeline does not implement yet. One list, read
// by job validation (CreateJob and validate_only refuse such a spec before it is queued, with the
// field paths) and by MakeTrainConfig (a job stored before an entry existed fails with the same
// words), so the two cannot disagree. Each setting is one entry in unsupported_options.cc: when
// the pipeline implements it, delete the entry and map the setting in MakeTrainConfig.
// Thread-safe (no state).

#include <vector>

#include "jobspec/field_violation.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

// Every unimplemented setting `spec` asks for, in field order; empty when it asks for none.
std::vector<FieldViolation> UnsupportedOptions(const offloadd::v1::JobSpec& spec);

}  // namespace offloadd::daemon
