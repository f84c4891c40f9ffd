#include "lsp/projector.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace offloadd::lsp {
namespace {

at::Tensor Fp32(const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat); }

}  // namespace

SparseProjector SparseProjector::Random(int64_t rows, int64_t cols, int64_t nonzeros, uint64_t seed,
                                        at::Device device) {
  const int64_t d = std::clamp<int64_t>(nonzeros, 1, cols);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  // d distinct columns per row, uniform over the d-subsets: Floyd's algorithm, O(rows d) draws
  // (a multinomial without replacement over [rows, cols] weights took 0.23 s for one 11008 x 512
  // projector, most of a 7B projector check).
  at::Tensor index = at::empty({rows, d}, at::kLong);
  std::mt19937_64 rng(seed);
  int64_t* out = index.data_ptr<int64_t>();
  std::vector<int64_t> picked;
  for (int64_t r = 0; r < rows; ++r) {
    picked.clear();
    for (int64_t j = cols - d; j < cols; ++j) {
      const auto t = static_cast<int64_t>(rng() % static_cast<uint64_t>(j + 1));
      picked.push_back(std::find(picked.begin(), picked.end(), t) == picked.end() ? t : j);
    }
    std::copy(picked.begin(), picked.end(), out + r * d);
  }
  at::Tensor values = at::normal(0.0, 1.0 / std::sqrt(static_cast<double>(d)), {rows, d}, gen);
  SparseProjector p;
  p.rows_ = rows;
  p.cols_ = cols;
  p.index_ = index.t().contiguous().to(device);
  p.values_ = values.t().contiguous().to(device);
  return p;
}

SparseProjector SparseProjector::Identity(int64_t n, at::Device device) {
  SparseProjector p;
  p.rows_ = n;
  p.cols_ = n;
  p.index_ = at::arange(n, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0);
  p.values_ = at::ones({1, n}, at::TensorOptions().dtype(at::kFloat).device(device));
  return p;
}

StatusOr<SparseProjector> SparseProjector::FromParts(int64_t cols, const at::Tensor& index,
                                                     const at::Tensor& values) {
  if (index.dim() != 2 || values.dim() != 2 || index.sizes() != values.sizes()) {
    return InvalidArgumentError("projector positions and values must both be [rows, d]");
  }
  if (index.scalar_type() != at::kLong || values.scalar_type() != at::kFloat) {
    return InvalidArgumentError("projector positions must be int64 and values float32");
  }
  const int64_t d = index.size(1);
  if (cols < 1 || d < 1 || d > cols) {
    return InvalidArgumentError("projector of " + std::to_string(cols) + " columns cannot have " +
                                std::to_string(d) + " nonzeros per row");
  }
  if (index.numel() > 0) {
    const at::Tensor cpu = index.cpu();
    if (cpu.min().item<int64_t>() < 0 || cpu.max().item<int64_t>() >= cols) {
      return InvalidArgumentError("projector positions outside [0, " + std::to_string(cols) + ")");
    }
    const at::Tensor sorted = std::get<0>(cpu.sort(1));
    if (d > 1 && sorted.narrow(1, 1, d - 1).eq(sorted.narrow(1, 0, d - 1)).any().item<bool>()) {
      return InvalidArgumentError("projector positions repeat within a row");
    }
  }
  if (!values.isfinite().all().item<bool>()) return InvalidArgumentError("projector values are not finite");
  SparseProjector p;
  p.rows_ = index.size(0);
  p.cols_ = cols;
  p.index_ = index.t().contiguous();
  p.values_ = values.t().contiguous();
  return p;
}

SparseProjector SparseProjector::WithValues(const at::Tensor& values) const {
  SparseProjector p = *this;
  p.values_ = values.t();
  return p;
}

SparseProjector SparseProjector::To(at::Device device) const {
  SparseProjector p = *this;
  p.index_ = index_.to(device);
  p.values_ = values_.to(device);
  return p;
}

// P^T along `dim`: the d passes add each row (dim 0) or column (dim 1) of x, times its value, into
// its position's row/column of the result.
at::Tensor SparseProjector::Project(const at::Tensor& x, int64_t dim) const {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[dim] = cols_;
  at::Tensor out = at::zeros(shape, x.options().dtype(at::kFloat));
  for (int64_t j = 0; j < nonzeros(); ++j) {
    out = out.index_add(dim, index_[j], x * values_[j].unsqueeze(1 - dim));
  }
  return out;
}

// P along `dim`: the d passes gather each result row (dim 0) or column (dim 1) from its positions
// in y, times their values.
at::Tensor SparseProjector::Gather(const at::Tensor& y, int64_t dim) const {
  const at::Tensor y32 = Fp32(y);
  at::Tensor out;
  for (int64_t j = 0; j < nonzeros(); ++j) {
    at::Tensor term = y32.index_select(dim, index_[j]) * values_[j].unsqueeze(1 - dim);
    out = out.defined() ? out + term : term;
  }
  return out;
}

at::Tensor SparseProjector::ProjectRows(const at::Tensor& x) const { return Project(x, 0); }
at::Tensor SparseProjector::ProjectColumns(const at::Tensor& x) const { return Project(x, 1); }
at::Tensor SparseProjector::Expand(const at::Tensor& y) const { return Gather(y, 0); }
at::Tensor SparseProjector::ExpandColumns(const at::Tensor& z) const { return Gather(z, 1); }

at::Tensor SparseProjector::Dense(at::ScalarType dtype) const {
  at::Tensor out = at::zeros({rows_, cols_}, values_.options().dtype(dtype));
  return out.scatter_(1, index_.t(), dtype == values_.scalar_type() ? values_.t() : values_.t().to(dtype));
}

ProjectorPair ProjectorPair::Random(int64_t m, int64_t n, int64_t s, int64_t d, uint64_t seed,
                                    at::Device device) {
  const int64_t sm = std::clamp<int64_t>(s, 1, m), sn = std::clamp<int64_t>(s, 1, n);
  return Draw(m, sm, std::min(d, sm), n, sn, std::min(d, sn), seed, device);
}

ProjectorPair ProjectorPair::Draw(int64_t m, int64_t sm, int64_t dm, int64_t n, int64_t sn, int64_t dn,
                                  uint64_t seed, at::Device device) {
  // Two streams of one seed (the golden-ratio constant), so P and Q are not the same draw.
  return ProjectorPair(SparseProjector::Random(m, sm, dm, seed, device),
                       SparseProjector::Random(n, sn, dn, seed ^ 0x9e3779b97f4a7c15ull, device));
}

ProjectorPair ProjectorPair::Identity(int64_t m, int64_t n, at::Device device) {
  return ProjectorPair(SparseProjector::Identity(m, device), SparseProjector::Identity(n, device));
}

at::Tensor ProjectorPair::Compress(const at::Tensor& g) const {
  return q_.ProjectColumns(p_.ProjectRows(g));
}

at::Tensor ProjectorPair::Decompress(const at::Tensor& a) const {
  return q_.ExpandColumns(p_.Expand(a));
}

namespace {
// The GEMM form of the residual (below) on CUDA, where the sparse passes are thousands of small
// kernels; OFFLOADD_LSP_DENSE=1 forces it on the CPU too (its tests), =0 forces the sparse passes.
bool DenseForm(const at::Tensor& g) {
  const char* force = std::getenv("OFFLOADD_LSP_DENSE");
  if (force != nullptr && (force[0] == '0' || force[0] == '1')) return force[0] == '1';
  return g.is_cuda();
}

// [rows, cols] dense from positions [rows, d] and values [rows, d]; differentiable in the values.
at::Tensor DenseOf(const at::Tensor& index, const at::Tensor& values, int64_t cols) {
  return at::zeros({index.size(0), cols}, values.options()).scatter(1, index, values);
}
// ||P P^T G Q Q^T - G||^2 by GEMMs, for the CUDA path: with C = P^T G Q,
//   ||P C Q^T - G||^2 = ||G||^2 - 2 ||C||^2 + tr(C^T (P^T P) C (Q^T Q)),
// so G is read once (P^T G Q) and the rest is s x s. Same value as the sparse passes up to rounding.
// G may be held in a lower precision (LearnOptions::gemm_dtype): P^T G is then that dtype's GEMM,
// with fp32 accumulation, and the rest fp32.
at::Tensor SquaredResidual(const at::Tensor& pd, const at::Tensor& qd, const at::Tensor& g, double norm2) {
  const at::Tensor ptg = at::matmul(pd.t().to(g.scalar_type()), g).to(at::kFloat);
  const at::Tensor c = at::matmul(ptg, qd);
  const at::Tensor ptp = at::matmul(pd.t(), pd), qtq = at::matmul(qd.t(), qd);
  return norm2 - 2 * c.square().sum() + (at::matmul(at::matmul(c.t(), ptp), c) * qtq).sum();
}
}  // namespace

double ProjectorPair::RelativeBias(const at::Tensor& g) const {
  c10::NoGradGuard no_grad;
  const at::Tensor g32 = Fp32(g);
  const double norm2 = g32.square().sum().item<double>();
  if (norm2 == 0) return 0;
  if (DenseForm(g)) {
    const at::Tensor r = SquaredResidual(DenseOf(p_.index(), p_.values(), p_.cols()),
                                         DenseOf(q_.index(), q_.values(), q_.cols()), g32, norm2);
    return std::max(0.0, r.item<double>()) / norm2;
  }
  return (Decompress(Compress(g32)) - g32).square().sum().item<double>() / norm2;
}

ProjectorPair ProjectorPair::Learn(const at::Tensor& g, const LearnOptions& opt,
                                   LearnReport* report) const {
  ProjectorPair fresh = Draw(p_.rows(), rank_rows(), p_.nonzeros(), q_.rows(), rank_cols(), q_.nonzeros(),
                             opt.seed, g.device());
  LearnReport rep;
  rep.bias_before = RelativeBias(g);
  rep.bias_initial = fresh.RelativeBias(g);
  const at::Tensor g32 = Fp32(g).detach();
  const double norm2 = g32.square().sum().item<double>();
  if (norm2 > 0 && opt.steps > 0) {
    const at::Tensor g_gemm = g32.to(opt.gemm_dtype);  // the dense form's copy of G (once)
    c10::AutoGradMode grad_mode(true);
    std::vector<at::Tensor> vals = {fresh.p_.values().contiguous().clone().requires_grad_(true),
                                    fresh.q_.values().contiguous().clone().requires_grad_(true)};
    std::vector<at::Tensor> m1, m2;
    for (const at::Tensor& v : vals) {
      m1.push_back(at::zeros_like(v).detach());
      m2.push_back(at::zeros_like(v).detach());
    }
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int step = 1; step <= opt.steps; ++step) {
      at::Tensor residual;
      if (DenseForm(g32)) {
        residual = SquaredResidual(DenseOf(fresh.p_.index(), vals[0], fresh.p_.cols()),
                                   DenseOf(fresh.q_.index(), vals[1], fresh.q_.cols()), g_gemm, norm2);
      } else {
        const ProjectorPair trial(fresh.p_.WithValues(vals[0]), fresh.q_.WithValues(vals[1]));
        residual = (trial.Decompress(trial.Compress(g32)) - g32).square().sum();
      }
      at::Tensor loss = residual / norm2 + opt.gamma * (vals[0].square().sum() + vals[1].square().sum());
      loss.backward();
      c10::NoGradGuard no_grad;
      for (size_t i = 0; i < vals.size(); ++i) {
        at::Tensor grad = vals[i].grad();
        m1[i].mul_(b1).add_(grad, 1 - b1);
        m2[i].mul_(b2).addcmul_(grad, grad, 1 - b2);
        const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
        vals[i].sub_(m1[i] / c1 / ((m2[i] / c2).sqrt() + eps) * opt.lr);
        vals[i].mutable_grad().zero_();
      }
      rep.steps = step;
    }
    fresh = ProjectorPair(fresh.p_.WithValues(vals[0].detach().contiguous()),
                          fresh.q_.WithValues(vals[1].detach().contiguous()));
  }
  rep.bias_after = fresh.RelativeBias(g);
  if (report) *report = rep;
  return fresh;
}

void ProjectorPair::Reproject(const ProjectorPair& old, at::Tensor* exp_avg, at::Tensor* exp_avg_sq) const {
  c10::NoGradGuard no_grad;
  const at::Tensor rp = p_.ProjectRows(old.p_.Dense());    // P^T P_old  [s_m, s_m_old]
  const at::Tensor rq = old.q_.ProjectRows(q_.Dense());    // Q_old^T Q  [s_n_old, s_n]
  *exp_avg = rp.mm(*exp_avg).mm(rq);
  *exp_avg_sq = rp.square().mm(*exp_avg_sq).mm(rq.square());
}

}  // namespace offloadd::lsp
