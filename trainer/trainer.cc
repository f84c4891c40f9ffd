// Trainer: the step loop (forward, backward with active gradient offloading, pipelined reporting).
#include "trainer/trainer.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "trainer/trainer_impl.h"

namespace offloadd::trainer {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

at::Tensor ToTensor(const std::vector<int64_t>& v, int64_t b, int64_t t) {
  return at::from_blob(const_cast<int64_t*>(v.data()), {b, t}, at::kLong).clone();
}

}  // namespace

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() {
  if (impl_ && impl_->host) {
    Status st = impl_->Flush();
    (void)st;
  }
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                   TrainObserver* observer) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = config;
  impl->obs = observer;
  try {
    RETURN_IF_ERROR(impl->Setup());
  } catch (const c10::Error& e) {
    return InternalError(std::string("trainer setup: ") + e.what_without_backtrace());
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Status Trainer::RunStep() {
  try {
    return impl_->RunStep();
  } catch (const c10::Error& e) {
    return InternalError(std::string("training step: ") + e.what_without_backtrace());
  }
}
Status Trainer::Flush() { return impl_->Flush(); }
int64_t Trainer::completed_steps() const { return impl_->completed; }
int64_t Trainer::total_steps() const { return impl_->total; }
std::string Trainer::DescribePlan() const { return impl_->plan_text; }
StatusOr<std::string> Trainer::SaveCheckpoint() { return impl_->SaveCheckpoint(); }
Status Trainer::RestoreCheckpoint(const std::string& dir) { return impl_->RestoreCheckpoint(dir); }
Status Trainer::ExportModel(const std::string& dir) { return impl_->ExportModel(dir); }

// ---- weights on the device ----

void Trainer::Impl::BindDevice(int b, const at::Tensor& flat) {
  for (auto& slot : layout[b].params) {
    slot.param->value = flat.narrow(0, static_cast<int64_t>(slot.offset), static_cast<int64_t>(slot.numel))
                            .view(slot.shape);
  }
}

void Trainer::Impl::OnUpdated(int b) {
  // Optimizer thread: the block's new weights are in the arena.
  if (cuda && resident) {
    auto e = streams->CopyToDevice(dev_weights[b], host_weights[b],
                                   "weights " + model->block(b).name(), /*after_compute=*/false);
    std::lock_guard<std::mutex> lock(ready_mu);
    ready[b] = e;
  }
}

Status Trainer::Impl::EnsureWeights(int b, uint64_t wait_step, double* stall) {
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(host->WaitUpdated(b, wait_step));
  if (cuda) {
    if (!resident && !dev_weights[b].defined()) Prefetch(b, 0);
    DeviceStreams::EventPtr e;
    {
      std::lock_guard<std::mutex> lock(ready_mu);
      e = ready[b];
    }
    streams->ComputeWaits(e);
    if (tied && b == n - 1 && b != 0) RETURN_IF_ERROR(EnsureWeights(0, wait_step, stall));
  }
  *stall += Seconds(t0, std::chrono::steady_clock::now());
  return OkStatus();
}

void Trainer::Impl::Prefetch(int b, uint64_t wait_step) {
  if (!cuda || resident || b < 0 || b >= n || dev_weights[b].defined()) return;
  if (!host->WaitUpdated(b, wait_step).ok()) return;  // the error surfaces in EnsureWeights
  dev_weights[b] = at::empty({static_cast<int64_t>(layout[b].numel)},
                             at::TensorOptions().dtype(dtype).device(device));
  BindDevice(b, dev_weights[b]);
  auto e = streams->CopyToDevice(dev_weights[b], host_weights[b], "weights " + model->block(b).name());
  std::lock_guard<std::mutex> lock(ready_mu);
  ready[b] = e;
}

void Trainer::Impl::ReleaseWeights(int b) {
  if (!cuda || resident || (tied && b == 0)) return;
  dev_weights[b] = at::Tensor();
  for (auto& slot : layout[b].params) slot.param->value = at::Tensor();
}

// ---- the step ----

Status Trainer::Impl::RunStep() {
  if (completed >= total) return OutOfRangeError("all " + std::to_string(total) + " steps are done");
  c10::NoGradGuard no_grad;
  streams->UseCompute();
  const int64_t k = completed + 1;
  const uint32_t A = static_cast<uint32_t>(cfg.gradient_accumulation_steps);
  std::vector<MicroBatchData> micro;
  int64_t tokens = 0, trained = 0;
  for (uint32_t a = 0; a < A; ++a) {
    ASSIGN_OR_RETURN(MicroBatchData m, data->Next());
    tokens += m.tokens;
    trained += m.trained_tokens;
    micro.push_back(std::move(m));
  }
  const auto start = std::chrono::steady_clock::now();
  CollectDeviceSpans();  // the previous step's device work is queued: measure it now
  streams->MarkStepStart();

  Pending cur;
  cur.start = start;
  cur.stats.step = k;
  cur.stats.max_steps = total;
  cur.stats.tokens = tokens;
  cur.stats.trained_tokens = trained;
  double flops = 0;

  // Activation offloading to pinned host memory (SaveMode::kOffload).
  struct Offloaded {
    std::vector<at::Tensor> host, device;
  };
  std::map<uint64_t, Offloaded> offloaded;
  std::map<int, uint64_t> ticket_of;
  uint64_t next_ticket = 1;
  engine::OffloadCallbacks offload;
  std::map<uint64_t, uint64_t> spilled;  // engine ticket -> ActivationSpill ticket
  offload.offload = [&](int block, std::vector<at::Tensor> saved) -> StatusOr<uint64_t> {
    if (spill_nvme[block]) {
      ASSIGN_OR_RETURN(uint64_t st, spill->Put(block, saved));
      const uint64_t ticket = next_ticket++;
      ticket_of[block] = ticket;
      spilled[ticket] = st;
      return ticket;
    }
    Offloaded o;
    for (auto& t : saved) {
      if (!t.defined() || !cuda) {
        o.host.push_back(t);
        continue;
      }
      at::Tensor h = at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
      streams->CopyToHost(h, t, "activations " + std::to_string(block));
      streams->ReleaseAfterCopies(t);
      o.host.push_back(h);
    }
    const uint64_t ticket = next_ticket++;
    ticket_of[block] = ticket;
    offloaded[ticket] = std::move(o);
    return ticket;
  };
  Status spill_status;
  auto prefetch_acts = [&](int block) {
    auto it = ticket_of.find(block);
    if (it != ticket_of.end() && spilled.count(it->second)) {
      if (spill_status.ok()) spill_status = spill->Prefetch(spilled[it->second]);
      return;
    }
    if (!cuda || it == ticket_of.end()) return;
    Offloaded& o = offloaded[it->second];
    if (!o.device.empty()) return;
    for (auto& h : o.host) {
      if (!h.defined()) {
        o.device.push_back(h);
        continue;
      }
      at::Tensor d = at::empty(h.sizes(), h.options().device(device).pinned_memory(false));
      auto e = streams->CopyToDevice(d, h, "activations " + std::to_string(block));
      streams->ComputeWaits(e);
      o.device.push_back(d);
    }
  };
  offload.fetch = [&](int block, uint64_t ticket) -> StatusOr<std::vector<at::Tensor>> {
    RETURN_IF_ERROR(spill_status);
    if (auto s = spilled.find(ticket); s != spilled.end()) {
      const uint64_t st = s->second;
      spilled.erase(s);
      ticket_of.erase(block);
      return spill->Take(st, device);
    }
    auto it = offloaded.find(ticket);
    if (it == offloaded.end()) return InternalError("no offloaded activations for ticket");
    if (cuda) prefetch_acts(block);
    std::vector<at::Tensor> out = cuda ? std::move(it->second.device) : std::move(it->second.host);
    offloaded.erase(it);
    ticket_of.erase(block);
    return out;
  };

  at::Tensor loss_sum;
  std::vector<engine::SavedState> saved(n);
  for (uint32_t a = 0; a < A; ++a) {
    const MicroBatchData& m = micro[a];
    ASSIGN_OR_RETURN(
        engine::MicroBatch mb,
        model->PrepareBatch(ToTensor(m.input_ids, m.batch, m.seq), ToTensor(m.targets, m.batch, m.seq),
                            static_cast<double>(std::max<int64_t>(1, trained)),
                            ToTensor(m.position_ids, m.batch, m.seq),
                            m.segment_ids.empty() ? at::Tensor() : ToTensor(m.segment_ids, m.batch, m.seq)));
    for (int b = 0; b < n; ++b) {  // the head's estimate already counts its backward
      const double f = model->block(b).EstimateCost(m.batch, m.seq, dtype).forward_flops;
      flops += b == n - 1 ? f : 3 * f;
    }
    // Forward.
    const uint64_t wait = a == 0 ? static_cast<uint64_t>(k - 1) : 0;
    at::Tensor x;
    for (int b = 0; b < n; ++b) {
      RETURN_IF_ERROR(EnsureWeights(b, wait, &cur.stall_weights));
      for (int p = 1; p <= window; ++p) Prefetch(b + p, wait);
      if (b == n - 1 && scaler) {
        // The head computes its gradients in the forward, so the loss scale must be final: step
        // k-1's overflow check is done (its updates are: this forward waited for each of them).
        if (a == 0 && pending) RETURN_IF_ERROR(ReportPending(start));
        mb.loss_scale = scaler->scale();
      }
      streams->BeginCompute("forward " + model->block(b).name());
      ASSIGN_OR_RETURN(x, model->block(b).Forward(mb, x, modes[b], &saved[b], &offload));
      streams->EndCompute();
      if (b < n - 1 - window) ReleaseWeights(b);
    }
    loss_sum = loss_sum.defined() ? loss_sum + x.detach() : x.detach().clone();
    if (a == 0) {
      if (pending) RETURN_IF_ERROR(ReportPending(start));
      // Step k-1 is reported, so `applied` is final: a skipped fp16 step does not advance the
      // schedule. The driver gets the step before the first gradients (queued after k-1's end).
      const double lr = cfg.optim.learning_rate * schedule->Multiplier(applied);
      cur.stats.learning_rate = lr;
      cur.stats.loss_scale = scaler ? scaler->scale() : 1.0;
      RETURN_IF_ERROR(host->BeginStep(static_cast<uint64_t>(k), lr,
                                      scaler ? scaler->grad_unscale() : 1.0f));
    }
    // Backward: each block's gradients leave as soon as its backward is done.
    at::Tensor g, tied_grad;
    for (int b = n - 1; b >= 0; --b) {
      RETURN_IF_ERROR(EnsureWeights(b, 0, &cur.stall_weights));
      for (int p = 1; p <= window; ++p) Prefetch(b - p, 0);
      if (b > 0) prefetch_acts(b - 1);
      const auto t0 = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(host->WaitStagingFree(b));
      cur.stall_grads += Seconds(t0, std::chrono::steady_clock::now());
      at::Tensor gflat = cuda ? at::empty({static_cast<int64_t>(layout[b].numel)},
                                          at::TensorOptions().dtype(dtype).device(device))
                              : host_grads[b];
      auto slice = [&](uint64_t offset, const ParamSlot& slot) {
        return gflat.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(slot.numel)).view(slot.shape);
      };
      Status grad_status;
      engine::GradCallback on_grad = [&](const std::string& name, const at::Tensor& grad) {
        auto it = owner.find(name);
        if (it == owner.end()) {
          grad_status = InternalError("gradient for unknown parameter " + name);
          return;
        }
        if (it->second.first != b) {  // the tied embedding, used by the head
          tied_grad = tied_grad.defined() ? tied_grad + grad : grad;
          return;
        }
        for (const auto& slot : layout[b].params) {
          if (slot.offset == it->second.second) slice(slot.offset, slot).copy_(grad);
        }
      };
      streams->BeginCompute("backward " + model->block(b).name());
      ASSIGN_OR_RETURN(g, model->block(b).Backward(mb, g, &saved[b], on_grad, &offload));
      RETURN_IF_ERROR(grad_status);
      if (b == 0 && tied_grad.defined()) {
        for (const auto& slot : layout[0].params) {
          if (slot.param->name == model->block(n - 1).shared_params()[0]->name)
            slice(slot.offset, slot).add_(tied_grad);
        }
        tied_grad = at::Tensor();
      }
      streams->EndCompute();
      if (cuda) {
        auto e = streams->CopyToHost(host_grads[b], gflat, "gradients " + model->block(b).name());
        RETURN_IF_ERROR(host->GradsReady(
            b, a, [e, gflat]() { return DeviceStreams::Synchronize(e); },
            [e]() {
              try {
                return DeviceStreams::Completed(e);
              } catch (const c10::Error&) {
                return true;  // Synchronize reports the error
              }
            }));
      } else {
        RETURN_IF_ERROR(host->GradsReady(b, a, nullptr));
      }
      if (b > window || a + 1 == A) ReleaseWeights(b);
    }
  }
  RETURN_IF_ERROR(host->FinishStepAsync());
  completed = k;
  cur.loss = loss_sum;
  cur.stats.model_flops = flops;
  cur.stats.epoch = data->epoch();
  pending = std::move(cur);
  return OkStatus();
}

Status Trainer::Impl::ReportPending(std::chrono::steady_clock::time_point end) {
  if (!pending) return OkStatus();
  Pending p = std::move(*pending);
  pending.reset();
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(workers::StepResult r, host->WaitFinished(static_cast<uint64_t>(p.stats.step)));
  p.stats.stall_optimizer_seconds = Seconds(t0, std::chrono::steady_clock::now());
  StepStats& s = p.stats;
  s.loss = p.loss.defined() ? p.loss.item<double>() : 0.0;
  s.grad_norm = r.grad_norm;
  s.skipped = r.skipped;
  s.clipped = r.clipped;
  s.speculated_layers = static_cast<int32_t>(r.speculated_shards);
  s.corrected_layers = static_cast<int32_t>(r.corrected_shards);
  s.cpu_update_params = r.params_updated + r.params_corrected;
  applied = static_cast<int64_t>(r.adam_step);
  if (scaler) scaler->Update(r.skipped);
  s.step_seconds = Seconds(p.start, end);
  s.stall_weights_seconds = p.stall_weights;
  s.stall_grads_seconds = p.stall_grads;
  const UpdateTotals u = host->TakeTotals();
  s.cpu_update_seconds = u.worker_busy_seconds;
  s.nvme_seconds = u.nvme_busy_seconds;
  s.nvme_read_bytes = u.nvme_read_bytes;
  s.nvme_write_bytes = u.nvme_write_bytes;
  if (spill) {
    const SpillTotals a = spill->TakeTotals();
    s.nvme_read_bytes += a.read_bytes;
    s.nvme_write_bytes += a.write_bytes;
    s.nvme_activation_bytes = a.read_bytes + a.write_bytes;
    s.stall_activations_seconds = a.wait_seconds;
  }
  s.gpu_peak_bytes = streams->PeakReservedBytes();
  if (!std::isfinite(s.loss) && !s.skipped) {
    return DataLossError("loss is not finite at step " + std::to_string(s.step));
  }
  last_loss = s.loss;
  loss_history.push_back({s.step, s.loss});
  ++traced_steps;
  reported = s.step;
  if (obs) obs->OnStep(s);
  return OkStatus();
}

Status Trainer::Impl::Flush() {
  if (!pending) return OkStatus();
  const auto end = std::chrono::steady_clock::now();
  CollectDeviceSpans();
  return ReportPending(end);
}

void Trainer::Impl::CollectDeviceSpans() {
  if (!pending) return;
  StepStats& st = pending->stats;
  auto spans = streams->TakeSpans(&st.gpu_compute_seconds, &st.h2d_seconds, &st.d2h_seconds,
                                  &st.h2d_bytes, &st.d2h_bytes);
  std::lock_guard<std::mutex> lock(trace_mu);
  if (cfg.trace_steps == 0 || traced_steps < cfg.trace_steps)
    trace.insert(trace.end(), spans.begin(), spans.end());
}

}  // namespace offloadd::trainer
