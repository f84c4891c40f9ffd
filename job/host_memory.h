#pragma once
// The host RAM and disk a job needs, predicted before anything is allocated, and the host limit a
// node gives a job that names none. offloadd-train, the executor's trainer and the daemon's job
// validation all call these, so a job the kernel would OOM-kill is refused at validation with its
// numbers and the smallest change that would fit.
//
// RAM: the shared arena (ArenaBytes, the trainer's own formula), the activation
// checkpoints that wait in pinned RAM (recompute_offload_cpu), a CPU device's working set, and an
// allowance for the processes (the trainer with LibTorch and, on CUDA, its context; each worker
// process; the store with its io_uring buffers; the checkpoint reader). Disk: 12 B per parameter
// whose states are on NVMe, the new versions in flight (one block per staging slot and one
// committing: a write takes new extents, the old return after its commit), and the offload_nvme
// activations; 2 B more per parameter whose 16-bit weights are there too (nvme_weight_blocks).
// Torch-free; thread-compatible.
#include <cstdint>
#include <string>

#include "common/status.h"
#include "job/host_optimizer_options.h"

namespace offloadd::trainer {

// What the node can give a job safely when neither the job nor the daemon names a limit:
//   min(MemAvailable, the cgroup's memory.max - (memory.current - its page cache),
//       RLIMIT_MEMLOCK) - reserve
// probed when the job is validated or starts (another job's arena is already not available).
// The reserve holds what the prediction leaves out plus the kernel's own slack: the measured
// host peaks ran 2.7-7.7 GiB (at most 6.1% of RAM) above PredictHostMemory on the 125.9 GiB
// H200 host and 8.6 GiB (1.7%) on the 503 GiB x4 host (docs/host_memory_and_nvme.md).
inline constexpr uint64_t kHostReserveMinBytes = uint64_t{4} << 30;
inline constexpr uint64_t kHostReservePercent = 6;

// The host's memory as the default limit sees it. 0 means unknown (or unlimited, for the caps).
struct NodeMemory {
  uint64_t total = 0;         // MemTotal
  uint64_t available = 0;     // MemAvailable (0: unknown, then `total` counts)
  uint64_t cgroup_max = 0;    // the process's cgroup v2 memory.max (0: "max", or no cgroup v2)
  uint64_t cgroup_usage = 0;  // its memory.current
  // The part of memory.current the kernel reclaims before it OOM-kills inside the cgroup: the
  // page cache on the file LRUs (active_file + inactive_file of memory.stat; shmem, hence the
  // arena's memfd, is on the anon LRUs and stays counted) and reclaimable slab. A container
  // that has just built or read a lot shows memory.current near memory.max with most of it
  // cache, as MemAvailable counts cache as available.
  uint64_t cgroup_reclaimable = 0;
  uint64_t memlock = 0;       // RLIMIT_MEMLOCK's soft limit (0: unlimited)
  bool pinned = true;         // the arena is page-locked (a GPU): memlock bounds it
};

// Reads <proc>/meminfo, <proc>/self/cgroup with <cgroup_root>/<path>/memory.{max,current,stat},
// and
// getrlimit. The roots are seams for tests.
NodeMemory ProbeNodeMemory(const std::string& proc_root = "/proc",
                           const std::string& cgroup_root = "/sys/fs/cgroup");
// max(4 GiB, 6% of `total_bytes`).
uint64_t HostMemoryReserve(uint64_t total_bytes);

struct HostMemoryLimit {
  uint64_t bytes = 0;  // 0: nothing known to limit by (no RAM size); 1: nothing left to give
  std::string source;  // "the default: what this node can give now: 118.2 GiB available less ..."
};
// `configured` (the daemon's memory.host_memory_limit) when set, else what the node can give
// safely (above). `offloadctl node`, the daemon's validation, the executor's trainer and
// offloadd-train all call it.
HostMemoryLimit DefaultHostMemoryLimit(uint64_t configured, const NodeMemory& node);

// Allowances (measured RSS of the processes beside the shared arena, rounded up).
inline constexpr uint64_t kTrainerProcessBytes = uint64_t{768} << 20;      // LibTorch, data, CPU
inline constexpr uint64_t kCudaContextHostBytes = uint64_t{1536} << 20;    // CUDA runtime + context
inline constexpr uint64_t kWorkerProcessBytes = uint64_t{64} << 20;        // each offloadd-worker
inline constexpr uint64_t kStoreProcessBytes = uint64_t{64} << 20;         // offloadd-store
inline constexpr uint64_t kCheckpointReaderBytes = uint64_t{256} << 20;    // safetensors reads

struct HostMemoryInputs {
  HostOptimizerOptions optimizer;  // what the arena is sized from (its tier included)
  bool cuda = false;
  int64_t micro = 1;                // the micro-batch the batch-dependent bytes are for
  uint64_t checkpoint_bytes = 0;    // activation checkpoints in pinned RAM (per micro-batch)
  uint64_t device_batch_bytes = 0;  // a CPU device's activations and workspace (0 on a GPU)
  uint64_t device_fixed_bytes = 0;  // a CPU device's weights; across hosts the whole (.cc)
  uint64_t spill_disk_bytes = 0;    // offload_nvme activations and NVMe layer inputs
  uint64_t spill_buffer_bytes = 0;  // their pinned staging buffer (ActivationSpillBufferBytes)
  // offload_param: {device: nvme}: PlaceStatesUnderLimit may put NVMe blocks' 16-bit weights in
  // the store too (optimizer.nvme_weight_blocks) when their states on NVMe do not free enough RAM.
  bool nvme_weights_allowed = false;
  // offload_param: {device: nvme} (with nvme_weights_allowed): every NVMe block's 16-bit weights
  // go to the store, whatever the limit (PlaceWeightsOnNvme).
  bool nvme_weights_forced = false;
};

struct HostMemoryPrediction {
  uint64_t arena = 0, checkpoints = 0, device = 0, processes = 0;
  uint64_t spill_buffer = 0;  // the activation spill's pinned staging buffer
  uint64_t total = 0;       // RAM
  uint64_t disk_bytes = 0;  // the store directories
  uint64_t nvme_params = 0;  // parameters whose states are on NVMe
  uint64_t nvme_weight_params = 0;  // of them, those whose 16-bit weights are there too
  // The arena's host bytes per parameter and the optimizer mode it holds (a compact mode's
  // Describe names both: "arena 1.2 GiB at 8.03 B/parameter, not exact: fp32 master, int8 states").
  double arena_bytes_per_param = 0;
  workers::OptimizerMode mode = {};
  std::string Describe() const;  // "host RAM 12.3 GiB (arena ..., ...); disk ..."
};

HostMemoryPrediction PredictHostMemory(const HostMemoryInputs& in);

// How the caller's user changes what a refusal suggests: flags for offloadd-train, spec fields for
// the daemon.
struct HostMemoryNames {
  std::string limit = "--host-memory-limit";
  std::string nvme = "--tier=nvme --nvme-dir=DIR";  // empty: not offered (across hosts)
  std::string batch = "--batch-size";
  std::string param_nvme = "--param-tier=nvme";  // the 16-bit weights on NVMe too
  bool nvme_configured = true;  // store directories exist (the daemon: storage.directories)
  std::string nvme_dir = "--nvme-dir=DIR";  // a store directory (the layer inputs' NVMe tier)
};

// OK when the prediction fits `limit`; else RESOURCE_EXHAUSTED with the prediction, the limit and
// where it came from (`limit_source`), and the smallest changes that would fit: a lower
// micro-batch, the states on NVMe (with its RAM and disk), a higher limit up to what the node can
// give safely (`node_limit`: DefaultHostMemoryLimit(0, node).bytes; 0: unknown, none offered
// beyond the RAM).
Status CheckHostMemory(const HostMemoryInputs& in, uint64_t limit, const std::string& limit_source,
                       uint64_t node_limit, const HostMemoryNames& names = {});

// The disk term of a step with `nvme_params` parameters' states on NVMe: each is read and written
// once per step (master, exp_avg, exp_avg_sq: 12 B each way exact; a compact mode's
// workers::StateBytesPerParam) at the store's measured rates; 0 when nothing is on NVMe or a rate
// is unknown.
double NvmeStepSeconds(uint64_t nvme_params, double read_bytes_per_s, double write_bytes_per_s,
                       double state_bytes_per_param = 12);

}  // namespace offloadd::trainer
