#include "text/mixture.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "text/batcher.h"

namespace offloadd::text {
namespace {

std::string Where(size_t i) { return "datasets[" + std::to_string(i) + "]"; }

}  // namespace

StatusOr<MixtureStopping> ParseMixtureStopping(std::string_view name) {
  if (name == "first_exhausted" || name.empty()) return MixtureStopping::kFirstExhausted;
  if (name == "all_exhausted") return MixtureStopping::kAllExhausted;
  return InvalidArgumentError("stopping_strategy '" + std::string(name) +
                              "': expected first_exhausted or all_exhausted");
}

const char* MixtureStoppingName(MixtureStopping s) {
  return s == MixtureStopping::kAllExhausted ? "all_exhausted" : "first_exhausted";
}

Mixture::Mixture(MixtureOptions options) : options_(std::move(options)) {
  double sum = 0;
  for (size_t i = 0; i < options_.sizes.size(); ++i) {
    offsets_.push_back(total_);
    total_ += options_.sizes[i];
    sum += options_.weights[i];
    cumulative_.push_back(sum);
  }
}

StatusOr<Mixture> Mixture::Create(const MixtureOptions& options) {
  if (options.sizes.empty()) return InvalidArgumentError("datasets: an empty mixture");
  if (options.sizes.size() != options.weights.size()) {
    return InvalidArgumentError("datasets: " + std::to_string(options.sizes.size()) +
                                " sizes but " + std::to_string(options.weights.size()) +
                                " weights");
  }
  uint64_t total = 0;
  for (size_t i = 0; i < options.sizes.size(); ++i) {
    const double w = options.weights[i];
    if (!std::isfinite(w) || w <= 0) {
      char v[32];
      std::snprintf(v, sizeof v, "%g", w);
      return InvalidArgumentError(Where(i) + ".weight: " + v +
                                  " (a weight must be finite and > 0)");
    }
    if (options.sizes[i] == 0) return InvalidArgumentError(Where(i) + ": no documents");
    total += options.sizes[i];
  }
  if (total > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgumentError("datasets: more than 2^32 documents in all");
  }
  Mixture m(options);
  if (!std::isfinite(m.cumulative_.back())) {
    return InvalidArgumentError("datasets: the weights' sum is not finite");
  }
  const double expected = m.ExpectedEpochDraws();
  // first_exhausted draws each document at most once: its epoch is bounded by the documents.
  const bool all = options.stopping == MixtureStopping::kAllExhausted;
  if (all && !(expected <= static_cast<double>(kMaxMixtureEpochDraws / 4))) {
    char e[32];
    std::snprintf(e, sizeof e, "%.3g", expected);
    return InvalidArgumentError(
        "datasets: an all_exhausted epoch would take about " + std::string(e) +
        " documents (each dataset's size x total weight / its weight, the largest), more than " +
        std::to_string(kMaxMixtureEpochDraws / 4) +
        "; raise the small datasets' weights or use stopping_strategy first_exhausted");
  }
  return m;
}

double Mixture::ExpectedEpochDraws() const {
  const double W = cumulative_.back();
  const bool all = options_.stopping == MixtureStopping::kAllExhausted;
  double out = all ? 0 : std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < options_.sizes.size(); ++i) {
    const double e = static_cast<double>(options_.sizes[i]) * W / options_.weights[i];
    out = all ? std::max(out, e) : std::min(out, e);
  }
  return out;
}

std::vector<uint32_t> Mixture::EpochOrder(uint64_t epoch) const {
  const size_t k = options_.sizes.size();
  const double W = cumulative_.back();
  const bool all = options_.stopping == MixtureStopping::kAllExhausted;
  std::vector<uint64_t> position(k, 0), pass(k, 0);
  std::vector<std::vector<uint32_t>> order(k);
  std::vector<bool> exhausted(k, false);
  size_t exhausted_count = 0;
  uint64_t state = options_.seed ^ kMixtureSalt ^ (epoch * 0x9E3779B97F4A7C15ull);
  std::vector<uint32_t> out;
  out.reserve(static_cast<size_t>(std::min<double>(ExpectedEpochDraws() * 1.25 + 16,
                                                   static_cast<double>(kMaxMixtureEpochDraws))));
  while (!all || out.size() < kMaxMixtureEpochDraws) {
    if (all ? exhausted_count == k : exhausted_count > 0) break;
    const double u = static_cast<double>(SplitMix64(&state) >> 11) * 0x1.0p-53;
    const double t = u * W;
    size_t i = 0;
    while (i + 1 < k && !(t < cumulative_[i])) ++i;
    if (position[i] == 0) {
      const uint64_t seed_i = options_.seed ^ ((i + 1) * 0xD1B54A32D192ED03ull);
      order[i] =
          Batcher::EpochOrder(options_.sizes[i], seed_i, (epoch << 32) | pass[i], options_.shuffle);
    }
    out.push_back(static_cast<uint32_t>(offsets_[i] + order[i][position[i]]));
    if (++position[i] == options_.sizes[i]) {
      position[i] = 0;
      ++pass[i];
      if (!exhausted[i]) {
        exhausted[i] = true;
        ++exhausted_count;
      }
    }
  }
  return out;
}

std::string Mixture::Fingerprint() const {
  std::string out = MixtureStoppingName(options_.stopping);
  for (size_t i = 0; i < options_.sizes.size(); ++i) {
    char w[40];
    std::snprintf(w, sizeof w, "%.17g", options_.weights[i]);
    out += " " + std::to_string(options_.sizes[i]) + ":" + w;
  }
  return out;
}

}  // namespace offloadd::text
