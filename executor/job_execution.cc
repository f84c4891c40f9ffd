#include "executor/job_execution.h"

#include <google/protobuf/util/time_util.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/file.h"
#include "common/file_identity.h"
#include "common/logging.h"
#include "common/safe_path.h"
#include "engine/model_config.h"
#include "engine/torch_boundary.h"
#include "executor/heartbeat.h"
#include "executor/tensorboard_writer.h"
#include "executor/trainer_state_file.h"
#include "ipc/liveness.h"
#include "job/executor_protocol.h"
#include "job/memory_estimate.h"
#include "job/train_job_config.h"
#include "trainer/state/checkpoint.h"
#include "trainer/trainer.h"

namespace offloadd::executor {
namespace {

namespace v1 = offloadd::v1;
namespace pb = offloadd::internal;
constexpr const char* kLog = "executor";

google::protobuf::Timestamp Now() { return google::protobuf::util::TimeUtil::GetCurrentTime(); }

void SetDuration(double seconds, google::protobuf::Duration* d) {
  if (!std::isfinite(seconds) || seconds < 0) seconds = 0;
  *d = google::protobuf::util::TimeUtil::NanosecondsToDuration(static_cast<int64_t>(seconds * 1e9));
}

v1::LogLevel ToLogLevel(trainer::TrainObserver::Level level) {
  switch (level) {
    case trainer::TrainObserver::Level::kDebug: return v1::LOG_LEVEL_DEBUG;
    case trainer::TrainObserver::Level::kWarning: return v1::LOG_LEVEL_WARNING;
    case trainer::TrainObserver::Level::kError: return v1::LOG_LEVEL_ERROR;
    default: return v1::LOG_LEVEL_INFO;
  }
}

// Input tokens the job had seen when `checkpoint` was written: the checkpoint's own count when it
// records one, else an estimate from the job's last reported progress (exact when that report was
// for the checkpoint's step, as after a pause, since every checkpoint is reported).
int64_t TokensAtCheckpoint(const v1::Job& job, const std::string& checkpoint) {
  auto reader = trainer::CheckpointReader::Open(checkpoint);
  if (!reader.ok()) return 0;  // Train() reports the real problem when it opens it
  const trainer::TrainerState& st = reader->state();
  if (st.num_input_tokens_seen > 0) return st.num_input_tokens_seen;
  const v1::JobProgress& p = job.progress();
  if (p.step() <= 0 || st.global_step <= 0) return 0;
  const double share = std::min(1.0, static_cast<double>(st.global_step) / static_cast<double>(p.step()));
  return static_cast<int64_t>(std::llround(static_cast<double>(p.tokens_seen()) * share));
}

// Sends what the trainer reports to the daemon: everything on rank 0, warnings and errors on the
// others.
class ChannelObserver final : public trainer::TrainObserver {
 public:
  // Steps up to `reported_before` were reported by an earlier run of the job (0: none).
  ChannelObserver(const v1::Job& job, int rank, ExecutorChannel& channel, int64_t tokens_seen,
                  int64_t reported_before, double progress_interval_seconds, Heartbeat& heartbeat)
      : job_id_(job.id()),
        rank_(rank),
        logging_steps_(std::max<int64_t>(1, job.spec().training().logging_steps())),
        save_steps_(job.spec().training().save_steps()),
        eval_steps_(job.spec().training().eval_steps()),
        heartbeat_(heartbeat),
        progress_interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(progress_interval_seconds))),
        channel_(channel),
        tokens_seen_(tokens_seen),
        reported_before_(reported_before),
        start_progress_(job.progress()) {}

  // training.report_to tensorboard: rank 0 also writes every step and evaluation to `events`.
  void SetEventWriter(std::unique_ptr<EventFileWriter> events) { events_ = std::move(events); }

  // The job's metrics history before this run (StartJob.history); this run's steps join it.
  void SetHistory(const google::protobuf::RepeatedPtrField<v1::StepMetrics>& rows) {
    for (const v1::StepMetrics& row : rows) history_.Add(row);
  }
  // Rank 0, when training finished: trainer_state.json with the whole log_history in `dir`.
  Status WriteTrainerStateFile(const std::string& dir, const v1::TrainingArguments& args) const {
    TrainerStateFacts f;
    f.global_step = last_.step;
    f.max_steps = last_.max_steps;
    f.epoch = last_.epoch;
    f.num_input_tokens_seen = tokens_seen_;
    f.logging_steps = logging_steps_;
    f.eval_steps = eval_steps_;
    f.save_steps = save_steps_;
    f.train_batch_size = args.per_device_train_batch_size();
    return WriteTrainerState(dir, history_, f);
  }

  void OnStep(const trainer::StepStats& s) override {
    EnterNextStep(s);
    if (rank_ != 0) return;
    WriteEvents(s.step, StepScalars(s));
    pb::ExecutorMessage m;
    *m.mutable_step() = daemon::ToProto(s);
    history_.Add(daemon::MetricsRow(m.step(), Now()));
    channel_.Send(m);
    tokens_seen_ += s.tokens;
    // The ETA follows recent steps (the first ones include warm-up costs).
    step_seconds_ = step_seconds_ > 0 ? 0.8 * step_seconds_ + 0.2 * s.step_seconds : s.step_seconds;
    last_ = s;
    // Every logging_steps, the last step, and whenever progress_interval passed since the last
    // report (metrics.progress_interval_seconds: watchers hear from a job with long steps).
    if (s.step % logging_steps_ == 0 || s.step >= s.max_steps ||
        std::chrono::steady_clock::now() - last_report_ >= progress_interval_) {
      Report();
    }
  }

  void OnEval(const trainer::EvalStats& e) override {
    if (rank_ != 0) return;
    WriteEvents(e.step, {{"eval/loss", e.loss}});
    pb::ExecutorMessage m;
    *m.mutable_eval() = daemon::ToProto(e);
    history_.Add(daemon::MetricsRow(m.eval(), Now()));
    channel_.Send(m);
    // Every evaluation gets a progress event of its own carrying it (JobProgress.eval_loss),
    // unless it falls among the steps an earlier run of the job reported (replayed after a
    // restart); the one before training is step 0, a resumed job's is at the step it resumed.
    eval_ = e;
    if (e.step >= reported_before_) SendProgress(e.step);
  }
  void OnProjectorCheck(const trainer::ProjectorCheckStats& c) override {
    if (rank_ != 0) return;
    pb::ExecutorMessage m;
    *m.mutable_projector_check() = daemon::ToProto(c);
    channel_.Send(m);
  }
  void OnRuntime(const trainer::RuntimeStats& r) override {
    if (rank_ != 0) return;
    pb::ExecutorMessage m;
    *m.mutable_runtime() = daemon::ToProto(r);
    m.mutable_runtime()->set_worker_watchdog_kills(ipc::WatchdogKills("worker"));
    channel_.Send(m);
  }

  void OnLog(Level level, const std::string& message) override {
    const bool loud = level == Level::kWarning || level == Level::kError;
    if (loud) {
      OFFLOADD_LOG(kWarning, kLog) << "job " << job_id_ << " rank " << rank_ << ": " << message;
    } else {
      OFFLOADD_LOG(kInfo, kLog) << "job " << job_id_ << " rank " << rank_ << ": " << message;
    }
    if (rank_ != 0 && !loud) return;
    Log(ToLogLevel(level), rank_ == 0 ? message : "rank " + std::to_string(rank_) + ": " + message);
  }

  void OnCheckpoint(const std::string& path, int64_t step, uint64_t bytes, double loss) override {
    // How long a checkpoint takes (from the step report before it): later steps that write one
    // are expected to take that much longer.
    checkpoint_seconds_ = std::max(
        checkpoint_seconds_, std::chrono::duration<double>(std::chrono::steady_clock::now() - last_step_at_).count());
    if (rank_ != 0) return;
    // The checkpoint's step gets a progress event even between logging steps, so the job record
    // shows where a paused job stands and a resume can count tokens from it.
    if (last_.step == step && reported_step_ != step) Report();
    pb::ExecutorMessage m;
    v1::Checkpoint& c = *m.mutable_checkpoint();
    c.set_id(path.substr(path.rfind('/') + 1));
    c.set_job_id(job_id_);
    c.set_step(step);
    *c.mutable_create_time() = Now();
    c.set_path(path);
    c.set_size_bytes(bytes);
    c.set_loss(loss);
    channel_.Send(m);
  }

  bool StopRequested() override { return channel_.stop() != StopRequest::kNone; }

  void Log(v1::LogLevel level, const std::string& message) {
    pb::ExecutorMessage m;
    m.mutable_log()->set_level(level);
    m.mutable_log()->set_message(message);
    channel_.Send(m);
  }

 private:
  // The heartbeat's phase after step s: the next step, expected to take the recent steps' time,
  // plus a checkpoint's when one falls around it. Unknown (0: only the heartbeats are watched)
  // before a step time or a checkpoint time was measured, around evaluations and before the
  // export that follows the last step.
  void EnterNextStep(const trainer::StepStats& s) {
    last_step_at_ = std::chrono::steady_clock::now();
    step_ema_ = step_ema_ > 0 ? 0.8 * step_ema_ + 0.2 * s.step_seconds : s.step_seconds;
    const int64_t next = s.step + 1;
    const auto near = [&](int64_t every) { return every > 0 && (s.step % every == 0 || next % every == 0); };
    double expected = step_ema_;
    if (near(save_steps_)) expected = checkpoint_seconds_ > 0 ? expected + checkpoint_seconds_ : 0;
    if (near(eval_steps_) || next >= s.max_steps) expected = 0;
    heartbeat_.Enter("step " + std::to_string(next), expected);
  }

  // A failed write (a full disk) stops the event file, not the job: the job's events say why once.
  void WriteEvents(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
    if (!events_) return;
    if (Status st = events_->AddScalars(step, values, WallTimeNow()); !st.ok()) {
      Log(v1::LOG_LEVEL_WARNING,
          "report_to tensorboard: no more events are written: " + st.ToString());
      events_.reset();
    }
  }

  void Report() {
    // A step an earlier run already reported (replayed after a resume) keeps its first event.
    if (last_.step <= reported_before_) return;
    SendProgress(last_.step);
  }

  // The progress of step `step`: the last step's values when it is that step, and the latest
  // evaluation. An evaluation before this run's first step is reported with the progress the
  // job had (a resumed job's), or with none (a new job's, at step 0).
  void SendProgress(int64_t step) {
    if (last_.step != step) {
      pb::ExecutorMessage m;
      v1::JobProgress& p = *m.mutable_progress();
      if (start_progress_.step() == step) p = start_progress_;
      p.set_step(step);
      if (eval_) {
        p.set_eval_loss(eval_->loss);
        p.set_eval_step(eval_->step);
      }
      channel_.Send(m);
      reported_step_ = step;
      last_report_ = std::chrono::steady_clock::now();
      return;
    }
    const trainer::StepStats& s = last_;
    pb::ExecutorMessage m;
    v1::JobProgress& p = *m.mutable_progress();
    if (eval_) {
      p.set_eval_loss(eval_->loss);
      p.set_eval_step(eval_->step);
    }
    p.set_step(step);
    p.set_max_steps(s.max_steps);
    p.set_epoch(s.epoch);
    p.set_tokens_seen(tokens_seen_);
    p.set_loss(s.loss);
    p.set_learning_rate(s.learning_rate);
    p.set_grad_norm(s.grad_norm);
    if (s.step_seconds > 0) {
      p.set_tokens_per_second(static_cast<double>(s.tokens) / s.step_seconds);
      p.set_model_tflops(s.model_flops / s.step_seconds / 1e12);
    }
    SetDuration(static_cast<double>(std::max<int64_t>(0, s.max_steps - s.step)) * step_seconds_, p.mutable_eta());
    SetDuration(s.step_seconds, p.mutable_step_time());
    channel_.Send(m);
    reported_step_ = step;
    last_report_ = std::chrono::steady_clock::now();
  }

  const std::string job_id_;
  const int rank_;
  const int64_t logging_steps_;
  const int64_t save_steps_, eval_steps_;
  Heartbeat& heartbeat_;
  const std::chrono::steady_clock::duration progress_interval_;
  std::chrono::steady_clock::time_point last_report_ = std::chrono::steady_clock::now();
  ExecutorChannel& channel_;
  int64_t tokens_seen_;
  double step_seconds_ = 0;
  trainer::StepStats last_;
  std::optional<trainer::EvalStats> eval_;  // the latest evaluation
  int64_t reported_step_ = 0;
  const int64_t reported_before_;
  const v1::JobProgress start_progress_;  // the job's progress when this run began
  double step_ema_ = 0, checkpoint_seconds_ = 0;
  std::chrono::steady_clock::time_point last_step_at_ = std::chrono::steady_clock::now();
  std::unique_ptr<EventFileWriter> events_;
  LogHistory history_;  // rank 0: trainer_state.json's log_history
};

// Free space in output_dir for a checkpoint and the exported model, sized from the model's config.
Status CheckOutputSpaceAtStart(const trainer::TrainConfig& config) {
  auto model = engine::LoadModelConfig(config.model_dir);
  if (!model.ok()) return OkStatus();  // the trainer reports it, with its context
  return daemon::CheckOutputSpace(
      config.output_dir, daemon::EstimateOutputSpace(daemon::EstimateModelSize(*model).total_params, config.model_dir));
}

// Runs the trainer; the caller cleans up whatever the outcome.
Status Train(const v1::Job& job, const trainer::TrainConfig& config, ExecutorChannel& channel,
             ChannelObserver& observer, Heartbeat& heartbeat) {
  auto created = trainer::Trainer::Create(config, &observer);
  if (!created.ok()) return created.status().WithContext("setting up the training pipeline");
  std::unique_ptr<trainer::Trainer> t = std::move(*created);
  // No checkpoint from Train() itself on a stop: a cancelled job does not need one, a paused one
  // gets it below.
  auto result = t->Train(/*checkpoint_on_stop=*/false);
  if (result.ok()) {
    if (config.parallel.rank == 0) {
      // Beside the exported model: the whole log_history (checkpoints' stop at their step). A
      // failure to write it fails the job as a failed export would.
      RETURN_IF_ERROR(observer.WriteTrainerStateFile(config.output_dir, job.spec().training()));
      observer.Log(v1::LOG_LEVEL_INFO, "finished " + std::to_string(result->steps) + " steps, final loss " +
                                           std::to_string(result->final_loss) +
                                           (result->exported_to.empty() ? "" : "; model in " + result->exported_to));
    }
    return OkStatus();
  }
  // A rank of a group across hosts stopped on rank 0's word: whether to checkpoint (every host
  // writes its partition) is its own request's, which its daemon relays from the coordinator.
  const bool follower = config.parallel.hosts > 1 && config.parallel.rank > 0;
  if (result.status().code() == StatusCode::kCancelled &&
      (follower ? channel.WaitForStop(std::chrono::seconds(30)) : channel.stop()) ==
          StopRequest::kPause) {
    heartbeat.Enter("writing the pause checkpoint", 0);
    auto saved = t->SaveCheckpoint();  // every rank: the trainer writes it on rank 0 only
    if (!saved.ok()) return saved.status().WithContext("job " + job.id() + ": checkpoint for the pause");
  }
  return result.status();
}

}  // namespace

Status ExecuteJob(const pb::StartJob& start, ExecutorChannel& channel) {
  const v1::Job& job = start.job();
  const daemon::TrainerEnvironment& env = start.environment();
  // Every file the job opens stays under the daemon's allowed_roots, checked at use.
  SetAllowedRoots({env.allowed_roots().begin(), env.allowed_roots().end()});
  // ...and is opened with the rights of the job's user (common/file_identity.h).
  if (start.has_file_identity()) {
    FileIdentity id;
    id.uid = start.file_identity().uid();
    id.gid = start.file_identity().gid();
    id.groups.assign(start.file_identity().groups().begin(), start.file_identity().groups().end());
    id.user = start.file_identity().user();
    SetJobFileIdentity(std::move(id));
  }
  // So are its waits on its workers and store (jobs.liveness; the trainer adds the node profile's
  // rates).
  ipc::SetLivenessPolicy(env.liveness_floor_seconds(), env.liveness_factor());
  ASSIGN_OR_RETURN(trainer::TrainConfig config, daemon::MakeTrainConfig(job, env));
  config.parallel = daemon::ParallelFromPlacement(start.placement());
  if (env.has_gpu() && start.placement().gpu_index() >= 0) {
    config.device = "cuda:" + std::to_string(start.placement().gpu_index());
  }
  std::vector<std::string> skipped;  // checkpoints passed over, and why: the job's events say so
  ASSIGN_OR_RETURN(config.resume_from, daemon::ResumePoint(job, /*restarted=*/start.restart() > 0, &skipped));
  const int rank = config.parallel.rank;
  int64_t tokens_seen = 0;
  // Progress reported by an earlier run of this job (a new job has none; a new job resuming
  // another's checkpoint neither): replayed steps up to there are not reported again, also when
  // the earlier run ended before its first checkpoint and this one trains from step 0 again.
  const int64_t reported_before = job.progress().step();
  if (!config.resume_from.empty()) tokens_seen = TokensAtCheckpoint(job, config.resume_from);
  // Liveness: heartbeats to the daemon from here until the job's final status.
  Heartbeat heartbeat(channel, env.heartbeat_seconds());
  heartbeat.Enter("setting up the training pipeline", 0);
  ChannelObserver observer(job, rank, channel, tokens_seen, reported_before,
                           env.progress_interval_seconds(), heartbeat);
  if (rank == 0) observer.SetHistory(start.history());
  if (rank == 0) {
    for (const std::string& s : skipped) observer.Log(v1::LOG_LEVEL_WARNING, s);
  }
  if (!config.resume_from.empty() && rank == 0) observer.Log(v1::LOG_LEVEL_INFO, "resuming from " + config.resume_from);
  if (config.resume_from.empty() && reported_before > 0 && rank == 0) {
    observer.Log(v1::LOG_LEVEL_INFO, "restarted before the job's first checkpoint: training again from step 1; steps 1-" +
                                         std::to_string(reported_before) +
                                         " were reported by the earlier run and are not reported again");
  }
  // Through the confined open, never through a symlink: a parent of output_dir swapped for one
  // while the job was queued is refused here, before training.
  if (auto out = MakeDirsConfined(config.output_dir); !out.ok()) {
    return out.status().WithContext("output_dir");
  }
  RETURN_IF_ERROR(CheckOutputSpaceAtStart(config));
  const auto& report_to = job.spec().training().report_to();
  if (rank == 0 &&
      std::find(report_to.begin(), report_to.end(), "tensorboard") != report_to.end()) {
    // A new file per run: a restarted or resumed job continues its curves in the next one.
    auto events = EventFileWriter::Create(config.output_dir + "/runs");
    if (!events.ok()) return events.status().WithContext("report_to tensorboard");
    observer.Log(v1::LOG_LEVEL_INFO, "report_to tensorboard: writing " + (*events)->path());
    observer.SetEventWriter(std::move(*events));
  }
  // States of an earlier run of this job are stale: the checkpoint holds what resuming needs.
  // Rank 0 owns them (its arena and store).
  auto remove_states = [&] {
    if (rank != 0) return;
    for (const auto& d : config.offload.nvme_dirs) {
      if (Status s = RemoveTree(d); !s.ok()) OFFLOADD_LOG(kWarning, kLog) << s.ToString();
    }
  };
  remove_states();
  Status status;
  try {
    status = Train(job, config, channel, observer, heartbeat);
  } catch (const std::exception& e) {  // LibTorch throws c10::Error; the trainer converts most
    status = engine::TorchErrorStatus("training", e);
  }
  remove_states();
  return status;
}

}  // namespace offloadd::executor
