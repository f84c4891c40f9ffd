#pragma once
// The wire contract between the daemon and the offloadd-store process. Everything travels through
// the project's one IPC layer (ipc/): the shared arena holds the tensors and two RingQueues of
// ipc::CommandRecord (commands to the store, completions back), each with its pair of eventfds.
//
// Start-up (StoreProcess::Launch in store_client.h does the daemon's side):
//   1. the daemon formats an Arena in a SharedSegment, creates the two rings in it, four eventfds
//      and an AF_UNIX SOCK_SEQPACKET socket pair, and execs `offloadd-store --control-fd=3 ...`
//      with one end of the pair as fd 3;
//   2. it sends StoreHello with fds {segment, cmd ready, cmd space, done ready, done space};
//   3. the store attaches, opens its directories (registering the whole segment with io_uring)
//      and answers StoreReady (code 0, or the error that stopped it) over the socket.
// Then the daemon pushes commands and pops completions; the store serves until kShutdown, or
// until the control socket hangs up (the daemon died), finishing what is in flight either way.
// Records hold arena offsets (from the segment base), never pointers; the store checks every
// offset against the arena's region table before touching it.

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "ipc/ring_queue.h"
#include "storage/format.h"

namespace offloadd::storage {

inline constexpr uint64_t kStoreHelloMagic = 0x4f4c4c4548545321ull;  // "!STHELLO"
inline constexpr uint64_t kStoreReadyMagic = 0x5944414552545321ull;  // "!STREADY"
inline constexpr uint32_t kStoreProtocolVersion = 1;

// ipc::CommandRecord::kind values.
enum class StoreOp : uint32_t {
  kWrite = 1,     // arena [offset, offset+bytes) -> new version of key
  kRead = 2,      // committed version (or kLatestVersion) of key -> arena [offset, offset+bytes)
  kDrop = 3,      // forget key
  kShutdown = 4,  // finish in-flight work, answer, exit 0
  kCompletion = 0x80,
};

// CommandRecord::payload of a command.
struct StoreCommand {
  uint32_t layer = 0;
  uint32_t kind = 0;  // TensorKind
  uint32_t part = 0;
  uint32_t reserved = 0;
  uint64_t version = 0;
  uint64_t offset = 0;  // arena offset from the segment base
  uint64_t bytes = 0;
  TensorKey key() const { return {layer, kind, part}; }
};
static_assert(sizeof(StoreCommand) == 40);

// CommandRecord::payload of a completion (kind kCompletion, id echoing the command's id).
struct StoreCompletion {
  int32_t code = 0;      // offloadd::StatusCode
  uint32_t op = 0;       // the StoreOp that completed
  uint64_t version = 0;  // version written or read
  uint64_t bytes = 0;
  char message[88] = {};  // status message, truncated; the store logs it in full with the id
  std::string_view text() const { return {message, strnlen(message, sizeof message)}; }
};
static_assert(sizeof(StoreCompletion) == 112);

struct StoreHello {
  uint64_t magic = kStoreHelloMagic;
  uint32_t version = kStoreProtocolVersion;
  uint32_t reserved = 0;
  char command_queue[48] = {};  // arena region names of the rings
  char completion_queue[48] = {};
};

struct StoreReady {
  uint64_t magic = kStoreReadyMagic;
  uint32_t version = kStoreProtocolVersion;
  int32_t code = 0;           // StatusCode of opening the store
  uint32_t metrics_port = 0;  // bound Prometheus port, 0 when not serving
  uint32_t reserved = 0;
  char engine[16] = {};
  char message[256] = {};
};

template <size_t N>
inline void CopyName(char (&dst)[N], std::string_view src) {
  const size_t n = std::min(src.size(), N - 1);
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

}  // namespace offloadd::storage
