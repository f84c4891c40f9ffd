#pragma once
// The rights a job's files are opened with. The allowed roots
// (common/safe_path.h) bound where a job may read and write; within them, a daemon running as root
// could still read any file there for any client (a hard link to another user's 0600 file was
// copied into a checkpoint). So when the daemon runs as root, every confined open, create, mkdir
// and rename of a job's files runs with the file-system credentials of the user the job belongs
// to: the Unix-socket client that submitted it (its SO_PEERCRED uid, with that user's primary and
// supplementary groups), or the user named on its TCP token's line (`user=<name>`). A user can
// then train on, and write, only what they could themselves; the kernel refuses the rest, hard
// links included.
//
// How: fsuid, fsgid and the supplementary groups are per-thread in the kernel, and the raw
// syscalls (unlike glibc's setgroups, which applies to every thread) switch only the calling
// thread. AsJobUser switches them for its lifetime around each confined operation and restores
// root's afterwards; the daemon's own files (state_dir, sockets, shared memory, store directories)
// are opened outside it, with the daemon's rights.
//
// Which identity: a process-wide one (the executor sets its job's once, at start), overridden on
// one thread by ScopedJobFileIdentity (the daemon validates each CreateJob as its client). None
// set, or a daemon not running as root: files are opened with the process's own rights.
//
// Thread-safe.

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd {

struct FileIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups
  std::string user;           // the user name, "" when the uid has no passwd entry
  // "user alice (uid 1000)" or "uid 4242": for messages.
  std::string Describe() const;
};

// The group a uid without a passwd entry gets (the kernel's overflow group, "nogroup").
inline constexpr gid_t kNoGroup = 65534;

// A local user's identity: the passwd entry's primary group and every group that lists the user
// (getgrouplist). A uid without an entry gets kNoGroup and no supplementary group.
FileIdentity IdentityOfUid(uid_t uid);
// NOT_FOUND for a name without a passwd entry.
StatusOr<FileIdentity> IdentityOfUser(const std::string& user);

// The identity of this process's job files (the executor's job); nullopt: the process's own.
void SetJobFileIdentity(std::optional<FileIdentity> identity);

// On this thread, for its lifetime, job files are opened as `identity` (nullopt: with the
// process's own rights) instead of the process-wide one. Not nestable across threads.
class ScopedJobFileIdentity {
 public:
  explicit ScopedJobFileIdentity(std::optional<FileIdentity> identity);
  ~ScopedJobFileIdentity();
  ScopedJobFileIdentity(const ScopedJobFileIdentity&) = delete;
  ScopedJobFileIdentity& operator=(const ScopedJobFileIdentity&) = delete;

 private:
  std::shared_ptr<const FileIdentity> saved_;
  bool saved_set_ = false;
};

// While alive, this thread's fsuid, fsgid and supplementary groups are the job file identity in
// force (see above), when one is set and the process runs as root; nestable on one thread (the
// outermost switches and restores). status() is not OK when the switch failed: the caller must
// then not touch the file.
class AsJobUser {
 public:
  AsJobUser();
  ~AsJobUser();
  AsJobUser(const AsJobUser&) = delete;
  AsJobUser& operator=(const AsJobUser&) = delete;
  const Status& status() const { return status_; }

 private:
  bool switched_ = false;
  std::vector<gid_t> saved_groups_;
  Status status_;
};

}  // namespace offloadd
