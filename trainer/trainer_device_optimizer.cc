// Trainer setup's device optimizer: which blocks' AdamW states the GPU holds under its budget
// (offload_optimizer.ratio, or the planner's choice; LSP's subspace states), and starting it with
// the states the host holds (trainer_setup.cc plans the rest of the device).
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "common/units.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {
namespace {

// A share as the job file writes it (0.25, not 0.250000).
std::string FormatShare(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace

Status Trainer::Impl::PlanDeviceOptimizer(bool resident, int64_t used) {
  device_plan.device_blocks.assign(n, false);
  if (pipeline.lsp) return PlanLspDeviceOptimizer(resident, used);
  int requested = cfg.offload.device_optimizer_blocks;
  if (const double share = cfg.offload.device_optimizer_share; share >= 0) {
    if (!(share <= 1)) {
      return InvalidArgumentError("device optimizer share must be in [0, 1], got " +
                                  std::to_string(share));
    }
    uint64_t total_params = 0, held = 0;
    for (const auto& bl : layout) total_params += bl.numel;
    requested = 0;
    while (requested < n && static_cast<double>(held) < share * static_cast<double>(total_params)) {
      held += layout[requested++].numel;
    }
  }
  if (requested > n) {
    return InvalidArgumentError("device_optimizer_blocks " + std::to_string(requested) +
                                ": the model has " + std::to_string(n) + " blocks");
  }
  int count = 0;
  if (!cuda) {
    // A CPU device keeps the "device" states in process memory: N as asked; auto places them
    // after the first step within gpu_memory_limit when one is given (the CI path of auto).
    count = std::max(0, requested);
    if (requested == OffloadPlanConfig::kAutoDeviceOptimizer && cfg.offload.gpu_memory_limit > 0) {
      device_plan.gpu_budget = static_cast<int64_t>(cfg.offload.gpu_memory_limit);
      device_plan.device_placement_pending = true;
    }
  } else if (requested == OffloadPlanConfig::kAutoDeviceOptimizer) {
    // The static estimates of the step's working set are not exact enough to fill the budget
    // (an out-of-memory error mid-job costs more): placed from the measured peak instead.
    device_plan.device_placement_pending = true;
  } else {
    const std::vector<int64_t> need = DeviceOptimizerNeeds(resident);
    int fit = 0;
    while (fit < n && used + need[fit + 1] <= device_plan.gpu_budget) ++fit;
    if (requested > fit) {
      const double share = cfg.offload.device_optimizer_share;
      const std::string what = share >= 0 ? "offload_optimizer.ratio " + FormatShare(1 - share) +
                                                " (blocks 0-" + std::to_string(requested - 1) +
                                                " on the GPU)"
                                          : "device_optimizer_blocks " + std::to_string(requested);
      return ResourceExhaustedError(
          what + " needs " + FormatByteSize(static_cast<uint64_t>(need[requested])) +
          " of GPU memory for their AdamW " + "states, but gpu_memory_limit " +
          FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget)) + " leaves " +
          FormatByteSize(
              static_cast<uint64_t>(std::max<int64_t>(0, device_plan.gpu_budget - used))) +
          " after the weights, activations and workspace: at most " + std::to_string(fit) +
          " blocks fit (leave it unset to place them by the first step's measured peak)");
    } else {
      count = requested;
    }
  }
  for (int b = 0; b < count; ++b) device_plan.device_blocks[b] = true;
  return OkStatus();
}

Status Trainer::Impl::PlanLspDeviceOptimizer(bool resident, int64_t used) {
  // LSP: the decoder layers' subspaces are updated by the CPU workers. The lowest blocks without
  // a compressed weight (the embedding) are exact, and their update is the one the next forward
  // waits for first under clipping: their AdamW states may live on the GPU. Auto places them when
  // the static estimate fits the budget with kLspDeviceMargin to spare (the planner's measured
  // placement prices CPU updates of whole blocks, which LSP's are not).
  int exact_prefix = 0;
  while (exact_prefix < n &&
         std::none_of(layout[exact_prefix].params.begin(), layout[exact_prefix].params.end(),
                      [](const ParamSlot& s) { return s.compressed != nullptr; })) {
    ++exact_prefix;
  }
  const int requested = cfg.offload.device_optimizer_blocks;
  if (requested > exact_prefix) {
    return UnimplementedError(
        "device_optimizer_blocks " + std::to_string(requested) +
        " with LSP compression: only the lowest " + std::to_string(exact_prefix) +
        " block(s), exact (no compressed weight), can keep AdamW states on the GPU; "
        "the decoder layers' subspaces are updated by the CPU workers");
  }
  int count = std::max(0, requested);
  if (requested == OffloadPlanConfig::kAutoDeviceOptimizer) {
    count = 0;
    if (cuda) {
      constexpr double kLspDeviceMargin = 0.10;
      const std::vector<int64_t> need = DeviceOptimizerNeeds(resident);
      const auto room = static_cast<int64_t>((1 - kLspDeviceMargin) *
                                             static_cast<double>(device_plan.gpu_budget));
      while (count < exact_prefix && used + need[count + 1] <= room) ++count;
    }
  } else if (cuda && count > 0 &&
             used + DeviceOptimizerNeeds(resident)[count] > device_plan.gpu_budget) {
    return ResourceExhaustedError(
        "device_optimizer_blocks " + std::to_string(count) + " needs " +
        FormatByteSize(static_cast<uint64_t>(DeviceOptimizerNeeds(resident)[count])) +
        " of GPU memory beside " + FormatByteSize(static_cast<uint64_t>(used)) +
        ": more than gpu_memory_limit " +
        FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget)));
  }
  for (int b = 0; b < count; ++b) device_plan.device_blocks[b] = true;
  return OkStatus();
}

std::vector<int64_t> Trainer::Impl::DeviceOptimizerNeeds(bool resident, int accumulation) const {
  const auto A =
      static_cast<uint32_t>(accumulation > 0 ? accumulation : cfg.gradient_accumulation_steps);
  const int64_t elem = c10::elementSize(dtype);
  std::vector<int64_t> need(n + 1, 0);
  for (int b = 0; b < n; ++b) {
    const int64_t numel = static_cast<int64_t>(layout[b].numel);
    need[b + 1] = need[b] + DeviceOptimizer::BlockBytes(layout[b].numel, dtype, A, optimizer_mode) -
                  (resident ? numel * elem : 0) +
                  (b == 0 ? DeviceOptimizer::UpdateWorkspaceBytes() : 0);
  }
  return need;
}

Status Trainer::Impl::StartDeviceOptimizer() {
  if (std::none_of(device_plan.device_blocks.begin(), device_plan.device_blocks.end(),
                   [](bool d) { return d; })) {
    return OkStatus();
  }
  DeviceOptimizer::Options o;
  o.layout = &layout;
  o.blocks = device_plan.device_blocks;
  o.device = device;
  o.dtype = dtype;
  o.optim = cfg.optim;
  o.accumulation_steps = static_cast<uint32_t>(cfg.gradient_accumulation_steps);
  o.held = cfg.optim.max_grad_norm > 0 || scaler.has_value();
  o.mode = optimizer_mode;
  pipeline.streams->UseCompute();
  ASSIGN_OR_RETURN(pipeline.device_opt, DeviceOptimizer::Create(o));
  // The initial masters were written to the arena (host->Initialize): bring them over.
  std::vector<float> master, m, v;
  std::vector<uint8_t> m_region, v_region, w_region;
  for (int b = 0; b < n; ++b) {
    if (!device_plan.device_blocks[b]) continue;
    if (!optimizer_mode.Exact()) {  // the workers' regions, byte for byte
      m_region.resize(host->state_region_bytes(b));
      v_region.resize(host->state_region_bytes(b));
      RETURN_IF_ERROR(host->ReadStateRegions(b, m_region.data(), v_region.data()));
      if (optimizer_mode.master == workers::MasterDtype::kBf16) {
        w_region.resize(host->master_region_bytes(b));
        RETURN_IF_ERROR(host->ReadMasterRegion(b, w_region.data()));
      } else {
        master.resize(layout[b].numel);
        RETURN_IF_ERROR(host->ReadStates(b, master.data(), nullptr, nullptr));
        RETURN_IF_ERROR(pipeline.device_opt->RestoreStates(b, master.data(), nullptr, nullptr));
      }
      RETURN_IF_ERROR(pipeline.device_opt->RestoreRegions(
          b, optimizer_mode.master == workers::MasterDtype::kBf16 ? w_region.data() : nullptr,
          m_region.data(), v_region.data()));
      continue;
    }
    master.resize(layout[b].numel);
    m.resize(layout[b].numel);
    v.resize(layout[b].numel);
    RETURN_IF_ERROR(host->ReadStates(b, master.data(), m.data(), v.data()));
    RETURN_IF_ERROR(pipeline.device_opt->RestoreStates(b, master.data(), m.data(), v.data()));
  }
  return OkStatus();
}

}  // namespace offloadd::trainer
