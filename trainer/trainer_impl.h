#pragma once
// Trainer internals shared by trainer.cc (step loop), trainer_setup.cc (plan, arena, weights) and
// trainer_state.cc (checkpoints, export). Not a public header.

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/model.h"
#include "trainer/activation_spill.h"
#include "trainer/data_source.h"
#include "trainer/device_streams.h"
#include "trainer/grad_scaler.h"
#include "trainer/host_optimizer.h"
#include "trainer/lr_schedule.h"
#include "trainer/trainer.h"

namespace offloadd::trainer {

struct ParamSlot {
  engine::Param* param = nullptr;  // owned by the block
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // elements into the block's flat buffers
  uint64_t numel = 0;
};

struct BlockLayout {
  std::vector<ParamSlot> params;
  uint64_t numel = 0;
};

struct Trainer::Impl {
  TrainConfig cfg;
  TrainObserver* obs = nullptr;
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<HostOptimizer> host;
  std::optional<LrSchedule> schedule;
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;
  bool cuda = false;
  int n = 0;  // blocks
  std::vector<BlockLayout> layout;
  std::map<std::string, std::pair<int, uint64_t>> owner;  // param name -> (block, offset)
  bool tied = false;  // the head uses block 0's embedding matrix
  std::vector<engine::SaveMode> modes;
  std::vector<bool> spill_nvme;  // per block: kOffload goes to NVMe, not pinned RAM
  std::unique_ptr<ActivationSpill> spill;
  bool resident = true;
  int window = 2;  // blocks streamed in ahead of use
  std::vector<at::Tensor> host_weights;  // per block, flat compute-dtype view of the arena
  std::vector<at::Tensor> host_grads;    // per block, flat staging view
  std::vector<at::Tensor> dev_weights;   // CUDA: per block flat weights while on the device
  std::unique_ptr<DeviceStreams> streams;
  std::vector<DeviceStreams::EventPtr> ready;  // per block: its weights' upload (CUDA)
  std::mutex ready_mu;
  uint64_t arena_bytes = 0;
  int64_t gpu_budget = 0;
  std::string plan_text;

  std::optional<GradScaler> scaler;  // fp16 compute only
  int64_t completed = 0;  // optimizer steps whose updates were submitted
  // AdamW updates applied through the last reported step (completed minus skipped fp16 steps,
  // once reported): what the learning-rate schedule counts, as HF Trainer does not step its
  // scheduler when GradScaler skipped the optimizer step.
  int64_t applied = 0;
  int64_t total = 0;
  int64_t reported = 0;
  // The step whose stats are not reported yet.
  struct Pending {
    StepStats stats;
    at::Tensor loss;  // fp32 scalar on the device
    std::chrono::steady_clock::time_point start;
    double stall_weights = 0, stall_grads = 0;
  };
  std::optional<Pending> pending;
  std::chrono::steady_clock::time_point last_forward_start;
  std::vector<Span> trace;
  std::mutex trace_mu;
  int64_t traced_steps = 0;
  double last_loss = 0;
  std::vector<std::pair<int64_t, double>> loss_history;

  // trainer_setup.cc
  Status Setup();
  Status PlanDevice();
  Status BindHostWeights();
  Status StartSpill();
  // trainer.cc
  Status EnsureWeights(int b, uint64_t wait_step, double* stall);
  void Prefetch(int b, uint64_t wait_step);
  void ReleaseWeights(int b);
  void BindDevice(int b, const at::Tensor& flat);
  void OnUpdated(int b);
  Status RunStep();
  Status Flush();
  // Device busy times, bytes per link and trace spans of the pending step (waits for its copies).
  void CollectDeviceSpans();
  Status ReportPending(std::chrono::steady_clock::time_point end);
  // trainer_state.cc
  StatusOr<std::string> SaveCheckpoint();
  Status RestoreCheckpoint(const std::string& dir);
  Status ExportModel(const std::string& dir);
  std::string Fingerprint() const;
  void Log(TrainObserver::Level level, const std::string& message);
};

}  // namespace offloadd::trainer
