#include "ipc/fd_passing.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace offloadd::ipc {

StatusOr<SocketPair> MakeSocketPair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoError(errno, "socketpair(AF_UNIX, SOCK_SEQPACKET)");
  }
  return SocketPair{UniqueFd(sv[0]), UniqueFd(sv[1])};
}

Status SendFds(int socket_fd, std::span<const int> fds, std::span<const uint8_t> payload) {
  if (fds.size() > kMaxPassedFds) {
    return InvalidArgumentError("SendFds: " + std::to_string(fds.size()) + " fds, at most " +
                                std::to_string(kMaxPassedFds));
  }
  if (payload.empty()) return InvalidArgumentError("SendFds: payload must not be empty");
  iovec iov{const_cast<uint8_t*>(payload.data()), payload.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoError(errno, "sendmsg(SCM_RIGHTS)");
  if (static_cast<size_t>(n) != payload.size()) return DataLossError("sendmsg: short write");
  return OkStatus();
}

StatusOr<ReceivedFds> RecvFds(int socket_fd, size_t max_fds, size_t max_payload) {
  ReceivedFds out;
  out.payload.resize(max_payload == 0 ? 1 : max_payload);
  iovec iov{out.payload.data(), out.payload.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoError(errno, "recvmsg(SCM_RIGHTS)");
  // Take ownership of whatever arrived first, so every error path below closes them.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if (n == 0) return UnavailableError("peer closed the control socket");
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    return DataLossError("control message truncated (payload over " + std::to_string(max_payload) +
                         " bytes or more than " + std::to_string(kMaxPassedFds) + " fds)");
  }
  if (out.fds.size() > max_fds) {
    return InvalidArgumentError("received " + std::to_string(out.fds.size()) +
                                " fds, expected at most " + std::to_string(max_fds));
  }
  out.payload.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace offloadd::ipc
