// What --validate-only prints (Trainer::Impl::PredictStep): the step at the configured batch and
// rows, priced by the same PriceBatch as the automatic batch size (trainer_batch.cc), then the
// same price at powers of two up to the model's positions (PredictLengths).
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "common/units.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {

Status Trainer::Impl::PredictStep() {
  // The configured step as the step planner would price it before the job (what the automatic
  // batch size compares candidates by), on the node profile's rates; records of varying length at
  // the expected padded length of their distribution, tokens/s counting real tokens only.
  ASSIGN_OR_RETURN(const NodeProfile prof, PlanNodeProfile());
  int64_t T = SeqLength();
  double real_per_row = static_cast<double>(T);
  std::string shape = "rows of " + std::to_string(T) + " tokens";
  if (!FixedShape()) {
    const std::vector<int64_t> lengths = data->SequenceLengths();
    const bool buckets = cfg.data.length_buckets.value_or(false) && !Packed();
    const double rows = static_cast<double>(cfg.batch_size) * world();
    const double expected = ExpectedLength(
        PaddedLengthDistribution(lengths, static_cast<int>(rows), SeqLength(), buckets));
    if (expected > 0) {
      T = std::clamp<int64_t>((std::llround(expected) + 7) / 8 * 8, 8, SeqLength());
      double sum = 0;
      for (int64_t l : lengths) sum += static_cast<double>(std::min<int64_t>(l, SeqLength()));
      real_per_row = sum / static_cast<double>(lengths.size());
      std::ostringstream o;
      o.precision(4);
      o << "records of " << real_per_row << " tokens on average, padded to " << T << " expected"
        << (buckets ? " (length buckets)" : "");
      shape = o.str();
    }
  }
  std::string gpu_basis;
  MoeStepFigures moe;
  ASSIGN_OR_RETURN(
      const BatchCandidate c,
      PriceBatch(cfg.batch_size, cfg.gradient_accumulation_steps, prof, T, &gpu_basis, 0, &moe));
  if (!c.feasible)
    return ResourceExhaustedError("micro-batch " + std::to_string(cfg.batch_size) + " " +
                                  c.why_not);
  StepPrediction& p = prediction;
  p.step_seconds = c.plan.predicted_s;
  p.micro = cfg.batch_size;
  p.accumulation = cfg.gradient_accumulation_steps;
  p.seq = T;
  p.tokens_per_second =
      p.step_seconds > 0
          ? static_cast<double>(p.micro * p.accumulation * world()) * real_per_row / p.step_seconds
          : 0;
  p.bound = c.plan.bound;
  p.basis = "node profile " + prof.key + " of " + prof.measured_at + "; GPU work: " + gpu_basis;
  uint64_t params = 0;  // every block's states on NVMe: the disk's share of the step
  for (const auto& bl : layout) params += bl.numel;
  p.nvme_tier_disk_seconds =
      NvmeStepSeconds(params, prof.store_read_bytes_per_s, prof.store_write_bytes_per_s,
                      workers::StateBytesPerParam(optimizer_mode));
  std::ostringstream o;
  o.precision(3);
  o << "predicted " << p.step_seconds << " s/step, " << p.tokens_per_second / 1e3
    << "k tokens/s (micro-batch " << p.micro << " x " << p.accumulation << " accumulation, "
    << shape << "; " << trainer::DescribePlan(c.plan, device_plan.gpu_budget)
    << "; basis: " << p.basis << ")";
  if (!optimizer_mode.Exact() && n > 2) {
    // The step planner prices a device block at its mode's size: the GPU-resident share grows
    // with the bytes saved.
    const uint64_t numel = layout[1].numel;  // a decoder layer
    const auto A = static_cast<uint32_t>(cfg.gradient_accumulation_steps);
    o << "; optimizer " << optimizer_mode.Describe()
      << ": a decoder layer's AdamW states on the GPU take "
      << FormatByteSize(
             static_cast<uint64_t>(DeviceOptimizer::BlockBytes(numel, dtype, A, optimizer_mode)))
      << " (exact "
      << FormatByteSize(static_cast<uint64_t>(DeviceOptimizer::BlockBytes(numel, dtype, A)))
      << "; master and states " << workers::StateBytesPerParam(optimizer_mode)
      << " B/parameter against 12)";
  }
  p.text = o.str();
  p.gpu_bytes = cuda ? c.plan.gpu_bytes : 0;
  Log(TrainObserver::Level::kInfo, "validate-only: " + p.text);
  p.moe = moe;
  if (moe.moe()) {
    std::ostringstream m;
    m.precision(3);
    m << DescribeMoe(moe) << "; predicted " << p.step_seconds << " s/step (" << p.bound << ")";
    if (cuda) {
      m << ", GPU peak " << FormatByteSize(static_cast<uint64_t>(p.gpu_bytes)) << " of "
        << FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget));
    }
    p.moe_text = m.str();
    Log(TrainObserver::Level::kInfo, "validate-only: " + p.moe_text);
  }
  return PredictLengths(prof);
}

Status Trainer::Impl::PredictLengths(const NodeProfile& prof) {
  const int64_t limit = std::max<int64_t>(model->config().max_position_embeddings, SeqLength());
  std::vector<int64_t> lengths;
  int64_t start = 1024;  // a small model's positions: a few lengths below them still
  while (start > 8 && 4 * start > limit) start /= 2;
  for (int64_t len = start; len < limit; len *= 2) lengths.push_back(len);
  lengths.push_back(limit);
  if (!std::count(lengths.begin(), lengths.end(), SeqLength())) lengths.push_back(SeqLength());
  std::sort(lengths.begin(), lengths.end());
  const int micro = cfg.batch_size;
  const int64_t A = cfg.gradient_accumulation_steps;
  for (int64_t len : lengths) {
    // Rows of this length throughout: the GPU memory sized for them, the work timed at them.
    StatusOr<BatchCandidate> priced =
        PriceBatch(micro, static_cast<int>(A), prof, len, nullptr, len);
    LengthPrediction l;
    l.seq = len;
    if (!priced.ok()) {  // the configured length priced above; another one only informs
      l.text = std::to_string(len) + " tokens: not priced (" + priced.status().ToString() + ")";
      Log(TrainObserver::Level::kWarning, "validate-only at " + l.text);
      prediction.lengths.push_back(std::move(l));
      continue;
    }
    const BatchCandidate& c = *priced;
    l.fits = c.feasible;
    l.gpu_bytes = cuda ? c.plan.gpu_bytes : 0;
    l.step_seconds = c.feasible ? c.plan.predicted_s : 0;
    l.tokens_per_second =
        l.step_seconds > 0 ? static_cast<double>(micro * A * world() * len) / l.step_seconds : 0;
    std::ostringstream o;
    o.precision(3);
    o << len << " tokens: ";
    if (!c.feasible) {
      o << "does not fit (" << c.why_not << ")";
    } else {
      o << l.step_seconds << " s/step, " << l.tokens_per_second / 1e3 << "k tokens/s ("
        << c.plan.bound << ")";
      if (cuda) {
        o << ", GPU peak " << FormatByteSize(static_cast<uint64_t>(l.gpu_bytes)) << " of "
          << FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget));
      }
    }
    l.text = o.str();
    Log(TrainObserver::Level::kInfo, "validate-only at " + l.text);
    prediction.lengths.push_back(std::move(l));
  }
  return OkStatus();
}

}  // namespace offloadd::trainer
