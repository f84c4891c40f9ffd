#pragma once
// Which files a job may touch: every model, tokenizer, dataset and output path must resolve,
// after following symlinks, to a location under one of the configured allowed roots. This is what
// stops a client that can reach the socket from reading /etc/shadow as a "dataset" or writing a
// "model" over system files. This check runs once, at CreateJob; what a path points to can change
// after it (a symlink planted in a model or output directory, an output directory swapped while
// the job is queued), so the daemon also confines every open and create at use time to the same
// roots (common/safe_path.h, SetAllowedRoots at startup). Thread-safe (stateless after
// construction).

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/file_identity.h"
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

// The files of a model (or tokenizer) directory that a job will open, other than those CreateJob
// parses anyway: config.json, generation_config.json, the tokenizer files, special_tokens_map.json,
// chat_template.jinja, model.safetensors or model.safetensors.index.json and every shard the index
// names. Each one present is opened as the job will open it (common/safe_path.h: under the allowed
// roots, with the rights of the job's user when set, never blocking) and must be a regular file:
// a FIFO there would hang the job at its first checkpoint, a symlink out of the roots would copy
// an outside file into it. Returns one problem per file, each naming it.
std::vector<std::string> ModelFileProblems(const std::string& dir);

// Whose rights a job's files are opened with (common/file_identity.h), from the
// client that submits it (Job.submitted_by): "unix:uid=<n>" is that local user; "token:<name>" is
// the user its token file line names (`token_users`: client name -> user=, or the `token_user` of
// the call at CreateJob); any other client, a token line without user=, or a daemon not running as
// root: nullopt, the daemon's own rights. NOT_FOUND when a token's user= names no local user.
StatusOr<std::optional<FileIdentity>> SubmitterFileIdentity(
    const std::string& submitted_by, const std::map<std::string, std::string>& token_users);

}  // namespace offloadd::daemon
