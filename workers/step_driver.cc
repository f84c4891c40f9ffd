#include "workers/step_driver.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace offloadd::workers {

float ClipCoefficient(double total_sq_norm, double max_grad_norm, float* total_norm) {
  // clip_grad_norm_: total_norm is an fp32 tensor; `max_norm / (total_norm + 1e-6)` is evaluated
  // by Tensor.__rtruediv__ as reciprocal(total_norm + 1e-6) * max_norm, then clamped to 1.
  const float norm = static_cast<float>(std::sqrt(total_sq_norm));
  if (total_norm != nullptr) *total_norm = norm;
  const float reciprocal = 1.0f / (norm + 1e-6f);
  const float coef = reciprocal * static_cast<float>(max_grad_norm);
  return coef < 1.0f ? coef : 1.0f;
}

std::string_view SpeculationName(Speculation s) {
  switch (s) {
    case Speculation::kNever:
      return "never";
    case Speculation::kAlways:
      return "always";
    case Speculation::kAuto:
      return "auto";
  }
  return "?";
}

StatusOr<Speculation> ParseSpeculation(std::string_view name) {
  for (Speculation s : {Speculation::kNever, Speculation::kAlways, Speculation::kAuto}) {
    if (SpeculationName(s) == name) return s;
  }
  return InvalidArgumentError("speculation must be auto, always or never, got '" +
                              std::string(name) + "'");
}

namespace {
constexpr size_t kClipHistory = 16;

bool IsUpdate(uint32_t kind) {  // what occupies a place in a worker's update queue
  return kind == static_cast<uint32_t>(CommandKind::kAdamW) ||
         kind == static_cast<uint32_t>(CommandKind::kAdamWCorrect);
}
}  // namespace

StepDriver::StepDriver(WorkerPool* pool, std::vector<ShardSpec> shards, OptimizerConfig config)
    : pool_(pool), shards_(std::move(shards)), config_(config) {
  if (config_.accumulation_steps == 0) config_.accumulation_steps = 1;
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (shards_[s].worker < 0) shards_[s].worker = static_cast<int>(s % pool_->size());
  }
  if (config_.update_depth == 0) config_.update_depth = 1;
  updates_queued_.assign(pool_->size(), 0);
}

Status StepDriver::BeginStep(uint64_t step, double lr, float grad_unscale) {
  if (open_) return FailedPreconditionError("step " + std::to_string(step_) + " is still open");
  if (step == 0) return InvalidArgumentError("steps count from 1");
  if (step <= skipped_steps_) {
    return InvalidArgumentError("step " + std::to_string(step) + " but " +
                                std::to_string(skipped_steps_) + " steps were skipped before it");
  }
  if (!std::isfinite(grad_unscale) || grad_unscale <= 0) {
    return InvalidArgumentError("grad_unscale must be finite and > 0, got " +
                                std::to_string(grad_unscale));
  }
  step_ = step;
  lr_ = lr;
  grad_unscale_ = grad_unscale;
  open_ = true;
  error_ = OkStatus();
  outstanding_.assign(shards_.size(), 0);
  micro_seen_.assign(shards_.size(), 0);
  sq_norm_.assign(shards_.size(), 0.0);
  norm_given_.assign(shards_.size(), 0);
  norms_given_ = 0;
  id_shard_.clear();
  id_kind_.clear();
  deferred_.clear();
  ready_.clear();
  first_id_ = next_id_;
  params_updated_ = 0;
  params_corrected_ = 0;
  // Speculation needs exact clipping to correct against and finite-or-fail steps (a skipped
  // fp16 step would have to undo speculative updates bit for bit).
  const size_t clips = static_cast<size_t>(std::count(recent_clips_.begin(), recent_clips_.end(), true));
  // kAuto: while fewer than half of the steps seen (up to the last 16) clipped; the first step
  // speculates. (Counting against 16 whatever the history held kept a run where every step clips
  // speculating and correcting for its first 8 steps.)
  // A compact mode's quantised states cannot be corrected afterwards: its steps never speculate.
  const bool compact = std::any_of(shards_.begin(), shards_.end(),
                                   [](const ShardSpec& s) { return !s.mode.Exact(); });
  speculate_ = config_.max_grad_norm > 0 && !config_.skip_nonfinite && !compact &&
               (config_.speculation == Speculation::kAlways ||
                (config_.speculation == Speculation::kAuto &&
                 (recent_clips_.empty() || 2 * clips < recent_clips_.size())));
  clip_certain_ = false;
  decided_ = false;
  step_clipped_ = false;
  known_sq_ = 0;
  speculated_.assign(shards_.size(), 0);
  return OkStatus();
}

Status StepDriver::Submit(size_t shard, const ipc::CommandRecord& r) {
  RETURN_IF_ERROR(pool_->Submit(r, shards_[shard].worker));
  id_shard_.push_back(shard);
  id_kind_.push_back(r.kind);
  if (IsUpdate(r.kind)) ++updates_queued_[shards_[shard].worker];
  ++outstanding_[shard];
  return OkStatus();
}

void StepDriver::MakeReady(size_t shard, Ready::What what, float grad_scale) {
  ready_.push_back(Ready{what, shard, grad_scale, ready_seq_++});
}

bool StepDriver::IsReady(size_t shard) const {
  return std::any_of(ready_.begin(), ready_.end(), [&](const Ready& r) { return r.shard == shard; });
}

Status StepDriver::Pump() {
  if (pumping_) return error_;  // re-entered from a before-update hook: the outer pump goes on
  pumping_ = true;
  Status st = error_;
  while (st.ok() && !ready_.empty()) {
    auto best = ready_.end();
    for (auto it = ready_.begin(); it != ready_.end(); ++it) {
      if (updates_queued_[shards_[it->shard].worker] >= config_.update_depth) continue;
      // A correction follows its shard's speculative update (still running when the norms
      // were given and FinishStep decided without waiting).
      if (it->what == Ready::kCorrect && outstanding_[it->shard] > 0) continue;
      const uint32_t layer = shards_[it->shard].layer;
      if (best == ready_.end() || layer < shards_[best->shard].layer ||
          (layer == shards_[best->shard].layer && it->seq < best->seq)) {
        best = it;
      }
    }
    if (best == ready_.end()) break;  // every worker with ready work is full
    const Ready r = *best;
    ready_.erase(best);
    st = Dispatch(r);
  }
  pumping_ = false;
  return st;
}

Status StepDriver::Dispatch(const Ready& r) {
  switch (r.what) {
    case Ready::kUpdate:
      return SubmitUpdate(r.shard, r.grad_scale);
    case Ready::kCorrect:
      return SubmitUpdate(r.shard, r.grad_scale, CommandKind::kAdamWCorrect);
    case Ready::kLanded:
      break;
  }
  if (!hold()) return SubmitUpdate(r.shard, grad_unscale_);
  // Speculating: take the norms that have come back before deciding. Once they exceed
  // max_grad_norm^2 the step clips for certain, and speculating more layers would only add
  // corrections: the shard's norm is measured and its update held for FinishStep.
  RETURN_IF_ERROR(TakeCompletions());
  if (!clip_certain_ || config_.speculation == Speculation::kAlways) {
    speculated_[r.shard] = 1;
    return SubmitUpdate(r.shard, grad_unscale_, CommandKind::kAdamW, kFlagSpeculative);
  }
  return norm_given_[r.shard] ? OkStatus() : SubmitNorm(r.shard);
}

void StepDriver::AddNorm(size_t shard, double sq) {
  sq_norm_[shard] = sq;
  if (speculate_ && !decided_) {  // measured before the step's coefficient: clipping certain?
    const double u = grad_unscale_;
    known_sq_ += sq;
    if (!(known_sq_ * u * u <= config_.max_grad_norm * config_.max_grad_norm)) clip_certain_ = true;
  }
}

Status StepDriver::SubmitNorm(size_t shard) {
  const ShardSpec& s = shards_[shard];
  const bool accumulated = config_.accumulation_steps > 1;
  ipc::CommandRecord r{};
  r.kind = static_cast<uint32_t>(CommandKind::kGradNorm);
  r.id = next_id_++;
  r.flags |= accumulated ? kFlagGradFp32 : GradDtypeFlags(s.grad_dtype);
  r.Pack(GradNormCommand{s.num_elements, accumulated ? s.accum_offset : s.grad_offset, s.layer, 0});
  return Submit(shard, r);
}

Status StepDriver::SubmitUpdate(size_t shard, float grad_scale, CommandKind kind,
                                uint32_t extra_flags) {
  if (before_update_) RETURN_IF_ERROR(before_update_(shard, &shards_[shard]));
  const ShardSpec& s = shards_[shard];
  const bool accumulated = config_.accumulation_steps > 1;
  ipc::CommandRecord r{};
  r.kind = static_cast<uint32_t>(kind);
  r.id = next_id_++;
  r.flags |= extra_flags;
  r.flags |= accumulated ? kFlagGradFp32 : GradDtypeFlags(s.grad_dtype);
  if (s.weight_dtype == WeightDtype::kNone) r.flags |= kFlagNoWeights;
  if (s.weight_dtype == WeightDtype::kFp16) r.flags |= kFlagWeightsFp16;
  r.flags |= OptimizerModeFlags(s.mode);
  r.Pack(AdamWCommand{s.num_elements, accumulated ? s.accum_offset : s.grad_offset, s.master_offset,
                      s.exp_avg_offset, s.exp_avg_sq_offset, s.weights_offset, s.counters_offset,
                      step_ - skipped_steps_, lr_, config_.beta1, config_.beta2, config_.eps,
                      config_.weight_decay, grad_scale, s.layer});
  return Submit(shard, r);
}

Status StepDriver::GradsReady(size_t shard, uint32_t micro, std::optional<double> sq_norm) {
  if (!open_) return FailedPreconditionError("GradsReady outside BeginStep/FinishStep");
  if (shard >= shards_.size())
    return OutOfRangeError("shard " + std::to_string(shard) + " does not exist");
  if (micro != micro_seen_[shard] || micro >= config_.accumulation_steps) {
    return InvalidArgumentError("shard " + std::to_string(shard) + ": micro-batch " +
                                std::to_string(micro) + " out of order (expected " +
                                std::to_string(micro_seen_[shard]) + " of " +
                                std::to_string(config_.accumulation_steps) + ")");
  }
  const uint32_t A = config_.accumulation_steps;
  if (shards_[shard].on_device) {  // updated by the trainer: only its norm counts here
    if ((micro + 1 == A) != sq_norm.has_value()) {
      return InvalidArgumentError("shard " + std::to_string(shard) +
                                  " is updated on the device: its gradient norm comes with its "
                                  "last micro-batch, and only then");
    }
    ++micro_seen_[shard];
    if (sq_norm) {
      norm_given_[shard] = 1;
      ++norms_given_;
      AddNorm(shard, *sq_norm);
    }
    return OkStatus();
  }
  if (sq_norm && A > 1) {
    return InvalidArgumentError("shard " + std::to_string(shard) +
                                ": a given gradient norm needs accumulation_steps 1 (the norm is "
                                "of the accumulated gradients)");
  }
  ++micro_seen_[shard];
  const ShardSpec& s = shards_[shard];
  if (sq_norm) {
    norm_given_[shard] = 1;
    ++norms_given_;
    AddNorm(shard, *sq_norm);
  }
  if (A > 1) {
    ipc::CommandRecord r{};
    r.kind = static_cast<uint32_t>(CommandKind::kAccumulate);
    r.id = next_id_++;
    r.flags |= GradDtypeFlags(s.grad_dtype);
    if (micro == 0) r.flags |= kFlagOverwrite;
    r.Pack(AccumulateCommand{s.num_elements, s.grad_offset, s.accum_offset, s.accum_counters_offset,
                             (step_ - 1) * A + micro + 1, s.layer, 0});
    RETURN_IF_ERROR(Submit(shard, r));
  }
  if (micro + 1 < A) return OkStatus();
  // LSP-Offload's static schedule holds the layers below its transition to FinishStep, when
  // speculating too (then their norms are measured now); the update of the next forward's first
  // layers then runs first, in ascending order.
  const bool below_transition = s.layer < config_.defer_below_layer;
  if (hold() && (!speculate_ || below_transition)) return sq_norm ? OkStatus() : SubmitNorm(shard);
  if (!hold() && below_transition) {
    deferred_.push_back(shard);
    return OkStatus();
  }
  if (config_.defer_below_layer > 0) return Dispatch(Ready{Ready::kLanded, shard});  // FCFS
  MakeReady(shard, Ready::kLanded);  // earliest-needed-first
  return Pump();
}

Status StepDriver::SetOnDevice(size_t shard, bool on_device) {
  if (open_) return FailedPreconditionError("SetOnDevice while step " + std::to_string(step_) + " is open");
  if (shard >= shards_.size())
    return OutOfRangeError("shard " + std::to_string(shard) + " does not exist");
  shards_[shard].on_device = on_device;
  return OkStatus();
}

Status StepDriver::WaitOne() {
  ASSIGN_OR_RETURN(WorkerCompletion c, pool_->WaitCompletion(config_.timeout_ms));
  if (c.id < first_id_ || c.id - first_id_ >= id_shard_.size()) {
    return InternalError("completion " + std::to_string(c.id) + " does not belong to this step");
  }
  Handle(c);
  return OkStatus();
}

Status StepDriver::Poll() {
  RETURN_IF_ERROR(TakeCompletions());
  return Pump();
}

Status StepDriver::TakeCompletions() {
  WorkerCompletion c;
  while (pool_->TryGetCompletion(&c)) {
    if (c.id < first_id_ || c.id - first_id_ >= id_shard_.size()) {
      return InternalError("completion " + std::to_string(c.id) + " does not belong to this step");
    }
    Handle(c);
  }
  return error_;
}

void StepDriver::Handle(WorkerCompletion c) {
  const size_t shard = id_shard_[c.id - first_id_];
  --outstanding_[shard];
  if (IsUpdate(id_kind_[c.id - first_id_])) --updates_queued_[shards_[shard].worker];
  if (c.status_code != 0) {
    c.message[sizeof(c.message) - 1] = 0;
    if (error_.ok()) {
      error_ = Status(static_cast<StatusCode>(c.status_code), c.message)
                   .WithContext("layer " + std::to_string(shards_[shard].layer));
    }
    return;
  }
  const auto kind = static_cast<CommandKind>(c.kind);
  if ((kind == CommandKind::kGradNorm || kind == CommandKind::kAdamW) && !norm_given_[shard]) {
    AddNorm(shard, c.grad_sq_norm);
  }
  // A speculative update is final only once FinishStep knows the step does not clip.
  const bool provisional =
      kind == CommandKind::kAdamW && speculated_[shard] && (!decided_ || step_clipped_);
  if (kind == CommandKind::kAdamW) params_updated_ += c.elements;
  if (kind == CommandKind::kAdamWCorrect) params_corrected_ += c.elements;
  const bool final_update = (kind == CommandKind::kAdamW && !provisional) || kind == CommandKind::kAdamWCorrect;
  if (final_update && on_updated_) on_updated_(shard);
}

Status StepDriver::WaitShardIdle(size_t shard) {
  if (shard >= shards_.size())
    return OutOfRangeError("shard " + std::to_string(shard) + " does not exist");
  // A ready update of the shard is dispatched and waited for too, except when called from a
  // before-update hook inside a dispatch (the NVMe tier reusing a staging slot): there only its
  // submitted commands count, since nothing can be dispatched until the hook returns.
  for (;;) {
    RETURN_IF_ERROR(Pump());
    if (outstanding_[shard] == 0 && (pumping_ || !IsReady(shard))) return error_;
    RETURN_IF_ERROR(WaitOne());
  }
}

StatusOr<StepResult> StepDriver::FinishStep() {
  if (!open_) return FailedPreconditionError("FinishStep without BeginStep");
  open_ = false;
  const auto drain = [&]() -> Status {  // every ready update dispatched, every command done
    for (;;) {
      RETURN_IF_ERROR(Pump());
      const bool busy =
          std::any_of(outstanding_.begin(), outstanding_.end(), [](uint32_t n) { return n > 0; });
      if (!busy && ready_.empty()) return error_;
      RETURN_IF_ERROR(WaitOne());
    }
  };
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (micro_seen_[s] != config_.accumulation_steps) {
      RETURN_IF_ERROR(drain());
      return FailedPreconditionError("shard " + std::to_string(s) + " (layer " +
                                     std::to_string(shards_[s].layer) + ") got " +
                                     std::to_string(micro_seen_[s]) + " of " +
                                     std::to_string(config_.accumulation_steps) + " micro-batches");
    }
  }
  // Every norm given: decide now, while speculative updates still run (they stand, or their
  // corrections follow them); else the workers' measurements are all in once they are done.
  // kAlways drains first: every landed shard is speculated, whatever the timing (see the header).
  const bool decide_now = hold() && norms_given_ == shards_.size() &&
                          !(speculate_ && config_.speculation == Speculation::kAlways);
  if (decide_now) {
    RETURN_IF_ERROR(TakeCompletions());
    // Landed shards not dispatched yet were not speculated: they get the decided update below.
    ready_.erase(std::remove_if(ready_.begin(), ready_.end(),
                                [](const Ready& r) { return r.what == Ready::kLanded; }),
                 ready_.end());
  } else {
    RETURN_IF_ERROR(drain());
  }
  StepResult result;
  // The workers measured the scaled gradients; a power-of-two grad_unscale rescales the sum
  // exactly (what GradScaler.unscale_ does to every gradient before clip_grad_norm_).
  const double u = grad_unscale_;
  float norm = 0;
  if (hold()) {
    double sum_sq = std::accumulate(sq_norm_.begin(), sq_norm_.end(), 0.0);
    if (combine_sq_) {
      const StatusOr<double> all = combine_sq_(sum_sq);
      if (!all.ok()) {
        RETURN_IF_ERROR(drain());
        return all.status();
      }
      sum_sq = *all;
    }
    const double total_sq = sum_sq * u * u;
    if (config_.max_grad_norm > 0) {
      result.clip_coef = ClipCoefficient(total_sq, config_.max_grad_norm, &norm);
    } else {
      norm = static_cast<float>(std::sqrt(total_sq));
    }
    if (!std::isfinite(norm) || !std::isfinite(result.clip_coef)) {
      RETURN_IF_ERROR(drain());  // what was speculated has run: nothing is left in flight
      if (config_.skip_nonfinite) {
        ++skipped_steps_;
        result.skipped = true;
        result.grad_norm = norm;
        result.adam_step = step_ - skipped_steps_;
        if (on_decided_) on_decided_(result);
        return result;
      }
      return DataLossError("gradient norm is not finite (" + std::to_string(norm) + "); step " +
                           std::to_string(step_) + " was not applied");
    }
    decided_ = true;
    result.clipped = result.clip_coef < 1.0f;
    step_clipped_ = result.clipped;
    if (speculate_ || config_.speculation == Speculation::kAuto) {
      recent_clips_.push_back(result.clipped);
      if (recent_clips_.size() > kClipHistory) recent_clips_.pop_front();
    }
    // Dispatched lowest layer first (the ready set's order): the next forward's order.
    const float scale = result.clip_coef * grad_unscale_;
    result.grad_scale = scale;
    result.grad_norm = norm;
    result.adam_step = step_ - skipped_steps_;
    if (on_decided_) on_decided_(result);
    for (size_t s = 0; s < shards_.size(); ++s) {
      if (shards_[s].on_device) continue;
      if (!speculated_[s]) {
        MakeReady(s, Ready::kUpdate, scale);
        continue;
      }
      ++result.speculated_shards;
      if (!result.clipped) {  // grad scale 1 was right: the update stands as it is
        // Still running: final when it completes (Handle), the step being decided.
        if (outstanding_[s] == 0 && on_updated_) on_updated_(s);
        continue;
      }
      ++result.corrected_shards;
      MakeReady(s, Ready::kCorrect, scale);
    }
    RETURN_IF_ERROR(drain());
  } else {
    for (size_t s : deferred_) MakeReady(s, Ready::kUpdate, grad_unscale_);  // ascending
    deferred_.clear();
    RETURN_IF_ERROR(drain());
    // Deferred updates measured their shards' norms: sum again.
    double sum_sq = std::accumulate(sq_norm_.begin(), sq_norm_.end(), 0.0);
    if (combine_sq_) {
      ASSIGN_OR_RETURN(sum_sq, combine_sq_(sum_sq));
    }
    norm = static_cast<float>(std::sqrt(sum_sq * u * u));
    result.grad_scale = grad_unscale_;
    result.grad_norm = norm;
    result.adam_step = step_ - skipped_steps_;
    if (on_decided_) on_decided_(result);  // on_device shards were updated as they landed
  }
  result.grad_norm = norm;
  result.params_updated = params_updated_;
  result.params_corrected = params_corrected_;
  result.adam_step = step_ - skipped_steps_;
  return result;
}

}  // namespace offloadd::workers
