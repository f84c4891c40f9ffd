#pragma once
// The command protocol between the daemon (WorkerPool) and offloadd-worker processes. Commands
// and completions travel through ipc::RingQueue/Channel in the shared arena; every tensor is named
// by its offset from the segment base. One command covers one shard [a, b) of one layer: the
// daemon passes offsets that already point at element a and num_elements = b - a.
//
// Idempotence: each shard has an array of per-chunk step counters in shared memory (a kControl
// region of CountersBytes(n) bytes, zero-initialised = "step 0 done"). A chunk of kChunkElements
// elements is updated by step k only if its counter reads k - 1, and its counter becomes k when
// the update is complete; a counter already at k means "done, skip" (a replay after a crash). With
// crash_consistent on, the worker computes a chunk's new state into its own small redo slot
// (L1-resident: kChunkElements was chosen so that 3 fp32 chunks fit in L1), marks the slot
// committing, copies it over the shared state and only then advances the counter; a restarted
// worker rolls committing slots forward before taking commands, so the shared state is never
// left half-updated and nothing is applied twice.
// Accumulate commands use their own counter array with a caller-chosen sequence number instead
// of the step (seq = 1, 2, ... across all micro-batches of the run).
// Speculative updates (exact clipping without waiting for the global norm, StepDriver): an AdamW
// command with kFlagSpeculative applied grad_scale 1 before the norm was known; a chunk whose
// gradients are not finite is then left untouched (its counter too), so no inf/NaN reaches the
// states. If the step then clips by c < 1, a kAdamWCorrect command (AdamWCommand payload,
// grad_scale = c) turns each chunk's speculative result into the update with c, once: its
// correction counters are the second half of the AdamW counter region (AdamWCountersBytes), and
// a chunk is corrected for step k when its AdamW counter reads k and its correction counter < k.

#include <cstddef>
#include <cstdint>
#include <string>

#include "ipc/ring_queue.h"
#include "workers/adamw_compact.h"
#include "workers/adamw_kernel.h"

namespace offloadd::workers {

inline constexpr uint64_t kChunkElements = 2048;
inline uint64_t NumChunks(uint64_t n) { return (n + kChunkElements - 1) / kChunkElements; }
inline uint64_t CountersBytes(uint64_t n) { return NumChunks(n) * sizeof(uint64_t); }
// AdamW step counters followed by the correction counters (kAdamWCorrect).
inline uint64_t AdamWCountersBytes(uint64_t n) { return 2 * CountersBytes(n); }

enum class CommandKind : uint32_t {
  kAdamW = 1,       // AdamWCommand
  kAccumulate = 2,  // AccumulateCommand
  kGradNorm = 3,    // GradNormCommand
  kShutdown = 4,    // no payload; the worker exits after completing what it popped before
  kAdamWCorrect = 5,  // AdamWCommand: correct a speculative (grad_scale 1) update to grad_scale
};

// ipc::CommandRecord::flags
inline constexpr uint32_t kFlagGradFp32 = 1u << 0;     // else bf16 gradients (or kFlagGradFp16)
inline constexpr uint32_t kFlagWeightsFp16 = 1u << 1;  // else bf16 weight copy
inline constexpr uint32_t kFlagNoWeights = 1u << 2;    // do not write a 16-bit weight copy
inline constexpr uint32_t kFlagOverwrite = 1u << 3;    // accumulate: first micro-batch, acc = g
inline constexpr uint32_t kFlagGradFp16 = 1u << 4;     // fp16 gradients (fp16 loss scaling)
inline constexpr uint32_t kFlagSpeculative = 1u << 5;  // AdamW: skip chunks with inf/NaN grads
// AdamW in a compact optimizer mode (workers/adamw_compact.h): the master and state regions are
// laid out as MasterRegionBytes/StateRegionBytes say for the command's num_elements (the offsets
// point at the regions' starts), and stochastic rounding's seed is the command's layer. Not with
// kAdamWCorrect: a quantised state cannot be corrected after the fact.
inline constexpr uint32_t kFlagStateBf16 = 1u << 6;
inline constexpr uint32_t kFlagStateInt8 = 1u << 7;
inline constexpr uint32_t kFlagMasterBf16 = 1u << 8;

inline uint32_t GradDtypeFlags(GradDtype dt) {
  return dt == GradDtype::kFp32 ? kFlagGradFp32 : dt == GradDtype::kFp16 ? kFlagGradFp16 : 0;
}
// kFlagGradFp32 wins if both are set (the worker rejects that combination, see Validate).
inline GradDtype GradDtypeFromFlags(uint32_t flags) {
  if (flags & kFlagGradFp32) return GradDtype::kFp32;
  return (flags & kFlagGradFp16) ? GradDtype::kFp16 : GradDtype::kBf16;
}

inline uint32_t OptimizerModeFlags(OptimizerMode mode) {
  return (mode.state == StateDtype::kBf16 ? kFlagStateBf16 : 0) |
         (mode.state == StateDtype::kInt8 ? kFlagStateInt8 : 0) |
         (mode.master == MasterDtype::kBf16 ? kFlagMasterBf16 : 0);
}

struct AdamWCommand {
  uint64_t num_elements;
  uint64_t grad_offset;        // bf16, fp16 or fp32 gradients (fp32 for an accumulation buffer)
  uint64_t master_offset;      // fp32, updated in place
  uint64_t exp_avg_offset;     // fp32, updated in place
  uint64_t exp_avg_sq_offset;  // fp32, updated in place
  uint64_t weights_offset;     // bf16/fp16 copy of the new weights (ignored with kFlagNoWeights)
  uint64_t counters_offset;    // uint64[NumChunks(num_elements)]
  uint64_t step;               // k >= 1
  double lr, beta1, beta2, eps, weight_decay;
  float grad_scale;  // clip coefficient (1 when not clipping)
  uint32_t layer;    // for logs and metrics only
};
static_assert(sizeof(AdamWCommand) == 112);

struct AccumulateCommand {
  uint64_t num_elements;
  uint64_t grad_offset;
  uint64_t accum_offset;     // fp32
  uint64_t counters_offset;  // uint64[NumChunks(num_elements)], separate from the AdamW counters
  uint64_t seq;              // >= 1; applied where the counter reads seq - 1
  uint32_t layer;
  uint32_t reserved;
};
static_assert(sizeof(AccumulateCommand) == 48);

struct GradNormCommand {
  uint64_t num_elements;
  uint64_t grad_offset;
  uint32_t layer;
  uint32_t reserved;
};
static_assert(sizeof(GradNormCommand) == 24);

// Completion of one command. status_code is an offloadd::StatusCode; message is a truncated
// description (the worker logs the full one).
struct alignas(64) WorkerCompletion {
  uint64_t id;
  uint32_t kind;
  int32_t status_code;
  double grad_sq_norm;      // sum of squares of the gradients of the whole shard
  uint64_t chunks_applied;  // chunks this execution updated
  uint64_t chunks_skipped;  // chunks found already done (replay after a crash)
  uint64_t elements;
  uint64_t busy_ns;  // time the worker spent executing
  uint32_t worker;
  uint32_t layer;
  char message[192];
};
static_assert(sizeof(WorkerCompletion) == 256);

// Arena region names for worker i.
std::string CommandQueueName(uint32_t worker);     // "worker<i>.cmd"
std::string CompletionQueueName(uint32_t worker);  // "worker<i>.cpl"
std::string UndoRegionName(uint32_t worker);       // "worker<i>.undo"

// Fault injection for tests: where the first incarnation of a worker kills itself.
enum class CrashPoint : uint32_t {
  kNone = 0,
  kAfterKernel = 1,  // new state in the redo slot (not yet marked), shared state untouched
  kMidCopy = 2,      // slot marked committing, master copied back, exp_avg(_sq) not yet
  kAfterCommit = 3,  // counter advanced, slot still marked committing
};

// First message on the control socket (with fds: segment, cmd ready, cmd space, cpl ready,
// cpl space). Trivially copyable; versioned like every cross-process struct.
inline constexpr uint32_t kHelloMagic = 0x4f4c4c45;  // "ELLO"
inline constexpr uint32_t kHelloVersion = 1;
inline constexpr size_t kMaxCpusPerWorker = 256;
struct WorkerHello {
  uint32_t magic;
  uint32_t version;
  uint32_t worker;
  uint32_t threads;
  uint32_t kernel_path;  // KernelPath
  uint32_t crash_consistent;
  uint32_t incarnation;  // 0 for the first start, +1 per restart
  uint32_t crash_point;  // CrashPoint, only honoured when incarnation == 0
  uint64_t crash_after_chunks;
  int32_t parent_pid;
  uint32_t num_cpus;  // 0: do not pin
  uint16_t cpus[kMaxCpusPerWorker];
};
static_assert(sizeof(WorkerHello) == 560, "WorkerHello is shared across processes");

// The worker's reply once it is attached and recovered: status_code 0, or an error.
struct WorkerReady {
  int32_t status_code;
  uint32_t recovered_chunks;  // interrupted chunk commits completed at startup
  char message[248];
};
static_assert(sizeof(WorkerReady) == 256);

}  // namespace offloadd::workers
