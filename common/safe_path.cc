#include "common/safe_path.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <random>

#include "common/file_identity.h"

namespace offloadd {
namespace {

std::mutex g_mu;
std::vector<std::string> g_roots;              // canonical, no trailing '/'
std::function<void(int)> g_fsync_observer;     // tests only
std::atomic<bool> g_no_openat2{false};         // the kernel said ENOSYS once

bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

std::vector<std::string> Components(std::string_view rel) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < rel.size()) {
    size_t next = rel.find('/', pos);
    if (next == std::string_view::npos) next = rel.size();
    if (next > pos) out.emplace_back(rel.substr(pos, next - pos));
    pos = next + 1;
  }
  return out;
}

std::string RootList(const std::vector<std::string>& roots) {
  std::string list;
  for (const auto& r : roots) list += (list.empty() ? "" : ", ") + r;
  return "[" + list + "]";
}

// Where a confined path starts: the root it lies under and the rest, relative to it.
struct Anchor {
  std::string root;
  std::string rel;  // "" for the root itself
};

StatusOr<Anchor> FindAnchor(const std::string& path, const std::vector<std::string>& roots) {
  if (path.empty() || path[0] != '/') {
    return InvalidArgumentError("'" + path + "' must be an absolute path");
  }
  for (const std::string& c : Components(path)) {
    if (c == "." || c == "..") {
      return InvalidArgumentError("'" + path + "' must not contain '.' or '..' components");
    }
  }
  const std::string* best = nullptr;
  for (const std::string& r : roots) {
    if (IsUnder(path, r) && (best == nullptr || r.size() > best->size())) best = &r;
  }
  if (best == nullptr) {
    return PermissionDeniedError("'" + path + "' is outside the allowed roots " + RootList(roots));
  }
  std::string rel = *best == "/" ? path.substr(1) : path.substr(best->size());
  while (!rel.empty() && rel[0] == '/') rel.erase(0, 1);
  return Anchor{*best, rel};
}

Status OpenError(int err, const std::string& path, const Anchor& a, Access access) {
  if (err == EXDEV) {
    return PermissionDeniedError("'" + path + "' leads outside the allowed root " + a.root +
                                 " (through a symbolic link); refused");
  }
  if (err == ELOOP) {
    return PermissionDeniedError(
        "'" + path + "' goes through a symbolic link, refused under the allowed root " + a.root +
        (access == Access::kWrite ? " (files are written only through real directories)" : ""));
  }
  return ErrnoError(err, "open " + path);
}

// The fallback for kernels without openat2: one component at a time, never following a symlink.
int WalkNoFollow(int dirfd, const std::vector<std::string>& parts, int flags, mode_t mode) {
  OwnedFd cur;
  int at = dirfd;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int fd = ::openat(at, parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    cur.reset(fd);
    at = fd;
  }
  const char* last = parts.empty() ? "." : parts.back().c_str();
  return ::openat(at, last, flags | O_NOFOLLOW | O_CLOEXEC, mode);
}

int OpenBeneath(int rootfd, const std::string& rel, int flags, mode_t mode, Access access) {
  if (!g_no_openat2.load(std::memory_order_relaxed)) {
    open_how how{};
    how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    if (access == Access::kWrite) how.resolve |= RESOLVE_NO_SYMLINKS;
    const char* p = rel.empty() ? "." : rel.c_str();
    while (true) {
      const long fd = ::syscall(SYS_openat2, rootfd, p, &how, sizeof(how));
      if (fd >= 0) return static_cast<int>(fd);
      if (errno == EAGAIN || errno == EINTR) continue;  // a concurrent rename; try again
      if (errno != ENOSYS) return -1;
      g_no_openat2.store(true, std::memory_order_relaxed);
      break;
    }
  }
  return WalkNoFollow(rootfd, Components(rel), flags, mode);
}

}  // namespace

OwnedFd& OwnedFd::operator=(OwnedFd&& other) noexcept {
  if (this != &other) reset(std::exchange(other.fd_, -1));
  return *this;
}

void OwnedFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void SetAllowedRoots(const std::vector<std::string>& roots) {
  std::vector<std::string> canonical;
  for (const std::string& r : roots) {
    char buf[PATH_MAX];
    std::string root = ::realpath(r.c_str(), buf) != nullptr ? std::string(buf) : r;
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    canonical.push_back(root);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  g_roots = std::move(canonical);
}

std::vector<std::string> AllowedRoots() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_roots;
}

namespace {

const char* FileKind(mode_t m) {
  if (S_ISFIFO(m)) return " (a FIFO)";
  if (S_ISCHR(m)) return " (a character device)";
  if (S_ISBLK(m)) return " (a block device)";
  if (S_ISSOCK(m)) return " (a socket)";
  if (S_ISDIR(m)) return " (a directory)";
  return "";
}

Status NotRegular(const std::string& path, mode_t m) {
  return FailedPreconditionError("'" + path + "' is not a regular file" + FileKind(m) +
                                 "; a job reads and writes only regular files");
}

// The open itself never blocks (O_NONBLOCK: a FIFO would wait for a writer forever), and only a
// regular file is kept; then the caller's blocking mode is restored.
StatusOr<OwnedFd> KeepRegular(OwnedFd fd, const std::string& path, int flags) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode);
  if (!(flags & O_NONBLOCK)) {
    const int fl = ::fcntl(fd.get(), F_GETFL);
    if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0) {
      return ErrnoError(errno, "fcntl " + path);
    }
  }
  return fd;
}

}  // namespace

StatusOr<OwnedFd> OpenConfined(const std::string& path, int flags, Access access, mode_t mode) {
  AsJobUser as_user;  // with the rights of the job's user (common/file_identity.h)
  RETURN_IF_ERROR(as_user.status());
  const bool file = !(flags & (O_DIRECTORY | O_PATH));
  const int open_flags = file ? flags | O_NONBLOCK : flags;
  const std::vector<std::string> roots = AllowedRoots();
  int fd = -1;
  if (roots.empty()) {
    fd = ::open(path.c_str(), open_flags | O_CLOEXEC, mode);
    if (fd < 0 && errno == ENXIO)
      return FailedPreconditionError("'" + path + "' is not a regular file");
    if (fd < 0) return ErrnoError(errno, "open " + path);
  } else {
    ASSIGN_OR_RETURN(Anchor a, FindAnchor(path, roots));
    OwnedFd root(::open(a.root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid()) return ErrnoError(errno, "open allowed root " + a.root);
    fd = OpenBeneath(root.get(), a.rel, open_flags, mode, access);
    // ENXIO: a FIFO opened for writing without a reader.
    if (fd < 0 && errno == ENXIO)
      return FailedPreconditionError("'" + path + "' is not a regular file");
    if (fd < 0) return OpenError(errno, path, a, access);
  }
  if (!file) return OwnedFd(fd);
  return KeepRegular(OwnedFd(fd), path, flags);
}

StatusOr<OwnedFd> MakeDirsConfined(const std::string& path) {
  AsJobUser as_user;
  RETURN_IF_ERROR(as_user.status());
  const std::vector<std::string> roots = AllowedRoots();
  OwnedFd cur;
  std::vector<std::string> parts;
  std::string shown;  // the part walked so far, for messages
  int nofollow = 0;
  if (roots.empty()) {
    shown = path.empty() || path[0] != '/' ? "." : "";
    cur.reset(::open(path.empty() || path[0] != '/' ? "." : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    parts = Components(path);
  } else {
    ASSIGN_OR_RETURN(Anchor a, FindAnchor(path, roots));
    shown = a.root == "/" ? "" : a.root;
    cur.reset(::open(a.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    parts = Components(a.rel);
    nofollow = O_NOFOLLOW;
  }
  if (!cur.valid()) return ErrnoError(errno, "open " + (shown.empty() ? "/" : shown));
  for (const std::string& part : parts) {
    shown += "/" + part;
    const bool created = ::mkdirat(cur.get(), part.c_str(), 0755) == 0;
    if (!created && errno != EEXIST) return ErrnoError(errno, "mkdir " + shown);
    const int fd = ::openat(cur.get(), part.c_str(), O_RDONLY | O_DIRECTORY | nofollow | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      struct stat st {};
      if (nofollow && ::fstatat(cur.get(), part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(st.st_mode)) {
        return PermissionDeniedError("'" + shown + "' is a symbolic link; output directories "
                                     "under the allowed roots must be real directories");
      }
      if (err == ENOTDIR) return FailedPreconditionError("'" + shown + "' is not a directory");
      return ErrnoError(err, "open " + shown);
    }
    if (created) RETURN_IF_ERROR(FsyncFd(cur.get(), shown + "/.."));
    cur.reset(fd);
  }
  return cur;
}

Status FsyncFd(int fd, const std::string& what) {
  std::function<void(int)> observer;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    observer = g_fsync_observer;
  }
  if (observer) observer(fd);
  if (::fsync(fd) != 0) return ErrnoError(errno, "fsync " + what);
  return OkStatus();
}

Status FsyncDir(const std::string& dir) {
  ASSIGN_OR_RETURN(OwnedFd fd, OpenConfined(dir, O_RDONLY | O_DIRECTORY, Access::kWrite));
  return FsyncFd(fd.get(), dir);
}

Status WriteAll(int fd, const void* data, size_t size, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write " + what);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

Status WriteFileAtomically(const std::string& path, const std::function<Status(int fd)>& fill) {
  AsJobUser as_user;  // the temporary file, the rename and the unlink on failure
  RETURN_IF_ERROR(as_user.status());
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") {
    return InvalidArgumentError("'" + path + "' does not name a file");
  }
  ASSIGN_OR_RETURN(OwnedFd dirfd, OpenConfined(dir, O_RDONLY | O_DIRECTORY, Access::kWrite));
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string tmp;
  OwnedFd fd;
  for (int attempt = 0; attempt < 100 && !fd.valid(); ++attempt) {
    char suffix[24];
    std::snprintf(suffix, sizeof(suffix), ".tmp-%012llx",
                  static_cast<unsigned long long>(rng() & 0xffffffffffffull));
    tmp = "." + name + suffix;
    fd.reset(::openat(dirfd.get(), tmp.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd.valid() && errno != EEXIST) return ErrnoError(errno, "create " + dir + "/" + tmp);
  }
  if (!fd.valid()) return AlreadyExistsError("create a temporary file for " + path);
  const std::string tmp_path = dir + "/" + tmp;
  Status st = fill(fd.get());
  if (st.ok()) st = FsyncFd(fd.get(), tmp_path);
  if (st.ok() && ::close(fd.release()) != 0) st = ErrnoError(errno, "close " + tmp_path);
  // renameat replaces whatever is at `name` (a symlink included) without following it.
  if (st.ok() && ::renameat(dirfd.get(), tmp.c_str(), dirfd.get(), name.c_str()) != 0) {
    st = ErrnoError(errno, "rename " + tmp_path + " -> " + path);
  }
  if (!st.ok()) {
    ::unlinkat(dirfd.get(), tmp.c_str(), 0);
    return st;
  }
  return FsyncFd(dirfd.get(), dir);
}

Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  return WriteFileAtomically(
      path, [&](int fd) { return WriteAll(fd, contents.data(), contents.size(), path); });
}

StatusOr<std::string> ReadFileConfined(const std::string& path) {
  ASSIGN_OR_RETURN(OwnedFd fd, OpenConfined(path, O_RDONLY | O_NONBLOCK, Access::kRead));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode);
  std::string data;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read " + path);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  return data;
}

Status CopyFileConfined(const std::string& from, const std::string& to) {
  ASSIGN_OR_RETURN(std::string data, ReadFileConfined(from));
  return WriteFileAtomically(to, data);
}

void SetFsyncObserverForTesting(std::function<void(int fd)> observer) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_fsync_observer = std::move(observer);
}

}  // namespace offloadd
