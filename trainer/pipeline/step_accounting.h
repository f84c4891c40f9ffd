#pragma once
// StepAccounting: what each optimizer step measured, and when it is reported. Steps are
// pipelined, so two are open at once: the current one (BeginStep..EndStep), whose stalls the
// step loop adds up, and the previous one, pending until its CPU updates are done. Reporting the
// pending step waits for them, fills in its StepStats (loss, gradient norm, per-resource busy
// times, bytes, stalls), feeds the fp16 loss scale, counts the AdamW updates applied, keeps the
// loss history and calls TrainObserver::OnStep. Also owns the trace spans of the first
// trace_steps steps (0: all), device spans and host updates alike.
//
// Thread-safety: AddSpan and WriteTrace may be called from any thread (the optimizer thread adds
// its update spans); everything else is for the step loop's thread.

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "job/grad_scaler.h"
#include "job/step_stats.h"
#include "trainer/pipeline/activation_spill.h"
#include "trainer/pipeline/device_streams.h"
#include "trainer/pipeline/host_optimizer.h"
#include "trainer/state/checkpoint.h"
#include "trainer/trainer.h"

namespace offloadd::trainer {

class StepAccounting {
 public:
  struct Options {
    HostOptimizer* host = nullptr;
    DeviceStreams* streams = nullptr;
    ActivationSpill* spill = nullptr;  // when activations go to NVMe
    GradScaler* scaler = nullptr;      // fp16 compute
    TrainObserver* observer = nullptr;
    int64_t trace_steps = 0;  // steps whose spans are kept (0: all)
    int64_t max_steps = 0;
  };
  explicit StepAccounting(const Options& options);

  // Time the step loop blocked on the pipeline in the current step, by cause.
  struct Stalls {
    double weights = 0;  // for weights (an update or its upload)
    double grads = 0;    // for a free gradient staging buffer
  };

  // Step `step` starts now: the device work queued so far belongs to the pending step.
  void BeginStep(int64_t step, int64_t tokens, int64_t trained_tokens);
  Stalls& stalls() { return current_.stalls; }
  // The learning rate and loss scale the current step's updates and backward use.
  void SetUpdateSettings(double learning_rate, double loss_scale);
  // Parameters whose AdamW states live on the device from the next BeginStep on (each applied
  // step updates them).
  void SetDeviceParams(uint64_t params) { device_params_ = params; }
  // The run's set-up (trainer_setup.cc): the next step to begin reports the time since `created`
  // and these phases (StepStats::time_to_first_step_seconds, setup_phase_seconds).
  // `phase_start`: when each phase first began, seconds since `created` (-1: it did not run).
  void SetSetup(std::chrono::steady_clock::time_point created, std::vector<double> phase_seconds,
                std::vector<double> phase_start = {}) {
    created_ = created;
    setup_phases_ = std::move(phase_seconds);
    setup_starts_ = std::move(phase_start);
    setup_pending_ = true;
  }
  // The current step's work is queued; it is pending until reported. `loss`: its summed
  // micro-batch losses, a scalar on the device.
  // `aux_loss`: the MoE load-balancing share of it (StepStats::aux_loss), or undefined.
  void EndStep(at::Tensor loss, double model_flops, double epoch,
               at::Tensor aux_loss = at::Tensor());

  bool has_pending() const { return pending_.has_value(); }
  // Reports the pending step (if any) as having ended when the current one began.
  Status ReportPrevious() { return Report(current_.start); }
  // Reports the pending step (if any) as ending now, its device work done.
  Status Flush();

  // AdamW updates applied through the last reported step (completed minus skipped fp16 steps):
  // what the learning-rate schedule counts, as HF Trainer does not step its scheduler when
  // GradScaler skipped the optimizer step.
  int64_t applied() const { return applied_; }
  double last_loss() const { return last_loss_; }
  // The last reported step's figures (step 0 before any).
  const StepStats& last_stats() const { return last_stats_; }
  // The last reported step's compute spans ("forward <block>", "backward <block>", ...), with
  // their memory figures on CUDA: the per-block profile (job/shape_profile.h).
  const std::vector<Span>& last_compute_spans() const { return last_compute_; }
  // Every finished step as trainer_state.json's log_history records it.
  const std::vector<LogEntry>& loss_history() const { return loss_history_; }
  // Resuming from a checkpoint.
  void Restore(int64_t applied, std::vector<LogEntry> loss_history);

  // Any thread: a span for the trace, kept while the first trace_steps steps are not reported.
  void AddSpan(Span span);
  // Writes the kept spans as Chrome trace JSON.
  Status WriteTrace(const std::string& path);

 private:
  struct Step {
    StepStats stats;
    at::Tensor loss;      // fp32 scalar on the device
    at::Tensor aux_loss;  // its MoE load-balancing share, or undefined
    std::chrono::steady_clock::time_point start;
    Stalls stalls;
    std::vector<Span> compute;
  };
  // Device busy times, bytes per link and trace spans of the pending step (waits for its copies).
  void CollectDeviceSpans();
  Status Report(std::chrono::steady_clock::time_point end);

  const Options options_;
  Step current_;
  std::optional<Step> pending_;
  int64_t applied_ = 0;
  uint64_t device_params_ = 0;
  std::chrono::steady_clock::time_point created_;
  std::vector<double> setup_phases_, setup_starts_;
  bool setup_pending_ = false;
  double last_loss_ = 0;
  StepStats last_stats_;
  std::vector<Span> last_compute_;
  std::vector<LogEntry> loss_history_;
  std::mutex trace_mu_;
  std::vector<Span> trace_;
  int64_t traced_steps_ = 0;  // reported steps
};

}  // namespace offloadd::trainer
