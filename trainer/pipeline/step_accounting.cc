// StepAccounting: per-step statistics, pipelined reporting, loss history and the trace.
#include "trainer/pipeline/step_accounting.h"

#include <cmath>

#include "trainer/pipeline/trace.h"

namespace offloadd::trainer {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

StepAccounting::StepAccounting(const Options& options) : options_(options) {}

void StepAccounting::BeginStep(int64_t step, int64_t tokens, int64_t trained_tokens) {
  const auto start = std::chrono::steady_clock::now();
  CollectDeviceSpans();  // the previous step's device work is queued: measure it now
  options_.streams->MarkStepStart();
  current_ = Step();
  current_.start = start;
  current_.stats.step = step;
  current_.stats.max_steps = options_.max_steps;
  current_.stats.tokens = tokens;
  current_.stats.trained_tokens = trained_tokens;
  current_.stats.device_update_params = device_params_;  // the placement this step runs with
  if (setup_pending_) {
    current_.stats.time_to_first_step_seconds = Seconds(created_, start);
    current_.stats.setup_phase_seconds = std::move(setup_phases_);
    current_.stats.setup_phase_start_seconds = std::move(setup_starts_);
    setup_pending_ = false;
  }
}

void StepAccounting::SetUpdateSettings(double learning_rate, double loss_scale) {
  current_.stats.learning_rate = learning_rate;
  current_.stats.loss_scale = loss_scale;
}

void StepAccounting::EndStep(at::Tensor loss, double model_flops, double epoch,
                             at::Tensor aux_loss) {
  current_.loss = std::move(loss);
  current_.aux_loss = std::move(aux_loss);
  current_.stats.model_flops = model_flops;
  current_.stats.epoch = epoch;
  pending_ = std::move(current_);
}

Status StepAccounting::Flush() {
  if (!pending_) return OkStatus();
  const auto end = std::chrono::steady_clock::now();
  CollectDeviceSpans();
  return Report(end);
}

void StepAccounting::Restore(int64_t applied,
                             std::vector<LogEntry> loss_history) {
  applied_ = applied;
  loss_history_ = std::move(loss_history);
  if (!loss_history_.empty()) last_loss_ = loss_history_.back().loss;
}

Status StepAccounting::Report(std::chrono::steady_clock::time_point end) {
  if (!pending_) return OkStatus();
  Step p = std::move(*pending_);
  pending_.reset();
  StepStats& s = p.stats;
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(workers::StepResult r,
                   options_.host->WaitFinished(static_cast<uint64_t>(s.step)));
  s.stall_optimizer_seconds = Seconds(t0, std::chrono::steady_clock::now());
  s.loss = p.loss.defined() ? p.loss.item<double>() : 0.0;
  s.aux_loss = p.aux_loss.defined() ? p.aux_loss.item<double>() : 0.0;
  s.grad_norm = r.grad_norm;
  s.skipped = r.skipped;
  s.clipped = r.clipped;
  s.speculated_layers = static_cast<int32_t>(r.speculated_shards);
  s.corrected_layers = static_cast<int32_t>(r.corrected_shards);
  s.cpu_update_params = r.params_updated + r.params_corrected;
  if (r.skipped) s.device_update_params = 0;
  applied_ = static_cast<int64_t>(r.adam_step);
  if (options_.scaler) options_.scaler->Update(r.skipped);
  s.step_seconds = Seconds(p.start, end);
  s.stall_weights_seconds = p.stalls.weights;
  s.stall_grads_seconds = p.stalls.grads;
  const UpdateTotals u = options_.host->TakeTotals();
  s.cpu_update_seconds = u.worker_busy_seconds;
  s.nvme_seconds = u.nvme_busy_seconds;
  s.nvme_read_bytes = u.nvme_read_bytes;
  s.nvme_write_bytes = u.nvme_write_bytes;
  if (options_.spill) {
    const SpillTotals a = options_.spill->TakeTotals();
    s.nvme_read_bytes += a.read_bytes;
    s.nvme_write_bytes += a.write_bytes;
    s.nvme_activation_bytes = a.read_bytes + a.write_bytes;
    s.stall_activations_seconds = a.wait_seconds;
  }
  s.gpu_peak_bytes = options_.streams->PeakReservedBytes();
  if (!std::isfinite(s.loss) && !s.skipped) {
    return DataLossError("loss is not finite at step " + std::to_string(s.step));
  }
  last_loss_ = s.loss;
  last_stats_ = s;
  last_compute_ = std::move(p.compute);
  loss_history_.push_back({s.step, s.epoch, s.loss, s.learning_rate, s.grad_norm});
  {
    std::lock_guard<std::mutex> lock(trace_mu_);
    ++traced_steps_;
  }
  if (options_.observer) options_.observer->OnStep(s);
  return OkStatus();
}

void StepAccounting::CollectDeviceSpans() {
  if (!pending_) return;
  StepStats& st = pending_->stats;
  auto spans = options_.streams->TakeSpans(&st.gpu_compute_seconds, &st.h2d_seconds,
                                           &st.d2h_seconds, &st.h2d_bytes, &st.d2h_bytes);
  for (const Span& s : spans) {
    if (s.track == "lsp compress") st.lsp_compress_seconds += (s.end_us - s.start_us) * 1e-6;
    if (s.track == "lsp decompress") st.lsp_decompress_seconds += (s.end_us - s.start_us) * 1e-6;
    if (s.track != "gpu compute") continue;
    if (s.name.rfind("forward ", 0) == 0) st.gpu_forward_seconds += (s.end_us - s.start_us) * 1e-6;
    pending_->compute.push_back(s);
  }
  std::lock_guard<std::mutex> lock(trace_mu_);
  if (options_.trace_steps == 0 || traced_steps_ < options_.trace_steps)
    trace_.insert(trace_.end(), spans.begin(), spans.end());
}

void StepAccounting::AddSpan(Span span) {
  std::lock_guard<std::mutex> lock(trace_mu_);
  if (options_.trace_steps > 0 && traced_steps_ >= options_.trace_steps) return;
  trace_.push_back(std::move(span));
}

Status StepAccounting::WriteTrace(const std::string& path) {
  TraceRecorder rec;
  std::lock_guard<std::mutex> lock(trace_mu_);
  for (const auto& s : trace_) {
    rec.AddSpan(s.track, s.name, static_cast<int64_t>(s.start_us), static_cast<int64_t>(s.end_us));
  }
  return rec.WriteJson(path);
}

}  // namespace offloadd::trainer
