// Trainer in a data-parallel group (docs/data_parallel.md): joining the group, the one
// host optimizer (rank 0 creates it, the other ranks attach to its arena), the shared stop
// decision between steps, and a resume on ranks > 0 (rank 0 restores the states).
#include <algorithm>
#include <sstream>

#include "trainer/state/checkpoint.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {

Status Trainer::Impl::StartGroup() {
  const ParallelConfig& p = cfg.parallel;
  if (p.world_size < 1) return InvalidArgumentError("parallel.world_size must be >= 1");
  if (p.world_size == 1) return OkStatus();
  const std::string what = "data parallelism (" + std::to_string(p.world_size) + " ranks)";
  // What the group does not support yet is refused by name rather than run wrongly.
  if (cfg.lsp.enabled) return UnimplementedError(what + " with LSP compression is not built yet");
  if (cfg.auto_batch_size && p.hosts > 1) {
    return UnimplementedError(
        what +
        " across hosts with per_device_train_batch_size auto is not built yet "
        "(its pricing covers the ranks of one host); give the micro-batch per rank");
  }
  if ((cfg.offload.device_optimizer_blocks != 0 || cfg.offload.device_optimizer_share >= 0) &&
      cfg.offload.tier == StateTier::kNvme) {
    return UnimplementedError(what + " with optimizer states on the GPU and the NVMe tier is not built yet "
                              "(the other ranks read the states they start from in rank 0's arena)");
  }
  bool nvme_activations = cfg.offload.activations == ActivationMode::kOffloadNvme;
  for (const auto& [layer, mode] : cfg.offload.layer_overrides) nvme_activations |= mode == ActivationMode::kOffloadNvme;
  if (nvme_activations) return UnimplementedError(what + " with activations offloaded to NVMe is not built yet");
  RETURN_IF_ERROR(CheckAcrossHosts(what));
  ASSIGN_OR_RETURN(dp, DataParallel::Create(p, device));
  if (!cfg.trace_path.empty() && dp->rank() > 0) cfg.trace_path += ".rank" + std::to_string(dp->rank());
  const std::string hosts = p.hosts > 1 ? ", ZeRO-1 across " + std::to_string(p.hosts) +
                                              " hosts: this host's slice of the states"
                                        : "";
  Log(TrainObserver::Level::kInfo,
      "data parallel: rank " + std::to_string(dp->rank()) + " of " + std::to_string(dp->world()) +
          hosts + " (" + dp->backend_name() + ", " + p.rendezvous + ", " + device.str() +
          "), micro-batch " +
          (cfg.auto_batch_size ? std::string("auto") : std::to_string(cfg.batch_size)) +
          " per rank, group timeout " + std::to_string(p.timeout_seconds) + " s");
  return OkStatus();
}

Status Trainer::Impl::CreateHostOptimizer(HostOptimizerOptions ho) {
  if (!dp) {
    ASSIGN_OR_RETURN(host, HostOptimizer::Create(ho));
    return OkStatus();
  }
  if (across_hosts()) {  // each host its own arena, holding its slice of every block
    for (int b = 0; b < n; ++b) {  // every rank refuses alike: the last host's slice is empty
      const int64_t numel = static_cast<int64_t>(layout[b].numel);
      const int64_t chunk = dp->Padded(numel) / dp->world();
      if (int64_t{cfg.parallel.hosts - 1} * ranks_per_host() * chunk >= numel) {
        return UnimplementedError("block " + std::to_string(b) + " (" +
                                  std::to_string(layout[b].numel) +
                                  " parameters) is too small to split across " +
                                  std::to_string(cfg.parallel.hosts) + " hosts (parallel.hosts)");
      }
    }
    ho = SliceOptions(std::move(ho));
    if (ranks_per_host() == 1) {
      ASSIGN_OR_RETURN(host, HostOptimizer::Create(ho));
      return OkStatus();
    }
  }
  // The ranks of one host share its leader's arena (across hosts: keys per host).
  const std::string suffix = across_hosts() ? "/" + std::to_string(host_index()) : "";
  const double timeout = static_cast<double>(cfg.parallel.timeout_seconds);
  if (host_leader()) {
    ASSIGN_OR_RETURN(link, GroupLink::Create(ranks_per_host(), n, timeout));
    ho.group = link.get();
    ASSIGN_OR_RETURN(host, HostOptimizer::Create(ho));
    RETURN_IF_ERROR(dp->Set("link" + suffix, link->Path()));
    return dp->Set("arena" + suffix, host->ArenaPath());
  }
  ASSIGN_OR_RETURN(const std::string link_path, dp->Get("link" + suffix));
  ASSIGN_OR_RETURN(link, GroupLink::Attach(link_path, local_rank(), timeout));
  ho.group = link.get();
  ho.combine_sq_norm = nullptr;  // the host's leader takes the decision
  ASSIGN_OR_RETURN(ho.leader_arena_path, dp->Get("arena" + suffix));
  ASSIGN_OR_RETURN(host, HostOptimizer::Create(ho));
  return OkStatus();
}

StatusOr<bool> Trainer::Impl::StopAtBoundary() {
  if (across_hosts()) {  // no shared segment: rank 0's decision goes through the store
    const std::string key = "stop/" + std::to_string(completed);
    if (!leader()) {
      StatusOr<std::string> v = dp->Get(key);
      if (!v.ok()) return v.status();
      return *v == std::string("1");
    }
    const bool stop = obs != nullptr && obs->StopRequested();
    RETURN_IF_ERROR(dp->Set(key, stop ? "1" : "0"));
    return stop;
  }
  if (!link) return obs != nullptr && obs->StopRequested();
  if (leader()) {
    const bool stop = obs != nullptr && obs->StopRequested();
    link->PublishBoundary(completed, stop);
    return stop;
  }
  return link->WaitBoundary(completed);
}

Status Trainer::Impl::PublishDevicePlan(int device_block_count) {
  if (!dp) return OkStatus();
  std::string kept;
  for (int b = 0; b < n; ++b) {
    if (device_plan.modes[b] == engine::SaveMode::kKeep) kept += " " + std::to_string(b);
  }
  return dp->Set("device-plan", std::to_string(device_block_count) + kept);
}

Status Trainer::Impl::FollowDevicePlan() {
  device_plan.device_placement_pending = false;
  RETURN_IF_ERROR(pipeline.accounting->Flush());
  ASSIGN_OR_RETURN(const std::string text, dp->Get("device-plan"));
  std::istringstream in(text);
  int count = 0;
  in >> count;
  std::string kept_list;
  for (int b; in >> b;) {
    if (b < 0 || b >= n) return InternalError("rank 0's plan names block " + std::to_string(b));
    device_plan.modes[b] = engine::SaveMode::kKeep;
    pipeline.schedule->SetMode(b, engine::SaveMode::kKeep);
    kept_list += " " + std::to_string(b);
  }
  if (count < 0 || count > n) return InternalError("rank 0's plan places " + std::to_string(count) + " blocks");
  if (count > 0) RETURN_IF_ERROR(MoveStatesToDevice(count));
  Log(TrainObserver::Level::kInfo, "rank " + std::to_string(dp->rank()) + " follows rank 0's plan: " +
                                       std::to_string(count) + " blocks' AdamW states on this GPU, activations kept in blocks" +
                                       (kept_list.empty() ? " none" : kept_list));
  return OkStatus();
}

}  // namespace offloadd::trainer
