#include "lsp/subspace.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <vector>

namespace offloadd::lsp {

CheckResult CheckAndUpdate(const ProjectorPair& current, const at::Tensor& g, const CheckOptions& opt) {
  CheckResult r;
  r.bias = current.RelativeBias(g);
  r.next = current;
  if (r.bias < opt.threshold) return r;
  ProjectorPair learned = current.Learn(g, opt.learn, &r.learn);
  if (r.learn.bias_after < r.bias) {
    r.updated = true;
    r.next = std::move(learned);
  }
  return r;
}

Status SwitchSubspace(const ProjectorPair& old, const ProjectorPair& now, at::Tensor& base, at::Tensor& a,
                      at::Tensor& exp_avg, at::Tensor& exp_avg_sq) {
  const int64_t m = old.p().rows(), n = old.q().rows();
  if (now.p().rows() != m || now.q().rows() != n) {
    return InvalidArgumentError("the new projectors are for another matrix shape");
  }
  if (base.sizes() != at::IntArrayRef{m, n} || base.scalar_type() != at::kFloat) {
    return InvalidArgumentError("the base weight must be fp32 [" + std::to_string(m) + ", " + std::to_string(n) + "]");
  }
  const std::vector<int64_t> sub = {old.rank_rows(), old.rank_cols()};
  for (const at::Tensor* t : {&a, &exp_avg, &exp_avg_sq}) {
    if (t->sizes() != at::IntArrayRef(sub) || t->scalar_type() != at::kFloat) {
      return InvalidArgumentError("subspace state must be fp32 [" + std::to_string(sub[0]) + ", " +
                                  std::to_string(sub[1]) + "]");
    }
  }
  c10::NoGradGuard no_grad;
  base.add_(old.Decompress(a.to(base.device())));
  at::Tensor m1 = exp_avg, m2 = exp_avg_sq;
  now.Reproject(old, &m1, &m2);
  if (now.rank_rows() == old.rank_rows() && now.rank_cols() == old.rank_cols()) {
    a.zero_();
    exp_avg.copy_(m1);
    exp_avg_sq.copy_(m2);
  } else {
    a = at::zeros({now.rank_rows(), now.rank_cols()}, a.options());
    exp_avg = m1;
    exp_avg_sq = m2;
  }
  return OkStatus();
}

void SaveProjectorPair(const ProjectorPair& pq, const std::string& prefix, std::map<std::string, at::Tensor>* out) {
  (*out)[prefix + "p_index"] = pq.p().index().contiguous().cpu();
  (*out)[prefix + "p_values"] = pq.p().values().contiguous().cpu();
  (*out)[prefix + "q_index"] = pq.q().index().contiguous().cpu();
  (*out)[prefix + "q_values"] = pq.q().values().contiguous().cpu();
  (*out)[prefix + "shape"] =
      at::tensor({pq.p().rows(), pq.q().rows(), pq.rank_rows(), pq.rank_cols()}, at::kLong);
}

StatusOr<ProjectorPair> LoadProjectorPair(const std::map<std::string, at::Tensor>& in, const std::string& prefix,
                                          at::Device device) {
  auto get = [&](const char* name) -> StatusOr<at::Tensor> {
    auto it = in.find(prefix + name);
    if (it == in.end()) return NotFoundError("projector part \"" + prefix + name + "\" is missing");
    return it->second;
  };
  ASSIGN_OR_RETURN(const at::Tensor shape, get("shape"));
  if (shape.scalar_type() != at::kLong || shape.numel() != 4) {
    return InvalidArgumentError("\"" + prefix + "shape\" must be 4 int64 values [m, n, s_m, s_n]");
  }
  const at::Tensor sh = shape.cpu();
  const int64_t m = sh[0].item<int64_t>(), n = sh[1].item<int64_t>();
  const int64_t sm = sh[2].item<int64_t>(), sn = sh[3].item<int64_t>();
  ASSIGN_OR_RETURN(const at::Tensor pi, get("p_index"));
  ASSIGN_OR_RETURN(const at::Tensor pv, get("p_values"));
  ASSIGN_OR_RETURN(const at::Tensor qi, get("q_index"));
  ASSIGN_OR_RETURN(const at::Tensor qv, get("q_values"));
  auto p = SparseProjector::FromParts(sm, pi.cpu(), pv.cpu());
  if (!p.ok()) return InvalidArgumentError("\"" + prefix + "p\": " + p.status().message());
  auto q = SparseProjector::FromParts(sn, qi.cpu(), qv.cpu());
  if (!q.ok()) return InvalidArgumentError("\"" + prefix + "q\": " + q.status().message());
  if (p->rows() != m || q->rows() != n) {
    return InvalidArgumentError("\"" + prefix + "\" projectors are not for a [" + std::to_string(m) + ", " +
                                std::to_string(n) + "] matrix");
  }
  return ProjectorPair(p->To(device), q->To(device));
}

}  // namespace offloadd::lsp
