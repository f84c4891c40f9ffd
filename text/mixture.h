#pragma once
// Several datasets mixed by weight (Hugging Face datasets' interleave_datasets with
// probabilities, whose map-style rule this follows): the document order of each epoch, as indices
// into the concatenation of the datasets (dataset i's documents at offsets()[i] ...). The Batcher
// (batcher.h) packs them in this order. Deterministic in (sizes, weights, stopping, shuffle,
// seed, epoch); nothing else (no clock, no thread) enters.
//
// The rule, for epoch e (uint64 arithmetic, splitmix64 as in batcher.h):
//   state = seed XOR kMixtureSalt XOR (e * 0x9E3779B97F4A7C15)
//   W = w[0] + ... + w[k-1] and C[i] = w[0] + ... + w[i], summed left to right in doubles
//   every dataset starts its pass 0 at position 0, not exhausted
//   repeat:
//     stop when the stopping strategy says so (first_exhausted: any dataset is exhausted;
//       all_exhausted: every dataset is, or kMaxMixtureEpochDraws documents were drawn)
//     u = (splitmix64(state) >> 11) * 2^-53; dataset i = the first i with u * W < C[i] (k-1 if
//       rounding leaves none)
//     at position 0 of its pass p, dataset i takes the order Batcher::EpochOrder(n[i],
//       seed XOR ((i + 1) * 0xD1B54A32D192ED03), (e << 32) | p, shuffle)
//     emit offsets[i] + that order[position]; position += 1
//     at position n[i]: dataset i is exhausted, and starts its pass p + 1 at position 0
// So an epoch is one interleaved pass that ends with the first dataset to run out
// (first_exhausted, HF's default: no document is seen twice in an epoch, and the others are cut
// short), or once every dataset has run out at least once (all_exhausted: smaller datasets are
// seen again, each pass in a new order). Each draw picks dataset i with probability w[i] / W
// whatever has been drawn before. Without shuffle every pass is in file order; the draws are
// seeded all the same. Thread-compatible.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::text {

enum class MixtureStopping { kFirstExhausted, kAllExhausted };
// "first_exhausted" or "all_exhausted" (interleave_datasets' stopping_strategy names).
StatusOr<MixtureStopping> ParseMixtureStopping(std::string_view name);
const char* MixtureStoppingName(MixtureStopping s);

inline constexpr uint64_t kMixtureSalt = 0x6D69787475726521ull;  // "mixture!"
// An all_exhausted epoch longer than this is cut here (a small dataset with a tiny weight);
// Create refuses all_exhausted mixtures whose expected epoch is longer than a quarter of it.
// A first_exhausted epoch draws each document at most once, so the documents bound it.
inline constexpr uint64_t kMaxMixtureEpochDraws = uint64_t{1} << 26;

struct MixtureOptions {
  std::vector<uint64_t> sizes;  // documents of each dataset, each at least 1
  std::vector<double> weights;  // each finite and > 0; only their ratios matter
  MixtureStopping stopping = MixtureStopping::kFirstExhausted;
  bool shuffle = true;
  uint64_t seed = 0;
};

class Mixture {
 public:
  // INVALID_ARGUMENT naming datasets[i] for an empty dataset, a weight <= 0 or not finite, no
  // dataset at all, or an all_exhausted epoch too long to hold (see kMaxMixtureEpochDraws).
  static StatusOr<Mixture> Create(const MixtureOptions& options);

  // Epoch e's document order (see the rule above).
  std::vector<uint32_t> EpochOrder(uint64_t epoch) const;
  const std::vector<uint64_t>& offsets() const { return offsets_; }
  uint64_t total() const { return total_; }  // documents of all datasets together
  const MixtureOptions& options() const { return options_; }
  // The draws an epoch is expected to take: min (first_exhausted) or max (all_exhausted) over
  // the datasets of n[i] * W / w[i].
  double ExpectedEpochDraws() const;
  // What a saved cursor must match to continue the same sequence (sizes, weights, stopping).
  std::string Fingerprint() const;

 private:
  explicit Mixture(MixtureOptions options);
  MixtureOptions options_;
  std::vector<uint64_t> offsets_;
  std::vector<double> cumulative_;
  uint64_t total_ = 0;
};

}  // namespace offloadd::text
