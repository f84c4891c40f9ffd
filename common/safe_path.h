#pragma once
// Opening and creating files under a job's paths without leaving the allowed roots, and writing
// files durably.
//
// Validation (job/path_policy.h) checks a job's top-level paths once, at CreateJob. That
// is not enough: a symlink inside a model directory, a symlink planted in an output directory, or
// an output directory replaced by a symlink while the job is queued all lead elsewhere at use
// time. So every open and create under a job's paths goes through this file, which resolves the
// path again at each use, in the kernel, relative to a descriptor of the root:
//   * reads: openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) from the root. Relative symlinks
//     that stay under the root still work (a Hugging Face cache snapshot's links into blobs/);
//     anything that leads out of it, absolute symlinks included, is refused.
//   * writes (files created, directories made or written into): RESOLVE_NO_SYMLINKS as well. The
//     daemon never needs a symlink to write its output, and one planted there is an attack.
// Kernels without openat2 (< 5.6) fall back to a component walk with O_NOFOLLOW, which refuses
// every symlink.
//
// Every file opened here is a regular file: the open itself never blocks
// (O_NONBLOCK, so a FIFO cannot wait for a writer forever), then fstat refuses anything else
// before the caller's blocking mode is restored. And every open, create, mkdir and rename here runs
// with the rights of the job's user when the daemon runs as root (common/file_identity.h).
// Every open of a job's file goes through this file; tests/python/
// test_job_file_opens.py fails CI on any other.
//
// The roots are process-wide: the daemon sets its allowed_roots once at startup. With no roots set
// (offloadd-train, tests, tools) the functions open paths as given, following symlinks, so that an
// operator's own command line works as before; the durable-write helpers still never follow a
// symlink at the file they replace.
//
// Thread-safe: the roots are read under a lock; everything else is per call.

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace offloadd {

// Owns one file descriptor and closes it on destruction. Move-only.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept;
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Confines every later call of this file to the given roots (canonicalised with realpath; a root
// that does not exist is kept literally). An empty list lifts the confinement.
void SetAllowedRoots(const std::vector<std::string>& roots);
std::vector<std::string> AllowedRoots();

enum class Access { kRead, kWrite };

// open(path, flags, mode), confined as described above; O_CLOEXEC is always added. Errors name
// the path: PERMISSION_DENIED for a path outside the roots or a refused symlink, INVALID_ARGUMENT
// for a relative path or one with "." or ".." components (confined mode only),
// FAILED_PRECONDITION for anything but a regular file (unless O_DIRECTORY or O_PATH is asked
// for), else the errno.
StatusOr<OwnedFd> OpenConfined(const std::string& path, int flags, Access access, mode_t mode = 0);

// mkdir -p of `path` (mode 0755), confined for writing; returns the directory opened O_RDONLY.
// Directories it creates are fsync'd into their parents.
StatusOr<OwnedFd> MakeDirsConfined(const std::string& path);

// fsync(fd); `what` names the file in the error. Every fsync of this file goes through it.
Status FsyncFd(int fd, const std::string& what);
// Opens the directory (confined, for writing) and fsyncs it.
Status FsyncDir(const std::string& dir);

// write(2) until done, retrying EINTR and short writes.
Status WriteAll(int fd, const void* data, size_t size, const std::string& what);

// Writes `path` atomically and durably: `fill` writes the contents to a new hidden temporary file
// in the same directory (created O_EXCL | O_NOFOLLOW), which is fsync'd and renamed over `path`,
// and the directory is fsync'd. A symlink at `path` is replaced, never followed. The temporary file
// is removed on failure; an existing `path` stays as it was.
Status WriteFileAtomically(const std::string& path, const std::function<Status(int fd)>& fill);
Status WriteFileAtomically(const std::string& path, std::string_view contents);

// Reads a regular file (confined for reading). FAILED_PRECONDITION for a FIFO, device or directory.
StatusOr<std::string> ReadFileConfined(const std::string& path);

// Copies a regular file: ReadFileConfined(from), then WriteFileAtomically(to).
Status CopyFileConfined(const std::string& from, const std::string& to);

// Test seam: called with each descriptor just before FsyncFd fsyncs it; nullptr removes it.
void SetFsyncObserverForTesting(std::function<void(int fd)> observer);

}  // namespace offloadd
