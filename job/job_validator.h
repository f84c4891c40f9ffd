#pragma once
// Validation of a JobSpec before anything is queued: every problem the daemon can find without
// training is reported at once, each with its field path relative to JobSpec
// ("training.learning_rate", "dataset.paths[1]"), so a user fixes a spec in one round trip.
//
// Checks: paths exist and resolve under the allowed roots; config.json parses and the
// architecture is supported; the tokenizer loads; the first records of every dataset parse and
// encode; hyperparameters are in range; no setting the pipeline does not implement is asked for
// (unsupported_options.h); memory budgets are feasible on this node (floors from
// memory_estimate.h). The result also carries the spec with defaults filled in and paths
// canonicalised: what the job would actually run with. Thread-safe (no shared state).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "job/memory_estimate.h"
#include "job/node_facts.h"
#include "job/path_policy.h"
#include "jobspec/field_violation.h"
#include "jobspec/job_defaults.h"
#include "jobspec/training_rules.h"  // ApplyJobDefaults, CheckTrainingValues
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

// Bounds on what a job record carries (documented in docs/; checked first, before any path is
// opened). The CreateJob request as a whole is bounded by server.max_request_bytes.
inline constexpr size_t kMaxDisplayNameBytes = 256;
inline constexpr size_t kMaxLabels = 64;
inline constexpr size_t kMaxLabelKeyBytes = 64;
inline constexpr size_t kMaxLabelValueBytes = 256;
inline constexpr size_t kMaxPathBytes = 4096;
inline constexpr size_t kMaxDatasetPaths = 256;
inline constexpr size_t kMaxLayerOverrides = 4096;
inline constexpr size_t kMaxRequestIdBytes = 128;
// The whole spec, serialized: 256 dataset and 256 eval paths of 4 KB each made a 2.1 MB job
// record that broke `offloadctl list` for everyone.
inline constexpr size_t kMaxJobSpecBytes = 256u << 10;

// What this node offers; filled from the node probe and the daemon config.
struct NodeBudget {
  uint64_t host_memory_bytes = 0;         // physical RAM
  uint64_t host_memory_limit = 0;         // daemon default for host_memory_limit (0: what the
                                          // node can give safely, trainer::DefaultHostMemoryLimit)
  // MemAvailable, the cgroup's memory.max and memory.current, memlock (trainer::ProbeNodeMemory);
  // total 0: host_memory_bytes with nothing else known.
  trainer::NodeMemory host_memory;
  uint64_t gpu_memory_limit = 0;          // daemon default per-job GPU budget (0 = GPU's memory)
  std::vector<GpuFacts> gpus;
  int cpu_cores = 1;                      // logical cores: the bound of CPU executors (resources.gpus)
  // Hosts a job may span (resources.hosts): this daemon and its cluster.peers.
  int cluster_hosts = 1;
  // Why this node's NVIDIA GPU cannot be used (its driver is too old for the bundled CUDA runtime,
  // node/gpu_driver.h); every job is refused while it is set, rather than trained on the CPU.
  std::string gpu_driver_problem;
  std::vector<StoreDirFacts> store_dirs;  // the daemon's configured NVMe store directories
  // Configured store directories that cannot be used now (missing, not writable), with why.
  std::vector<StoreDirFacts> unusable_store_dirs;
  std::string profile_dir;  // <state_dir>/profiles: measured floors
  // The daemon's storage.aio: a job's offload.aio defaults to it.
  uint64_t aio_block_size = 1u << 20;
  uint32_t aio_queue_depth = 32;
};

// The defaults this node and the daemon's configuration give a job (ResolveJobDefaults).
JobDefaults JobDefaultsOf(const NodeBudget& node);

// What one CreateJob's validation may spend, over all its files and records together (each
// rendering was bounded, but 8 preview records of each of 512 paths, the same file allowed 512
// times, made ~94 CPU-minutes for one request). Repeated paths are checked once.
inline constexpr uint64_t kMaxValidationRenderSteps =
    16'000'000;  // ~8 s of chat template rendering
inline constexpr uint64_t kMaxValidationPreviewBytes = 256ull << 20;  // dataset bytes read
inline constexpr int kMaxValidationPreviewRecords = 64;  // records encoded, all files together

struct ValidationOptions {
  // Asked between files and records and every few thousand template steps; once it returns true,
  // validation ends early with ValidationResult::stopped (the client cancelled the call or its
  // deadline passed: nobody waits for the answer). Empty: never stops early.
  std::function<bool()> stop;
  uint64_t max_render_steps = kMaxValidationRenderSteps;
  uint64_t max_preview_bytes = kMaxValidationPreviewBytes;
  // Each distinct file gets kDatasetPreviewRecords of these, fewer when there are many files (at
  // least one record each).
  int max_preview_records = kMaxValidationPreviewRecords;
  // A CreateJob retry: the client already created a job with this request_id (JobManager::Submit
  // looks it up before validating), which gets that job back (or AlreadyExists for another spec),
  // so the checkpoints that job wrote into output_dir are no reason to refuse it.
  bool retry_of_created_job = false;
};

struct ValidationResult {
  // CANCELLED when ValidationOptions::stop ended validation early (the violations are then
  // incomplete and the result must not be used).
  Status stopped;
  std::vector<FieldViolation> violations;
  offloadd::v1::JobSpec resolved;  // defaults filled, paths canonical (meaningful when valid)
  ModelSize model_size;
  MemoryFloor memory_floor;
  // The model as the engine assembles it (engine::DescribeParts); empty when config.json was not
  // read. model_type and architectures[0] of its config.json.
  std::string model_type, model_architecture, model_parts;
  offloadd::v1::StepEstimate step_estimate;  // the step priced on this node (EstimateJobStep)
  // Host RAM and disk as the trainer would plan them (job/host_memory.h), the limit they were
  // checked against, and the host RAM and disk with every state in RAM or all on NVMe.
  trainer::HostMemoryPrediction host_memory;
  uint64_t host_memory_limit = 0;
  uint64_t ram_tier_host_bytes = 0, nvme_tier_host_bytes = 0, nvme_tier_disk_bytes = 0;
  // The largest-trainable arithmetic for this job under that limit and the store directories'
  // free space (job/capacity.h: CapacityFigures::Describe); empty before the host memory check.
  std::string capacity_text;
  bool ok() const { return violations.empty(); }
};

// Number of dataset records read and encoded per file to check it.
inline constexpr int kDatasetPreviewRecords = 8;

ValidationResult ValidateJobSpec(const offloadd::v1::JobSpec& spec, const PathPolicy& paths,
                                 const NodeBudget& node, const ValidationOptions& options = {});

}  // namespace offloadd::daemon
