#include "common/file_identity.h"

#include <grp.h>
#include <pwd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

namespace offloadd {
namespace {

std::mutex g_mu;
std::shared_ptr<const FileIdentity> g_identity;  // process-wide; null: the process's own rights

thread_local bool t_override_set = false;
thread_local std::shared_ptr<const FileIdentity> t_override;
thread_local int t_depth = 0;  // AsJobUser nesting on this thread

std::shared_ptr<const FileIdentity> Current() {
  if (t_override_set) return t_override;
  std::lock_guard<std::mutex> lock(g_mu);
  return g_identity;
}

// The raw syscalls: per thread (glibc's setgroups changes every thread of the process).
long SetGroups(const std::vector<gid_t>& groups) {
  return ::syscall(SYS_setgroups, groups.size(), groups.empty() ? nullptr : groups.data());
}

std::vector<gid_t> GetGroups() {
  const long n = ::syscall(SYS_getgroups, 0, nullptr);
  std::vector<gid_t> out(n > 0 ? static_cast<size_t>(n) : 0);
  if (n > 0 && ::syscall(SYS_getgroups, n, out.data()) != n) out.clear();
  return out;
}

// setfsuid/setfsgid report no error; reading the value back (-1 changes nothing) tells.
bool SetFsUid(uid_t uid) {
  ::syscall(SYS_setfsuid, uid);
  return static_cast<uid_t>(::syscall(SYS_setfsuid, static_cast<uid_t>(-1))) == uid;
}

bool SetFsGid(gid_t gid) {
  ::syscall(SYS_setfsgid, gid);
  return static_cast<gid_t>(::syscall(SYS_setfsgid, static_cast<gid_t>(-1))) == gid;
}

FileIdentity FromPasswd(const passwd& pw) {
  FileIdentity id;
  id.uid = pw.pw_uid;
  id.gid = pw.pw_gid;
  id.user = pw.pw_name;
  int n = 32;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  while (::getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    groups.resize(static_cast<size_t>(n) + 16);
    n = static_cast<int>(groups.size());
  }
  groups.resize(static_cast<size_t>(n));
  id.groups = std::move(groups);
  return id;
}

}  // namespace

std::string FileIdentity::Describe() const {
  if (user.empty()) return "uid " + std::to_string(uid);
  return "user " + user + " (uid " + std::to_string(uid) + ")";
}

FileIdentity IdentityOfUid(uid_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    return FromPasswd(pw);
  }
  FileIdentity id;
  id.uid = uid;
  id.gid = kNoGroup;
  return id;
}

StatusOr<FileIdentity> IdentityOfUser(const std::string& user) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (::getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return NotFoundError("no local user '" + user + "'");
  }
  return FromPasswd(pw);
}

void SetJobFileIdentity(std::optional<FileIdentity> identity) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_identity = identity ? std::make_shared<const FileIdentity>(std::move(*identity)) : nullptr;
}

ScopedJobFileIdentity::ScopedJobFileIdentity(std::optional<FileIdentity> identity)
    : saved_(t_override), saved_set_(t_override_set) {
  t_override_set = true;
  t_override = identity ? std::make_shared<const FileIdentity>(std::move(*identity)) : nullptr;
}

ScopedJobFileIdentity::~ScopedJobFileIdentity() {
  t_override = std::move(saved_);
  t_override_set = saved_set_;
}

AsJobUser::AsJobUser() {
  if (t_depth++ > 0) return;  // an outer AsJobUser on this thread has switched already
  const std::shared_ptr<const FileIdentity> id = Current();
  if (id == nullptr || ::geteuid() != 0 || id->uid == 0) return;
  saved_groups_ = GetGroups();
  if (SetGroups(id->groups) != 0) {
    status_ =
        ErrnoError(errno, "taking the groups of " + id->Describe() + " to open its job's files");
    return;
  }
  if (!SetFsGid(id->gid) || !SetFsUid(id->uid)) {
    SetFsGid(::getegid());
    SetGroups(saved_groups_);
    status_ = PermissionDeniedError("cannot take the file-system identity of " + id->Describe() +
                                    " to open its job's files");
    return;
  }
  switched_ = true;
}

AsJobUser::~AsJobUser() {
  --t_depth;
  if (!switched_) return;
  SetFsUid(::geteuid());
  SetFsGid(::getegid());
  SetGroups(saved_groups_);
}

}  // namespace offloadd
