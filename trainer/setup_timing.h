#pragma once
// SetupTiming: the trainer's set-up timed by phase (job/step_stats.h kSetupPhases): each phase's
// wall seconds and when it first began, counted from this object's creation (Trainer::Create), and
// the plan log's line, which names the phases that overlapped (the arena may be populated in the
// background, TrainConfig::setup_overlap). Thread-compatible: the set-up's thread only.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "job/step_stats.h"

namespace offloadd::trainer {

class SetupTiming {
 public:
  using Clock = std::chrono::steady_clock;

  // Adds [begin, end) to phase `phase` (an index into kSetupPhases); its first begin is its start.
  void Add(size_t phase, Clock::time_point begin, Clock::time_point end);
  // Whether the arena was populated in the background (HostOptimizer::populating_in_background()
  // at its creation), for the line.
  void set_arena_in_background(bool in_background) { arena_in_background_ = in_background; }

  Clock::time_point created() const { return created_; }
  // Per phase: wall seconds, and the first start in seconds since created() (-1: it did not run).
  std::vector<double> seconds() const { return {seconds_.begin(), seconds_.end()}; }
  std::vector<double> starts() const { return {start_.begin(), start_.end()}; }

  // "set-up 12.3 s (16 threads): cuda 1.2, model 0.01, ..., arena 9.5 (0.2-9.7 s, beside workers,
  // weights), ...; arena 1.2 GiB": the wall time the phases cover, and each overlapping phase's
  // interval. arena_bytes: the host optimizer's arena (nullopt: none was made, validate_only).
  std::string Describe(uint32_t threads, std::optional<uint64_t> arena_bytes) const;

 private:
  Clock::time_point created_ = Clock::now();
  std::array<double, kSetupPhases.size()> seconds_{};
  std::array<double, kSetupPhases.size()> start_{-1, -1, -1, -1, -1, -1, -1, -1};
  bool arena_in_background_ = false;
};

// Adds the wall time of its own lifetime to one phase of a SetupTiming.
class SetupPhase {
 public:
  SetupPhase(SetupTiming& timing, size_t phase)
      : timing_(timing), phase_(phase), start_(SetupTiming::Clock::now()) {}
  ~SetupPhase() { timing_.Add(phase_, start_, SetupTiming::Clock::now()); }
  SetupPhase(const SetupPhase&) = delete;
  SetupPhase& operator=(const SetupPhase&) = delete;

 private:
  SetupTiming& timing_;
  size_t phase_;
  SetupTiming::Clock::time_point start_;
};

}  // namespace offloadd::trainer
