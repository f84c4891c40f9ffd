#pragma once
// The host RAM and disk a job needs, predicted before anything is allocated, and the host limit a
// node gives a job that names none. offloadd-train, the executor's trainer and the daemon's job
// validation all call these, so a job the kernel would OOM-kill is refused at validation with its
// numbers and the smallest change that would fit.
//
// RAM: the shared arena (HostOptimizer::ArenaBytes, the trainer's own formula), the activation
// checkpoints that wait in pinned RAM (recompute_offload_cpu), a CPU device's working set, and an
// allowance for the processes (the trainer with LibTorch and, on CUDA, its context; each worker
// process; the store with its io_uring buffers; the checkpoint reader). Disk: 12 B per parameter
// whose states are on NVMe, the new versions in flight (one block per staging slot and one
// committing: a write takes new extents, the old return after its commit), and the offload_nvme
// activations.
// Torch-free; thread-compatible.
#include <cstdint>
#include <string>

#include "common/status.h"
#include "trainer/host_optimizer.h"

namespace offloadd::trainer {

// The share of physical RAM a job may take when neither it nor the daemon names a limit.
inline constexpr uint64_t kDefaultHostMemoryPercent = 80;
// The most a refusal suggests raising a limit to (the rest is the kernel's, the page cache's and
// the daemon's: the 8B runs killed by the kernel had an arena of 96% of RAM).
inline constexpr uint64_t kMaxHostMemoryPercent = 90;

// `configured` (the daemon's memory.host_memory_limit, or a job's own) when set, else 80% of
// `ram_bytes`: what the node can give a job safely, beside the daemon, the page cache the
// checkpoint reader uses and whatever else runs there. `offloadctl node` shows it.
uint64_t DefaultHostMemoryLimit(uint64_t configured, uint64_t ram_bytes);
// Physical RAM of this machine (sysconf; MemTotal).
uint64_t HostRamBytes();

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
  uint64_t device_fixed_bytes = 0;  // a CPU device's own weight copy (0 on a GPU)
  uint64_t spill_disk_bytes = 0;    // offload_nvme activations (per micro-batch)
};

struct HostMemoryPrediction {
  uint64_t arena = 0, checkpoints = 0, device = 0, processes = 0;
  uint64_t total = 0;       // RAM
  uint64_t disk_bytes = 0;  // the store directories
  uint64_t nvme_params = 0;  // parameters whose states are on NVMe
  std::string Describe() const;  // "host RAM 12.3 GiB (arena ..., ...); disk ..."
};

HostMemoryPrediction PredictHostMemory(const HostMemoryInputs& in);

// How the caller's user changes what a refusal suggests: flags for offloadd-train, spec fields for
// the daemon.
struct HostMemoryNames {
  std::string limit = "--host-memory-limit";
  std::string nvme = "--tier=nvme --nvme-dir=DIR";
  std::string batch = "--batch-size";
  bool nvme_configured = true;  // store directories exist (the daemon: storage.directories)
};

// OK when the prediction fits `limit`; else RESOURCE_EXHAUSTED with the prediction, the limit and
// where it came from (`limit_source`), and the smallest changes that would fit: a lower
// micro-batch, the states on NVMe (with its RAM and disk), a higher limit up to 90% of the RAM.
Status CheckHostMemory(const HostMemoryInputs& in, uint64_t limit, const std::string& limit_source,
                       uint64_t ram_bytes, const HostMemoryNames& names = {});

// The disk term of a step with `nvme_params` parameters' states on NVMe: each is read and written
// once per step (fp32 master, exp_avg, exp_avg_sq: 12 B each way) at the store's measured rates;
// 0 when nothing is on NVMe or a rate is unknown.
double NvmeStepSeconds(uint64_t nvme_params, double read_bytes_per_s, double write_bytes_per_s);

}  // namespace offloadd::trainer
