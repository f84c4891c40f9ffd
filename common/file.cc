#include "common/file.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/safe_path.h"

namespace offloadd {

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

Status MakeDirs(const std::string& path) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      return ErrnoError(errno, "mkdir " + cur);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(path + " is not a directory");
  }
  return OkStatus();
}

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

StatusOr<std::string> ReadFile(const std::string& path) { return ReadFileConfined(path); }

Status WriteFile(const std::string& path, std::string_view contents) {
  return WriteFileAtomically(path, contents);
}

Status CopyFile(const std::string& from, const std::string& to) {
  return CopyFileConfined(from, to);
}

Status RemoveTree(const std::string& path) {
  if (!PathExists(path)) return OkStatus();
  auto rm = [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); };
  if (::nftw(path.c_str(), rm, 16, FTW_DEPTH | FTW_PHYS) != 0)
    return ErrnoError(errno, "remove " + path);
  return OkStatus();
}

}  // namespace offloadd
