#include "job/step_estimate.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "job/step_planner.h"

namespace offloadd::trainer {

StatusOr<StepEstimate> EstimateStep(const StepEstimateInputs& e) {
  if (!e.node) {
    return NotFoundError("no node profile on this node yet (it is measured when the first job starts)");
  }
  const NodeProfile& prof = *e.node;
  const double A = static_cast<double>(std::max<int64_t>(1, e.accumulation));
  PlanInputs in;
  double params = 0;
  for (int64_t p : e.block_params) {
    in.params.push_back(p);
    params += static_cast<double>(p);
  }
  const size_t n = in.params.size();
  in.device_state_bytes.assign(n, 0);
  in.keep_extra_bytes.assign(n, 0);
  in.recompute_seconds.assign(n, 0);
  in.place_states = false;  // what the first steps run; the planner may place states afterwards
  in.keep_activations = false;
  in.budget_bytes = std::numeric_limits<int64_t>::max() / 4;
  if (e.shape) {  // its blocks' forward and backward (recompute included), per micro-batch
    double fwd = 0, total = 0;
    for (const BlockProfile& b : e.shape->blocks) {
      fwd += b.forward_s;
      total += b.forward_s + b.backward_s;
    }
    in.gpu_seconds = A * total;
    in.gpu_forward_seconds = A * fwd;
  }
  ParamTraffic t;
  t.grad_bytes = e.compute_bytes;
  t.upload_bytes = e.weights_fp32 ? 4 : e.compute_bytes;
  t.weight_copy = !e.weights_fp32 && e.compute_bytes < 4;
  t.accumulation = static_cast<int>(A);
  // The GPU gives each block's norm beside its copy, except with accumulation (the norm is of the
  // accumulated gradients) or without a GPU.
  t.cpu_norm = e.held_updates && (A > 1 || !e.gpu);
  ApplyParamTraffic(t, &in);
  if (e.gpu) {  // weights streamed in for the forward and again for the backward; gradients out
    in.h2d_bytes = 2 * A * params * t.upload_bytes;
    in.d2h_bytes = A * params * e.compute_bytes;
  }
  if (e.nvme_params > 0) {
    in.nvme_params = static_cast<double>(e.nvme_params);
    in.nvme_read_bytes_per_s = prof.store_read_bytes_per_s;
    in.nvme_write_bytes_per_s = prof.store_write_bytes_per_s;
  }
  in.host_bytes_per_s = prof.host_bytes_per_s;
  in.cpu_params_per_s = prof.cpu_params_per_s;
  in.cpu_params_per_s_during_dma = std::min(prof.cpu_params_per_s_during_dma, prof.cpu_params_per_s);
  in.h2d_bytes_per_s = prof.h2d_bytes_per_s > 0 ? prof.h2d_bytes_per_s : 1e30;
  in.d2h_bytes_per_s = prof.d2h_bytes_per_s > 0 ? prof.d2h_bytes_per_s : 1e30;
  in.held_updates = e.held_updates;
  RETURN_IF_ERROR(ValidatePlanInputs(in));
  const PlanChoice c = EvaluatePlan(in, 0, 0);
  StepEstimate out;
  out.lower_bound = e.gpu && !e.shape;
  out.step_seconds = c.predicted_s;
  out.bound = c.bound;
  const double tokens = A * static_cast<double>(e.micro * e.seq);
  out.tokens_per_second = c.predicted_s > 0 ? tokens / c.predicted_s : 0;
  out.basis = "node profile " + prof.key + " of " + prof.measured_at;
  if (e.shape) {
    out.basis += "; GPU work: the shape profile of " + e.shape->measured_at + " on " + e.shape->gpu;
  } else if (e.gpu) {
    out.basis += "; the GPU's work is not known before a run of this shape (no shape profile on this node): "
                 "the CPU update, host memory and PCIe terms only";
  }
  if (e.nvme_params > 0 && in.nvme_read_bytes_per_s <= 0) {
    out.lower_bound = true;
    out.basis += "; the disk is not priced: the node profile measured no store directory";
  }
  std::ostringstream o;
  o.precision(3);
  o << (out.lower_bound ? "at least " : "") << out.step_seconds << " s/step, " << (out.lower_bound ? "at most " : "")
    << out.tokens_per_second / 1e3 << "k tokens/s (micro-batch " << e.micro << " x " << e.accumulation
    << " accumulation at " << e.seq << " tokens per row; bound: " << out.bound
    << (e.held_updates ? ", updates held for the clipping norm" : "") << "; basis: " << out.basis << ")";
  out.text = o.str();
  return out;
}

std::optional<ShapeProfile> FindShapeProfile(const std::string& profile_dir, const std::string& gpu,
                                             const std::string& fingerprint_prefix, int64_t batch,
                                             int64_t seq, int compute_bytes) {
  if (profile_dir.empty()) return std::nullopt;
  const char* dtype = compute_bytes == 4 ? "Float" : "BFloat16";
  for (auto& p : ListShapeProfiles(profile_dir, nullptr)) {  // newest first
    if (p.gpu != gpu || p.model.rfind(fingerprint_prefix, 0) != 0 || p.batch != batch || p.seq != seq ||
        (p.dtype != dtype && !(compute_bytes == 2 && p.dtype == "Half"))) {
      continue;
    }
    return std::move(p);
  }
  return std::nullopt;
}

}  // namespace offloadd::trainer
