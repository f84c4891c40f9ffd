#pragma once
// A timeline of what the offloaded pipeline did, written as Chrome trace JSON (open it in
// https://ui.perfetto.dev or chrome://tracing). One named track per resource ("gpu compute",
// "h2d", "d2h", "cpu update", "nvme read", "nvme write", "step"), each span an "X" complete event
// in microseconds since the process-wide trace epoch (NowMicros()).
//
// GPU spans are timed by the caller from CUDA events and added afterwards with explicit
// timestamps; CPU-side spans use ScopedSpan. Memory is bounded: past Options::max_events new
// spans are dropped and counted (the count is written into the file). Torch-free.
//
// Thread-safe: every TraceRecorder member may be called from any thread.

#include <concepts>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace offloadd::trainer {

// Microseconds on the steady clock since the trace epoch: the first call in this process. All
// recorders share it, so spans from several recorders and threads line up.
int64_t NowMicros();

// The pipeline's standard tracks, created by every recorder in this order (others are created on
// first use, e.g. one "cpu update 3" per worker when their spans overlap).
namespace tracks {
inline constexpr std::string_view kStep = "step";
inline constexpr std::string_view kGpuCompute = "gpu compute";
inline constexpr std::string_view kH2D = "h2d";
inline constexpr std::string_view kD2H = "d2h";
inline constexpr std::string_view kCpuUpdate = "cpu update";
inline constexpr std::string_view kNvmeRead = "nvme read";
inline constexpr std::string_view kNvmeWrite = "nvme write";
}  // namespace tracks

// One "args" entry of a span, shown in the trace viewer's details pane: {"layer", 3},
// {"bytes", n}, {"loss", 2.5}, {"kind", "fwd"}. The value is rendered to JSON on construction.
class TraceArg {
 public:
  template <std::integral T>
  TraceArg(std::string key, T value) : key_(std::move(key)), json_(std::to_string(value)) {}
  TraceArg(std::string key, bool value) : key_(std::move(key)), json_(value ? "true" : "false") {}
  TraceArg(std::string key, double value);  // non-finite values become null
  TraceArg(std::string key, std::string_view value);
  TraceArg(std::string key, const char* value)
      : TraceArg(std::move(key), std::string_view(value)) {}

  const std::string& key() const { return key_; }
  const std::string& json() const { return json_; }

 private:
  std::string key_;
  std::string json_;
};

class TraceRecorder {
 public:
  struct Options {
    std::string process_name = "offloadd";  // names the trace's one process (e.g. the job id)
    size_t max_events = 1'000'000;          // spans kept; later ones are dropped and counted
    std::string path;                       // where StepFinished() flushes; empty: never
    int64_t flush_every_steps = 0;          // StepFinished(step) writes when step % N == 0
  };

  TraceRecorder() : TraceRecorder(Options{}) {}
  explicit TraceRecorder(Options options);

  // One span on `track` (created on first use) from start_us to end_us (NowMicros() timebase).
  // A span that ends before it starts is kept with zero duration. Spans on one track should be
  // nested or disjoint, as trace viewers draw each track as one call stack.
  void AddSpan(std::string_view track, std::string_view name, int64_t start_us, int64_t end_us,
               std::vector<TraceArg> args = {});

  // Writes {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}} to `path`
  // atomically (a temporary file in the same directory, then rename). Keeps the spans: later
  // writes hold everything recorded so far.
  Status WriteJson(const std::string& path) const;

  // Per-step flush: writes Options::path when flush_every_steps divides `step`; OK otherwise.
  Status StepFinished(int64_t step);

  size_t size() const;                           // spans held
  uint64_t dropped() const;                      // spans refused because max_events was reached
  std::vector<std::string> track_names() const;  // in track-id order

 private:
  struct Span {
    uint32_t track;
    std::string name;
    int64_t start_us;
    int64_t dur_us;
    std::string args_json;  // "{...}" or empty
  };

  uint32_t TrackIdLocked(std::string_view track);

  const Options options_;
  mutable std::mutex mu_;
  std::vector<std::string> track_names_;
  std::unordered_map<std::string, uint32_t> track_ids_;
  // A deque: appending never moves the spans already held, so WriteJson can format them outside
  // the lock from pointers taken under it (spans are never modified or removed).
  std::deque<Span> spans_;
  uint64_t dropped_ = 0;
};

// Times a CPU-side span from construction to destruction and adds it to `recorder`; a null
// recorder makes it a no-op, so tracing can be switched off without touching the call sites.
// Not copyable; use from one thread.
class ScopedSpan {
 public:
  ScopedSpan(TraceRecorder* recorder, std::string_view track, std::string_view name)
      : recorder_(recorder), track_(track), name_(name), start_us_(recorder ? NowMicros() : 0) {}
  ~ScopedSpan();
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

  void AddArg(TraceArg arg) {
    if (recorder_ != nullptr) args_.push_back(std::move(arg));
  }

 private:
  TraceRecorder* recorder_;
  std::string track_;
  std::string name_;
  int64_t start_us_;
  std::vector<TraceArg> args_;
};

}  // namespace offloadd::trainer
