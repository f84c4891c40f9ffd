#include "trainer/export_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/file.h"
#include "common/logging.h"

namespace offloadd::trainer {

bool IsExportTemporaryName(std::string_view name) {
  constexpr std::string_view kTmp = ".tmp-";
  constexpr size_t kHex = 12;
  if (name.size() < 1 + 1 + kTmp.size() + kHex || name.front() != '.') return false;
  const size_t tmp_at = name.size() - kHex - kTmp.size();
  if (name.substr(tmp_at, kTmp.size()) != kTmp) return false;
  for (char c : name.substr(name.size() - kHex)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

StatusOr<ExportLock> ExportLock::Acquire(const std::string& output_dir) {
  ASSIGN_OR_RETURN(OwnedFd fd, MakeDirsConfined(output_dir));
  while (::flock(fd.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return ErrnoError(errno, "flock " + output_dir);
  }
  return ExportLock(std::move(fd));
}

StatusOr<std::vector<std::string>> RemoveExportTemporaries(const std::string& output_dir) {
  std::vector<std::string> removed;
  if (!PathExists(output_dir)) return removed;
  ASSIGN_OR_RETURN(OwnedFd dir, OpenConfined(output_dir, O_RDONLY | O_DIRECTORY, Access::kWrite));
  if (::flock(dir.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return removed;  // an export is writing them
    return ErrnoError(errno, "flock " + output_dir);
  }
  // readdir on a second descriptor: closedir closes it, `dir` keeps the lock and the unlinks.
  const int list_fd = ::dup(dir.get());
  if (list_fd < 0) return ErrnoError(errno, "dup " + output_dir);
  DIR* d = ::fdopendir(list_fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(list_fd);
    return ErrnoError(err, "opendir " + output_dir);
  }
  Status status;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!IsExportTemporaryName(name)) continue;
    struct stat st {};
    if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      continue;
    const std::string path = JoinPath(output_dir, name);
    if (::unlinkat(dir.get(), name.c_str(), 0) != 0) {
      if (errno != ENOENT && status.ok()) status = ErrnoError(errno, "remove " + path);
      continue;
    }
    OFFLOADD_LOG(kInfo, "checkpoint")
        << "removed " << path << " (" << st.st_size << " bytes), left by an interrupted export";
    removed.push_back(path);
  }
  ::closedir(d);
  if (!status.ok()) return status;
  return removed;
}

}  // namespace offloadd::trainer
