// TensorStore implementation. Threads: one I/O engine per directory (ring thread or pool), one
// commit thread. A Write is split into block_size chunks submitted through a sliding window; when
// all are on disk the op goes to the commit thread, which batches ops (group commit): fdatasync
// of every data file they touched, one manifest append, fdatasync of the manifest, then the
// index switches to the new version and the old version's extents are freed once no read holds
// them. A Read holds a reference to the version it reads, so those extents cannot be reused
// under it.
#include "storage/tensor_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/logging.h"
#include "common/units.h"
#include "storage/store_dir.h"
#include "storage/tensor_store_impl.h"

namespace offloadd::storage {

Placement::~Placement() {
  if (store != nullptr) store->ReleaseExtents(rec);
}

void TensorStore::Impl::ReleaseExtents(const TensorRecord& r) {
  for (const auto& x : r.extents) {
    Directory& d = *dirs[x.dir];
    std::lock_guard lock(d.alloc_mu);
    d.alloc.Free(x.offset, x.length);
  }
}

void TensorStore::Impl::OpStarted(bool write) {
  std::lock_guard lock(ops_mu);
  ++(write ? writes_in_progress : reads_in_progress);
}

void TensorStore::Impl::OpEnded(bool write) {
  std::lock_guard lock(ops_mu);
  --(write ? writes_in_progress : reads_in_progress);
  if (reads_in_progress == 0 && writes_in_progress == 0) ops_cv.notify_all();
}

Status ValidateStoreOptions(const StoreOptions& o) {
  if (o.directories.empty()) return InvalidArgumentError("directories: at least one is required");
  if (o.directories.size() > 1024) return InvalidArgumentError("directories: at most 1024");
  std::set<std::string> seen;
  for (size_t i = 0; i < o.directories.size(); ++i) {
    const auto& d = o.directories[i];
    const std::string where = "directories[" + std::to_string(i) + "]";
    if (d.path.empty()) return InvalidArgumentError(where + ".path: empty");
    if (!(d.weight > 0) || d.weight > 1e6) {
      return InvalidArgumentError(where + ".weight: must be in (0, 1e6], got " +
                                  std::to_string(d.weight));
    }
    std::error_code ec;
    auto canon = std::filesystem::weakly_canonical(d.path, ec);
    if (!seen.insert(ec ? d.path : canon.string()).second) {
      return InvalidArgumentError(where + ".path: " + d.path + " is listed twice");
    }
  }
  if (o.block_size < kAlign || o.block_size % kAlign != 0 || o.block_size > (256u << 20)) {
    return InvalidArgumentError(
        "aio.block_size: must be a multiple of 4096 between 4 KiB and 256 MiB, got " +
        std::to_string(o.block_size));
  }
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return InvalidArgumentError("aio.queue_depth: must be in [1, 4096], got " +
                                std::to_string(o.queue_depth));
  }
  return OkStatus();
}

Status TensorStore::Impl::OpenDirectories() {
  std::vector<std::string> paths;
  for (size_t i = 0; i < options.directories.size(); ++i) {
    auto d = std::make_unique<Directory>();
    d->index = static_cast<int>(i);
    d->path = options.directories[i].path;
    d->weight = options.directories[i].weight;
    RETURN_IF_ERROR(EnsureDirectory(d->path, options.create_if_missing));
    ASSIGN_OR_RETURN(d->lock_fd, LockDirectory(d->path));
    paths.push_back(d->path);
    dirs.push_back(std::move(d));
  }
  RETURN_IF_ERROR(SetupIdentities(paths, options.create_if_missing));
  const int want = options.direct_io == DirectIoMode::kOff  ? 0
                   : options.direct_io == DirectIoMode::kOn ? 2
                                                            : 1;
  for (auto& d : dirs) {
    ASSIGN_OR_RETURN(DataFile f, OpenDataFile(d->path, want));
    d->data_fd = f.fd;
    d->direct = f.direct;
    d->file_size = f.size;
    if (!f.note.empty()) {
      OFFLOADD_LOG(kWarning, "storage") << d->path << ": " << f.note;
    }
  }
  // Smooth weighted round robin: spreads each directory's share evenly along the sequence.
  std::vector<double> current(dirs.size(), 0);
  double total = 0;
  for (auto& d : dirs) total += d->weight;
  schedule.resize(dirs.size() == 1 ? 1 : 4096);
  for (auto& s : schedule) {
    size_t best = 0;
    for (size_t i = 0; i < dirs.size(); ++i) {
      current[i] += dirs[i]->weight;
      if (current[i] > current[best]) best = i;
    }
    current[best] -= total;
    s = static_cast<uint16_t>(best);
  }
  return OkStatus();
}

Status TensorStore::Impl::Recover() {
  const std::string path = dirs[0]->path + "/" + kManifestFileName;
  manifest_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (manifest_fd < 0) return ErrnoError(errno, "opening " + path);
  ASSIGN_OR_RETURN(auto image, ReadWholeFile(manifest_fd, path));
  auto replay = ReplayManifest(image);
  if (!replay.ok()) return replay.status().WithContext(path);
  if (replay->torn_tail) {
    OFFLOADD_LOG(kWarning, "storage") << path << ": dropping " << image.size() - replay->valid_bytes
                                      << " bytes of an incomplete final record (interrupted "
                                         "commit; the previous version of that key stays)";
    if (::ftruncate(manifest_fd, static_cast<off_t>(replay->valid_bytes)) != 0 ||
        ::fdatasync(manifest_fd) != 0) {
      return ErrnoError(errno, "truncating torn tail of " + path);
    }
  }
  manifest_size = replay->valid_bytes;
  manifest_size_public = manifest_size;
  std::map<TensorKey, TensorRecord> live;
  for (auto& e : replay->entries) {
    if (e.type == RecordType::kDrop) {
      live.erase(e.record.key);
      continue;
    }
    RETURN_IF_ERROR(e.record.Validate(dirs.size()).WithContext(path));
    live[e.record.key] = std::move(e.record);
  }
  for (auto& [key, rec] : live) {
    for (const auto& x : rec.extents) {
      Directory& d = *dirs[x.dir];
      if (x.offset + x.length > AlignUp(d.file_size) && rec.size > 0) {
        return DataLossError("store directory " + d.path + ": committed " + KeyString(key) +
                             " version " + std::to_string(rec.version) + " extends to byte " +
                             std::to_string(x.offset + x.length) + " but the data file has only " +
                             std::to_string(d.file_size) + " bytes (was the data file replaced?)");
      }
      d.alloc.MarkUsed(x.offset, x.length);
    }
    for (size_t i = 0; i < rec.chunks.size(); ++i) {
      dirs[rec.chunks[i].dir]->live_bytes += rec.chunk_len(i);
    }
    auto p = std::make_shared<Placement>();
    p->store = this;
    p->offsets = rec.ChunkOffsets();
    p->rec = std::move(rec);
    index[key].committed = std::move(p);
  }
  for (auto& d : dirs) d->alloc.FinishRecovery();
  if (replay->entries.size() > 2 * index.size() + 64) RETURN_IF_ERROR(CompactManifest());
  manifest_compacted_size = manifest_size;
  return OkStatus();
}

// Rewrites the manifest with one record per live key. Called at open and from the commit
// thread (which owns manifest appends), so no append can interleave.
Status TensorStore::Impl::CompactManifest() {
  // Frames of up to ~1 MiB (the file is replaced atomically, so frame boundaries are free).
  std::vector<uint8_t> bytes;
  {
    std::lock_guard lock(index_mu);
    std::vector<std::vector<uint8_t>> entries;
    size_t pending = 0;
    for (const auto& [key, e] : index) {
      if (!e.committed) continue;
      entries.emplace_back();
      EncodeEntry({RecordType::kCommit, e.committed->rec}, &entries.back());
      pending += entries.back().size();
      if (pending >= (1u << 20)) {
        EncodeFrame(entries, &bytes);
        entries.clear();
        pending = 0;
      }
    }
    if (!entries.empty()) EncodeFrame(entries, &bytes);
  }
  // The new file is opened before it is renamed into place, so appends can never go to an
  // unlinked inode: until the rename the old manifest stays in use, after it the new one.
  const std::string& dir = dirs[0]->path;
  const std::string path = dir + "/" + kManifestFileName;
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "creating " + tmp);
  Status st = WriteAll(fd, bytes.data(), bytes.size(), "writing " + tmp);
  if (st.ok() && ::fdatasync(fd) != 0) st = ErrnoError(errno, "fdatasync " + tmp);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    st = ErrnoError(errno, "renaming " + tmp);
  if (!st.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  }
  ::close(manifest_fd);
  manifest_fd = fd;
  OFFLOADD_LOG(kInfo, "storage") << "compacted " << path << " from " << manifest_size << " to "
                                 << bytes.size() << " bytes";
  manifest_size = bytes.size();
  manifest_size_public = manifest_size;
  manifest_compacted_size = manifest_size;
  st = FsyncDirectory(dir);
  if (!st.ok()) {
    // The rename may not survive a crash, and later appends would then be lost with the new file.
    std::lock_guard lock(index_mu);
    manifest_broken = UnavailableError(st.message() + " after compacting " + path +
                                       "; writes are refused until the store restarts");
    return st;
  }
  return OkStatus();
}

Status TensorStore::Impl::StartEngines() {
  const std::vector<std::span<std::byte>>& buffers = options.registered_buffers;
  if (!buffers.empty()) {
    OFFLOADD_LOG(kInfo, "storage") << RaiseMemlockLimit();
  }
  auto engine_options = [&](const Directory& d) {
    IoEngineOptions eo;
    eo.dir = d.index;
    eo.fd = d.data_fd;
    eo.queue_depth = options.queue_depth;
    eo.faults = options.faults;
    eo.buffers = buffers;
    return eo;
  };
  bool use_uring = options.io_engine != IoEngineChoice::kThreads;
  for (auto& d : dirs) {
    if (!use_uring) break;
    auto e = MakeUringEngine(engine_options(*d));
    if (e.ok()) {
      d->engine = std::move(*e);
      continue;
    }
    if (options.io_engine == IoEngineChoice::kIoUring) {
      return e.status().WithContext("io_engine: io_uring requested for " + d->path);
    }
    OFFLOADD_LOG(kWarning, "storage") << "io_uring unavailable (" << e.status().message()
                                      << "); falling back to the pread/pwrite thread pool";
    use_uring = false;
  }
  for (auto& d : dirs) {
    if (!use_uring) d->engine = MakeThreadEngine(engine_options(*d));
  }
  engine_name = std::string(dirs[0]->engine->name());
  for (auto& d : dirs) {
    OFFLOADD_LOG(kInfo, "storage")
        << "directory " << d->index << " " << d->path << " weight " << d->weight << ": "
        << (d->direct ? "O_DIRECT" : "buffered") << ", " << d->engine->name() << " ("
        << d->engine->description() << "), data file " << FormatByteSize(d->file_size);
  }
  return OkStatus();
}

TensorStore::Impl::~Impl() {
  {
    std::unique_lock lock(ops_mu);
    ops_cv.wait(lock, [this] { return reads_in_progress == 0 && writes_in_progress == 0; });
  }
  {
    std::lock_guard lock(commit_mu);
    stopping = true;
  }
  commit_cv.notify_all();
  if (commit_thread.joinable()) commit_thread.join();
  for (auto& d : dirs) d->engine.reset();
  {
    std::lock_guard lock(index_mu);
    index.clear();  // placements free into allocators that are still alive
  }
  for (auto& d : dirs) {
    if (d->data_fd >= 0) ::close(d->data_fd);
    if (d->lock_fd >= 0) ::close(d->lock_fd);
  }
  if (manifest_fd >= 0) ::close(manifest_fd);
}

}  // namespace offloadd::storage

namespace offloadd::storage {

TensorStore::TensorStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TensorStore::~TensorStore() = default;

StatusOr<std::unique_ptr<TensorStore>> TensorStore::Open(StoreOptions options) {
  RETURN_IF_ERROR(ValidateStoreOptions(options));
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  RETURN_IF_ERROR(impl->OpenDirectories());
  RETURN_IF_ERROR(impl->Recover());
  // fdatasync makes a file's data durable, not its name: make sure the data files and the
  // manifest created by this open are in their directories before anything is committed.
  for (const auto& d : impl->dirs) RETURN_IF_ERROR(FsyncDirectory(d->path));
  RETURN_IF_ERROR(impl->StartEngines());
  Impl* raw = impl.get();
  impl->commit_thread = std::thread([raw] { raw->CommitLoop(); });
  uint64_t bytes = 0;
  for (const auto& [k, e] : impl->index) bytes += e.committed->rec.size;
  OFFLOADD_LOG(kInfo, "storage") << "store open: " << impl->dirs.size() << " directories, "
                                 << impl->index.size() << " tensors (" << FormatByteSize(bytes)
                                 << "), aio.block_size " << FormatByteSize(impl->options.block_size)
                                 << ", aio.queue_depth " << impl->options.queue_depth << ", engine "
                                 << impl->engine_name;
  return std::unique_ptr<TensorStore>(new TensorStore(std::move(impl)));
}

void TensorStore::Write(const TensorKey& key, uint64_t version, std::span<const std::byte> data,
                        WriteCallback done) {
  auto* op = new Op;
  op->write = true;
  op->key = key;
  op->version = version;
  op->write_done = std::move(done);
  Status st = impl_->BeginWrite(op, data);
  if (!st.ok()) {
    auto cb = std::move(op->write_done);
    delete op;
    cb(std::move(st));
    return;
  }
  impl_->OpStarted(true);
  impl_->PrepareChunks(op, reinterpret_cast<uint8_t*>(const_cast<std::byte*>(data.data())));
  if (op->chunks.empty()) {
    impl_->FinishIo(op);
  } else {
    impl_->SubmitMore(op);
  }
}

void TensorStore::Read(const TensorKey& key, uint64_t version, std::span<std::byte> out,
                       ReadCallback done) {
  auto* op = new Op;
  op->key = key;
  op->version = version;
  op->read_done = std::move(done);
  Status st = impl_->BeginRead(op, out);
  if (!st.ok()) {
    auto cb = std::move(op->read_done);
    delete op;
    cb(std::move(st));
    return;
  }
  impl_->OpStarted(false);
  impl_->PrepareChunks(op, reinterpret_cast<uint8_t*>(out.data()));
  if (op->chunks.empty()) {
    impl_->FinishIo(op);
  } else {
    impl_->SubmitMore(op);
  }
}

void TensorStore::Drop(const TensorKey& key, WriteCallback done) {
  auto* op = new Op;
  op->write = true;
  op->drop = true;
  op->key = key;
  op->write_done = std::move(done);
  Status st;
  {
    std::lock_guard lock(impl_->index_mu);
    auto it = impl_->index.find(key);
    if (it == impl_->index.end() || !it->second.committed) {
      st = NotFoundError(KeyString(key) + " has no committed version to drop");
    } else if (it->second.writing) {
      st = FailedPreconditionError("a write or drop of " + KeyString(key) + " is in flight");
    } else {
      it->second.writing = true;
      op->version = it->second.committed->rec.version;
    }
  }
  if (!st.ok()) {
    auto cb = std::move(op->write_done);
    delete op;
    cb(std::move(st));
    return;
  }
  impl_->OpStarted(true);
  impl_->FinishIo(op);  // straight to the commit thread: a drop is one manifest entry
}

Status TensorStore::Drop(const TensorKey& key) {
  std::promise<Status> p;
  Drop(key, [&p](Status st) { p.set_value(std::move(st)); });
  return p.get_future().get();
}

Status TensorStore::WriteSync(const TensorKey& key, uint64_t version,
                              std::span<const std::byte> data) {
  std::promise<Status> p;
  Write(key, version, data, [&p](Status st) { p.set_value(std::move(st)); });
  return p.get_future().get();
}

StatusOr<TensorInfo> TensorStore::ReadSync(const TensorKey& key, uint64_t version,
                                           std::span<std::byte> out) {
  std::promise<StatusOr<TensorInfo>> p;
  Read(key, version, out, [&p](StatusOr<TensorInfo> r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

std::optional<TensorInfo> TensorStore::Lookup(const TensorKey& key) const {
  std::lock_guard lock(impl_->index_mu);
  auto it = impl_->index.find(key);
  if (it == impl_->index.end() || !it->second.committed) return std::nullopt;
  return TensorInfo{key, it->second.committed->rec.version, it->second.committed->rec.size};
}

std::vector<TensorInfo> TensorStore::List() const {
  std::vector<TensorInfo> out;
  std::lock_guard lock(impl_->index_mu);
  for (const auto& [key, e] : impl_->index) {
    if (e.committed) out.push_back({key, e.committed->rec.version, e.committed->rec.size});
  }
  return out;
}

StoreMetrics TensorStore::Metrics() const {
  StoreMetrics m;
  m.engine = impl_->engine_name;
  for (const auto& d : impl_->dirs) {
    DirectoryMetrics dm;
    dm.path = d->path;
    dm.bytes_read = d->bytes_read.load(std::memory_order_relaxed);
    dm.bytes_written = d->bytes_written.load(std::memory_order_relaxed);
    dm.read_ops = d->read_ops.load(std::memory_order_relaxed);
    dm.write_ops = d->write_ops.load(std::memory_order_relaxed);
    dm.syncs = d->syncs.load(std::memory_order_relaxed);
    dm.in_flight = d->engine ? d->engine->in_flight() : 0;
    dm.live_bytes = d->live_bytes.load(std::memory_order_relaxed);
    {
      std::lock_guard lock(d->alloc_mu);
      dm.file_bytes = d->file_size;
    }
    for (size_t k = 0; k < dm.errors.size(); ++k)
      dm.errors[k] = d->errors[k].load(std::memory_order_relaxed);
    dm.read_latency = d->read_latency.Snapshot();
    dm.write_latency = d->write_latency.Snapshot();
    dm.sync_latency = d->sync_latency.Snapshot();
    m.directories.push_back(std::move(dm));
  }
  {
    std::lock_guard lock(impl_->index_mu);
    for (const auto& [key, e] : impl_->index) {
      if (!e.committed) continue;
      ++m.tensors;
      m.stored_bytes += e.committed->rec.size;
    }
  }
  {
    std::lock_guard lock(impl_->ops_mu);
    m.reads_in_progress = impl_->reads_in_progress;
    m.writes_in_progress = impl_->writes_in_progress;
  }
  m.commits = impl_->commits.load(std::memory_order_relaxed);
  m.manifest_bytes = impl_->manifest_size_public.load(std::memory_order_relaxed);
  m.commit_latency = impl_->commit_latency.Snapshot();
  m.read_latency = impl_->read_latency.Snapshot();
  return m;
}

std::string_view TensorStore::engine_name() const { return impl_->engine_name; }
const StoreOptions& TensorStore::options() const { return impl_->options; }
bool TensorStore::direct_io(size_t i) const {
  return i < impl_->dirs.size() && impl_->dirs[i]->direct;
}

}  // namespace offloadd::storage
