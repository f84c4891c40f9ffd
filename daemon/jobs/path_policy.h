#pragma once
// Which files a job may touch: every model, tokenizer, dataset and output path must resolve,
// after following symlinks, to a location under one of the configured allowed roots. This is what
// stops a client that can reach the socket from reading /etc/shadow as a "dataset" or writing a
// "model" over system files. This check runs once, at CreateJob; what a path points to can change
// after it (a symlink planted in a model or output directory, an output directory swapped while
// the job is queued), so the daemon also confines every open and create at use time to the same
// roots (common/safe_path.h, SetAllowedRoots at startup). Thread-safe (stateless after
// construction).

#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::daemon {

class PathPolicy {
 public:
  // Roots are canonicalised once; roots that do not exist are kept literally (nothing can
  // resolve under them until they are created).
  explicit PathPolicy(const std::vector<std::string>& allowed_roots);

  // An existing path: returns its canonical form if it lies under a root.
  // NOT_FOUND if it does not exist, PERMISSION_DENIED if outside every root.
  StatusOr<std::string> ResolveExisting(const std::string& path) const;

  // A path that may not exist yet (an output directory): its deepest existing ancestor is
  // canonicalised and the remaining components appended; the result must lie under a root and
  // contain no ".." after the existing part.
  StatusOr<std::string> ResolveForWriting(const std::string& path) const;

  const std::vector<std::string>& roots() const { return roots_; }

 private:
  Status CheckUnderRoot(const std::string& canonical, const std::string& original) const;

  std::vector<std::string> roots_;
};

}  // namespace offloadd::daemon
