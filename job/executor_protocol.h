#pragma once
// The daemon <-> offloadd-executor protocol (proto/offloadd/internal/executor.proto) as both ends
// use it: whole messages over the control socket (ipc/message_channel.h), the versioned hellos,
// and the conversions between the trainer's torch-free structs (job/step_stats.h,
// trainer::ParallelConfig) and their wire messages. The job (its validated, resolved JobSpec) and
// the daemon's TrainerEnvironment travel as the messages themselves (train_job_config.h).
// Torch-free, so the daemon links it without the training pipeline; the executor links it beside
// the trainer. Thread-compatible free functions (callers serialise the senders of one socket).

#include <cstdint>
#include <string>

#include <google/protobuf/message_lite.h>

#include "common/status.h"
#include "job/step_stats.h"
#include "job/train_config.h"
#include "job/train_job_config.h"
#include "offloadd/internal/executor.pb.h"

namespace offloadd::daemon {

// Raised whenever a message changes meaning; both hellos carry it, and a peer with another
// version is refused by name (a stale executor beside a newer daemon).
inline constexpr uint32_t kExecutorProtocolVersion = 1;
inline constexpr const char* kDaemonProgram = "offloadd";
inline constexpr const char* kExecutorProgram = "offloadd-executor";
// A job record (spec, transitions) is a few KiB to a few MiB; anything larger is refused.
inline constexpr size_t kMaxExecutorMessageBytes = 64u << 20;

// Serialises `message` and sends it as one framed message.
Status SendProto(int socket_fd, const google::protobuf::MessageLite& message);
// Receives one framed message into `message`. The channel's errors (UNAVAILABLE: the peer closed
// the socket; DATA_LOSS: garbled; RESOURCE_EXHAUSTED: over kMaxExecutorMessageBytes), or
// DATA_LOSS when the bytes do not parse as `message`'s type.
Status RecvProto(int socket_fd, google::protobuf::MessageLite* message);

// This process's hello as `program`.
offloadd::internal::Hello MakeHello(const std::string& program);
// OK when `hello` comes from `expected_program` and speaks kExecutorProtocolVersion;
// FAILED_PRECONDITION naming both programs and versions otherwise.
Status CheckHello(const offloadd::internal::Hello& hello, const std::string& expected_program);

// Field-for-field conversions.
offloadd::internal::StepStats ToProto(const trainer::StepStats& s);
trainer::StepStats FromProto(const offloadd::internal::StepStats& p);
offloadd::internal::EvalStats ToProto(const trainer::EvalStats& s);
trainer::EvalStats FromProto(const offloadd::internal::EvalStats& p);
offloadd::internal::ProjectorCheckStats ToProto(const trainer::ProjectorCheckStats& s);
trainer::ProjectorCheckStats FromProto(const offloadd::internal::ProjectorCheckStats& p);
offloadd::internal::RuntimeStats ToProto(const trainer::RuntimeStats& s);
trainer::RuntimeStats FromProto(const offloadd::internal::RuntimeStats& p);

// A job's metrics history rows (v1::StepMetrics, ListJobMetrics) as the daemon records them and
// the executor writes them into trainer_state.json: a step's training values (tokens per second
// as JobProgress has them; aux_loss only when the model reports a router loss), an evaluation's
// loss. `time` is the row's time.
offloadd::v1::StepMetrics MetricsRow(const offloadd::internal::StepStats& s,
                                     const google::protobuf::Timestamp& time);
offloadd::v1::StepMetrics MetricsRow(const offloadd::internal::EvalStats& e,
                                     const google::protobuf::Timestamp& time);
// Adds to `to` (a row of the same step) the values of `from` that it lacks: a value a row has
// keeps its first report (a step replayed after a resume), an evaluation joins its step's
// training values. True when it added any; training values also set the row's time and epoch.
bool MergeStepMetrics(const offloadd::v1::StepMetrics& from, offloadd::v1::StepMetrics* to);

// The placement's trainer::ParallelConfig (gpu_index is the executor's device, not part of it).
trainer::ParallelConfig ParallelFromPlacement(const offloadd::internal::Placement& p);

// A Status as the executor's final message, and back.
offloadd::internal::Finished ToFinished(const Status& s);
Status FromFinished(const offloadd::internal::Finished& f);

}  // namespace offloadd::daemon
