#include "daemon/server/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/file.h"

namespace offloadd::daemon {

Status PrepareUnixSocketPath(const std::string& path, const std::string& setting) {
  // POSIX, not std::filesystem: the daemon links LibTorch (docs/DEVELOPING.md, hazards).
  const size_t slash = path.rfind('/');
  const std::string parent = slash == std::string::npos ? "" : path.substr(0, slash);
  if (!parent.empty()) {
    if (Status s = MakeDirs(parent); !s.ok())
      return s.WithContext("cannot create socket directory " + parent);
  }
  struct stat st{};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoError(errno, "cannot stat socket path " + path);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return FailedPreconditionError(setting + " " + path +
                                   " exists and is not a socket; refusing to replace it");
  }
  // Is anyone listening? A successful connect means another daemon owns it.
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError(errno, "socket(AF_UNIX)");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int err = errno;
  close(fd);
  if (rc == 0) {
    return FailedPreconditionError("another process is already serving on " + path +
                                   " (is offloadd already running? `systemctl status offloadd`)");
  }
  if (err != ECONNREFUSED && err != ENOENT) return ErrnoError(err, "cannot probe socket " + path);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError(errno, "cannot remove stale socket " + path);
  return OkStatus();
}

StatusOr<std::unique_ptr<PrivateSocketBinding>> PrivateSocketBinding::Create(
    const std::string& final_path, const std::string& setting) {
  const size_t slash = final_path.rfind('/');
  std::string tmpl = (slash == std::string::npos ? "." : final_path.substr(0, slash)) + "/.offloadd-XXXXXX";
  auto b = std::make_unique<PrivateSocketBinding>();
  b->final_path_ = final_path;
  if (mkdtemp(tmpl.data()) == nullptr) return ErrnoError(errno, "cannot create a directory beside " + final_path);
  b->dir_ = tmpl;  // mkdtemp makes it 0700
  b->bind_path_ = b->dir_ + "/s";
  if (b->bind_path_.size() > sizeof(sockaddr_un{}.sun_path) - 1) {
    return InvalidArgumentError(
        setting + " " + final_path + ": the directory's path is too long to bind in (" +
        std::to_string(b->bind_path_.size()) + " bytes; Unix sockets allow 107)");
  }
  return b;
}

PrivateSocketBinding::~PrivateSocketBinding() {
  if (dir_.empty()) return;
  unlink(bind_path_.c_str());
  rmdir(dir_.c_str());
}

Status PrivateSocketBinding::Publish(unsigned mode) {
  RETURN_IF_ERROR(SetSocketMode(bind_path_, mode));
  if (rename(bind_path_.c_str(), final_path_.c_str()) != 0) {
    return ErrnoError(errno, "cannot move the socket to " + final_path_);
  }
  rmdir(dir_.c_str());
  dir_.clear();
  return OkStatus();
}

Status SetSocketMode(const std::string& path, unsigned mode) {
  if (chmod(path.c_str(), mode) != 0) return ErrnoError(errno, "chmod " + path);
  return OkStatus();
}

}  // namespace offloadd::daemon
