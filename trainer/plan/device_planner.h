#pragma once
// The device plan of a job and the state its planner keeps (trainer/plan/README.md).
//
// DevicePlan is what was decided, per block and for the job: where each block's activations wait,
// which blocks' optimizer states live on the GPU or on NVMe, the tiles, the GPU budget. The
// pipeline (residency, activation offload, schedule), the host optimizer's options and the
// checkpoints read it; the planning steps (PlanDevice at set-up, PlaceDeviceBlocks after the first
// step, CheckHostMemory) write it.
//
// DevicePlanner is what the planning steps measure and remember between them: the node and shape
// profiles, the step planner's inputs and choice, the check of its prediction against the measured
// step, the GEMM rates the automatic batch size priced with, and the lengths a job of records of
// varying length has met.
//
// Both are plain values owned by Trainer::Impl (trainer/trainer_impl.h), whose planning methods
// (trainer_batch.cc, trainer_predict.cc, trainer_moe.cc, plan/trainer_plan.cc,
// plan/trainer_profile.cc, PlanDevice in trainer_setup.cc) fill them. Thread-compatible: the step
// loop's thread only.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/model.h"
#include "job/node_profile_file.h"
#include "job/shape_profile.h"
#include "job/step_planner.h"
#include "job/tile_plan.h"

namespace offloadd::trainer {

struct DevicePlan {
  // Per block: its activation mode, and whether kOffload goes to NVMe.
  std::vector<engine::SaveMode> modes;
  std::vector<bool> spill_nvme;
  std::vector<bool> offload_checkpoint;  // recomputed blocks whose checkpoint waits in pinned RAM
  // Of them, those whose checkpoint waits on NVMe instead (the activation spill), where the host
  // memory limit cannot hold them all (PlaceLayerInputs), described in checkpoint_placement_text.
  std::vector<bool> checkpoint_nvme;
  std::string checkpoint_placement_text;
  // Per block: its optimizer states live on the device (the lowest blocks; PlanDevice).
  std::vector<bool> device_blocks;
  // The NVMe tier: per block, whether its fp32 masters and moments are in the store (empty: every
  // block); PlaceStatesUnderLimit in CheckHostMemory, described in state_placement_text.
  std::vector<bool> nvme_blocks;
  std::string state_placement_text;
  // offload_param on NVMe: per block, whether its 16-bit weights are in the store too (empty:
  // none; PlaceWeightsOnNvme in CheckHostMemory), described in weight_placement_text.
  std::vector<bool> nvme_weight_blocks;
  std::string weight_placement_text;
  // device_optimizer_blocks auto on CUDA: placed after this process's first step, from the
  // allocator's measured peak (PlaceDeviceBlocks).
  bool device_placement_pending = false;
  // The tiled MLP's and the LM head's tile sizes in use (the engine's defaults, or smaller ones
  // PlanDevice chose to fit the GPU budget at max_seq_length).
  TileChoice tiles;
  int64_t gpu_budget = 0;  // gpu_memory_limit, else 90% of the device's free memory (CUDA)
  std::string plan_text;   // the plan's line (Trainer::DescribePlan)
};

struct DevicePlanner {
  // The step planner's inputs and choice (trainer_plan.cc); plan_check_step: the step whose
  // measured time is compared with the prediction (0: none pending).
  PlanInputs plan_inputs;
  PlanChoice plan;
  // The per-block profile (trainer_profile.cc): cached for this shape, then the one measured on
  // the step the plan is priced with. planned_held_bytes: what PlanDevice holds on the GPU by
  // design (weights, activations, placed states), which the measured peak exceeds by the
  // step's working set.
  std::optional<ShapeProfile> shape_profile;
  int64_t planned_held_bytes = 0;
  int64_t plan_check_step = 0;
  bool plan_resolved = false;
  // Records of varying length: the per-step model FLOPs at the expected padded length (0: priced
  // on the measured step; PriceVariableLengths).
  double planned_flops = 0;
  // Variable lengths: the padded lengths the job's micro-batches have had (trainer.cc), the steps
  // that met one not seen before (at most one per length), and what that adds to a step
  // (PriceVariableLengths).
  std::set<int64_t> seen_lengths, steps_with_new_length;
  double new_length_forward_s = 0, new_length_backward_s = 0;
  // The node profile (cached under cfg.profile_dir, else measured once per run).
  std::optional<NodeProfile> node_profile;
  // SecondsPerFlop's measurements, by micro-batch; ExpertSecondsPerFlop's, by (micro, seq).
  std::map<int64_t, double> seconds_per_flop;
  std::map<std::pair<int64_t, int64_t>, double> expert_seconds_per_flop;
};

}  // namespace offloadd::trainer
