#pragma once
// IoEngine: asynchronous positional reads and writes on a set of open files, one engine per store
// directory (per SSD). Two implementations behind one interface:
//   * io_uring (uring_engine.cc): one ring and one thread per engine; registered files, and
//     registered buffers for memory the caller declares up front (the shared arena);
//   * a pread/pwrite thread pool (this file), used when the kernel refuses io_uring.
// Both keep at most `queue_depth` transfers in flight, queue the rest in FIFO order, resubmit the
// remainder of short transfers, and retry EINTR/EAGAIN.
//
// Ownership: the engine does not own the fds (the store does; they must outlive the engine) nor
// the request objects (the submitter does, until `done` has run). Submit() is thread-safe and never
// blocks on I/O; `done` runs on an engine thread and may call Submit() again.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::storage {

enum class IoOp : uint8_t { kRead, kWrite };

// Syscall seam: production code passes none; tests subclass it to force faults. Every data
// transfer, sync and file extension on a store data/manifest file asks it first.
class IoFaults {
 public:
  virtual ~IoFaults() = default;
  // Before each transfer, including resubmissions of a remainder. Return 0 to issue it as asked,
  // 0 < n < len to issue only the first n bytes (a real short transfer; keep n a multiple of 4096
  // on O_DIRECT files), or a negative errno to fail it without issuing.
  virtual int64_t BeforeTransfer(IoOp op, int dir, uint64_t offset, uint64_t len) { return 0; }
  // Before fdatasync of a directory's data file (`manifest` false) or of the manifest (true).
  virtual int BeforeSync(int dir, bool manifest) { return 0; }
  // Before growing a directory's data file with fallocate.
  virtual int BeforeAllocate(int dir, uint64_t offset, uint64_t len) { return 0; }
  // Before appending `len` bytes to the manifest. 0 < n < len writes only n bytes and then fails
  // with EIO (a torn record); a negative errno fails without writing.
  virtual int64_t BeforeManifestAppend(uint64_t len) { return 0; }
  // Before creating an io_uring ring; a negative errno makes the probe fail as if the kernel (or a
  // seccomp filter) refused io_uring, so the fallback path can be tested anywhere.
  virtual int BeforeRingSetup() { return 0; }
};

// One transfer. Owned by the submitter until `done` has run.
struct IoRequest {
  IoOp op = IoOp::kRead;
  uint64_t offset = 0;  // in the engine's file
  uint8_t* buf = nullptr;
  uint64_t len = 0;
  // Called exactly once on an engine thread: `res` == len on success, a negative errno on failure,
  // or 0 <= res < len when a read hit the end of the file.
  std::function<void(int64_t res)> done;

  // Engine bookkeeping.
  uint64_t transferred = 0;
  int buf_index = -1;
};

struct IoEngineOptions {
  int dir = 0;  // index of the directory, passed to IoFaults and used in log lines
  int fd = -1;  // the data file; not owned
  unsigned queue_depth = 32;
  IoFaults* faults = nullptr;
  // Memory to register with io_uring (the shared arena). Split into <= 1 GiB pieces.
  std::vector<std::span<std::byte>> buffers;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;  // waits for in-flight transfers; queued ones get -ECANCELED
  virtual std::string_view name() const = 0;  // "io_uring" or "threads"
  // Human-readable features ("registered files, 3 registered buffers (8 GiB)").
  virtual std::string description() const = 0;
  virtual void Submit(IoRequest* req) = 0;
  virtual uint64_t in_flight() const = 0;
};

// Fails with UNAVAILABLE (the reason in the message) when the kernel refuses io_uring or lacks
// the opcodes the store needs; the caller then falls back to MakeThreadEngine.
StatusOr<std::unique_ptr<IoEngine>> MakeUringEngine(const IoEngineOptions& options);
std::unique_ptr<IoEngine> MakeThreadEngine(const IoEngineOptions& options);

// Raises RLIMIT_MEMLOCK's soft limit to the hard limit (and to unlimited when permitted) so
// registered buffers can be pinned; returns a line for the log saying what happened.
std::string RaiseMemlockLimit();

}  // namespace offloadd::storage
