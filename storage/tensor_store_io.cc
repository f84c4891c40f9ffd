// TensorStore's data path: chunked reads and writes through the per-directory engines, checksum
// computation and verification, and the group-commit thread that makes writes durable.
#include <fcntl.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <set>

#include "common/logging.h"
#include "storage/crc32c.h"
#include "storage/tensor_store_impl.h"

namespace offloadd::storage {
namespace {

std::string Hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08" PRIx32, v);
  return b;
}

uint64_t KeyHash(const TensorKey& k) {
  return uint64_t{k.layer} * 0x9E3779B97F4A7C15ull ^ uint64_t { k.kind } * 0xC2B2AE3D27D4EB4Full ^
         uint64_t { k.part } * 0x165667B19E3779F9ull;
}

}  // namespace

std::string TensorStore::Impl::OpName(const Op& op) const {
  return std::string(op.write ? "write of " : "read of ") + KeyString(op.key) + " version " +
         std::to_string(op.version);
}

Status TensorStore::Impl::BeginWrite(Op* op, std::span<const std::byte> data) {
  if (!data.empty() && data.data() == nullptr) return InvalidArgumentError("write: null data");
  {
    std::lock_guard lock(index_mu);
    if (!manifest_broken.ok()) return manifest_broken;
    auto [it, inserted] = index.try_emplace(op->key);
    Entry& e = it->second;
    if (e.writing) {
      return FailedPreconditionError("a write or drop of " + KeyString(op->key) +
                                     " is already in flight");
    }
    if (e.committed && op->version <= e.committed->rec.version) {
      return InvalidArgumentError("version " + std::to_string(op->version) + " of " +
                                  KeyString(op->key) + " is not newer than the committed version " +
                                  std::to_string(e.committed->rec.version));
    }
    e.writing = true;
  }
  auto p = std::make_shared<Placement>();
  p->store = this;
  TensorRecord& rec = p->rec;
  rec.key = op->key;
  rec.version = op->version;
  rec.size = data.size();
  rec.chunk_bytes = options.block_size;
  const uint64_t n = (rec.size + rec.chunk_bytes - 1) / rec.chunk_bytes;
  rec.chunks.resize(n);
  std::vector<uint64_t> per_dir(dirs.size(), 0);
  const uint64_t h = KeyHash(op->key);
  for (uint64_t i = 0; i < n; ++i) {
    rec.chunks[i].dir = schedule[(i + h) % schedule.size()];
    ++per_dir[rec.chunks[i].dir];
  }
  Status st;
  for (size_t d = 0; d < dirs.size() && st.ok(); ++d) {
    if (per_dir[d] == 0) continue;
    Directory& dir = *dirs[d];
    const uint64_t len = per_dir[d] * rec.chunk_bytes;
    std::lock_guard lock(dir.alloc_mu);
    const uint64_t off = dir.alloc.Allocate(len);
    if (off + len > dir.file_size) {
      // Reserve the blocks now so a full disk fails the write before any data moves.
      const uint64_t grow = off + len - dir.file_size;
      int rc = options.faults ? options.faults->BeforeAllocate(dir.index, dir.file_size, grow) : 0;
      if (rc == 0 && ::fallocate(dir.data_fd, 0, static_cast<off_t>(dir.file_size),
                                 static_cast<off_t>(grow)) != 0) {
        rc = -errno;
        if (rc == -EOPNOTSUPP) {
          rc = ::ftruncate(dir.data_fd, static_cast<off_t>(off + len)) == 0 ? 0 : -errno;
        }
      }
      if (rc < 0) {
        dir.alloc.Free(off, len);
        dir.CountError(KindOfErrno(-rc));
        st = ErrnoError(-rc, "store directory " + dir.path + ": reserving " + std::to_string(len) +
                                 " bytes for " + KeyString(op->key) + " version " +
                                 std::to_string(op->version));
        break;
      }
      dir.file_size = off + len;
    }
    rec.extents.push_back({static_cast<uint16_t>(d), off, len});
  }
  if (!st.ok()) {
    p.reset();  // frees what was allocated
    std::lock_guard lock(index_mu);
    auto it = index.find(op->key);
    it->second.writing = false;
    if (!it->second.committed) index.erase(it);
    return st;
  }
  p->offsets = rec.ChunkOffsets();
  op->placement = std::move(p);
  return OkStatus();
}

Status TensorStore::Impl::BeginRead(Op* op, std::span<std::byte> out) {
  std::lock_guard lock(index_mu);
  auto it = index.find(op->key);
  if (it == index.end() || !it->second.committed) {
    return NotFoundError(KeyString(op->key) + " has no committed version in the store");
  }
  const auto& committed = it->second.committed;
  if (op->version != kLatestVersion && op->version != committed->rec.version) {
    return NotFoundError(KeyString(op->key) + " version " + std::to_string(op->version) +
                         " is not stored; the committed version is " +
                         std::to_string(committed->rec.version) + " (only the last one is kept)");
  }
  if (out.size() != committed->rec.size) {
    return InvalidArgumentError("read of " + KeyString(op->key) + " version " +
                                std::to_string(committed->rec.version) + ": buffer has " +
                                std::to_string(out.size()) + " bytes but the tensor has " +
                                std::to_string(committed->rec.size));
  }
  if (!out.empty() && out.data() == nullptr) return InvalidArgumentError("read: null buffer");
  op->version = committed->rec.version;
  op->placement = committed;
  return OkStatus();
}

void TensorStore::Impl::PrepareChunks(Op* op, uint8_t* base) {
  const TensorRecord& rec = op->placement->rec;
  op->chunks = std::vector<ChunkIo>(rec.chunks.size());
  for (size_t i = 0; i < rec.chunks.size(); ++i) {
    ChunkIo& c = op->chunks[i];
    c.op = op;
    c.index = i;
    c.user = base + i * uint64_t{rec.chunk_bytes};
    c.len = rec.chunk_len(i);
    c.req.op = op->write ? IoOp::kWrite : IoOp::kRead;
    c.req.offset = op->placement->offsets[i];
    c.dir = rec.chunks[i].dir;
    c.req.done = [this, &c](int64_t res) { OnChunkDone(&c, res); };
  }
}

// With op->mu held: takes the next chunks (up to the window) and counts them in flight, so the
// op cannot finish before they are submitted. Returns whether the op is finished instead.
bool TensorStore::Impl::PickChunks(Op* op, std::vector<ChunkIo*>* ready) {
  const size_t window = size_t{options.queue_depth} * dirs.size();
  while (op->next < op->chunks.size() && op->in_flight < window && op->error.ok()) {
    ChunkIo& c = op->chunks[op->next++];
    const Directory& d = *dirs[c.dir];
    const uint64_t io_len = d.direct ? AlignUp(c.len) : c.len;
    const bool aligned =
        !d.direct || (reinterpret_cast<uintptr_t>(c.user) % kAlign == 0 && c.len % kAlign == 0);
    if (aligned) {
      c.req.buf = c.user;
    } else {
      // Unaligned caller memory (odd offsets, or the tail of an odd-sized tensor) goes through
      // a 4 KiB-aligned bounce buffer, zero-padded on writes.
      c.bounce.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, io_len)));
      if (!c.bounce) {
        op->error = ResourceExhaustedError("no memory for a bounce buffer of " +
                                           std::to_string(io_len) + " bytes for " + OpName(*op));
        break;
      }
      if (op->write) {
        std::memcpy(c.bounce.get(), c.user, c.len);
        std::memset(c.bounce.get() + c.len, 0, io_len - c.len);
      }
      c.req.buf = c.bounce.get();
    }
    c.req.len = io_len;
    c.start = Clock::now();
    ++op->in_flight;
    ready->push_back(&c);
  }
  return op->in_flight == 0 && (op->next == op->chunks.size() || !op->error.ok());
}

// Touches only the chunks, never their op: once the last one is submitted the op may complete
// and be deleted on another thread.
void TensorStore::Impl::SubmitChunks(const std::vector<ChunkIo*>& ready) {
  for (ChunkIo* c : ready) dirs[c->dir]->engine->Submit(&c->req);
}

void TensorStore::Impl::SubmitMore(Op* op) {
  std::vector<ChunkIo*> ready;
  bool finished;
  {
    std::lock_guard lock(op->mu);
    finished = PickChunks(op, &ready);
  }
  SubmitChunks(ready);
  if (finished) FinishIo(op);
}

void TensorStore::Impl::OnChunkDone(ChunkIo* c, int64_t res) {
  Op* op = c->op;
  ChunkRef& ref = op->placement->rec.chunks[c->index];
  Directory& d = *dirs[ref.dir];
  const double seconds = SecondsSince(c->start);
  auto where = [&] {
    return "store directory " + d.path + ": " + OpName(*op) + ", chunk " +
           std::to_string(c->index) + " at data offset " + std::to_string(c->req.offset);
  };
  Status err;
  if (res < 0) {
    d.CountError(KindOfErrno(static_cast<int>(-res)));
    err = ErrnoError(static_cast<int>(-res), where());
  } else if (static_cast<uint64_t>(res) < c->req.len) {
    d.CountError(ErrorKind::kShortTransfer);
    err = DataLossError(where() + ": the data file ends after " + std::to_string(res) + " of " +
                        std::to_string(c->req.len) + " bytes");
  } else if (op->write) {
    d.bytes_written.fetch_add(c->req.len, std::memory_order_relaxed);
    d.write_ops.fetch_add(1, std::memory_order_relaxed);
    d.write_latency.Record(seconds);
    ref.crc = Crc32c(0, c->user, c->len);  // the caller keeps the bytes unchanged until done
  } else {
    d.bytes_read.fetch_add(c->req.len, std::memory_order_relaxed);
    d.read_ops.fetch_add(1, std::memory_order_relaxed);
    d.read_latency.Record(seconds);
    const uint8_t* got = c->bounce ? c->bounce.get() : c->user;
    const uint32_t crc = Crc32c(0, got, c->len);
    if (crc != ref.crc) {
      d.CountError(ErrorKind::kChecksum);
      err = DataLossError(where() + ": checksum mismatch over " + std::to_string(c->len) +
                          " bytes (stored crc32c " + Hex(ref.crc) + ", read " + Hex(crc) + ")");
    } else if (c->bounce) {
      std::memcpy(c->user, got, c->len);
    }
  }
  c->bounce.reset();
  // Deciding to finish and picking more happen under one lock: a completion on another
  // directory's thread may otherwise finish (and delete) the op while this one still uses it.
  std::vector<ChunkIo*> ready;
  bool finished;
  {
    std::lock_guard lock(op->mu);
    --op->in_flight;
    if (!err.ok() && op->error.ok()) op->error = std::move(err);
    finished = PickChunks(op, &ready);
  }
  SubmitChunks(ready);
  if (finished) FinishIo(op);
}

void TensorStore::Impl::FinishIo(Op* op) {
  if (!op->write) {
    CompleteRead(op);
  } else if (!op->error.ok()) {
    CompleteWrite(op, op->error);
  } else {
    std::lock_guard lock(commit_mu);
    commit_queue.push_back(op);
    commit_cv.notify_one();
  }
}

void TensorStore::Impl::CompleteRead(Op* op) {
  StatusOr<TensorInfo> result =
      op->error.ok()
          ? StatusOr<TensorInfo>(TensorInfo{op->key, op->version, op->placement->rec.size})
          : StatusOr<TensorInfo>(op->error);
  if (result.ok()) read_latency.Record(SecondsSince(op->start));
  auto done = std::move(op->read_done);
  delete op;  // drops the placement reference (the version may now be freed)
  done(std::move(result));
  OpEnded(false);
}

void TensorStore::Impl::CompleteWrite(Op* op, Status st) {
  if (!st.ok()) {
    op->placement.reset();  // never committed: its extents go back now
    std::lock_guard lock(index_mu);
    auto it = index.find(op->key);
    if (it != index.end()) {
      it->second.writing = false;
      if (!it->second.committed) index.erase(it);
    }
  } else {
    commit_latency.Record(SecondsSince(op->start));
  }
  auto done = std::move(op->write_done);
  delete op;
  done(std::move(st));
  OpEnded(true);
}

void TensorStore::Impl::CommitLoop() {
  for (;;) {
    std::vector<Op*> batch;
    {
      std::unique_lock lock(commit_mu);
      commit_cv.wait(lock, [this] { return stopping || !commit_queue.empty(); });
      if (commit_queue.empty()) return;  // stopping, nothing left
      batch.assign(commit_queue.begin(), commit_queue.end());
      commit_queue.clear();
    }
    CommitBatch(std::move(batch));
  }
}

void TensorStore::Impl::CommitBatch(std::vector<Op*> batch) {
  // 1. Data durable: one fdatasync per directory touched by the batch (group commit).
  std::set<uint16_t> touched;
  for (Op* op : batch) {
    if (op->placement) {
      for (const auto& x : op->placement->rec.extents) touched.insert(x.dir);
    }
  }
  std::map<uint16_t, Status> sync_error;
  for (uint16_t di : touched) {
    Directory& d = *dirs[di];
    const auto t = Clock::now();
    int rc = options.faults ? options.faults->BeforeSync(di, false) : 0;
    if (rc == 0 && ::fdatasync(d.data_fd) != 0) rc = -errno;
    d.sync_latency.Record(SecondsSince(t));
    d.syncs.fetch_add(1, std::memory_order_relaxed);
    if (rc < 0) {
      d.CountError(KindOfErrno(-rc));
      sync_error[di] =
          ErrnoError(-rc, "store directory " + d.path + ": fdatasync of the data file");
    }
  }
  std::vector<Op*> ready;
  for (Op* op : batch) {
    Status st;
    if (op->placement) {
      for (const auto& x : op->placement->rec.extents) {
        if (auto it = sync_error.find(x.dir); it != sync_error.end()) st = it->second;
      }
    }
    if (!st.ok()) {
      CompleteWrite(op, st.WithContext(OpName(*op) + " not committed"));
    } else {
      ready.push_back(op);
    }
  }
  if (ready.empty()) return;

  // 2. Commit point: the records, durable in the manifest, as one frame per append (a batch
  // too big for one frame is split, each part committing on its own).
  std::vector<std::vector<uint8_t>> entries(ready.size());
  for (size_t i = 0; i < ready.size(); ++i) {
    Op* op = ready[i];
    if (op->drop) {
      TensorRecord r;
      r.key = op->key;
      r.version = op->version;
      EncodeEntry({RecordType::kDrop, r}, &entries[i]);
    } else {
      EncodeEntry({RecordType::kCommit, op->placement->rec}, &entries[i]);
    }
  }
  std::vector<Op*> committed;
  for (size_t begin = 0; begin < ready.size();) {
    size_t end = begin, bytes_in_frame = 0;
    while (end < ready.size() &&
           (end == begin || bytes_in_frame + entries[end].size() < kMaxRecordPayload / 2)) {
      bytes_in_frame += entries[end++].size();
    }
    std::vector<uint8_t> frame;
    EncodeFrame({entries.data() + begin, end - begin}, &frame);
    Status st = AppendManifest(frame);
    for (size_t i = begin; i < end; ++i) {
      if (st.ok()) {
        committed.push_back(ready[i]);
      } else {
        CompleteWrite(ready[i], st.WithContext(OpName(*ready[i]) + " not committed"));
      }
    }
    begin = end;
  }
  ready.swap(committed);
  if (ready.empty()) return;

  // 3. Publish; the superseded versions are freed when the last read of them ends.
  std::vector<std::shared_ptr<Placement>> superseded;
  {
    std::lock_guard lock(index_mu);
    for (Op* op : ready) {
      auto it = index.find(op->key);
      std::shared_ptr<Placement> old = std::move(it->second.committed);
      if (op->drop) {
        index.erase(it);
      } else {
        it->second.committed = op->placement;
        it->second.writing = false;
        for (size_t i = 0; i < op->placement->rec.chunks.size(); ++i) {
          dirs[op->placement->rec.chunks[i].dir]->live_bytes += op->placement->rec.chunk_len(i);
        }
      }
      if (old) {
        for (size_t i = 0; i < old->rec.chunks.size(); ++i) {
          dirs[old->rec.chunks[i].dir]->live_bytes -= old->rec.chunk_len(i);
        }
        superseded.push_back(std::move(old));
      }
      op->placement.reset();
    }
  }
  superseded.clear();
  commits.fetch_add(ready.size(), std::memory_order_relaxed);
  for (Op* op : ready) CompleteWrite(op, OkStatus());

  if (manifest_size > options.manifest_compact_bytes &&
      manifest_size > 2 * manifest_compacted_size) {
    Status cs = CompactManifest();
    if (!cs.ok()) {
      OFFLOADD_LOG(kError, "storage") << "manifest compaction failed: " << cs.ToString();
    }
  }
}

Status TensorStore::Impl::AppendManifest(const std::vector<uint8_t>& bytes) {
  const std::string what =
      "store directory " + dirs[0]->path + ": appending to " + kManifestFileName;
  {
    std::lock_guard lock(index_mu);
    if (!manifest_broken.ok()) return manifest_broken;
  }
  uint64_t allow = bytes.size();
  int err = 0;
  if (options.faults != nullptr) {
    const int64_t f = options.faults->BeforeManifestAppend(bytes.size());
    if (f < 0) err = static_cast<int>(-f);
    if (f > 0 && static_cast<uint64_t>(f) < allow) {
      allow = static_cast<uint64_t>(f);
      err = EIO;  // the torn append "fails" after its first `f` bytes
    }
  }
  size_t done = 0;
  while (done < allow) {
    const ssize_t n = ::write(manifest_fd, bytes.data() + done, allow - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0) {
    int rc = options.faults ? options.faults->BeforeSync(0, true) : 0;
    if (rc == 0 && ::fdatasync(manifest_fd) != 0) rc = -errno;
    if (rc < 0) err = -rc;
  }
  if (err == 0) {
    manifest_size += bytes.size();
    manifest_size_public = manifest_size;
    return OkStatus();
  }
  dirs[0]->CountError(KindOfErrno(err));
  // Roll the log back to its last good length, so later appends stay readable at replay.
  if (::ftruncate(manifest_fd, static_cast<off_t>(manifest_size)) != 0 ||
      ::fdatasync(manifest_fd) != 0) {
    Status broken = UnavailableError(
        what + " failed and the partial record could not be removed (" + std::strerror(errno) +
        "); writes are refused until the store restarts (reads still work; the restart drops "
        "the partial record)");
    OFFLOADD_LOG(kError, "storage") << broken.message();
    std::lock_guard lock(index_mu);
    manifest_broken = std::move(broken);
  }
  return ErrnoError(err, what);
}

}  // namespace offloadd::storage
