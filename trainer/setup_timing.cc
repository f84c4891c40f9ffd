// The set-up's timing by phase (trainer/setup_timing.h).
#include "trainer/setup_timing.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/units.h"

namespace offloadd::trainer {
namespace {

double Seconds(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

void SetupTiming::Add(size_t phase, Clock::time_point begin, Clock::time_point end) {
  if (start_[phase] < 0) start_[phase] = Seconds(created_, begin);
  seconds_[phase] += Seconds(begin, end);
}

std::string SetupTiming::Describe(uint32_t threads, std::optional<uint64_t> arena_bytes) const {
  // The wall time the phases cover (their union), and for each phase that overlaps another its
  // interval and the phases it overlaps: the durations of overlapping phases do not add up.
  constexpr size_t kN = kSetupPhases.size();
  std::vector<std::pair<double, double>> spans;
  for (size_t i = 0; i < kN; ++i) {
    if (start_[i] >= 0) spans.emplace_back(start_[i], start_[i] + seconds_[i]);
  }
  std::sort(spans.begin(), spans.end());
  double covered = 0, reach = -1;
  for (const auto& [b, e] : spans) {
    if (b > reach) {
      covered += e - b;
    } else if (e > reach) {
      covered += e - reach;
    }
    reach = std::max(reach, e);
  }
  auto overlap = [&](size_t i, size_t j) {
    if (i == j || start_[i] < 0 || start_[j] < 0) return false;
    const double lo = std::max(start_[i], start_[j]);
    const double hi = std::min(start_[i] + seconds_[i], start_[j] + seconds_[j]);
    return hi - lo > 1e-4;  // a tenth of a millisecond: not phases run one after the other
  };
  std::ostringstream out;
  out.precision(3);
  out << "set-up " << covered << " s (" << threads << " threads"
      << (arena_in_background_ ? "; the arena populated in the background" : "") << "):";
  for (size_t i = 0; i < kN; ++i) {
    out << (i ? ", " : " ") << kSetupPhases[i] << " " << seconds_[i];
    std::string with;
    for (size_t j = 0; j < kN; ++j) {
      if (overlap(i, j)) with += std::string(with.empty() ? "" : ", ") + kSetupPhases[j];
    }
    if (!with.empty()) {
      out << " (" << start_[i] << "-" << start_[i] + seconds_[i] << " s, beside " << with << ")";
    }
  }
  if (arena_bytes) out << "; arena " << FormatByteSize(*arena_bytes);
  return out.str();
}

}  // namespace offloadd::trainer
