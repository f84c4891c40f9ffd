#pragma once
// Messages of any size (up to a bound the receiver sets) over a SOCK_SEQPACKET socket, such as the
// control socket ipc::LaunchChild hands a child. A datagram is limited by the socket's send
// buffer (about 200 KiB by default), so a message is sent as one or more chunks of at most
// kMaxChunkBytes, each a datagram that starts with a ChunkHeader (magic, the message's total size,
// the chunk's offset in it). SEQPACKET keeps datagrams whole and in order, so a receiver sees the
// chunks of one message back to back as long as one sender writes at a time.
//
// A receiver refuses, without reading past the current datagram, a chunk with another magic, an
// offset that is not where the message stands, a datagram truncated or shorter than its header,
// and a total size over its bound: such a channel is garbled, and the caller drops its peer.
//
// Thread-compatible free functions: callers serialise senders (one mutex per socket) and
// receivers.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"

namespace offloadd::ipc {

struct ChunkHeader {
  uint32_t magic;
  uint32_t total_bytes;   // of the whole message
  uint32_t offset_bytes;  // of this chunk's payload within the message
};
static_assert(sizeof(ChunkHeader) == 12, "the chunk header is part of the wire format");

inline constexpr uint32_t kChunkMagic = 0x4f464d31;  // "OFM1"
inline constexpr size_t kMaxChunkBytes = 64 * 1024;  // payload bytes per datagram
inline constexpr size_t kMaxMessageBytes = 1u << 30;

// Sends `bytes` (may be empty: one header-only datagram). INVALID_ARGUMENT over
// kMaxMessageBytes; UNAVAILABLE when the peer is gone (EPIPE, ECONNRESET); other errno errors.
Status SendMessage(int socket_fd, std::span<const uint8_t> bytes);
inline Status SendMessage(int socket_fd, const std::string& bytes) {
  return SendMessage(socket_fd, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

// Receives one whole message (blocking). UNAVAILABLE when the peer closed the socket before a
// message began; DATA_LOSS when it closed in the middle of one, or a chunk is garbled;
// RESOURCE_EXHAUSTED when the message is larger than `max_bytes`.
StatusOr<std::string> RecvMessage(int socket_fd, size_t max_bytes);

}  // namespace offloadd::ipc
