#pragma once
// The checks of a weighted dataset mixture (dataset.datasets, text/mixture.h) that need no file:
// the fields of each dataset, its chat template against the job's, the stopping strategy. Its
// files are checked with the job's others (job_validator.cc). Stateless; thread-safe.

#include <string>
#include <vector>

#include "job/path_policy.h"
#include "jobspec/field_violation.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

// dataset.datasets and dataset.stopping_strategy of `spec`, whose dataset.template is resolved
// (CheckChatTemplate): given with dataset.paths; a dataset without paths; a weight that is not
// finite and > 0; an unknown format; a template other than the job's (one job renders its chat
// records with one template, the one its exported model carries); an unknown stopping strategy.
// A dataset's template that names the job's is stored resolved.
void CheckMixture(offloadd::v1::JobSpec& spec, const PathPolicy& paths, Checker& c);

// The DatasetSpec that one dataset of a mixture is read with: the job's, with that dataset's
// paths, and its format and mask_prompt where it sets them.
offloadd::v1::DatasetSpec MixtureSourceSpec(const offloadd::v1::DatasetSpec& ds,
                                            const offloadd::v1::DatasetSource& source);

// The dataset's path count and bytes (job_validator.cc CheckSizes' limits).
void CheckMixtureSizes(const offloadd::v1::DatasetSpec& ds, size_t max_paths, size_t max_path_bytes,
                       Checker& c);

}  // namespace offloadd::daemon
