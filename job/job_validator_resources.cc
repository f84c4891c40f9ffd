#include <algorithm>
#include <string>

#include "common/units.h"
#include "job/job_validator_checks.h"
#include "job/memory_estimate.h"

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

int ComputeBytes(const v1::JobSpec& spec, bool gpu) {
  const v1::ComputeDtype dtype = spec.model().compute_dtype();
  return dtype == v1::COMPUTE_DTYPE_FP32 || (!gpu && dtype == v1::COMPUTE_DTYPE_UNSPECIFIED) ? 4
                                                                                             : 2;
}

// resources.hosts: resources.gpus_per_host ranks per host, each host its own daemon (this one and
// the first hosts-1 of cluster.peers); what the trainer does not build across hosts is refused
// here by name, before anything starts.
void CheckHosts(const v1::JobSpec& spec, const NodeBudget& node, Checker& c) {
  const auto& res = spec.resources();
  const int64_t hosts = std::max<int64_t>(1, res.hosts());
  if (hosts == 1) {
    if (res.gpus_per_host() > 1) {
      c.Add("resources.gpus_per_host",
            "is for a job across hosts (resources.hosts > 1); a job on one host sets "
            "resources.gpus");
    }
    return;
  }
  if (hosts > node.cluster_hosts) {
    c.Add("resources.hosts",
          "this daemon's cluster has " + std::to_string(node.cluster_hosts) +
              " host(s) (itself and cluster.peers in its configuration); the job asks for " +
              std::to_string(hosts));
  }
  // resources.gpus_per_host: that many executors on every host, bounded by this host's GPUs (or
  // cores on a node without GPUs) as resources.gpus is; each peer checks its own when it reserves.
  const int64_t per_host = std::max<int64_t>(1, res.gpus_per_host());
  const int gpu_count = static_cast<int>(node.gpus.size());
  if (gpu_count > 0 && per_host > gpu_count) {
    c.Add("resources.gpus_per_host", "this node has " + std::to_string(gpu_count) +
                                         " GPU(s); the job asks for " + std::to_string(per_host));
  } else if (gpu_count == 0 && per_host > std::max(1, node.cpu_cores)) {
    c.Add("resources.gpus_per_host", "this node has no GPU; at most one CPU executor per core (" +
                                         std::to_string(node.cpu_cores) +
                                         ") can stand in for GPUs, got " +
                                         std::to_string(per_host));
  }
  if (res.gpus() > 1) {
    c.Add("resources.gpus", "a job across hosts sets resources.gpus_per_host, not gpus");
  }
  if (res.has_gpu_index() && res.gpu_index() >= 0) {
    c.Add("resources.gpu_index", "pins a GPU of one host; a job across hosts gets free ones");
  }
  const auto& opt = spec.offload().offload_optimizer();
  if (opt.device() == v1::OFFLOAD_DEVICE_NVME) {
    c.Add("offload.offload_optimizer.device",
          "nvme is not built across hosts (each host's states are in its RAM)");
  }
  if (opt.device() == v1::OFFLOAD_DEVICE_NONE || opt.has_ratio()) {
    c.Add(opt.has_ratio() ? "offload.offload_optimizer.ratio" : "offload.offload_optimizer.device",
          "optimizer states on the GPU are not built across hosts (they stay in each host's RAM)");
  }
  if (spec.compression().type() == v1::COMPRESSION_TYPE_LSP) {
    c.Add("compression.type", "lsp is not built across hosts");
  }
}

void CheckResources(const v1::JobSpec& spec, const NodeBudget& node, Checker& c) {
  const auto& res = spec.resources();
  // 0 is also the unset value (proto3), so it stands for "the CPU" on a node without GPUs.
  const int gpu_count = static_cast<int>(node.gpus.size());
  // Jobs train on the GPU whenever the node has one; this node has one it cannot drive.
  if (!node.gpu_driver_problem.empty()) {
    c.Add("resources", "this node has an NVIDIA GPU it cannot use: " + node.gpu_driver_problem +
                           "; the job would train on the CPU instead, so it is refused");
  }
  if (res.gpu_index() < -1 || res.gpu_index() >= std::max(gpu_count, 1)) {
    c.Add("resources.gpu_index", "this node has " + std::to_string(node.gpus.size()) +
                                     " GPU(s); got index " + std::to_string(res.gpu_index()));
  }
  // resources.gpus: one executor per GPU. A node without GPUs runs that many CPU executors (the
  // data-parallel group over Gloo), bounded by its cores.
  const int64_t executors = std::max<int64_t>(1, res.gpus());
  if (gpu_count > 0 && executors > gpu_count) {
    c.Add("resources.gpus", "this node has " + std::to_string(gpu_count) +
                                " GPU(s); the job asks for " + std::to_string(executors));
  } else if (gpu_count == 0 && executors > std::max(1, node.cpu_cores)) {
    c.Add("resources.gpus", "this node has no GPU; at most one CPU executor per core (" +
                                std::to_string(node.cpu_cores) + ") can stand in for GPUs, got " +
                                std::to_string(executors));
  }
  if (executors > 1 && res.has_gpu_index() && res.gpu_index() >= 0) {
    c.Add("resources.gpu_index",
          "pins a one-GPU job; a job on " + std::to_string(executors) +
              " GPUs gets free ones from the scheduler (leave gpu_index unset)");
  }
  CheckHosts(spec, node, c);
  if (spec.compression().type() == v1::COMPRESSION_TYPE_LSP && !node.gpus.empty() &&
      spec.model().compute_dtype() != v1::COMPUTE_DTYPE_UNSPECIFIED &&
      spec.model().compute_dtype() != v1::COMPUTE_DTYPE_BF16) {
    c.Add("model.compute_dtype",
          "lsp compression on a GPU computes in bf16 (leave compute_dtype unset or bf16)");
  }
}

void PriceStep(const v1::JobSpec& spec, const engine::ModelConfig& config, const NodeBudget& node,
               ValidationResult* r) {
  const auto& res = spec.resources();
  const bool gpu = !node.gpus.empty();
  const int compute_bytes = ComputeBytes(spec, gpu);
  const bool auto_batch = spec.training().auto_find_batch_size();
  const int64_t floor_batch = auto_batch ? 1 : spec.training().per_device_train_batch_size();
  const int gi = res.gpu_index() >= 0 && res.gpu_index() < static_cast<int>(node.gpus.size())
                     ? res.gpu_index()
                     : 0;
  // The device reads the fp32 masters except on the NVMe tier's 16-bit compute
  // (ArenaWeightsAreFp32).
  const bool nvme = spec.offload().offload_optimizer().device() == v1::OFFLOAD_DEVICE_NVME;
  r->step_estimate =
      auto_batch
          ? StepEstimateUnavailable(
                "per_device_train_batch_size auto is priced when the job "
                "starts (its log lists each candidate's price)")
          : EstimateJobStep(
                node.profile_dir, gpu ? node.gpus[gi].name : "", config, r->model_size, floor_batch,
                spec.training().gradient_accumulation_steps(), spec.dataset().max_seq_length(),
                compute_bytes, spec.training().max_grad_norm() > 0,
                static_cast<int64_t>(r->host_memory.nvme_params), compute_bytes == 4 || !nvme);
}

void CheckGpuMemory(const v1::JobSpec& spec, const engine::ModelConfig& config,
                    const NodeBudget& node, uint64_t gpu_memory_limit, Checker& c,
                    ValidationResult* r) {
  const auto& res = spec.resources();
  const auto& ds = spec.dataset();
  r->model_size = EstimateModelSize(config);
  const bool gpu = !node.gpus.empty();
  const int compute_bytes = ComputeBytes(spec, gpu);
  // The automatic batch size needs its smallest candidate, micro-batch 1, to fit.
  const bool auto_batch = spec.training().auto_find_batch_size();
  const int64_t floor_batch = auto_batch ? 1 : spec.training().per_device_train_batch_size();
  r->memory_floor =
      EstimateMemoryFloor(r->model_size, config, floor_batch, ds.max_seq_length(), compute_bytes);
  const MemoryFloor& f = r->memory_floor;
  if (gpu) {
    const int idx = res.gpu_index() >= 0 && res.gpu_index() < static_cast<int>(node.gpus.size())
                        ? res.gpu_index()
                        : 0;
    // A job of this shape ran here before: its measured working set replaces the estimate.
    if (auto p = ProfiledGpuFloor(node.profile_dir, node.gpus[idx].name, config, r->model_size,
                                  floor_batch, ds.max_seq_length(), compute_bytes)) {
      r->memory_floor.gpu_bytes = p->gpu_bytes;
      r->memory_floor.gpu_breakdown = p->source;
    }
    const uint64_t card = node.gpus[idx].total_memory_bytes;
    const uint64_t limit = gpu_memory_limit ? gpu_memory_limit : card;
    if (limit > card) {
      c.Add("resources.gpu_memory_limit", FormatByteSize(limit) + " is more than GPU " +
                                              std::to_string(idx) + "'s " + FormatByteSize(card));
    } else if (limit < f.gpu_bytes) {
      const int64_t batch = floor_batch;
      const int64_t fits = LargestBatchWithin(r->model_size, config, ds.max_seq_length(),
                                              compute_bytes, limit, batch);
      const int64_t seq_fits = fits > 0
                                   ? 0
                                   : LargestSeqLengthWithin(r->model_size, config, 1, compute_bytes,
                                                            limit, ds.max_seq_length() - 8);
      c.Add(res.gpu_memory_limit() ? "resources.gpu_memory_limit"
                                   : "training.per_device_train_batch_size",
            "the GPU budget of " + FormatByteSize(limit) + " is below the " +
                FormatByteSize(f.gpu_bytes) + " this model needs at " +
                (auto_batch ? "micro-batch 1 (the automatic batch size's smallest)"
                            : "batch " + std::to_string(batch)) +
                " x " + std::to_string(ds.max_seq_length()) + " tokens (" + f.gpu_breakdown +
                "); the smallest budget for this batch is " + FormatByteSize(f.gpu_bytes) +
                ", and " +
                (fits > 0
                     ? "the largest batch within " + FormatByteSize(limit) + " is " +
                           std::to_string(fits)
                     : "not even batch 1 fits within " + FormatByteSize(limit) +
                           " at this max_seq_length" +
                           (seq_fits > 0
                                ? " (the largest dataset.max_seq_length that fits at batch 1 is " +
                                      std::to_string(seq_fits) + ")"
                                : "")) +
                " (per_device_train_batch_size, with gradient_accumulation_steps to keep the "
                "global batch)");
    } else if (const v1::OffloadTarget& opt = spec.offload().offload_optimizer();
               opt.device() == v1::OFFLOAD_DEVICE_NONE || opt.has_ratio()) {
      // States asked onto the GPU (none: all; ratio: 1 - ratio of them) add 12 B per parameter
      // (fp32 master, exp_avg, exp_avg_sq) to the floor.
      const bool all = opt.device() == v1::OFFLOAD_DEVICE_NONE;
      const double share = all ? 1.0 : 1.0 - opt.ratio();
      const auto states =
          static_cast<uint64_t>(share * 12.0 * static_cast<double>(r->model_size.total_params));
      if (share >= 0 && share <= 1 && limit < f.gpu_bytes + states) {
        c.Add(all ? "offload.offload_optimizer.device" : "offload.offload_optimizer.ratio",
              "the GPU budget of " + FormatByteSize(limit) + " is below the " +
                  FormatByteSize(f.gpu_bytes + states) + " needed with " + FormatByteSize(states) +
                  " of optimizer states on the GPU (" + f.gpu_breakdown +
                  "); keep more of them on the CPU (a higher ratio), or leave ratio unset to place "
                  "what fits");
      }
    }
  }
}

}  // namespace offloadd::daemon
