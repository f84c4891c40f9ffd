#include "ipc/message_channel.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace offloadd::ipc {
namespace {

// recv of one datagram into `buf`; its length, or the error. EINTR is retried.
StatusOr<size_t> RecvDatagram(int fd, uint8_t* buf, size_t size, bool* truncated) {
  iovec iov{buf, size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == ECONNRESET) return UnavailableError("peer reset the connection");
    return ErrnoError(errno, "recvmsg");
  }
  *truncated = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  return static_cast<size_t>(n);
}

}  // namespace

Status SendMessage(int fd, std::span<const uint8_t> bytes) {
  if (bytes.size() > kMaxMessageBytes) {
    return InvalidArgumentError("message of " + std::to_string(bytes.size()) + " bytes, at most " +
                                std::to_string(kMaxMessageBytes));
  }
  size_t offset = 0;
  do {
    const size_t n = std::min(kMaxChunkBytes, bytes.size() - offset);
    ChunkHeader h{kChunkMagic, static_cast<uint32_t>(bytes.size()), static_cast<uint32_t>(offset)};
    iovec iov[2] = {{&h, sizeof h}, {const_cast<uint8_t*>(bytes.data()) + offset, n}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n > 0 ? 2 : 1;
    ssize_t sent;
    do {
      sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent < 0) {
      if (errno == EPIPE || errno == ECONNRESET) return UnavailableError("peer closed the socket");
      return ErrnoError(errno, "sendmsg");
    }
    if (static_cast<size_t>(sent) != sizeof h + n) return DataLossError("sendmsg: short write of a datagram");
    offset += n;
  } while (offset < bytes.size());
  return OkStatus();
}

StatusOr<std::string> RecvMessage(int fd, size_t max_bytes) {
  std::vector<uint8_t> buf(sizeof(ChunkHeader) + kMaxChunkBytes);
  std::string out;
  size_t total = 0;
  bool started = false;
  do {
    bool truncated = false;
    ASSIGN_OR_RETURN(const size_t n, RecvDatagram(fd, buf.data(), buf.size(), &truncated));
    if (n == 0) {
      if (!started) return UnavailableError("peer closed the socket");
      return DataLossError("peer closed the socket in the middle of a message (" + std::to_string(out.size()) +
                           " of " + std::to_string(total) + " bytes)");
    }
    if (truncated) return DataLossError("garbled message: a datagram over " + std::to_string(buf.size()) + " bytes");
    if (n < sizeof(ChunkHeader)) {
      return DataLossError("garbled message: a datagram of " + std::to_string(n) + " bytes, shorter than its header");
    }
    ChunkHeader h;
    std::memcpy(&h, buf.data(), sizeof h);
    if (h.magic != kChunkMagic) return DataLossError("garbled message: bad chunk magic");
    if (!started) {
      if (h.offset_bytes != 0) return DataLossError("garbled message: first chunk at offset " + std::to_string(h.offset_bytes));
      if (h.total_bytes > max_bytes) {
        return ResourceExhaustedError("message of " + std::to_string(h.total_bytes) + " bytes, over the limit of " +
                                      std::to_string(max_bytes));
      }
      total = h.total_bytes;
      out.reserve(total);
      started = true;
    } else if (h.total_bytes != total || h.offset_bytes != out.size()) {
      return DataLossError("garbled message: chunk at offset " + std::to_string(h.offset_bytes) + " of " +
                           std::to_string(h.total_bytes) + ", expected " + std::to_string(out.size()) + " of " +
                           std::to_string(total));
    }
    const size_t payload = n - sizeof h;
    if (payload > total - out.size()) return DataLossError("garbled message: chunk runs past the message's end");
    if (payload == 0 && total > 0) return DataLossError("garbled message: empty chunk");
    out.append(reinterpret_cast<const char*>(buf.data()) + sizeof h, payload);
  } while (out.size() < total);
  return out;
}

}  // namespace offloadd::ipc
