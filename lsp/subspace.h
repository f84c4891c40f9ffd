#pragma once
// The check-and-update step of LSP-Offload (Alg. 2) and the projector's saved form: what the
// trainer's LSP mode runs every `check_every` steps on a sub-sampled gradient, and what its
// checkpoints hold per compressed matrix.
#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "common/status.h"
#include "lsp/projector.h"

namespace offloadd::lsp {

struct CheckOptions {
  double threshold = 0.5;  // relative squared bias ||C(G) - G||^2 / ||G||^2 that triggers learning
  LearnOptions learn;
};

struct CheckResult {
  double bias = 0;       // of the current projectors on the sub-sampled gradient
  bool updated = false;  // bias >= threshold and the learned pair is better
  LearnReport learn;     // when learning ran
  ProjectorPair next;    // the pair to use from now on (the current one unless updated)
};

// Measures the current pair's bias on `g` (the gradient of a sub-sampled batch, [m, n]). When it
// reaches `threshold`, learns a new pair (ProjectorPair::Learn) and takes it if its bias is lower
// than the current one's; otherwise the current pair stays.
CheckResult CheckAndUpdate(const ProjectorPair& current, const at::Tensor& g, const CheckOptions& opt);

// Moves a matrix's optimizer state from `old` to `now`: the learned change is folded into the
// base weight (base += P_old A Q_old^T, in fp32), A restarts at zero, and Adam's moments are
// re-projected (ProjectorPair::Reproject). The effective weight base + P A Q^T is unchanged up to
// one fp32 rounding per element. `base` is fp32 [m, n]; a, exp_avg, exp_avg_sq fp32 [s_m, s_n].
// All are updated in place (a, exp_avg and exp_avg_sq may change shape only if the ranks do, which
// they do not for pairs drawn with the same s).
Status SwitchSubspace(const ProjectorPair& old, const ProjectorPair& now, at::Tensor& base, at::Tensor& a,
                      at::Tensor& exp_avg, at::Tensor& exp_avg_sq);

// Saved form: "<prefix>p_index", "<prefix>p_values", "<prefix>q_index", "<prefix>q_values" plus
// "<prefix>shape" ([m, n, s_m, s_n] int64). Load checks every part (shapes, dtypes, positions in
// range and distinct per row, finite values) and names what is wrong.
void SaveProjectorPair(const ProjectorPair& pq, const std::string& prefix,
                       std::map<std::string, at::Tensor>* out);
StatusOr<ProjectorPair> LoadProjectorPair(const std::map<std::string, at::Tensor>& in, const std::string& prefix,
                                          at::Device device);

}  // namespace offloadd::lsp
