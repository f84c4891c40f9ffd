// The set-up's timing by phase (trainer_setup.cc): each phase's wall seconds and first start, and
// the plan log's line, which names the phases that overlapped.
#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/units.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {
namespace {

double Seconds(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

void Trainer::Impl::AddSetupPhase(size_t phase, std::chrono::steady_clock::time_point begin,
                                  std::chrono::steady_clock::time_point end) {
  if (setup_start[phase] < 0) setup_start[phase] = Seconds(created, begin);
  setup_seconds[phase] += Seconds(begin, end);
}

std::string Trainer::Impl::DescribeSetup() const {
  // The wall time the phases cover (their union), and for each phase that overlaps another its
  // interval and the phases it overlaps: the durations of overlapping phases do not add up.
  constexpr size_t kN = kSetupPhases.size();
  std::vector<std::pair<double, double>> spans;
  for (size_t i = 0; i < kN; ++i) {
    if (setup_start[i] >= 0) spans.emplace_back(setup_start[i], setup_start[i] + setup_seconds[i]);
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
    if (i == j || setup_start[i] < 0 || setup_start[j] < 0) return false;
    const double lo = std::max(setup_start[i], setup_start[j]);
    const double hi = std::min(setup_start[i] + setup_seconds[i], setup_start[j] + setup_seconds[j]);
    return hi - lo > 1e-4;  // a tenth of a millisecond: not phases run one after the other
  };
  std::ostringstream out;
  out.precision(3);
  out << "set-up " << covered << " s (" << SetupThreads() << " threads"
      << (arena_in_background ? "; the arena populated in the background" : "")
      << "):";
  for (size_t i = 0; i < kN; ++i) {
    out << (i ? ", " : " ") << kSetupPhases[i] << " " << setup_seconds[i];
    std::string with;
    for (size_t j = 0; j < kN; ++j) {
      if (overlap(i, j)) with += std::string(with.empty() ? "" : ", ") + kSetupPhases[j];
    }
    if (!with.empty()) {
      out << " (" << setup_start[i] << "-" << setup_start[i] + setup_seconds[i] << " s, beside "
          << with << ")";
    }
  }
  if (host) out << "; arena " << FormatByteSize(host->segment().total_size());
  return out.str();
}

}  // namespace offloadd::trainer
