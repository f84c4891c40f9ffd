#pragma once
// StepPipeline: the owners of one optimizer step's work on the device, made by the trainer's set-up
// once the host optimizer's arena holds the initial weights (Trainer::Impl::StartPipeline), and
// driven by the step loop (trainer/trainer.cc). Each part has one job (trainer/pipeline/README.md):
// the streams and the events ordering them, where the weights are, where the activations wait, the
// order of the step's work, what the step measured, the blocks updated on the GPU, and LSP mode.
//
// Destroyed in reverse order of declaration: LSP mode, the schedule and the accounting first, then
// the activations' and weights' owners they drive, the spill, the streams, the device optimizer.
// Thread-compatible: the step loop's thread (each part documents its own threads).

#include <memory>

#include "trainer/pipeline/activation_offload.h"
#include "trainer/pipeline/activation_spill.h"
#include "trainer/pipeline/device_optimizer.h"
#include "trainer/pipeline/device_streams.h"
#include "trainer/pipeline/lsp_mode.h"
#include "trainer/pipeline/step_accounting.h"
#include "trainer/pipeline/step_schedule.h"
#include "trainer/pipeline/weight_residency.h"

namespace offloadd::trainer {

struct StepPipeline {
  std::unique_ptr<DeviceOptimizer> device_opt;  // null when no block's states are on the GPU
  std::unique_ptr<DeviceStreams> streams;
  std::unique_ptr<ActivationSpill> spill;  // when a block's activations go to NVMe
  std::unique_ptr<WeightResidency> weights;
  std::unique_ptr<ActivationOffload> activations;
  std::unique_ptr<StepAccounting> accounting;
  std::unique_ptr<StepSchedule> schedule;
  std::unique_ptr<LspMode> lsp;  // LSP-Offload mode (cfg.lsp.enabled)
};

}  // namespace offloadd::trainer
