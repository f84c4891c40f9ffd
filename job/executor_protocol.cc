#include "job/executor_protocol.h"

#include <unistd.h>

#include <algorithm>

#include "ipc/message_channel.h"

namespace offloadd::daemon {

namespace pb = offloadd::internal;
namespace v1 = offloadd::v1;

Status SendProto(int fd, const google::protobuf::MessageLite& message) {
  std::string bytes;
  if (!message.SerializeToString(&bytes)) return InternalError("cannot serialise " + message.GetTypeName());
  return ipc::SendMessage(fd, bytes);
}

Status RecvProto(int fd, google::protobuf::MessageLite* message) {
  ASSIGN_OR_RETURN(const std::string bytes, ipc::RecvMessage(fd, kMaxExecutorMessageBytes));
  if (!message->ParseFromString(bytes)) {
    return DataLossError("garbled message: " + std::to_string(bytes.size()) + " bytes that are not a " +
                         message->GetTypeName());
  }
  return OkStatus();
}

pb::Hello MakeHello(const std::string& program) {
  pb::Hello h;
  h.set_program(program);
  h.set_protocol_version(kExecutorProtocolVersion);
  h.set_pid(static_cast<int32_t>(::getpid()));
  return h;
}

Status CheckHello(const pb::Hello& hello, const std::string& expected_program) {
  if (hello.program() != expected_program) {
    return FailedPreconditionError("expected a hello from " + expected_program + ", got one from '" +
                                   hello.program().substr(0, 64) + "'");
  }
  if (hello.protocol_version() != kExecutorProtocolVersion) {
    return FailedPreconditionError(expected_program + " speaks executor protocol version " +
                                   std::to_string(hello.protocol_version()) + ", this " +
                                   (expected_program == kExecutorProgram ? kDaemonProgram : kExecutorProgram) +
                                   " speaks version " + std::to_string(kExecutorProtocolVersion) +
                                   ": install offloadd and offloadd-executor from the same build");
  }
  return OkStatus();
}

// Each field listed once per struct, for both directions.
// clang-format off
#define OFFLOADD_STEP_FIELDS(X)                                                                    \
  X(step) X(max_steps) X(epoch) X(tokens) X(trained_tokens) X(loss) X(learning_rate)               \
  X(grad_norm) X(loss_scale) X(skipped) X(clipped) X(speculated_layers) X(corrected_layers)        \
  X(cpu_update_params) X(device_update_params) X(step_seconds) X(model_flops)                      \
  X(gpu_compute_seconds) X(gpu_forward_seconds) X(h2d_seconds) X(d2h_seconds)                      \
  X(cpu_update_seconds) X(nvme_seconds) X(lsp_compress_seconds) X(lsp_decompress_seconds)          \
  X(stall_weights_seconds) X(stall_grads_seconds) X(stall_optimizer_seconds)                       \
  X(stall_activations_seconds) X(h2d_bytes) X(d2h_bytes) X(nvme_read_bytes)                        \
  X(nvme_write_bytes) X(nvme_activation_bytes) X(gpu_peak_bytes)                                   \
  X(time_to_first_step_seconds) X(aux_loss)
#define OFFLOADD_EVAL_FIELDS(X) X(step) X(loss) X(tokens) X(seconds)
#define OFFLOADD_CHECK_FIELDS(X) X(step) X(checked) X(switched) X(mean_bias) X(mean_bias_after) X(seconds)
#define OFFLOADD_WORKER_FIELDS(X) \
  X(index) X(pid) X(cpu_seconds) X(busy_seconds) X(params_updated) X(queue_depth) X(restarts)
// clang-format on
#define OFFLOADD_STORE_FIELDS(X) \
  X(role)                        \
  X(pid) X(cpu_seconds) X(submitted) X(completed) X(errors) X(in_flight) X(latency_sum_seconds)

#define OFFLOADD_TO(f) p.set_##f(s.f);
#define OFFLOADD_FROM(f) s.f = p.f();

pb::StepStats ToProto(const trainer::StepStats& s) {
  pb::StepStats p;
  OFFLOADD_STEP_FIELDS(OFFLOADD_TO)
  for (double v : s.setup_phase_seconds) p.add_setup_phase_seconds(v);
  for (double v : s.setup_phase_start_seconds) p.add_setup_phase_start_seconds(v);
  return p;
}
trainer::StepStats FromProto(const pb::StepStats& p) {
  trainer::StepStats s;
  OFFLOADD_STEP_FIELDS(OFFLOADD_FROM)
  s.setup_phase_seconds.assign(p.setup_phase_seconds().begin(), p.setup_phase_seconds().end());
  s.setup_phase_start_seconds.assign(p.setup_phase_start_seconds().begin(),
                                     p.setup_phase_start_seconds().end());
  return s;
}

pb::EvalStats ToProto(const trainer::EvalStats& s) {
  pb::EvalStats p;
  OFFLOADD_EVAL_FIELDS(OFFLOADD_TO)
  return p;
}
trainer::EvalStats FromProto(const pb::EvalStats& p) {
  trainer::EvalStats s;
  OFFLOADD_EVAL_FIELDS(OFFLOADD_FROM)
  return s;
}

v1::StepMetrics MetricsRow(const pb::StepStats& s, const google::protobuf::Timestamp& time) {
  v1::StepMetrics row;
  row.set_step(s.step());
  *row.mutable_time() = time;
  row.set_epoch(s.epoch());
  row.set_loss(s.loss());
  row.set_learning_rate(s.learning_rate());
  row.set_grad_norm(s.grad_norm());
  if (s.step_seconds() > 0)
    row.set_tokens_per_second(static_cast<double>(s.tokens()) / s.step_seconds());
  if (s.aux_loss() != 0) row.set_aux_loss(s.aux_loss());  // 0: the model reports no router loss
  return row;
}

v1::StepMetrics MetricsRow(const pb::EvalStats& e, const google::protobuf::Timestamp& time) {
  v1::StepMetrics row;
  row.set_step(e.step());
  *row.mutable_time() = time;
  row.set_eval_loss(e.loss());
  return row;
}

bool MergeStepMetrics(const v1::StepMetrics& from, v1::StepMetrics* to) {
  bool changed = false;
  const auto take = [&](bool has_to, bool has_from, auto set) {
    if (!has_to && has_from) {
      set();
      changed = true;
    }
  };
  take(to->has_loss(), from.has_loss(), [&] {
    to->set_loss(from.loss());
    *to->mutable_time() = from.time();
    to->set_epoch(from.epoch());
  });
  take(to->has_learning_rate(), from.has_learning_rate(),
       [&] { to->set_learning_rate(from.learning_rate()); });
  take(to->has_grad_norm(), from.has_grad_norm(), [&] { to->set_grad_norm(from.grad_norm()); });
  take(to->has_tokens_per_second(), from.has_tokens_per_second(),
       [&] { to->set_tokens_per_second(from.tokens_per_second()); });
  take(to->has_aux_loss(), from.has_aux_loss(), [&] { to->set_aux_loss(from.aux_loss()); });
  take(to->has_eval_loss(), from.has_eval_loss(), [&] { to->set_eval_loss(from.eval_loss()); });
  return changed;
}

pb::ProjectorCheckStats ToProto(const trainer::ProjectorCheckStats& s) {
  pb::ProjectorCheckStats p;
  OFFLOADD_CHECK_FIELDS(OFFLOADD_TO)
  return p;
}
trainer::ProjectorCheckStats FromProto(const pb::ProjectorCheckStats& p) {
  trainer::ProjectorCheckStats s;
  OFFLOADD_CHECK_FIELDS(OFFLOADD_FROM)
  return s;
}

pb::RuntimeStats ToProto(const trainer::RuntimeStats& r) {
  pb::RuntimeStats out;
  for (const auto& s : r.workers) {
    pb::RuntimeStats::Worker& p = *out.add_workers();
    OFFLOADD_WORKER_FIELDS(OFFLOADD_TO)
  }
  for (const auto& s : r.stores) {
    pb::RuntimeStats::Store& p = *out.add_stores();
    OFFLOADD_STORE_FIELDS(OFFLOADD_TO)
    p.mutable_latency_bounds_seconds()->Add(s.latency_bounds_seconds.begin(), s.latency_bounds_seconds.end());
    p.mutable_latency_counts()->Add(s.latency_counts.begin(), s.latency_counts.end());
  }
  out.set_arena_bytes(r.arena_bytes);
  out.set_pinned_host_bytes(r.pinned_host_bytes);
  return out;
}
trainer::RuntimeStats FromProto(const pb::RuntimeStats& in) {
  trainer::RuntimeStats r;
  for (const auto& p : in.workers()) {
    trainer::RuntimeStats::Worker& s = r.workers.emplace_back();
    OFFLOADD_WORKER_FIELDS(OFFLOADD_FROM)
  }
  for (const auto& p : in.stores()) {
    trainer::RuntimeStats::Store& s = r.stores.emplace_back();
    OFFLOADD_STORE_FIELDS(OFFLOADD_FROM)
    s.latency_bounds_seconds.assign(p.latency_bounds_seconds().begin(), p.latency_bounds_seconds().end());
    s.latency_counts.assign(p.latency_counts().begin(), p.latency_counts().end());
  }
  r.arena_bytes = in.arena_bytes();
  r.pinned_host_bytes = in.pinned_host_bytes();
  return r;
}

#undef OFFLOADD_TO
#undef OFFLOADD_FROM

trainer::ParallelConfig ParallelFromPlacement(const pb::Placement& p) {
  trainer::ParallelConfig c;
  c.world_size = std::max(1, p.world_size());
  c.rank = p.rank();
  c.rendezvous = p.rendezvous();
  if (p.timeout_seconds() > 0) c.timeout_seconds = p.timeout_seconds();
  c.hosts = std::max(1, p.hosts());
  return c;
}

pb::Finished ToFinished(const Status& s) {
  pb::Finished f;
  f.set_code(static_cast<int32_t>(s.code()));
  f.set_message(std::string(s.message()));
  return f;
}

Status FromFinished(const pb::Finished& f) {
  if (f.code() == 0) return OkStatus();
  // Codes the executor cannot send (a newer enum, garbage) still fail the job, as INTERNAL.
  const int code = f.code() > 0 && f.code() <= static_cast<int>(StatusCode::kUnauthenticated)
                       ? f.code()
                       : static_cast<int>(StatusCode::kInternal);
  return Status(static_cast<StatusCode>(code), f.message());
}

}  // namespace offloadd::daemon
