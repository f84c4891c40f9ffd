#pragma once
// TensorStore: the NVMe tensor store's core. Keeps versions of tensors (fp32 master weights,
// Adam moments, ...) addressed by TensorKey in one or more directories (one per SSD), striping
// each tensor's chunks across all of them by weight so their bandwidth adds up. Reads and writes
// are asynchronous; many of both may be in flight at once.
//
// Guarantees (see storage/README.md for the on-disk format and fsync policy):
//   * Write(key, v) never touches the bytes of the last committed version of `key`; its callback
//     reports OK only once the data and its manifest record are durable (fdatasync). A crash at
//     any point leaves every key at its last committed version, readable bit-identical.
//   * Every chunk carries a crc32c that is verified on every Read.
//   * I/O errors (EIO, ENOSPC, short transfers that make no progress, checksum mismatches) come
//     back through the callback as a Status naming the directory and the key; the store stays up.
//
// Ownership: the caller owns the memory passed to Write/Read and must keep it valid (and, for
// Write, unchanged) until the callback has run. Callbacks run on store threads, without store
// locks held (or on the calling thread when a request is refused at once); they may call back
// into the store but must not block for long.
// Thread-safety: all methods are thread-safe. At most one Write per key may be in flight.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "storage/format.h"
#include "storage/io_engine.h"
#include "storage/metrics.h"

namespace offloadd::storage {

struct StoreDirectory {
  std::string path;
  double weight = 1.0;  // share of each tensor's chunks placed here (e.g. relative SSD bandwidth)
};

enum class IoEngineChoice { kAuto, kIoUring, kThreads };
enum class DirectIoMode {
  kAuto,  // O_DIRECT where the filesystem accepts it, buffered I/O (with a warning) elsewhere
  kOn,    // refuse to open a directory whose filesystem rejects O_DIRECT
  kOff,   // buffered I/O everywhere (tests on tmpfs); durability still comes from fdatasync
};

struct StoreOptions {
  std::vector<StoreDirectory> directories;
  // DeepSpeed `aio` names. block_size: bytes per I/O request, also the striping and checksum
  // unit (a multiple of 4 KiB). queue_depth: requests in flight per directory.
  uint32_t block_size = 1u << 20;
  uint32_t queue_depth = 32;
  IoEngineChoice io_engine = IoEngineChoice::kAuto;
  DirectIoMode direct_io = DirectIoMode::kAuto;
  bool create_if_missing = true;  // create directories and a new store when none is there
  // Memory to register with io_uring (the shared pinned arena); transfers inside it use
  // READ_FIXED/WRITE_FIXED. Other memory works too, unregistered.
  std::vector<std::span<std::byte>> registered_buffers;
  // Rewrite the manifest with only live records once it grows past this many bytes.
  uint64_t manifest_compact_bytes = 64ull << 20;
  IoFaults* faults = nullptr;  // test seam; not owned
};

// Checks ranges and consistency; messages name the option.
Status ValidateStoreOptions(const StoreOptions& options);

struct TensorInfo {
  TensorKey key;
  uint64_t version = 0;
  uint64_t size = 0;  // bytes
};

class TensorStore {
 public:
  using WriteCallback = std::function<void(Status)>;
  using ReadCallback = std::function<void(StatusOr<TensorInfo>)>;

  // Opens (or creates) the store in options.directories: checks their identity files, replays
  // the manifest (a torn final record from a crash is dropped), probes io_uring and O_DIRECT and
  // logs the effective settings.
  static StatusOr<std::unique_ptr<TensorStore>> Open(StoreOptions options);
  // Waits for reads and writes in flight, then closes everything.
  ~TensorStore();
  TensorStore(const TensorStore&) = delete;
  TensorStore& operator=(const TensorStore&) = delete;

  // Stores `data` as `version` of `key`; `version` must be greater than the committed one.
  void Write(const TensorKey& key, uint64_t version, std::span<const std::byte> data,
             WriteCallback done);
  // Reads the committed `version` of `key` (or kLatestVersion) into `out`, whose size must equal
  // the tensor's. Only the last committed version is kept.
  void Read(const TensorKey& key, uint64_t version, std::span<std::byte> out, ReadCallback done);
  // Durably forgets `key`: `done` gets OK once the drop is committed (its space is reused after).
  void Drop(const TensorKey& key, WriteCallback done);

  // Blocking conveniences.
  Status Drop(const TensorKey& key);

  Status WriteSync(const TensorKey& key, uint64_t version, std::span<const std::byte> data);
  StatusOr<TensorInfo> ReadSync(const TensorKey& key, uint64_t version, std::span<std::byte> out);

  std::optional<TensorInfo> Lookup(const TensorKey& key) const;
  std::vector<TensorInfo> List() const;
  StoreMetrics Metrics() const;
  std::string_view engine_name() const;
  const StoreOptions& options() const;
  // Whether directory `i` uses O_DIRECT (false where the filesystem refused it).
  bool direct_io(size_t i) const;

  class Impl;

 private:
  explicit TensorStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd::storage
