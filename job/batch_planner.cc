#include "job/batch_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace offloadd::trainer {

StatusOr<std::vector<BatchCandidate>> BatchCandidates(int cap, int global_batch, int accumulation) {
  if (cap < 1) return InvalidArgumentError("the automatic batch size's cap must be at least 1, got " + std::to_string(cap));
  if (accumulation < 1) {
    return InvalidArgumentError("gradient_accumulation_steps must be at least 1, got " + std::to_string(accumulation));
  }
  if (global_batch < 0) {
    return InvalidArgumentError("train_batch_size must be positive, got " + std::to_string(global_batch));
  }
  std::vector<BatchCandidate> out;
  auto add = [&](int micro, int acc) {
    BatchCandidate c;
    c.micro = micro;
    c.accumulation = acc;
    out.push_back(c);
  };
  if (global_batch > 0) {
    for (int m = 1; m <= std::min(cap, global_batch); ++m) {
      if (global_batch % m == 0) add(m, global_batch / m);
    }
    return out;
  }
  int m = 1;
  for (; m < cap; m *= 2) add(m, accumulation);
  add(cap, accumulation);
  return out;
}

double ExpectedPaddedLength(std::vector<int64_t> lengths, int batch, int64_t multiple, int64_t cap) {
  if (lengths.empty() || batch < 1) return 0;
  std::sort(lengths.begin(), lengths.end());
  const double n = static_cast<double>(lengths.size());
  const int64_t m = std::max<int64_t>(1, multiple);
  double expected = 0, below = 0;  // below: P(max <= the previous length)
  for (size_t i = 0; i < lengths.size(); ++i) {
    const double at_most = std::pow(static_cast<double>(i + 1) / n, batch);
    const int64_t padded = std::min(std::max<int64_t>(cap, lengths[i]), (lengths[i] + m - 1) / m * m);
    expected += static_cast<double>(padded) * (at_most - below);
    below = at_most;
  }
  return expected;
}

int64_t PaddedLength(int64_t longest, int64_t cap, bool buckets) {
  const int64_t top = std::max(cap, longest);
  int64_t step = 8;
  if (buckets) {
    step = 16;
    for (int64_t octave = 64; octave < longest; octave *= 2) step = octave / 4;
  }
  return std::min(top, std::max<int64_t>(1, (longest + step - 1) / step * step));
}

std::vector<std::pair<int64_t, double>> PaddedLengthDistribution(std::vector<int64_t> lengths, int batch,
                                                                  int64_t cap, bool buckets) {
  std::vector<std::pair<int64_t, double>> out;
  if (lengths.empty() || batch < 1) return out;
  std::sort(lengths.begin(), lengths.end());
  const double n = static_cast<double>(lengths.size());
  double below = 0;  // P(longest <= the previous length)
  for (size_t i = 0; i < lengths.size(); ++i) {
    const double at_most = std::pow(static_cast<double>(i + 1) / n, batch);
    const int64_t padded = PaddedLength(lengths[i], cap, buckets);
    if (!out.empty() && out.back().first == padded) {
      out.back().second += at_most - below;
    } else if (at_most > below) {
      out.emplace_back(padded, at_most - below);
    }
    below = at_most;
  }
  return out;
}

double ExpectedLength(const std::vector<std::pair<int64_t, double>>& distribution) {
  double e = 0;
  for (const auto& [length, p] : distribution) e += static_cast<double>(length) * p;
  return e;
}

double CandidateTokensPerSecond(const BatchCandidate& c, int64_t seq) {
  if (!(c.plan.predicted_s > 0)) return 0;
  return static_cast<double>(c.micro) * c.accumulation * static_cast<double>(seq) / c.plan.predicted_s;
}

StatusOr<int> ChooseBatch(const std::vector<BatchCandidate>& candidates) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(candidates.size()); ++i) {
    const BatchCandidate& c = candidates[i];
    if (!c.feasible) continue;
    // Candidates come smallest micro first: a larger one must be more than 2% faster.
    if (best < 0 || c.tokens_per_s > candidates[best].tokens_per_s * 1.02) best = i;
  }
  if (best >= 0) return best;
  if (candidates.empty()) return InvalidArgumentError("no batch size to choose from");
  return ResourceExhaustedError("no micro-batch fits: at " + std::to_string(candidates[0].micro) + " " +
                                candidates[0].why_not);
}

namespace {
std::string Rate(double tokens_per_s) {
  char buf[32];
  if (tokens_per_s >= 1000) {
    std::snprintf(buf, sizeof(buf), "%.2fk", tokens_per_s / 1000);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f", tokens_per_s);
  }
  return buf;
}
}  // namespace

std::string DescribeBatchChoice(const std::vector<BatchCandidate>& candidates, int chosen, int64_t seq) {
  std::ostringstream o;
  const BatchCandidate& c = candidates.at(static_cast<size_t>(chosen));
  o << "micro-batch " << c.micro << " x " << c.accumulation << " accumulation (" << c.micro * c.accumulation
    << " sequences of " << seq << " tokens per step): predicted " << Rate(c.tokens_per_s) << " tokens/s, "
    << FormatSeconds(c.plan.predicted_s) << "/step bound by " << c.plan.bound << "; candidates";
  for (const BatchCandidate& k : candidates) {
    o << (&k == &candidates.front() ? " " : ", ") << k.micro << "x" << k.accumulation << ": ";
    if (k.feasible) {
      o << Rate(k.tokens_per_s) << " (" << k.plan.bound << ")";
    } else {
      o << "does not fit (" << k.why_not << ")";
    }
  }
  return o.str();
}

}  // namespace offloadd::trainer
