#include "workers/shard_executor.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/atomic_fence.h"
#include "common/logging.h"
#include "workers/adamw_compact.h"

namespace offloadd::workers {
namespace {

// Destinations a redo slot copies back: exact AdamW's master, exp_avg and exp_avg_sq, a compact
// mode's pieces (a bf16 master's compensation and the int8 scales are pieces of their own), or an
// accumulation buffer.
constexpr uint32_t kMaxSlotArrays = 6;
struct UndoSlot {
  std::atomic<uint32_t> state;  // kSlotEmpty or kSlotCommitting
  uint32_t arrays;              // destinations, at most kMaxSlotArrays
  uint64_t counter_offset;      // the chunk's counter
  uint64_t seq;                 // the counter value once the chunk is committed
  uint64_t count;               // elements of the chunk
  uint64_t dst_offset[kMaxSlotArrays];  // where each array's chunk lives
  uint32_t bytes[kMaxSlotArrays];       // each array's bytes (count * 4 for fp32 arrays)
};
constexpr uint64_t kSlotHeaderBytes = 128;
static_assert(sizeof(UndoSlot) <= kSlotHeaderBytes);
constexpr uint64_t kSlotDataBytes = 3 * kChunkElements * sizeof(float);
constexpr uint32_t kSlotEmpty = 0;
constexpr uint32_t kSlotCommitting = 1;
constexpr uint64_t kUndoSlotBytes = kSlotHeaderBytes + kSlotDataBytes;

uint64_t RoundUp64(uint64_t v) { return (v + 63) / 64 * 64; }

UndoSlot* SlotAt(const ipc::Arena& arena, uint64_t undo_offset, uint32_t thread) {
  return arena.At<UndoSlot>(undo_offset + thread * kUndoSlotBytes);
}
// Array a's data: the arrays follow the header in order, each at a multiple of 64 bytes.
uint8_t* SlotData(UndoSlot* slot, const uint32_t* bytes, uint32_t array) {
  uint64_t at = kSlotHeaderBytes;
  for (uint32_t i = 0; i < array; ++i) at += RoundUp64(bytes[i]);
  return reinterpret_cast<uint8_t*>(slot) + at;
}
uint64_t SlotDataBytes(const uint32_t* bytes, uint32_t arrays) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < arrays; ++i) total += RoundUp64(bytes[i]);
  return total;
}

// A compact-mode chunk's state as pieces of shared memory: the pointers in `span` to re-point at
// the slot's copies, with each piece's bytes.
struct Piece {
  void** field;
  uint32_t bytes;
};
uint32_t CompactPieces(CompactSpan* span, OptimizerMode mode, Piece out[kMaxSlotArrays]) {
  const uint64_t n = span->n;
  const uint32_t state = mode.state == StateDtype::kFp32   ? 4
                         : mode.state == StateDtype::kBf16 ? 2
                                                           : 1;
  uint32_t k = 0;
  out[k++] = {&span->master,
              static_cast<uint32_t>(n * (mode.master == MasterDtype::kBf16 ? 2 : 4))};
  if (mode.master == MasterDtype::kBf16)
    out[k++] = {reinterpret_cast<void**>(&span->master_comp), static_cast<uint32_t>(2 * n)};
  out[k++] = {&span->exp_avg, static_cast<uint32_t>(n * state)};
  out[k++] = {&span->exp_avg_sq, static_cast<uint32_t>(n * state)};
  if (mode.state == StateDtype::kInt8) {
    const auto scales = static_cast<uint32_t>(4 * Int8Blocks(n));
    out[k++] = {reinterpret_cast<void**>(&span->exp_avg_scale), scales};
    out[k++] = {reinterpret_cast<void**>(&span->exp_avg_sq_scale), scales};
  }
  return k;
}

OptimizerMode ModeFromFlags(uint32_t flags) {
  OptimizerMode mode;
  if (flags & kFlagStateBf16) mode.state = StateDtype::kBf16;
  if (flags & kFlagStateInt8) mode.state = StateDtype::kInt8;
  if (flags & kFlagMasterBf16) mode.master = MasterDtype::kBf16;
  return mode;
}

// Whether [offset, +bytes) overlaps the undo log of `threads` slots at `undo_offset`. A command's
// arrays and a redo slot's counter and destinations never may: the log's data would be copied
// over itself (found twice by the worker_protocol fuzzer: overlapping memcpy). Both ranges must
// already be checked inside the arena, so the sums cannot wrap.
bool OverlapsUndoLog(uint64_t undo_offset, uint32_t threads, uint64_t offset, uint64_t bytes) {
  return offset < undo_offset + UndoRegionBytes(threads) && undo_offset < offset + bytes;
}

[[noreturn]] void CrashForTest() {
  ::kill(::getpid(), SIGKILL);
  for (;;) ::pause();
}

}  // namespace

uint64_t UndoRegionBytes(uint32_t threads) { return threads * kUndoSlotBytes; }

StatusOr<uint32_t> RecoverUndoSlots(const ipc::Arena& arena, uint64_t undo_offset,
                                    uint32_t threads) {
  RETURN_IF_ERROR(arena.Check(undo_offset, UndoRegionBytes(threads)));
  uint32_t completed = 0;
  for (uint32_t t = 0; t < threads; ++t) {
    UndoSlot* slot = SlotAt(arena, undo_offset, t);
    if (slot->state.load(std::memory_order_acquire) != kSlotCommitting) continue;
    const uint32_t arrays = slot->arrays;
    if (arrays > kMaxSlotArrays || slot->count > kChunkElements || slot->seq == 0 ||
        slot->counter_offset % sizeof(uint64_t) != 0 ||
        SlotDataBytes(slot->bytes, arrays) > kSlotDataBytes) {
      return DataLossError("redo slot " + std::to_string(t) + " is corrupt");
    }
    RETURN_IF_ERROR(arena.Check(slot->counter_offset, sizeof(uint64_t)));
    if (OverlapsUndoLog(undo_offset, threads, slot->counter_offset, sizeof(uint64_t))) {
      return DataLossError("redo slot " + std::to_string(t) + " is corrupt: its counter lies in the undo region");
    }
    for (uint32_t a = 0; a < arrays; ++a) {
      RETURN_IF_ERROR(arena.Check(slot->dst_offset[a], slot->bytes[a]));
      if (OverlapsUndoLog(undo_offset, threads, slot->dst_offset[a], slot->bytes[a])) {
        return DataLossError("redo slot " + std::to_string(t) + " is corrupt: array " + std::to_string(a) +
                             " would be copied into the undo region");
      }
    }
    std::atomic_ref<uint64_t> counter(*arena.At<uint64_t>(slot->counter_offset));
    // The slot holds the chunk's complete new state; a copy interrupted half-way is simply redone.
    // Below seq: not committed yet (AdamW and accumulate counters read seq - 1 then; a correction
    // counter may be older, as not every step is corrected).
    if (counter.load(std::memory_order_acquire) < slot->seq) {
      for (uint32_t a = 0; a < arrays; ++a) {
        std::memcpy(arena.At<uint8_t>(slot->dst_offset[a]), SlotData(slot, slot->bytes, a),
                    slot->bytes[a]);
      }
      offloadd::Fence(std::memory_order_seq_cst);
      counter.store(slot->seq, std::memory_order_seq_cst);
      ++completed;
    }
    slot->state.store(kSlotEmpty, std::memory_order_release);
  }
  return completed;
}

struct ShardExecutor::Job {
  CommandKind kind{};
  GradDtype grad_dtype{};
  WeightDtype weight_dtype{};
  bool overwrite = false;
  bool speculative = false;  // kAdamW with kFlagSpeculative: non-finite chunks stay untouched
  OptimizerMode mode;        // kAdamW: the master's and states' formats
  uint32_t layer = 0;
  uint64_t n = 0;
  uint64_t chunks = 0;
  uint64_t seq = 0;  // step (AdamW) or sequence number (accumulate)
  uint64_t grad_offset = 0, state_offset[3] = {}, weights_offset = 0, counters_offset = 0;
  AdamWHyper hyper;
  std::atomic<uint64_t> next_chunk{0};
  std::atomic<uint64_t> applied{0}, skipped{0};
  std::vector<double> chunk_sq;
  Status error;  // first error, guarded by ShardExecutor::mu_
};

ShardExecutor::ShardExecutor(const ipc::Arena* arena, ExecutorOptions options)
    : arena_(arena), options_(std::move(options)) {
  options_.threads = std::max<uint32_t>(options_.threads, 1);
}

ShardExecutor::~ShardExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

Status ShardExecutor::Start() {
  for (uint32_t t = 0; t < options_.threads; ++t) {
    threads_.emplace_back([this, t] { ThreadMain(t); });
    if (options_.cpus.empty()) continue;
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cpu = options_.cpus[t % options_.cpus.size()];
    CPU_SET(cpu, &set);
    const int rc = pthread_setaffinity_np(threads_.back().native_handle(), sizeof(set), &set);
    if (rc != 0) {
      return ErrnoError(rc, "pinning worker " + std::to_string(options_.worker) + " thread " +
                                std::to_string(t) + " to cpu " + std::to_string(cpu));
    }
  }
  return OkStatus();
}

void ShardExecutor::ThreadMain(uint32_t thread) {
  uint64_t seen = 0;
  for (;;) {
    Job* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_.get();
    }
    Status first_error;
    for (uint64_t c = job->next_chunk.fetch_add(1); c < job->chunks;
         c = job->next_chunk.fetch_add(1)) {
      bool applied = false;
      Status st = RunChunk(*job, thread, c, &job->chunk_sq[c], &applied);
      if (!st.ok()) {
        if (first_error.ok()) first_error = st;
        continue;
      }
      (applied ? job->applied : job->skipped).fetch_add(1, std::memory_order_relaxed);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_error.ok() && job->error.ok()) job->error = first_error;
    if (--running_ == 0) done_cv_.notify_one();
  }
}

Status ShardExecutor::RunChunk(const Job& job, uint32_t thread, uint64_t chunk, double* sq_norm,
                               bool* applied) {
  const uint64_t begin = chunk * kChunkElements;
  const uint64_t count = std::min(kChunkElements, job.n - begin);
  const size_t gsize = GradBytes(job.grad_dtype);
  const void* grad = arena_->At<uint8_t>(job.grad_offset + begin * gsize);
  if (job.kind == CommandKind::kGradNorm) {
    *sq_norm = GradSquaredNorm(grad, job.grad_dtype, count, options_.path);
    return OkStatus();
  }
  // A correction is sequenced by its own counter (the region's second half) and needs the chunk's
  // speculative update of the same step (its AdamW counter at seq).
  const bool correct = job.kind == CommandKind::kAdamWCorrect;
  const uint64_t counter_offset =
      job.counters_offset + ((correct ? job.chunks : 0) + chunk) * sizeof(uint64_t);
  std::atomic_ref<uint64_t> counter(*arena_->At<uint64_t>(counter_offset));
  const uint64_t current = counter.load(std::memory_order_acquire);
  if (current == job.seq) {  // already done by a predecessor that crashed after committing
    *sq_norm = GradSquaredNorm(grad, job.grad_dtype, count, options_.path);
    return OkStatus();
  }
  if (correct) {
    std::atomic_ref<uint64_t> step(*arena_->At<uint64_t>(job.counters_offset + chunk * 8));
    const uint64_t at = step.load(std::memory_order_acquire);
    if (at != job.seq || current > job.seq) {
      return FailedPreconditionError("layer " + std::to_string(job.layer) + " chunk " +
                                     std::to_string(chunk) + ": a correction for step " +
                                     std::to_string(job.seq) + " needs that step's update, the "
                                     "chunk is at step " + std::to_string(at));
    }
  } else if (current != job.seq - 1) {
    return FailedPreconditionError("layer " + std::to_string(job.layer) + " chunk " +
                                   std::to_string(chunk) + " is at " + std::to_string(current) +
                                   " but the command is for " + std::to_string(job.seq) +
                                   " (commands must be applied in order)");
  }
  if (job.speculative) {
    // Grad scale 1 before the global norm is known: a chunk with inf/NaN gradients is left as it
    // is (counter too), so none reaches the states; the driver fails or skips the step.
    const double sq = GradSquaredNorm(grad, job.grad_dtype, count, options_.path);
    if (!std::isfinite(sq)) {
      *sq_norm = sq;
      return OkStatus();
    }
  }
  const uint64_t processed = chunks_processed_.fetch_add(1);
  const bool crash_here =
      options_.crash_point != CrashPoint::kNone && processed == options_.crash_after_chunks;
  UndoSlot* slot =
      options_.crash_consistent ? SlotAt(*arena_, options_.undo_offset, thread) : nullptr;
  // The chunk's state as pieces of shared memory (dst) and where the update writes them (out: the
  // redo slot's copies, or the shared state itself).
  uint32_t arrays = 0;
  uint8_t* dst[kMaxSlotArrays] = {};
  uint64_t dst_offset[kMaxSlotArrays] = {};
  uint32_t bytes[kMaxSlotArrays] = {};
  uint16_t* weights = job.kind == CommandKind::kAccumulate || job.weight_dtype == WeightDtype::kNone
                          ? nullptr
                          : arena_->At<uint16_t>(job.weights_offset + begin * sizeof(uint16_t));
  if (job.kind != CommandKind::kAccumulate && !job.mode.Exact()) {
    CompactSpan span = CompactSpanAt(job.mode, arena_->At<uint8_t>(job.state_offset[0]),
                                     arena_->At<uint8_t>(job.state_offset[1]),
                                     arena_->At<uint8_t>(job.state_offset[2]), job.n, begin, count);
    span.grad = grad;
    span.grad_dtype = job.grad_dtype;
    span.weights = weights;
    span.weight_dtype = job.weight_dtype;
    span.seed = job.layer;
    Piece pieces[kMaxSlotArrays];
    arrays = CompactPieces(&span, job.mode, pieces);
    for (uint32_t a = 0; a < arrays; ++a) {
      dst[a] = static_cast<uint8_t*>(*pieces[a].field);
      dst_offset[a] = static_cast<uint64_t>(dst[a] - arena_->At<uint8_t>(0));
      bytes[a] = pieces[a].bytes;
    }
    if (slot != nullptr) {  // the update runs in place on the slot's copy of the old state
      for (uint32_t a = 0; a < arrays; ++a) {
        uint8_t* copy = SlotData(slot, bytes, a);
        std::memcpy(copy, dst[a], bytes[a]);
        *pieces[a].field = copy;
      }
    }
    StatusOr<double> sq = CompactAdamW(span, job.mode, job.hyper, options_.path);
    if (!sq.ok()) return sq.status();
    *sq_norm = *sq;
  } else {
    arrays = job.kind == CommandKind::kAccumulate ? 1 : 3;
    float* out[3] = {};
    for (uint32_t a = 0; a < arrays; ++a) {
      dst_offset[a] = job.state_offset[a] + begin * sizeof(float);
      dst[a] = arena_->At<uint8_t>(dst_offset[a]);
      bytes[a] = static_cast<uint32_t>(count * sizeof(float));
    }
    for (uint32_t a = 0; a < arrays; ++a) {
      out[a] = reinterpret_cast<float*>(slot != nullptr ? SlotData(slot, bytes, a) : dst[a]);
    }
    float* state[3] = {};
    for (uint32_t a = 0; a < arrays; ++a) state[a] = reinterpret_cast<float*>(dst[a]);
    if (job.kind != CommandKind::kAccumulate) {
      AdamWSpan span;
      span.grad = grad;
      span.grad_dtype = job.grad_dtype;
      span.master = state[0];
      span.exp_avg = state[1];
      span.exp_avg_sq = state[2];
      span.out_master = out[0];
      span.out_exp_avg = out[1];
      span.out_exp_avg_sq = out[2];
      span.weight_dtype = job.weight_dtype;
      span.weights = weights;
      span.n = count;
      *sq_norm = correct ? CorrectAdamW(span, job.hyper, options_.path)
                         : FusedAdamW(span, job.hyper, options_.path);
    } else {
      *sq_norm = AccumulateGrad(out[0], grad, job.grad_dtype, count, job.overwrite, options_.path,
                                state[0]);
    }
  }
  if (crash_here && options_.crash_point == CrashPoint::kAfterKernel) CrashForTest();
  if (slot != nullptr) {
    slot->arrays = arrays;
    slot->counter_offset = counter_offset;
    slot->seq = job.seq;
    slot->count = count;
    for (uint32_t a = 0; a < arrays; ++a) {
      slot->dst_offset[a] = dst_offset[a];
      slot->bytes[a] = bytes[a];
    }
    // The slot (data and header) must be complete before the shared state starts changing.
    offloadd::Fence(std::memory_order_seq_cst);
    slot->state.store(kSlotCommitting, std::memory_order_seq_cst);
    offloadd::Fence(std::memory_order_seq_cst);
    for (uint32_t a = 0; a < arrays; ++a) {
      std::memcpy(dst[a], SlotData(slot, bytes, a), bytes[a]);
      if (crash_here && a == 0 && options_.crash_point == CrashPoint::kMidCopy) CrashForTest();
    }
  }
  offloadd::Fence(std::memory_order_seq_cst);  // the new state lands before the commit
  counter.store(job.seq, std::memory_order_seq_cst);
  if (crash_here && options_.crash_point == CrashPoint::kAfterCommit) CrashForTest();
  if (slot != nullptr) slot->state.store(kSlotEmpty, std::memory_order_release);
  *applied = true;
  return OkStatus();
}

Status ShardExecutor::Validate(const ipc::CommandRecord& command, Job* job) const {
  const auto check = [&](const char* what, uint64_t offset, uint64_t bytes, uint64_t align) {
    if (offset % align != 0) {
      return InvalidArgumentError(std::string(what) + " offset " + std::to_string(offset) +
                                  " is not " + std::to_string(align) + "-byte aligned");
    }
    Status st = arena_->Check(offset, bytes);
    if (!st.ok()) return st.WithContext(what);
    // The undo log is the worker's own: a command's region inside it would be overwritten by the
    // log it is being copied from.
    if (options_.crash_consistent) {
      if (OverlapsUndoLog(options_.undo_offset, options_.threads, offset, bytes)) {
        return InvalidArgumentError(std::string(what) + " range [" + std::to_string(offset) + ", +" +
                                    std::to_string(bytes) + ") overlaps the worker's undo log");
      }
    }
    return st;
  };
  job->kind = static_cast<CommandKind>(command.kind);
  if ((command.flags & kFlagGradFp32) && (command.flags & kFlagGradFp16))
    return InvalidArgumentError("gradient dtype flags say both fp32 and fp16");
  job->grad_dtype = GradDtypeFromFlags(command.flags);
  const uint64_t gsize = GradBytes(job->grad_dtype);
  switch (job->kind) {
    case CommandKind::kAdamW:
    case CommandKind::kAdamWCorrect: {
      const auto c = command.Unpack<AdamWCommand>();
      job->speculative = job->kind == CommandKind::kAdamW && (command.flags & kFlagSpeculative);
      job->n = c.num_elements;
      job->layer = c.layer;
      job->seq = c.step;
      job->grad_offset = c.grad_offset;
      job->state_offset[0] = c.master_offset;
      job->state_offset[1] = c.exp_avg_offset;
      job->state_offset[2] = c.exp_avg_sq_offset;
      job->weights_offset = c.weights_offset;
      job->counters_offset = c.counters_offset;
      job->weight_dtype = (command.flags & kFlagNoWeights)     ? WeightDtype::kNone
                          : (command.flags & kFlagWeightsFp16) ? WeightDtype::kFp16
                                                               : WeightDtype::kBf16;
      job->hyper = {c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.step, c.grad_scale};
      RETURN_IF_ERROR(ValidateHyper(job->hyper));
      if ((command.flags & kFlagStateBf16) && (command.flags & kFlagStateInt8))
        return InvalidArgumentError("optimizer mode flags say both bf16 and int8 states");
      job->mode = ModeFromFlags(command.flags);
      if (job->kind == CommandKind::kAdamWCorrect && !job->mode.Exact()) {
        return InvalidArgumentError(
            "a correction of a speculative update needs exact states, not " + job->mode.Describe());
      }
      break;
    }
    case CommandKind::kAccumulate: {
      const auto c = command.Unpack<AccumulateCommand>();
      job->n = c.num_elements;
      job->layer = c.layer;
      job->seq = c.seq;
      job->grad_offset = c.grad_offset;
      job->state_offset[0] = c.accum_offset;
      job->counters_offset = c.counters_offset;
      job->overwrite = (command.flags & kFlagOverwrite) != 0;
      if (c.seq == 0) return InvalidArgumentError("accumulate seq must be >= 1");
      break;
    }
    case CommandKind::kGradNorm: {
      const auto c = command.Unpack<GradNormCommand>();
      job->n = c.num_elements;
      job->layer = c.layer;
      job->grad_offset = c.grad_offset;
      break;
    }
    default:
      return InvalidArgumentError("unknown command kind " + std::to_string(command.kind));
  }
  if (job->n == 0 || job->n > (uint64_t{1} << 40)) {
    return InvalidArgumentError("num_elements " + std::to_string(job->n) + " out of range");
  }
  job->chunks = NumChunks(job->n);
  RETURN_IF_ERROR(check("grad", job->grad_offset, job->n * gsize, gsize));
  if (job->kind == CommandKind::kGradNorm) return OkStatus();
  const bool correct = job->kind == CommandKind::kAdamWCorrect;
  RETURN_IF_ERROR(check("counters", job->counters_offset, job->chunks * (correct ? 16 : 8), 8));
  if (job->kind == CommandKind::kAccumulate) {
    RETURN_IF_ERROR(check("accum", job->state_offset[0], job->n * 4, 4));
  } else {
    RETURN_IF_ERROR(
        check("master", job->state_offset[0], MasterRegionBytes(job->mode.master, job->n), 4));
    const uint64_t state = StateRegionBytes(job->mode.state, job->n);
    RETURN_IF_ERROR(check("exp_avg", job->state_offset[1], state, 4));
    RETURN_IF_ERROR(check("exp_avg_sq", job->state_offset[2], state, 4));
  }
  if (job->kind != CommandKind::kAccumulate && job->weight_dtype != WeightDtype::kNone) {
    RETURN_IF_ERROR(check("weights", job->weights_offset, job->n * 2, 2));
  }
  if (options_.crash_consistent) {
    RETURN_IF_ERROR(arena_->Check(options_.undo_offset, UndoRegionBytes(options_.threads)));
  }
  return OkStatus();
}

WorkerCompletion ShardExecutor::Execute(const ipc::CommandRecord& command) {
  const auto start = std::chrono::steady_clock::now();
  WorkerCompletion done{};
  done.id = command.id;
  done.kind = command.kind;
  done.worker = options_.worker;
  auto job = std::make_unique<Job>();
  Status st = threads_.empty() ? FailedPreconditionError("ShardExecutor::Start() was not called")
                               : Validate(command, job.get());
  done.layer = job->layer;
  if (st.ok()) {
    job->chunk_sq.assign(job->chunks, 0.0);
    std::unique_lock<std::mutex> lock(mu_);
    job_ = std::move(job);
    running_ = static_cast<uint32_t>(threads_.size());
    ++generation_;
    work_cv_.notify_all();
    done_cv_.wait(lock, [&] { return running_ == 0; });
    job = std::move(job_);
    st = job->error;
  }
  if (st.ok()) {
    double sq = 0;
    for (double s : job->chunk_sq) sq += s;  // chunk order: independent of threads and replays
    done.grad_sq_norm = sq;
    done.chunks_applied = job->applied.load();
    done.chunks_skipped = job->skipped.load();
    done.elements = job->n;
  } else {
    OFFLOADD_LOG(kError, "workers")
        << "worker " << options_.worker << " command " << command.id << ": " << st.ToString();
    std::strncpy(done.message, st.message().c_str(), sizeof(done.message) - 1);
  }
  done.status_code = static_cast<int32_t>(st.code());
  done.busy_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
  return done;
}

}  // namespace offloadd::workers
