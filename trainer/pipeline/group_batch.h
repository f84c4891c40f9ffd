#pragma once
// The automatic batch size (job/batch_planner.h) in a data-parallel group of one host: every rank
// prices the same candidates on its own GPU (its own budget and timings); a candidate runs only
// where it fits on every rank, and rank 0's prices choose among those, so that every rank trains
// the same micro-batch and accumulation. The ranks meet through the group's store.

#include <vector>

#include "common/status.h"
#include "job/batch_planner.h"
#include "trainer/pipeline/data_parallel.h"

namespace offloadd::trainer {

// `candidates`: this rank's priced candidates, the same list on every rank. Rank 0 marks those
// above another rank's largest fitting micro-batch as not fitting (naming that rank) and chooses
// (ChooseBatch); every rank returns rank 0's index, or its refusal (none fits every rank).
StatusOr<int> ChooseGroupBatch(DataParallel* dp, std::vector<BatchCandidate>* candidates);

}  // namespace offloadd::trainer
