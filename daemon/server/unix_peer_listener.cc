#include "daemon/server/unix_peer_listener.h"

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

#include "common/logging.h"
#include "daemon/server/client_quota.h"

namespace offloadd::daemon {
namespace {
constexpr const char* kLog = "server";
}  // namespace

void PeerCredentials::Set(int fd, PeerCred cred) {
  std::lock_guard<std::mutex> lock(mu_);
  by_fd_[fd] = cred;
}

std::optional<PeerCred> PeerCredentials::Lookup(std::string_view peer) const {
  if (peer.rfind("fd:", 0) != 0) return std::nullopt;
  const std::string_view digits = peer.substr(3);
  int fd = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), fd);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

std::string PeerCredentials::ClientFor(std::string_view peer) const {
  if (auto cred = Lookup(peer)) return "unix:uid=" + std::to_string(cred->uid);
  return ClientKey(peer);
}

StatusOr<std::unique_ptr<UnixPeerListener>> UnixPeerListener::Bind(const std::string& bind_path,
                                                                   std::shared_ptr<PeerCredentials> peers) {
  sockaddr_un addr{};
  if (bind_path.size() >= sizeof addr.sun_path) {
    return InvalidArgumentError("Unix socket path " + bind_path + " is longer than the 107 bytes a socket allows");
  }
  ipc::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoError(errno, "socket(AF_UNIX)");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, bind_path.data(), bind_path.size());
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoError(errno, "cannot bind Unix socket " + bind_path);
  }
  if (listen(fd.get(), SOMAXCONN) != 0) return ErrnoError(errno, "listen on " + bind_path);
  ipc::UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return ErrnoError(errno, "eventfd");
  return std::unique_ptr<UnixPeerListener>(new UnixPeerListener(std::move(fd), std::move(wake), std::move(peers)));
}

UnixPeerListener::~UnixPeerListener() { Stop(); }

void UnixPeerListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixPeerListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  if (write(wake_fd_.get(), &one, sizeof one) < 0) {
    OFFLOADD_LOG(kError, kLog) << "cannot wake the Unix socket's accept loop: " << std::strerror(errno);
  }
  thread_.join();
  listen_fd_.reset();
}

void UnixPeerListener::AcceptLoop(grpc::Server* server) {
  pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      OFFLOADD_LOG(kError, kLog) << "Unix socket accept loop: poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      // Out of fds (EMFILE, ENFILE) or memory: the pending connection waits in the backlog; retry
      // shortly rather than spin. Connections already served are unaffected.
      OFFLOADD_LOG(kWarning, kLog) << "Unix socket: accept: " << std::strerror(errno) << "; retrying in 100 ms";
      if (poll(&fds[1], 1, 100) > 0) return;
      continue;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      OFFLOADD_LOG(kWarning, kLog) << "Unix socket: SO_PEERCRED: " << std::strerror(errno) << "; connection closed";
      close(conn);
      continue;
    }
    peers_->Set(conn, PeerCred{cred.pid, cred.uid, cred.gid});
    accepted_.fetch_add(1);
    grpc::AddInsecureChannelFromFd(server, conn);  // the server owns the fd from here
  }
}

}  // namespace offloadd::daemon
