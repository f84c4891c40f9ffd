#include "daemon/server/unix_peer_listener.h"

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

#include "common/logging.h"
#include "daemon/server/client_quota.h"
#include "ipc/event_fd.h"

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
  ASSIGN_OR_RETURN(ipc::UniqueFd wake, ipc::MakeEventFd());
  return std::unique_ptr<UnixPeerListener>(new UnixPeerListener(std::move(fd), std::move(wake), std::move(peers)));
}

UnixPeerListener::~UnixPeerListener() { Stop(); }

void UnixPeerListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixPeerListener::Stop() {
  if (!thread_.joinable()) return;
  ipc::SignalEventFd(wake_fd_.get());
  thread_.join();
  listen_fd_.reset();
}

void UnixPeerListener::AcceptLoop(grpc::Server* server) {
  std::chrono::steady_clock::time_point last_report{};
  int64_t failed_accepts = 0;
  for (;;) {
    // Stop() signals wake_fd_, which ends the wait with UNAVAILABLE.
    if (Status s = ipc::WaitReadable(listen_fd_.get(), wake_fd_.get(), -1); !s.ok()) {
      if (s.code() != StatusCode::kUnavailable) OFFLOADD_LOG(kError, kLog) << "Unix socket accept loop: " << s.ToString();
      return;
    }
    const int conn = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      // Out of fds (EMFILE, ENFILE) or memory: the pending connection waits in the backlog; retry
      // shortly rather than spin (or stop, if asked meanwhile). Connections already served are
      // unaffected.
      // Logged at most every 10 s while it lasts, with the count: not 10 lines a second.
      const int err = errno;
      ++failed_accepts;
      if (const auto now = std::chrono::steady_clock::now(); now - last_report >= std::chrono::seconds(10)) {
        OFFLOADD_LOG(kWarning, kLog) << "Unix socket: accept: " << std::strerror(err) << " (" << failed_accepts
                                     << " failed accept(s) since the last report); retrying every 100 ms";
        last_report = now;
        failed_accepts = 0;
      }
      if (ipc::WaitReadable(wake_fd_.get(), -1, 100).ok()) return;
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
