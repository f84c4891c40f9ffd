#pragma once
// Passing file descriptors (shared segment, eventfds) between processes over a Unix socket with
// SCM_RIGHTS, together with a small payload (e.g. a serialized hello message).
//
//   int sv[2]; socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);   // or MakeSocketPair()
//   parent: SendFds(sv[0], {seg.fd(), ready.get(), space.get()}, payload_bytes);
//   child:  ASSIGN_OR_RETURN(ReceivedFds got, RecvFds(sv[1], /*max_fds=*/8, /*max_payload=*/4096));
//
// Thread-compatible free functions. Use SOCK_SEQPACKET so one Send matches one Recv.

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "ipc/unique_fd.h"

namespace offloadd::ipc {

inline constexpr size_t kMaxPassedFds = 16;

struct SocketPair {
  UniqueFd first;
  UniqueFd second;
};
// AF_UNIX SOCK_SEQPACKET pair, close-on-exec.
StatusOr<SocketPair> MakeSocketPair();

// Sends `payload` (non-empty) and `fds` (at most kMaxPassedFds) in one message.
Status SendFds(int socket_fd, std::span<const int> fds, std::span<const uint8_t> payload);

struct ReceivedFds {
  std::vector<UniqueFd> fds;  // close-on-exec, owned by the caller
  std::vector<uint8_t> payload;
};
// Receives one message. UNAVAILABLE when the peer closed the socket, DATA_LOSS when the payload
// or the fd list was truncated (the fds that did arrive are closed), INVALID_ARGUMENT when more
// than `max_fds` arrived.
StatusOr<ReceivedFds> RecvFds(int socket_fd, size_t max_fds, size_t max_payload);

}  // namespace offloadd::ipc
