#include "storage/store_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

namespace offloadd::storage {
namespace {

std::string Join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

}  // namespace

Status EnsureDirectory(const std::string& path, bool create) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      return FailedPreconditionError("store directory " + path + " is not a directory");
    return OkStatus();
  }
  if (!create) return NotFoundError("store directory " + path + " does not exist");
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return ErrnoError(ec.value(), "creating store directory " + path);
  return OkStatus();
}

StatusOr<int> LockDirectory(const std::string& path) {
  const std::string lock = Join(path, "LOCK");
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "opening " + lock);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return FailedPreconditionError("store directory " + path +
                                     " is in use by another offloadd-store process (" + lock +
                                     " is locked)");
    }
    return ErrnoError(err, "flock " + lock);
  }
  return fd;
}

Status SetupIdentities(const std::vector<std::string>& paths, bool create) {
  std::vector<std::optional<StoreIdentity>> ids(paths.size());
  std::vector<std::string> missing;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string file = Join(paths[i], kStoreFileName);
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno != ENOENT) return ErrnoError(errno, "opening " + file);
      missing.push_back(paths[i]);
      continue;
    }
    auto bytes = ReadWholeFile(fd, file);
    ::close(fd);
    if (!bytes.ok()) return bytes.status();
    auto id = DecodeIdentity(*bytes);
    if (!id.ok()) return id.status().WithContext(file);
    ids[i] = *id;
  }
  if (missing.size() == paths.size()) {
    if (!create) return NotFoundError("no store in " + paths[0] + " and create_if_missing is off");
    StoreIdentity id;
    if (::getrandom(id.uuid, sizeof id.uuid, 0) != sizeof id.uuid) {
      return ErrnoError(errno, "getrandom for the store uuid");
    }
    id.dir_count = static_cast<uint32_t>(paths.size());
    for (size_t i = 0; i < paths.size(); ++i) {
      id.dir_index = static_cast<uint32_t>(i);
      RETURN_IF_ERROR(ReplaceFileDurably(paths[i], kStoreFileName, EncodeIdentity(id)));
    }
    return OkStatus();
  }
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    return FailedPreconditionError(
        "store directories " + list +
        " have no STORE file but the others do: a directory of an "
        "existing store was replaced or is missing; refusing to continue");
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    const StoreIdentity& id = *ids[i];
    if (std::memcmp(id.uuid, ids[0]->uuid, sizeof id.uuid) != 0) {
      return FailedPreconditionError("store directory " + paths[i] +
                                     " belongs to a different store than " + paths[0]);
    }
    if (id.dir_index != i || id.dir_count != paths.size()) {
      return FailedPreconditionError("store directory " + paths[i] + " was created as directory " +
                                     std::to_string(id.dir_index) + " of " +
                                     std::to_string(id.dir_count) + " but is configured as " +
                                     std::to_string(i) + " of " + std::to_string(paths.size()) +
                                     "; list the directories in their original order");
    }
  }
  return OkStatus();
}

StatusOr<DataFile> OpenDataFile(const std::string& path, int want_direct) {
  const std::string file = Join(path, kDataFileName);
  DataFile out;
  if (want_direct != 0) {
    // Some filesystems accept O_DIRECT at open and refuse it at the first transfer, so probe with
    // an aligned write + read on a scratch file.
    const std::string probe = Join(path, ".direct_probe");
    int pfd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    int err = pfd < 0 ? errno : 0;
    if (pfd >= 0) {
      void* buf = std::aligned_alloc(kAlign, kAlign);
      std::memset(buf, 0x5a, kAlign);
      if (::pwrite(pfd, buf, kAlign, 0) != static_cast<ssize_t>(kAlign) ||
          ::pread(pfd, buf, kAlign, 0) != static_cast<ssize_t>(kAlign)) {
        err = errno != 0 ? errno : EIO;
      }
      std::free(buf);
      ::close(pfd);
    }
    ::unlink(probe.c_str());
    if (err == 0) {
      out.direct = true;
    } else if (want_direct == 2) {
      return FailedPreconditionError("store directory " + path + " refuses O_DIRECT (" +
                                     std::strerror(err) +
                                     "; tmpfs and some network filesystems do): use a directory "
                                     "on a local disk or set direct_io: auto");
    } else {
      out.note = std::string("O_DIRECT refused (") + std::strerror(err) +
                 "), using buffered I/O with fdatasync";
    }
  }
  const int flags = O_RDWR | O_CREAT | O_CLOEXEC | (out.direct ? O_DIRECT : 0);
  out.fd = ::open(file.c_str(), flags, 0644);
  if (out.fd < 0) return ErrnoError(errno, "opening " + file);
  struct stat st {};
  if (::fstat(out.fd, &st) != 0) {
    const int err = errno;
    ::close(out.fd);
    return ErrnoError(err, "fstat " + file);
  }
  out.size = static_cast<uint64_t>(st.st_size);
  return out;
}

Status WriteAll(int fd, const uint8_t* p, size_t n, const std::string& what) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, what);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

Status FsyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "opening directory " + dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError(err, "fsync of directory " + dir);
  return OkStatus();
}

Status ReplaceFileDurably(const std::string& dir, const std::string& name,
                          const std::vector<uint8_t>& bytes) {
  const std::string tmp = Join(dir, name + ".tmp");
  const std::string dst = Join(dir, name);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "creating " + tmp);
  Status st = WriteAll(fd, bytes.data(), bytes.size(), "writing " + tmp);
  if (st.ok() && ::fdatasync(fd) != 0) st = ErrnoError(errno, "fdatasync " + tmp);
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), dst.c_str()) != 0) st = ErrnoError(errno, "renaming " + tmp);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return FsyncDirectory(dir);
}

StatusOr<std::vector<uint8_t>> ReadWholeFile(int fd, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "fstat " + what);
  std::vector<uint8_t> out(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "reading " + what);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

}  // namespace offloadd::storage
