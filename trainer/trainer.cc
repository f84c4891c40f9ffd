// Trainer: the step loop. Each step reads like its schedule: load the micro-batches; for each, a
// forward pass, then (first micro-batch) the previous step's report and this step's update
// settings, then a backward pass that hands each block's gradients to the host optimizer.
#include "trainer/trainer.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <utility>
#include <vector>

#include "engine/torch_boundary.h"
#include "trainer/pipeline/trace.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() {
  if (impl_ && impl_->pipeline.accounting) {
    Status st = impl_->Flush();
    (void)st;
  }
  // Across hosts: the gathers queued run to the end on every rank alike, before the weights,
  // the host optimizer and the group they use go away.
  if (impl_ && impl_->gather) impl_->gather->Stop();
  // A data-parallel follower's thread uploads rank 0's updates into this rank's weights: it stops
  // before they are destroyed (rank 0's own thread only runs for steps this process submitted).
  if (impl_ && impl_->host && impl_->host->follower()) impl_->host->StopThread();
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                   TrainObserver* observer) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = config;
  impl->obs = observer;
  try {
    RETURN_IF_ERROR(impl->Setup());
  } catch (const std::exception& e) {  // LibTorch's c10::Error, out of memory included
    return engine::TorchErrorStatus("trainer setup", e);
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Status Trainer::RunStep() {
  try {
    return impl_->RunStep();
  } catch (const std::exception& e) {
    return engine::TorchErrorStatus("training step", e);
  }
}
Status Trainer::Flush() { return impl_->Flush(); }
int64_t Trainer::completed_steps() const { return impl_->completed; }
int64_t Trainer::total_steps() const { return impl_->total; }
int32_t Trainer::batch_size() const { return impl_->cfg.batch_size; }
int32_t Trainer::gradient_accumulation_steps() const { return impl_->cfg.gradient_accumulation_steps; }
std::string Trainer::DescribePlan() const { return impl_->device_plan.plan_text; }
const StepPrediction& Trainer::prediction() const { return impl_->prediction; }
StatusOr<std::string> Trainer::SaveCheckpoint() { return impl_->SaveCheckpoint(); }
Status Trainer::RestoreCheckpoint(const std::string& dir) { return impl_->RestoreCheckpoint(dir); }
Status Trainer::ExportModel(const std::string& dir) { return impl_->ExportModel(dir); }

namespace {

at::Tensor ToTensor(const std::vector<int64_t>& v, int64_t b, int64_t t) {
  return at::from_blob(const_cast<int64_t*>(v.data()), {b, t}, at::kLong).clone();
}

// One optimizer step's input.
struct StepBatches {
  std::vector<MicroBatchData> micro;
  int64_t tokens = 0, trained_tokens = 0;
};

StatusOr<StepBatches> NextBatches(DataSource& data, uint32_t count) {
  StepBatches s;
  for (uint32_t a = 0; a < count; ++a) {
    ASSIGN_OR_RETURN(MicroBatchData m, data.Next());
    s.tokens += m.tokens;
    s.trained_tokens += m.trained_tokens;
    s.micro.push_back(std::move(m));
  }
  return s;
}

// Rows [first, first + count) of a micro-batch (a data-parallel rank's share); the token counts
// stay the whole batch's, which normalise the loss.
MicroBatchData RowsOf(const MicroBatchData& m, int64_t first, int64_t count) {
  MicroBatchData r;
  r.batch = count;
  r.seq = m.seq;
  auto cut = [&](const std::vector<int64_t>& v) {
    if (v.empty()) return std::vector<int64_t>();
    return std::vector<int64_t>(v.begin() + first * m.seq, v.begin() + (first + count) * m.seq);
  };
  r.input_ids = cut(m.input_ids);
  r.targets = cut(m.targets);
  r.position_ids = cut(m.position_ids);
  r.segment_ids = cut(m.segment_ids);
  r.tokens = m.tokens;
  r.trained_tokens = m.trained_tokens;
  return r;
}

// The engine's batch for one micro-batch (the loss normalised over the whole step's trained
// tokens); adds its model FLOPs to *flops.
StatusOr<engine::MicroBatch> Prepare(engine::Model& model, const MicroBatchData& m,
                                     int64_t trained_tokens, c10::ScalarType dtype, double* flops) {
  ASSIGN_OR_RETURN(
      engine::MicroBatch mb,
      model.PrepareBatch(
          ToTensor(m.input_ids, m.batch, m.seq), ToTensor(m.targets, m.batch, m.seq),
          static_cast<double>(std::max<int64_t>(1, trained_tokens)),
          ToTensor(m.position_ids, m.batch, m.seq),
          m.segment_ids.empty() ? at::Tensor() : ToTensor(m.segment_ids, m.batch, m.seq)));
  const int n = model.num_blocks();
  for (int b = 0; b < n; ++b) {  // the head's estimate already counts its backward
    const double f = model.block(b).EstimateCost(m.batch, m.seq, dtype).forward_flops;
    *flops += b == n - 1 ? f : 3 * f;
  }
  return mb;
}

}  // namespace

Status Trainer::Impl::RunStep() {
  if (completed >= total) return OutOfRangeError("all " + std::to_string(total) + " steps are done");
  c10::NoGradGuard no_grad;
  pipeline.streams->UseCompute();
  // On CUDA the plan is priced on the second step: the first one's GPU time includes the kernels'
  // warm-up (cuDNN plans, cuBLAS handles, allocator growth), 2.5x the steady time at Llama-2-7B
  // batch 16 on the H200.
  if (steps_run == (cuda ? 2 : 1) &&
      (device_plan.device_placement_pending || !cfg.profile_dir.empty())) {
    if (FixedShape()) RETURN_IF_ERROR(RecordShapeProfile());
  }
  if (device_plan.device_placement_pending && steps_run == (cuda ? 2 : 1))
    RETURN_IF_ERROR(PlaceDeviceBlocks());
  // The step the shape profile records measures each compute span's allocator peak.
  pipeline.streams->MeasureSpanMemory(steps_run + 1 == (cuda ? 2 : 1));
  const int64_t k = completed + 1;
  const auto A = static_cast<uint32_t>(cfg.gradient_accumulation_steps);
  ASSIGN_OR_RETURN(StepBatches batches, NextBatches(*data, A));
  for (const MicroBatchData& m : batches.micro) {  // the step planner's check prices a new length's warm-up
    if (planner.seen_lengths.insert(m.seq).second) planner.steps_with_new_length.insert(k);
  }
  pipeline.accounting->BeginStep(k, batches.tokens, batches.trained_tokens);
  pipeline.schedule->BeginStep(k);
  at::Tensor loss_sum, aux_sum;
  double flops = 0;
  for (uint32_t a = 0; a < A; ++a) {
    if (dp) {  // this rank's rows of the global micro-batch
      MicroBatchData& m = batches.micro[a];
      const int64_t rows = m.batch / dp->world();
      m = RowsOf(m, rows * dp->rank(), rows);
    }
    ASSIGN_OR_RETURN(engine::MicroBatch mb,
                     Prepare(*model, batches.micro[a], batches.trained_tokens, dtype, &flops));
    if (a == 0 && pipeline.lsp && pipeline.lsp->CheckDue(k))
      RETURN_IF_ERROR(CheckProjectors(k, mb));
    ASSIGN_OR_RETURN(at::Tensor loss, pipeline.schedule->Forward(mb, a));
    loss_sum = loss_sum.defined() ? loss_sum + loss : loss.clone();
    if (mb.moe) {
      at::Tensor aux = mb.moe->AuxLoss() * mb.moe->aux_coef;
      if (dp) {
        // Every rank's head added the global micro-batch's load-balancing loss (the schedule
        // joined the group's router statistics); the ranks' losses are summed below, so each
        // keeps 1/world of it.
        const double share = 1.0 / static_cast<double>(dp->world());
        loss_sum = loss_sum - aux * (1.0 - share);
        aux = aux * share;
      }
      aux_sum = aux_sum.defined() ? aux_sum + aux : aux;
    }
    if (a == 0) RETURN_IF_ERROR(BeginUpdates(k));
    RETURN_IF_ERROR(pipeline.schedule->Backward(mb, a));
  }
  if (dp) {  // each rank's loss is its rows' share of the step's mean; the model FLOPs every rank's
    at::Tensor l = loss_sum.reshape({1});
    RETURN_IF_ERROR(dp->AllReduceSum(l));
    loss_sum = l.reshape({});
    if (aux_sum.defined()) {
      at::Tensor x = aux_sum.reshape({1});
      RETURN_IF_ERROR(dp->AllReduceSum(x));
      aux_sum = x.reshape({});
    }
    flops *= dp->world();
  }
  RETURN_IF_ERROR(host->FinishStepAsync());
  // Across hosts: each block's slices are gathered as its update finishes, on the gather thread.
  if (gather) RETURN_IF_ERROR(gather->Submit(static_cast<uint64_t>(k)));
  RETURN_IF_ERROR(UpdateDeviceBlocks(k));
  completed = k;
  ++steps_run;
  pipeline.accounting->EndStep(loss_sum, flops, data->epoch(), aux_sum);
  if (obs) {
    RuntimeStats rt;
    host->AddRuntime(&rt);
    if (pipeline.spill) pipeline.spill->AddRuntime(&rt);
    rt.pinned_host_bytes += pipeline.streams->PinnedBytes();
    obs->OnRuntime(rt);
  }
  return OkStatus();
}

Status Trainer::Impl::BeginUpdates(int64_t k) {
  RETURN_IF_ERROR(pipeline.accounting->ReportPrevious());
  RETURN_IF_ERROR(CheckPlan());
  // Step k-1 is reported, so `applied` is final: a skipped fp16 step does not advance the
  // schedule. The driver gets the step before the first gradients (queued after k-1's end).
  const double lr =
      cfg.optim.learning_rate * lr_schedule->Multiplier(pipeline.accounting->applied());
  pipeline.accounting->SetUpdateSettings(lr, scaler ? scaler->scale() : 1.0);
  const float unscale = scaler ? scaler->grad_unscale() : 1.0f;
  // Not held (no clipping, no loss scaling), a device block is updated as its gradients land:
  // with AdamW step applied + 1, since such a step cannot be skipped.
  if (pipeline.device_opt)
    pipeline.device_opt->BeginStep(lr, static_cast<uint64_t>(pipeline.accounting->applied()) + 1,
                                   unscale);
  return host->BeginStep(static_cast<uint64_t>(k), lr, unscale);
}

Status Trainer::Impl::Evaluate() {
  // Data parallel: the weights are the same on every rank; rank 0 evaluates.
  if (!eval.data || eval.at_step == completed || !leader()) return OkStatus();
  c10::NoGradGuard no_grad;
  pipeline.streams->UseCompute();
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(Flush());
  if (completed > 0) {  // the weights of every block as of the last step
    ASSIGN_OR_RETURN(workers::StepResult last, host->WaitFinished(static_cast<uint64_t>(completed)));
    (void)last;
  }
  RETURN_IF_ERROR(WaitGathers());  // across hosts: the other hosts' slices too
  RETURN_IF_ERROR(eval.data->Restore(eval.start));
  const int64_t batches = (eval.data->sequences_per_epoch() + cfg.batch_size - 1) / cfg.batch_size;
  at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble));
  int64_t trained = 0;
  double flops = 0;
  const int64_t rows = eval.data->sequences_per_epoch();
  for (int64_t i = 0; i < batches; ++i) {
    ASSIGN_OR_RETURN(MicroBatchData m, eval.data->Next());
    // The last batch is filled up from the next epoch: those rows do not count.
    const int64_t real = std::min<int64_t>(m.batch, rows - i * cfg.batch_size);
    for (int64_t r = real; r < m.batch; ++r) {
      for (int64_t t = 0; t < m.seq; ++t) {
        int64_t& target = m.targets[static_cast<size_t>(r * m.seq + t)];
        if (target != -100) --m.trained_tokens;
        target = -100;
      }
    }
    // Normaliser 1: the batch's summed token loss; the mean is over every trained token.
    ASSIGN_OR_RETURN(engine::MicroBatch mb, Prepare(*model, m, 1, dtype, &flops));
    ASSIGN_OR_RETURN(at::Tensor loss, pipeline.schedule->EvalLoss(mb));
    sum += loss.to(at::kCPU, at::kDouble);
    trained += m.trained_tokens;
  }
  EvalStats st;
  st.step = completed;
  st.tokens = trained;
  st.loss = trained > 0 ? sum.item<double>() / static_cast<double>(trained) : 0.0;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  eval.at_step = completed;
  eval.loss = st.loss;
  std::ostringstream msg;
  msg << "eval at step " << completed << ": loss " << st.loss << " over " << trained << " tokens ("
      << batches << " batches, " << st.seconds << " s)";
  Log(TrainObserver::Level::kInfo, msg.str());
  if (obs) obs->OnEval(st);
  return OkStatus();
}

Status Trainer::Impl::CheckProjectors(int64_t k, engine::MicroBatch& mb) {
  // Alg. 2's check on the step's first micro-batch (a random sample of the data: the loader
  // shuffles), between steps: step k-1's updates are applied and reported, so the subspace
  // states can move and the AdamW step count is final.
  const int64_t t0 = NowMicros();
  if (k > 1) {
    ASSIGN_OR_RETURN(workers::StepResult last, host->WaitFinished(static_cast<uint64_t>(k - 1)));
    (void)last;
  }
  RETURN_IF_ERROR(pipeline.accounting->Flush());
  LspMode::StateAccess access;
  access.read = [this](int b, std::vector<float>* master, std::vector<float>* m, std::vector<float>* v) {
    const size_t numel = layout[b].numel;
    master->resize(numel);
    m->resize(numel);
    v->resize(numel);
    return ReadBlockStates(b, master->data(), m->data(), v->data());
  };
  access.restore = [this](int b, const std::vector<float>& master, const std::vector<float>& m,
                          const std::vector<float>& v) {
    RETURN_IF_ERROR(RestoreBlockStates(b, master.data(), m.data(), v.data(),
                                       static_cast<uint64_t>(pipeline.accounting->applied())));
    // Resident weights: the device copy of A (now zero) follows, after the probe's use of it.
    pipeline.weights->OnUpdated(b, /*after_compute=*/true);
    return OkStatus();
  };
  // Block by block as the probe's backward produces their gradients (bounded memory on CUDA).
  LspMode::CheckSummary s;
  double bias_sum = 0, bias_after_sum = 0;
  RETURN_IF_ERROR(
      pipeline.schedule->ProbeGradients(mb, [&](std::map<std::string, at::Tensor> grads) -> Status {
        ASSIGN_OR_RETURN(const LspMode::CheckSummary part, pipeline.lsp->Check(k, grads, access));
        s.checked += part.checked;
        s.learn_seconds += part.learn_seconds;
        s.switch_seconds += part.switch_seconds;
        s.switched += part.switched;
        bias_sum += part.mean_bias * part.checked;
        bias_after_sum += part.mean_bias_after * part.switched;
        return OkStatus();
      }));
  if (s.checked > 0) s.mean_bias = bias_sum / s.checked;
  if (s.switched > 0) s.mean_bias_after = bias_after_sum / s.switched;
  s.seconds = static_cast<double>(NowMicros() - t0) * 1e-6;
  pipeline.accounting->AddSpan(
      {"lsp", "projector check", static_cast<double>(t0), static_cast<double>(NowMicros())});
  std::ostringstream msg;
  msg.precision(3);
  msg << "LSP projector check before step " << k << ": mean relative bias " << s.mean_bias << " over "
      << s.checked << " matrices; " << s.switched << " switched to learned projectors";
  if (s.switched > 0) msg << " (mean bias " << s.mean_bias_after << " after)";
  msg << " in " << s.seconds << " s (" << s.learn_seconds << " s checking and learning, " << s.switch_seconds
      << " s switching, the rest the probe's forward and backward)";
  Log(TrainObserver::Level::kInfo, msg.str());
  if (obs) obs->OnProjectorCheck({k, s.checked, s.switched, s.mean_bias, s.mean_bias_after, s.seconds});
  return OkStatus();
}

Status Trainer::Impl::UpdateDeviceBlocks(int64_t k) {
  if (!pipeline.device_opt || !pipeline.device_opt->held()) return OkStatus();
  ASSIGN_OR_RETURN(workers::StepResult decided, host->WaitDecided(static_cast<uint64_t>(k)));
  if (decided.skipped) return OkStatus();  // fp16 overflow: no block is updated
  for (int b = 0; b < n; ++b) {  // in the next forward's order
    if (!pipeline.device_opt->owns(b)) continue;
    pipeline.streams->BeginCompute("device update " + model->block(b).name());
    const Status updated = pipeline.device_opt->Update(b, decided.grad_scale, decided.adam_step);
    pipeline.streams->EndCompute();
    RETURN_IF_ERROR(updated);
  }
  return OkStatus();
}

Status Trainer::Impl::Flush() {
  RETURN_IF_ERROR(pipeline.accounting->Flush());
  return CheckPlan();  // when the checked step is the last one
}

}  // namespace offloadd::trainer
