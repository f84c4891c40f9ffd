// The step planner in the trainer: after the first step (the second on CUDA), the
// node profile and that step's measurements price every placement of AdamW states and kept
// activations (job/step_planner.h); the fastest feasible one is applied before the second step.
// Two steps later the measured step time is logged beside the prediction, and the plan is re-solved
// once when they differ by more than 10%.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/units.h"
#include "job/batch_planner.h"
#include "job/capacity.h"
#include "job/checkpoint_placement.h"
#include "job/state_placement.h"
#include "trainer/plan/node_profile.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {
namespace {

constexpr double kRecheckTolerance = 0.10;

}  // namespace

Status Trainer::Impl::CheckHostMemory() {
  NodeMemory node = ProbeNodeMemory();
  node.pinned = cuda;
  const bool named = cfg.offload.host_memory_limit > 0;
  const HostMemoryLimit node_limit = DefaultHostMemoryLimit(0, node);
  const uint64_t limit = named ? cfg.offload.host_memory_limit : node_limit.bytes;
  // Applied from here on (the arena's own check, the batch planner's CPU activations).
  cfg.offload.host_memory_limit = limit;
  // Data parallel: the leader's arena is the node's; the other ranks attach to it. Across hosts
  // each host's leader prices its host's share: its slice of the states, and the whole weights
  // its ranks read (trainer_hosts.cc).
  if (across_hosts() ? !host_leader() : !leader()) return OkStatus();
  HostMemoryInputs in;
  in.optimizer = across_hosts() ? SliceOptions(HostOptions()) : HostOptions();
  if (across_hosts()) {  // the whole weights its ranks read, one copy per host
    uint64_t whole = 0;
    for (const auto& bl : layout) whole += bl.numel;
    in.device_fixed_bytes = whole * (ArenaWeightsAreFp32(in.optimizer) ? 4 : 2);
  }
  in.cuda = cuda;
  in.micro = cfg.batch_size;
  const MemoryEstimate est = EstimateMemory(cfg.batch_size);
  uint64_t largest_keep = 0;  // the offload_nvme blocks' largest record
  for (int b = 0; b < n; ++b) {
    const auto recompute = static_cast<uint64_t>(est.cost[b].saved_bytes_recompute);
    const auto keep = static_cast<uint64_t>(est.cost[b].saved_bytes_keep);
    if (device_plan.offload_checkpoint[b]) in.checkpoint_bytes += recompute;
    if (device_plan.spill_nvme[b]) in.spill_disk_bytes += keep;
    if (device_plan.spill_nvme[b]) largest_keep = std::max<uint64_t>(largest_keep, keep);
    // The CPU device's activations are host RAM too (an offloaded checkpoint is counted above).
    if (!cuda && !device_plan.spill_nvme[b] && !device_plan.offload_checkpoint[b]) {
      in.device_batch_bytes += device_plan.modes[b] == engine::SaveMode::kKeep ? keep : recompute;
    }
  }
  if (across_hosts()) in.device_batch_bytes *= static_cast<uint64_t>(ranks_per_host());
  in.optimizer.nvme_blocks.clear();
  in.optimizer.nvme_weight_blocks.clear();
  in.nvme_weights_allowed = cfg.offload.param_tier != OffloadPlanConfig::ParamTier::kCpu;
  in.nvme_weights_forced = cfg.offload.param_tier == OffloadPlanConfig::ParamTier::kNvme;
  const uint64_t disk_free = StoreDirsFreeBytes(cfg.offload.nvme_dirs);
  StatePlacement placed;
  if (in.optimizer.tier == StateTier::kNvme &&
      (named || PredictHostMemory(in).disk_bytes > disk_free)) {
    // A named limit, or a disk too small for every block: RAM holds the states of as many blocks
    // as the limit allows, NVMe the rest (job/state_placement.h), then the weights.
    ASSIGN_OR_RETURN(placed, PlaceStatesUnderLimit(&in, limit, disk_free));
    device_plan.state_placement_text = placed.Describe();
  } else {
    // Every block's states on NVMe: their weights follow (offload_param nvme), or go there only
    // where the limit needs it (auto).
    placed = PlaceWeightsOnNvme(&in, limit);
    if (in.optimizer.tier == StateTier::kNvme && PredictHostMemory(in).disk_bytes > disk_free) {
      // Their weights do not fit the disk beside the states: placed under the limit (refused
      // with the numbers when even that does not fit).
      ASSIGN_OR_RETURN(placed, PlaceStatesUnderLimit(&in, limit, disk_free));
      device_plan.state_placement_text = placed.Describe();
    }
  }
  device_plan.nvme_blocks = in.optimizer.nvme_blocks;
  device_plan.nvme_weight_blocks = in.optimizer.nvme_weight_blocks;
  device_plan.weight_placement_text = placed.DescribeWeights();
  in.spill_buffer_bytes = ActivationSpillBufferBytes(largest_keep, 0);
  RETURN_IF_ERROR(PlaceLayerInputs(&in, limit, disk_free));
  const HostMemoryPrediction p = PredictHostMemory(in);
  StepPrediction& out = prediction;
  out.host_bytes = p.total;
  out.disk_bytes = p.disk_bytes;
  out.host_limit = limit;
  {  // the two tiers side by side, for --validate-only
    HostMemoryInputs t = in;
    t.optimizer.tier = StateTier::kCpu;
    out.ram_tier_host_bytes = PredictHostMemory(t).total;
    t.optimizer.tier = StateTier::kNvme;
    const HostMemoryPrediction q = PredictHostMemory(t);
    out.nvme_tier_host_bytes = q.total;
    out.nvme_tier_disk_bytes = q.disk_bytes;
    if (planner.node_profile) {
      out.nvme_tier_disk_seconds =
          NvmeStepSeconds(q.nvme_params, planner.node_profile->store_read_bytes_per_s,
                          planner.node_profile->store_write_bytes_per_s,
                          workers::StateBytesPerParam(optimizer_mode));
    }
  }
  const std::string source = named ? "host_memory_limit" : node_limit.source;
  out.host_text = (across_hosts() ? "host " + std::to_string(host_index()) + " of " +
                                        std::to_string(cfg.parallel.hosts) + ", its share: "
                                  : std::string()) +
                  p.Describe() + " within the host memory limit of " + FormatByteSize(limit) +
                  " (" + source + ")";
  if (!device_plan.state_placement_text.empty()) {
    out.host_text += "; optimizer states per block: " + device_plan.state_placement_text;
  } else if (!device_plan.weight_placement_text.empty()) {
    out.host_text += "; " + device_plan.weight_placement_text;
  }
  if (!device_plan.checkpoint_placement_text.empty())
    out.host_text += "; " + device_plan.checkpoint_placement_text;
  // The largest-trainable arithmetic (job/capacity.h): this job against what the limit and the
  // store directories hold, and the bytes per parameter beyond the mode's floor.
  out.host_text += "; " + JobCapacity(in, limit, disk_free).Describe();
  HostMemoryNames names;
  names.limit = "resources.host_memory_limit, --host-memory-limit";
  names.nvme = "offload_optimizer.device: nvme, --tier=nvme --nvme-dir=DIR";
  if (across_hosts()) names.nvme.clear();  // not built across hosts
  names.batch = "per_device_train_batch_size, --batch-size";
  names.param_nvme = "offload_param.device: nvme, --param-tier=nvme";
  names.nvme_configured = !cfg.offload.nvme_dirs.empty();
  names.nvme_dir = "nvme_path, --nvme-dir=DIR";
  const Status fits = trainer::CheckHostMemory(in, limit, source, node_limit.bytes, names);
  if (!fits.ok() && across_hosts()) {
    return Status(fits.code(), "host " + std::to_string(host_index()) + " of " +
                                   std::to_string(cfg.parallel.hosts) +
                                   " (its 1/H of the optimizer states and the whole weights its "
                                   "ranks read): " +
                                   std::string(fits.message()));
  }
  RETURN_IF_ERROR(fits);
  Log(TrainObserver::Level::kInfo, "host memory: " + out.host_text);
  return OkStatus();
}

Status Trainer::Impl::PlaceLayerInputs(HostMemoryInputs* in, uint64_t limit, uint64_t disk_free) {
  CheckpointPlacementInputs ci;
  ci.bytes.assign(n, 0);
  bool any = false;
  const MemoryEstimate est = EstimateMemory(cfg.batch_size);
  for (int b = 0; b < n; ++b) {
    if (!device_plan.offload_checkpoint[b]) continue;
    ci.bytes[b] = static_cast<uint64_t>(est.cost[b].saved_bytes_recompute);
    any = true;
  }
  const HostMemoryPrediction p = PredictHostMemory(*in);
  if (!any || limit == 0 || p.total <= limit) return OkStatus();
  ci.ram_over = p.total - limit;
  ci.nvme_configured = !cfg.offload.nvme_dirs.empty();
  // The spill's own store process (kStoreProcessBytes), unless the prediction has one already.
  if (in->spill_disk_bytes == 0 && in->optimizer.tier != StateTier::kNvme)
    ci.ram_over += kStoreProcessBytes;
  ci.largest_keep_record = 0;
  for (int b = 0; b < n; ++b) {
    if (device_plan.spill_nvme[b]) {
      ci.largest_keep_record = std::max<uint64_t>(
          ci.largest_keep_record, static_cast<uint64_t>(est.cost[b].saved_bytes_keep));
    }
  }
  ci.accumulation = static_cast<int>(cfg.gradient_accumulation_steps);
  CheckpointPlacement placed = PlaceCheckpoints(ci);
  if (placed.moved == 0) return OkStatus();  // CheckHostMemory refuses with the numbers
  // Priced: the store's rates (the node profile's) against the step's compute (its flops at the
  // rate of a GEMM of the model's MLP shape, recompute included).
  ASSIGN_OR_RETURN(const NodeProfile prof, PlanNodeProfile());
  ci.write_bytes_per_s = prof.store_write_bytes_per_s;
  ci.read_bytes_per_s = prof.store_read_bytes_per_s;
  double flops = 0;
  for (int b = 0; b < n; ++b) {
    const double f = est.cost[b].forward_flops;
    flops += b == n - 1 ? f : (device_plan.modes[b] == engine::SaveMode::kRecompute ? 4 : 3) * f;
  }
  ci.compute_seconds = ci.accumulation * flops * SecondsPerFlop(cfg.batch_size);
  placed = PlaceCheckpoints(ci);
  RETURN_IF_ERROR(CheckCheckpointDisk(placed, PredictHostMemory(*in).disk_bytes, disk_free));
  device_plan.checkpoint_nvme = placed.to_nvme;
  in->checkpoint_bytes = placed.ram_bytes;
  in->spill_disk_bytes += placed.disk_bytes;
  in->spill_buffer_bytes = placed.buffer_bytes;
  device_plan.checkpoint_placement_text = placed.Describe(ci);
  Log(TrainObserver::Level::kInfo,
      "host memory: the offloaded layer inputs do not all fit the host memory limit of " +
          FormatByteSize(limit) + " in pinned RAM (" + FormatByteSize(ci.ram_over) + " over); " +
          device_plan.checkpoint_placement_text);
  return OkStatus();
}

void Trainer::Impl::AddNvmeLayerInputs(PlanInputs* in, int micro, int64_t seq,
                                       const NodeProfile& prof) const {
  double bytes = 0;
  for (int b = 0; b < n; ++b) {
    if (b < static_cast<int>(device_plan.checkpoint_nvme.size()) &&
        device_plan.checkpoint_nvme[b]) {
      bytes += static_cast<double>(
          model->block(b).EstimateCost(micro, seq, dtype).saved_bytes_recompute);
    }
  }
  in->nvme_activation_bytes = bytes * static_cast<double>(cfg.gradient_accumulation_steps);
  if (bytes > 0 && in->nvme_read_bytes_per_s <= 0) {
    in->nvme_read_bytes_per_s = prof.store_read_bytes_per_s;
    in->nvme_write_bytes_per_s = prof.store_write_bytes_per_s;
  }
}

Status Trainer::Impl::PlaceDeviceBlocks() {
  if (!leader()) return FollowDevicePlan();  // data parallel: rank 0 plans for every GPU
  device_plan.device_placement_pending = false;
  RETURN_IF_ERROR(pipeline.accounting->Flush());  // step 1's figures: GPU time and bytes moved
  const StepStats& first = pipeline.accounting->last_stats();
  ASSIGN_OR_RETURN(const NodeProfile prof, PlanNodeProfile());

  const int64_t B = cfg.batch_size;
  const int64_t T = SeqLength();
  const std::vector<int64_t> need = DeviceOptimizerNeeds(pipeline.weights->resident());
  const bool may_keep =
      cfg.offload.activations == ActivationMode::kAuto && cfg.offload.layer_overrides.empty();
  PlanInputs& in = planner.plan_inputs;
  in = PlanInputs();
  double work = 0;  // GPU work of the step in forward-flop units, recompute included
  std::vector<double> forward(n);
  for (int b = 0; b < n; ++b) {
    const engine::BlockCost c = model->block(b).EstimateCost(B, T, dtype);
    forward[b] = c.forward_flops;
    const bool recomputed = device_plan.modes[b] == engine::SaveMode::kRecompute;
    work += b == n - 1 ? c.forward_flops : (recomputed ? 4 : 3) * c.forward_flops;
    in.params.push_back(static_cast<int64_t>(layout[b].numel));
    in.device_state_bytes.push_back(need[b + 1] - need[b]);
    // Measured (the shape profile of this step) where it exists, else estimated.
    const bool measured = planner.shape_profile && planner.shape_profile->blocks[b].keep_bytes > 0;
    const double extra =
        measured ? kMeasuredKeepSafety *
                       static_cast<double>(planner.shape_profile->blocks[b].keep_bytes -
                                           planner.shape_profile->blocks[b].recompute_bytes)
                 : kKeepSafety * static_cast<double>(c.saved_bytes_keep - c.saved_bytes_recompute);
    in.keep_extra_bytes.push_back(may_keep && recomputed && !device_plan.offload_checkpoint[b]
                                      ? std::max<int64_t>(1, static_cast<int64_t>(extra))
                                      : 0);
  }
  const double A = static_cast<double>(cfg.gradient_accumulation_steps);
  for (int b = 0; b < n; ++b) {
    const bool recomputed = device_plan.modes[b] == engine::SaveMode::kRecompute;
    double secs = recomputed && work > 0 ? first.gpu_compute_seconds * forward[b] / work : 0.0;
    if (recomputed && planner.shape_profile)
      secs = A * planner.shape_profile->blocks[b].recompute_s;
    in.recompute_seconds.push_back(secs);
  }
  in.budget_bytes = device_plan.gpu_budget;
  in.base_peak_bytes = pipeline.streams->PeakReservedBytes();
  if (cuda && !FixedShape()) {
    // The measured step's rows may be shorter than max_seq_length: a later batch of full rows
    // needs what PlanDevice's static estimate at max_seq_length sized (a 6 GiB TinyLlama job on
    // Alpaca records ran out of memory when kept layers were priced from a short first batch).
    const int64_t static_peak = planner.planned_held_bytes + EstimateMemory(B).workspace;
    if (static_peak > in.base_peak_bytes) {
      Log(TrainObserver::Level::kInfo,
          "step plan: records vary in length, so the step's floor is the estimate at " + std::to_string(T) +
              " tokens per row (" + FormatByteSize(static_cast<uint64_t>(static_peak)) + "), not the measured " +
              FormatByteSize(static_cast<uint64_t>(in.base_peak_bytes)));
      in.base_peak_bytes = static_peak;
    }
  }
  in.gpu_seconds = first.gpu_compute_seconds;
  in.h2d_bytes = static_cast<double>(first.h2d_bytes);
  in.d2h_bytes = static_cast<double>(first.d2h_bytes);
  in.host_bytes_per_s = prof.host_bytes_per_s;
  in.cpu_params_per_s = prof.cpu_params_per_s;
  in.cpu_params_per_s_during_dma = std::min(prof.cpu_params_per_s_during_dma, prof.cpu_params_per_s);
  in.h2d_bytes_per_s = prof.h2d_bytes_per_s > 0 ? prof.h2d_bytes_per_s : 1e30;
  in.d2h_bytes_per_s = prof.d2h_bytes_per_s > 0 ? prof.d2h_bytes_per_s : 1e30;
  in.keep_activations = may_keep;
  SetParamTraffic(&in, !pipeline.weights->resident(), prof);
  AddNvmeLayerInputs(&in, static_cast<int>(B), T, prof);
  // Clipping without speculation (or fp16's overflow check) holds every update until the step's
  // norm exists: the priced step updated no block during its backward.
  in.held_updates = (cfg.optim.max_grad_norm > 0 || scaler.has_value()) && first.speculated_layers == 0;
  if (planner.shape_profile) {
    double profiled_forward = 0;
    for (const auto& bp : planner.shape_profile->blocks) profiled_forward += bp.forward_s;
    in.gpu_forward_seconds = std::min(in.gpu_seconds, A * profiled_forward);
  }
  if (in.held_updates && cuda) {
    // One micro-batch's head forward, measured (the shape profile) or its share of the step.
    const double head = planner.shape_profile ? planner.shape_profile->blocks[n - 1].forward_s
                        : work > 0 ? first.gpu_compute_seconds * forward[n - 1] / work / A
                                   : 0.0;
    SetHeldTails(&in, head);
  }
  planner.planned_flops = 0;
  if (cuda && !FixedShape()) RETURN_IF_ERROR(PriceVariableLengths(&in));
  ASSIGN_OR_RETURN(planner.plan, SolvePlan(in));
  Log(TrainObserver::Level::kInfo,
      "step plan: " + trainer::DescribePlan(planner.plan, device_plan.gpu_budget) + "; step " +
          std::to_string(first.step) + " (nothing placed) peaked at " +
          FormatByteSize(static_cast<uint64_t>(in.base_peak_bytes)) + " and its GPU work took " +
          FormatSeconds(first.gpu_compute_seconds));
  RETURN_IF_ERROR(ApplyKeptLayers(planner.plan.keep_layers));
  RETURN_IF_ERROR(PublishDevicePlan(planner.plan.device_blocks));
  planner.plan_check_step = completed + 2;  // the second step run under the plan
  const int count = planner.plan.device_blocks;
  std::ostringstream msg;
  msg << "device optimizer (auto): step " << first.step << " peaked at "
      << FormatByteSize(static_cast<uint64_t>(in.base_peak_bytes)) << " of the "
      << FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget)) << " budget; ";
  if (count == 0) {
    if (in.base_peak_bytes + in.margin_bytes + need[1] > device_plan.gpu_budget) {
      msg << "no block's AdamW states fit beside it (the first needs "
          << FormatByteSize(static_cast<uint64_t>(need[1])) << "): all stay on the CPU";
    } else {
      msg << "the step planner keeps every block's AdamW states on the CPU (no faster elsewhere)";
    }
    Log(TrainObserver::Level::kInfo, msg.str());
    return OkStatus();
  }
  RETURN_IF_ERROR(MoveStatesToDevice(count));
  msg << "the AdamW states of blocks 0-" << count - 1 << " (" << pipeline.device_opt->params()
      << " parameters, " << FormatByteSize(static_cast<uint64_t>(need[count]))
      << ") move to the device";
  Log(TrainObserver::Level::kInfo, msg.str());
  return OkStatus();
}

Status Trainer::Impl::PriceVariableLengths(PlanInputs* in) {
  // Records of varying length: the priced step ran at its own batch's padded length, and on
  // CUDA its GPU time includes the kernels' warm-up for that new shape (cuDNN builds a graph per
  // sequence length): a 1.1B job on Alpaca records priced 2.1 s for a 0.48 s
  // step. Priced instead at the expected padded length of the data's length distribution,
  // with the blocks timed warm there.
  const double rows = static_cast<double>(cfg.batch_size) * world();  // padded over the global batch
  const bool buckets = cfg.data.length_buckets.value_or(false) && !Packed();
  const std::vector<std::pair<int64_t, double>> lengths =
      PaddedLengthDistribution(data->SequenceLengths(), static_cast<int>(rows), SeqLength(), buckets);
  const double expected = ExpectedLength(lengths);
  if (!(expected > 0)) return OkStatus();
  const int64_t T = std::clamp<int64_t>((static_cast<int64_t>(std::lround(expected)) + 7) / 8 * 8, 8, SeqLength());
  auto timed = TimeBlocks(cfg.batch_size, T);
  if (!timed.ok()) {
    Log(TrainObserver::Level::kWarning, "step plan: timing the blocks at the expected length " + std::to_string(T) +
                                            " failed (" + std::string(timed.status().message()) +
                                            "); priced on the measured step");
    return OkStatus();
  }
  const double A = static_cast<double>(cfg.gradient_accumulation_steps);
  const BlockTiming& t = *timed;
  if (!t.mixed) {  // every decoder layer of one kind
    const double layers = n - 2;
    in->gpu_seconds =
        A * (t.embedding_s + layers * (t.layer_forward_s + t.layer_backward_s) + t.head_s);
    in->gpu_forward_seconds = A * (t.embedding_s + layers * t.layer_forward_s + t.head_s);
  } else {  // a mixture of experts with dense layers too: each layer at its kind's times
    double forward = 0, backward = 0;
    for (int b = 1; b + 1 < n; ++b) {
      forward += t.Forward(SparseBlock(b));
      backward += t.Backward(SparseBlock(b));
    }
    in->gpu_seconds = A * (t.embedding_s + forward + backward + t.head_s);
    in->gpu_forward_seconds = A * (t.embedding_s + forward + t.head_s);
  }
  for (int b = 1; b + 1 < n; ++b) {
    if (in->recompute_seconds[b] > 0) in->recompute_seconds[b] = A * t.Forward(SparseBlock(b));
  }
  if (in->held_updates) SetHeldTails(in, t.head_s);
  planner.new_length_forward_s = A * t.new_shape_forward_s;
  planner.new_length_backward_s = A * t.new_shape_backward_s;
  planner.seen_lengths.insert(T);  // its kernels are warm now
  for (int b = 0; b < n; ++b) {  // StepStats' model_flops at that length (trainer.cc Prepare)
    const double f = model->block(b).EstimateCost(cfg.batch_size, T, dtype).forward_flops;
    planner.planned_flops += A * (b == n - 1 ? f : 3 * f);
  }
  std::ostringstream msg;
  msg.precision(3);
  msg << "step plan: records vary in length; priced at the expected padded length " << T << " of "
      << static_cast<int64_t>(rows) << " rows (mean " << expected << ", at most " << SeqLength()
      << "), blocks timed there: GPU " << in->gpu_seconds
      << " s per step; a step at a length not seen before adds "
      << planner.new_length_forward_s + planner.new_length_backward_s
      << " s (kernel warm-up: cuDNN's graphs are per length)";
  if (buckets) msg << "; " << WarmLengths(lengths);
  Log(TrainObserver::Level::kInfo, msg.str());
  return OkStatus();
}

std::string Trainer::Impl::WarmLengths(const std::vector<std::pair<int64_t, double>>& lengths) {
  // The padded lengths the steps will meet with some likelihood, warmed now (one untimed run of
  // the embedding, a layer and the head there): a warm-up inside a step costs it as much as the
  // step itself at 1.1B, and a step-4 check that met one was off by 28%.
  constexpr double kLikely = 0.005;
  constexpr size_t kMaxWarmed = 24;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> warmed;
  double covered = 0;
  for (const auto& [length, p] : lengths) {
    if (planner.seen_lengths.count(length) > 0) {
      covered += p;
      continue;
    }
    if (p < kLikely || warmed.size() >= kMaxWarmed) continue;
    auto w = TimeBlocks(cfg.batch_size, length, /*reps=*/1);
    if (!w.ok()) {
      return "warming the padded length " + std::to_string(length) + " failed (" +
             std::string(w.status().message()) + ")";
    }
    planner.seen_lengths.insert(length);
    warmed.push_back(length);
    covered += p;
  }
  std::ostringstream msg;
  msg.precision(3);
  msg << "padded lengths in buckets: warmed " << warmed.size() << " of " << lengths.size() << " (";
  for (size_t i = 0; i < warmed.size(); ++i) msg << (i ? ", " : "") << warmed[i];
  msg << ") in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
      << " s; the lengths now warm are " << 100 * covered << "% of the micro-batches";
  return msg.str();
}

Status Trainer::Impl::MoveStatesToDevice(int count) {
  // The last step's updates must be in the arena before the states move.
  ASSIGN_OR_RETURN(workers::StepResult last, host->WaitFinished(static_cast<uint64_t>(completed)));
  (void)last;
  for (int b = 0; b < count; ++b) device_plan.device_blocks[b] = true;
  RETURN_IF_ERROR(StartDeviceOptimizer());
  RETURN_IF_ERROR(host->SetDeviceBlocks(device_plan.device_blocks));
  pipeline.weights->AdoptDeviceOptimizer(pipeline.device_opt.get());
  pipeline.schedule->SetDeviceOptimizer(pipeline.device_opt.get());
  pipeline.accounting->SetDeviceParams(pipeline.device_opt->params());
  return OkStatus();
}

Status Trainer::Impl::ApplyKeptLayers(int keep) {
  for (int b : KeptBlocks(planner.plan_inputs, n)) {  // every keepable block, top first
    const engine::SaveMode m = keep-- > 0 ? engine::SaveMode::kKeep : engine::SaveMode::kRecompute;
    device_plan.modes[b] = m;
    pipeline.schedule->SetMode(b, m);
  }
  return OkStatus();
}

Status Trainer::Impl::CheckPlan() {
  const StepStats& s = pipeline.accounting->last_stats();
  if (planner.plan_check_step == 0 || s.step != planner.plan_check_step) return OkStatus();
  planner.plan_check_step = 0;
  const double measured = s.step_seconds;
  double predicted = planner.plan.predicted_s;
  std::ostringstream msg;
  msg.precision(3);
  const bool variable = planner.planned_flops > 0 && s.model_flops > 0;
  const double r = variable ? s.model_flops / world() / planner.planned_flops : 1.0;
  const bool new_length = variable && planner.steps_with_new_length.count(s.step) > 0;
  if (variable) {
    // Variable lengths: the plan's cost model at this step's own shape (its GPU work scaled by
    // the step's model FLOPs against the expected length's).
    PlanInputs at = planner.plan_inputs;
    at.gpu_seconds *= r;
    at.gpu_forward_seconds *= r;
    for (double& x : at.recompute_seconds) x *= r;
    if (new_length) {  // its kernels warmed up for the new length inside the step
      at.gpu_seconds += planner.new_length_forward_s + planner.new_length_backward_s;
      at.gpu_forward_seconds += planner.new_length_forward_s;
    }
    predicted = EvaluatePlan(at, planner.plan.device_blocks, planner.plan.keep_layers).predicted_s;
    msg << "step plan check: step " << s.step << " (" << s.tokens << " tokens, " << r
        << "x the expected length's work" << (new_length ? ", a length not seen before" : "")
        << ") took " << measured << " s against " << predicted << " s predicted for it ("
        << planner.plan.predicted_s << " s at the expected length)";
  } else {
    msg << "step plan check: step " << s.step << " took " << measured << " s against " << predicted
        << " s predicted";
  }
  const double off = predicted > 0 ? measured / predicted - 1 : 0;
  msg << " (" << (off >= 0 ? "+" : "") << 100 * off << "%)";
  if (std::abs(off) <= kRecheckTolerance || planner.plan_resolved || new_length) {
    // A new length's warm-up is a one-off (its cost varies between runs): no rate to re-fit.
    if (std::abs(off) > kRecheckTolerance && new_length) msg << "; not re-fitted on a step's one-off warm-up";
    Log(TrainObserver::Level::kInfo, msg.str());
    return OkStatus();
  }
  // Re-fit once: GPU time and bytes as measured under the plan, taken back to the first step's
  // plan; the resource that bound the prediction gets the measured step's rate.
  planner.plan_resolved = true;
  PlanInputs in = planner.plan_inputs;
  const double placed = static_cast<double>(planner.plan.placed_params);
  // (Variable lengths: taken back to the expected length's work.)
  in.gpu_seconds = s.gpu_compute_seconds / r + planner.plan.recompute_saved_s -
                   in.device_seconds_per_param * placed;
  in.h2d_bytes = static_cast<double>(s.h2d_bytes) + in.h2d_saved_per_param * placed;
  in.d2h_bytes = static_cast<double>(s.d2h_bytes) + in.d2h_saved_per_param * placed;
  in.gpu_forward_seconds = std::min(in.gpu_forward_seconds, in.gpu_seconds);
  // A bound resource that ran at another rate than profiled (contention, or a profile that
  // understates what the step sustains) gets the rate the measured step implies.
  double slow = measured / predicted;
  if (planner.plan.bound == "held updates" && planner.plan.update_s > 0) {
    // Only the update part of the dependency ran at another rate: the backward is measured.
    const double fixed =
        planner.plan.held_s - std::max(in.gpu_forward_seconds, planner.plan.update_s);
    if (measured - fixed > in.gpu_forward_seconds)
      slow = (measured - fixed) / planner.plan.update_s;
  }
  // The CPU update runs at the host's memory roofline: the three terms it sets are one resource,
  // so the pool's rate and the host's bandwidth move together.
  if (planner.plan.bound == "CPU update" || planner.plan.bound == "host memory" ||
      planner.plan.bound == "held updates") {
    in.cpu_params_per_s /= slow;
    in.cpu_params_per_s_during_dma /= slow;
    in.host_bytes_per_s /= slow;
  }
  if (planner.plan.bound == "H2D") in.h2d_bytes_per_s /= slow;
  if (planner.plan.bound == "NVMe") {
    in.nvme_read_bytes_per_s /= slow;
    in.nvme_write_bytes_per_s /= slow;
  }
  if (planner.plan.bound == "D2H") in.d2h_bytes_per_s /= slow;
  // The placed states stay where they are: only the kept layers may change.
  in.fixed_device_blocks = planner.plan.device_blocks;
  ASSIGN_OR_RETURN(const PlanChoice best, SolvePlan(in));
  msg << "; re-solved with the measured figures: "
      << trainer::DescribePlan(best, device_plan.gpu_budget);
  Log(TrainObserver::Level::kInfo, msg.str());
  planner.plan_inputs = in;
  planner.plan = best;
  return ApplyKeptLayers(best.keep_layers);
}

}  // namespace offloadd::trainer
