#include "job/moe_pricing.h"

#include <algorithm>
#include <cstdio>

#include "common/units.h"

namespace offloadd::trainer {
namespace {

std::string Count(double v, const char* unit) {  // 1.3e12, "FLOP" -> "1.30 TFLOP"
  char buf[48];
  if (v >= 1e12) {
    std::snprintf(buf, sizeof buf, "%.2f T%s", v / 1e12, unit);
  } else if (v >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f G%s", v / 1e9, unit);
  } else if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f M%s", v / 1e6, unit);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, unit);
  }
  return buf;
}

}  // namespace

MoeStepFigures PriceMoeStep(const engine::ModelConfig& c, int64_t micro, int64_t seq,
                            double uploads_per_step, double upload_bytes,
                            double host_bytes_per_param) {
  MoeStepFigures m;
  if (c.moe.num_experts <= 0) return m;
  const engine::ParamCounts n = engine::CountParams(c);
  m.num_experts = c.moe.num_experts;
  m.top_k = c.moe.top_k;
  m.sparse_layers = n.sparse_layers;
  m.total_params = n.total;
  m.active_params = n.active;
  m.expert_params = n.expert;
  m.tokens = std::max<int64_t>(0, micro) * std::max<int64_t>(0, seq);
  // Tokens x top_k assignments, each to a distinct expert of the token: at most that many experts
  // are reached, and never more than E.
  const double assignments = static_cast<double>(m.tokens) * static_cast<double>(m.top_k);
  m.routed_experts =
      static_cast<int64_t>(std::min(static_cast<double>(m.num_experts), assignments));
  m.expert_rows = m.routed_experts > 0 ? assignments / static_cast<double>(m.routed_experts) : 0;
  const double layers = static_cast<double>(m.sparse_layers);
  const double all_experts = layers * static_cast<double>(m.num_experts * m.expert_params);
  m.expert_upload_bytes = uploads_per_step * upload_bytes * all_experts;
  m.routed_upload_bytes = m.expert_upload_bytes * static_cast<double>(m.routed_experts) /
                          static_cast<double>(m.num_experts);
  const double T = static_cast<double>(m.tokens), H = static_cast<double>(c.hidden_size);
  m.router_flops = layers * 2 * T * H * static_cast<double>(m.num_experts);
  m.expert_flops = layers * 2 * assignments * 3 * H * static_cast<double>(c.moe.intermediate_size);
  m.expert_host_bytes = host_bytes_per_param * all_experts;
  return m;
}

std::string DescribeMoe(const MoeStepFigures& m) {
  if (!m.moe()) return "";
  char rows[32];
  std::snprintf(rows, sizeof rows, "%.1f", m.expert_rows);
  std::string out =
      "mixture of experts: " + std::to_string(m.sparse_layers) + " sparse layers of " +
      std::to_string(m.num_experts) + " experts, top-" + std::to_string(m.top_k) + ": " +
      std::to_string(m.total_params) + " parameters, " + std::to_string(m.active_params) +
      " active per token; per step " +
      FormatByteSize(static_cast<uint64_t>(m.expert_upload_bytes)) +
      " of expert weights uploaded (all " + std::to_string(m.num_experts) +
      " experts of each sparse layer: the upload precedes the routing; at most min(" +
      std::to_string(m.num_experts) + ", " + std::to_string(m.tokens) + " x " +
      std::to_string(m.top_k) + ") = " + std::to_string(m.routed_experts) + " receive tokens, " +
      FormatByteSize(static_cast<uint64_t>(m.routed_upload_bytes)) + " of them, " + rows +
      " rows per expert GEMM on average); per micro-batch forward: router " +
      Count(m.router_flops, "FLOP") + " (fp32), experts " + Count(m.expert_flops, "FLOP") +
      "; every expert's states " + FormatByteSize(static_cast<uint64_t>(m.expert_host_bytes)) +
      " of host RAM";
  return out;
}

}  // namespace offloadd::trainer
