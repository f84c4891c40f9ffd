// The ranks' agreement on the automatic batch (group_batch.h).
#include "trainer/pipeline/group_batch.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace offloadd::trainer {

StatusOr<int> ChooseGroupBatch(DataParallel* dp, std::vector<BatchCandidate>* candidates) {
  // The same candidates on every rank (one configuration); each priced them on its own GPU, up
  // to the first that does not fit there: its largest fitting micro-batch says which fit.
  int fits = 0;
  for (const BatchCandidate& c : *candidates) {
    if (c.feasible) fits = std::max(fits, c.micro);
  }
  RETURN_IF_ERROR(dp->Set("auto_batch/fits/" + std::to_string(dp->rank()), std::to_string(fits)));
  const int count = static_cast<int>(candidates->size());
  if (dp->rank() > 0) {
    StatusOr<std::string> got = dp->Get("auto_batch/choice");
    RETURN_IF_ERROR(got.status());
    const std::string choice = *std::move(got);
    if (choice.rfind("refused:", 0) == 0) {
      return ResourceExhaustedError("rank 0 found " + choice.substr(sizeof("refused:") - 1));
    }
    const int i = std::atoi(choice.c_str());
    if (i < 0 || i >= count || !(*candidates)[i].feasible) {
      return InternalError("rank 0 chose candidate " + choice + " of " + std::to_string(count) +
                           ", which this rank did not find to fit");
    }
    return i;
  }
  for (int r = 1; r < dp->world(); ++r) {
    ASSIGN_OR_RETURN(const std::string v, dp->Get("auto_batch/fits/" + std::to_string(r)));
    const int other = std::atoi(v.c_str());
    for (BatchCandidate& c : *candidates) {
      if (!c.feasible || c.micro <= other) continue;
      c.feasible = false;
      c.why_not = "rank " + std::to_string(r) + "'s GPU fits " +
                  (other > 0 ? "micro-batch " + std::to_string(other) + " at most" : "none");
    }
  }
  StatusOr<int> chosen = ChooseBatch(*candidates);
  RETURN_IF_ERROR(dp->Set(
      "auto_batch/choice",
      chosen.ok() ? std::to_string(*chosen) : "refused:" + std::string(chosen.status().message())));
  return chosen;
}

}  // namespace offloadd::trainer
