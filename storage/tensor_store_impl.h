#pragma once
// Internal to storage/: the state TensorStore's .cc files share. Not a public header.

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "storage/extent_allocator.h"
#include "storage/tensor_store.h"

namespace offloadd::storage {
namespace internal {

using Clock = std::chrono::steady_clock;
inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline ErrorKind KindOfErrno(int err) {
  if (err == ENOSPC || err == EDQUOT) return ErrorKind::kNoSpace;
  if (err == EIO) return ErrorKind::kIo;
  return ErrorKind::kOther;
}

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;

}  // namespace internal
using internal::AlignedBuffer;
using internal::Clock;
using internal::KindOfErrno;
using internal::SecondsSince;

struct Directory {
  int index = 0;
  std::string path;
  double weight = 1;
  int lock_fd = -1;
  int data_fd = -1;
  bool direct = false;
  std::unique_ptr<IoEngine> engine;

  std::mutex alloc_mu;  // guards alloc and file_size
  ExtentAllocator alloc;
  uint64_t file_size = 0;

  std::atomic<uint64_t> bytes_read{0}, bytes_written{0}, read_ops{0}, write_ops{0}, syncs{0};
  std::atomic<uint64_t> live_bytes{0};
  std::array<std::atomic<uint64_t>, static_cast<int>(ErrorKind::kCount)> errors{};
  LatencyHistogram read_latency, write_latency, sync_latency;

  void CountError(ErrorKind k) {
    errors[static_cast<int>(k)].fetch_add(1, std::memory_order_relaxed);
  }
};

// One version's bytes on disk. Destroying it returns its extents to the allocators, so it must
// only be destroyed when the version is superseded (or was never committed) and unread.
struct Placement {
  TensorStore::Impl* store = nullptr;
  TensorRecord rec;
  std::vector<uint64_t> offsets;  // per chunk, in its directory's data file
  ~Placement();
};

struct Op;
struct ChunkIo {
  IoRequest req;
  Op* op = nullptr;
  size_t index = 0;
  uint16_t dir = 0;
  uint8_t* user = nullptr;  // the caller's bytes for this chunk
  uint64_t len = 0;         // valid bytes (io may be longer, padded to 4 KiB)
  AlignedBuffer bounce;     // set when the caller's bytes are not aligned for O_DIRECT
  Clock::time_point start;
};

struct Op {
  bool write = false;
  bool drop = false;
  TensorKey key;
  uint64_t version = 0;
  std::shared_ptr<Placement> placement;
  std::vector<ChunkIo> chunks;
  TensorStore::WriteCallback write_done;
  TensorStore::ReadCallback read_done;
  Clock::time_point start = Clock::now();

  std::mutex mu;
  size_t next = 0;
  size_t in_flight = 0;
  Status error;
};

class TensorStore::Impl {
 public:
  StoreOptions options;
  std::vector<std::unique_ptr<Directory>> dirs;
  std::vector<uint16_t> schedule;  // weighted round robin of directory indexes
  std::string engine_name = "threads";

  int manifest_fd = -1;
  uint64_t manifest_size = 0;
  uint64_t manifest_compacted_size = 0;
  std::atomic<uint64_t> manifest_size_public{0};  // manifest_size for Metrics()

  mutable std::mutex index_mu;
  struct Entry {
    std::shared_ptr<Placement> committed;
    bool writing = false;
  };
  std::map<TensorKey, Entry> index;
  Status manifest_broken;  // set when a failed append could not be rolled back; under index_mu

  std::mutex commit_mu;
  std::condition_variable commit_cv;
  std::deque<Op*> commit_queue;
  bool stopping = false;
  std::thread commit_thread;

  std::mutex ops_mu;
  std::condition_variable ops_cv;
  uint64_t reads_in_progress = 0, writes_in_progress = 0;

  std::atomic<uint64_t> commits{0};
  LatencyHistogram commit_latency, read_latency;

  ~Impl();
  Status OpenDirectories();
  Status Recover();
  Status StartEngines();
  Status CompactManifest();

  std::string OpName(const Op& op) const;
  Status BeginWrite(Op* op, std::span<const std::byte> data);
  Status BeginRead(Op* op, std::span<std::byte> out);
  void PrepareChunks(Op* op, uint8_t* base);
  bool PickChunks(Op* op, std::vector<ChunkIo*>* ready);
  void SubmitChunks(const std::vector<ChunkIo*>& ready);
  void SubmitMore(Op* op);
  void OnChunkDone(ChunkIo* c, int64_t res);
  void FinishIo(Op* op);
  void CommitLoop();
  void CommitBatch(std::vector<Op*> batch);
  Status AppendManifest(const std::vector<uint8_t>& bytes);
  void CompleteWrite(Op* op, Status st);
  void CompleteRead(Op* op);
  void ReleaseExtents(const TensorRecord& rec);
  void OpStarted(bool write);
  void OpEnded(bool write);
  std::string DirName(int d) const { return dirs[static_cast<size_t>(d)]->path; }
};

}  // namespace offloadd::storage
