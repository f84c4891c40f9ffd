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

namespace offloadd::workers {
namespace {

struct UndoSlot {
  std::atomic<uint32_t> state;  // kSlotEmpty or kSlotCommitting
  uint32_t arrays;              // 3 for AdamW (master, exp_avg, exp_avg_sq), 1 for accumulate
  uint64_t counter_offset;      // the chunk's counter
  uint64_t seq;                 // the counter value once the chunk is committed
  uint64_t count;               // elements per array
  uint64_t dst_offset[3];       // where each array's chunk lives
};
static_assert(sizeof(UndoSlot) <= 64);
constexpr uint32_t kSlotEmpty = 0;
constexpr uint32_t kSlotCommitting = 1;
constexpr uint64_t kUndoSlotBytes = 64 + 3 * kChunkElements * sizeof(float);

UndoSlot* SlotAt(const ipc::Arena& arena, uint64_t undo_offset, uint32_t thread) {
  return arena.At<UndoSlot>(undo_offset + thread * kUndoSlotBytes);
}
float* SlotData(UndoSlot* slot, uint32_t array) {
  return reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(slot) + 64) + array * kChunkElements;
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
    bool aligned = slot->counter_offset % sizeof(uint64_t) == 0;
    for (uint32_t a = 0; a < slot->arrays && a < 3; ++a) aligned = aligned && slot->dst_offset[a] % 4 == 0;
    if (slot->arrays > 3 || slot->count > kChunkElements || slot->seq == 0 || !aligned) {
      return DataLossError("redo slot " + std::to_string(t) + " is corrupt");
    }
    RETURN_IF_ERROR(arena.Check(slot->counter_offset, sizeof(uint64_t)));
    if (OverlapsUndoLog(undo_offset, threads, slot->counter_offset, sizeof(uint64_t))) {
      return DataLossError("redo slot " + std::to_string(t) + " is corrupt: its counter lies in the undo region");
    }
    for (uint32_t a = 0; a < slot->arrays; ++a) {
      RETURN_IF_ERROR(arena.Check(slot->dst_offset[a], slot->count * sizeof(float)));
      if (OverlapsUndoLog(undo_offset, threads, slot->dst_offset[a], slot->count * sizeof(float))) {
        return DataLossError("redo slot " + std::to_string(t) + " is corrupt: array " + std::to_string(a) +
                             " would be copied into the undo region");
      }
    }
    std::atomic_ref<uint64_t> counter(*arena.At<uint64_t>(slot->counter_offset));
    // The slot holds the chunk's complete new state; a copy interrupted half-way is simply redone.
    // Below seq: not committed yet (AdamW and accumulate counters read seq - 1 then; a correction
    // counter may be older, as not every step is corrected).
    if (counter.load(std::memory_order_acquire) < slot->seq) {
      for (uint32_t a = 0; a < slot->arrays; ++a) {
        std::memcpy(arena.At<float>(slot->dst_offset[a]), SlotData(slot, a),
                    slot->count * sizeof(float));
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
  const uint32_t arrays = job.kind == CommandKind::kAccumulate ? 1 : 3;
  const uint64_t processed = chunks_processed_.fetch_add(1);
  const bool crash_here =
      options_.crash_point != CrashPoint::kNone && processed == options_.crash_after_chunks;
  float* state[3] = {};
  for (uint32_t a = 0; a < arrays; ++a) {
    state[a] = arena_->At<float>(job.state_offset[a] + begin * sizeof(float));
  }
  UndoSlot* slot =
      options_.crash_consistent ? SlotAt(*arena_, options_.undo_offset, thread) : nullptr;
  float* out[3] = {};
  for (uint32_t a = 0; a < arrays; ++a) out[a] = slot != nullptr ? SlotData(slot, a) : state[a];
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
    span.weights = job.weight_dtype == WeightDtype::kNone
                       ? nullptr
                       : arena_->At<uint16_t>(job.weights_offset + begin * sizeof(uint16_t));
    span.n = count;
    *sq_norm = correct ? CorrectAdamW(span, job.hyper, options_.path)
                       : FusedAdamW(span, job.hyper, options_.path);
  } else {
    *sq_norm =
        AccumulateGrad(out[0], grad, job.grad_dtype, count, job.overwrite, options_.path, state[0]);
  }
  if (crash_here && options_.crash_point == CrashPoint::kAfterKernel) CrashForTest();
  if (slot != nullptr) {
    slot->arrays = arrays;
    slot->counter_offset = counter_offset;
    slot->seq = job.seq;
    slot->count = count;
    for (uint32_t a = 0; a < arrays; ++a)
      slot->dst_offset[a] = job.state_offset[a] + begin * sizeof(float);
    // The slot (data and header) must be complete before the shared state starts changing.
    offloadd::Fence(std::memory_order_seq_cst);
    slot->state.store(kSlotCommitting, std::memory_order_seq_cst);
    offloadd::Fence(std::memory_order_seq_cst);
    for (uint32_t a = 0; a < arrays; ++a) {
      std::memcpy(state[a], out[a], count * sizeof(float));
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
  const uint32_t arrays = job->kind == CommandKind::kAccumulate ? 1 : 3;
  for (uint32_t a = 0; a < arrays; ++a) {
    RETURN_IF_ERROR(check(a == 0   ? "master/accum"
                          : a == 1 ? "exp_avg"
                                   : "exp_avg_sq",
                          job->state_offset[a], job->n * 4, 4));
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
