#include "trainer/pipeline/trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/safe_path.h"

namespace offloadd::trainer {
namespace {

// The epoch is a function-local static so that it is initialised by the first caller, whichever
// thread and translation unit that is.
std::chrono::steady_clock::time_point TraceEpoch() {
  static const auto epoch = std::chrono::steady_clock::now();
  return epoch;
}

// Span and track names come from callers (layer names, job ids): invalid UTF-8 is replaced
// rather than thrown on, as a trace must never fail a training step.
std::string JsonString(std::string_view s) {
  return nlohmann::json(std::string(s))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string RenderArgs(const std::vector<TraceArg>& args) {
  if (args.empty()) return {};
  std::string out = "{";
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out += ',';
    out += JsonString(args[i].key());
    out += ':';
    out += args[i].json();
  }
  out += '}';
  return out;
}

// Buffered writer over a file descriptor; a 1 MiB buffer keeps a million-span trace from being
// built as one string in memory.
class FdWriter {
 public:
  explicit FdWriter(int fd) : fd_(fd) { buf_.reserve(kFlushAt + 4096); }
  void Append(std::string_view s) {
    buf_.append(s);
    if (buf_.size() >= kFlushAt) Flush();
  }
  // Returns errno of the first failed write, 0 when all went out.
  int Flush() {
    size_t off = 0;
    while (err_ == 0 && off < buf_.size()) {
      const ssize_t n = ::write(fd_, buf_.data() + off, buf_.size() - off);
      if (n < 0) {
        if (errno != EINTR) err_ = errno;
        continue;
      }
      off += static_cast<size_t>(n);
    }
    buf_.clear();
    return err_;
  }

 private:
  static constexpr size_t kFlushAt = 1 << 20;
  int fd_;
  int err_ = 0;
  std::string buf_;
};

}  // namespace

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               TraceEpoch())
      .count();
}

TraceArg::TraceArg(std::string key, double value) : key_(std::move(key)) {
  if (!std::isfinite(value)) {
    json_ = "null";  // JSON has no NaN or infinity
    return;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  json_ = buf;
}

TraceArg::TraceArg(std::string key, std::string_view value)
    : key_(std::move(key)), json_(JsonString(value)) {}

TraceRecorder::TraceRecorder(Options options) : options_(std::move(options)) {
  NowMicros();  // fixes the epoch no later than the first recorder
  std::lock_guard lock(mu_);
  for (std::string_view t : {tracks::kStep, tracks::kGpuCompute, tracks::kH2D, tracks::kD2H,
                             tracks::kCpuUpdate, tracks::kNvmeRead, tracks::kNvmeWrite}) {
    TrackIdLocked(t);
  }
}

uint32_t TraceRecorder::TrackIdLocked(std::string_view track) {
  auto [it, inserted] =
      track_ids_.try_emplace(std::string(track), static_cast<uint32_t>(track_names_.size()));
  if (inserted) track_names_.emplace_back(track);
  return it->second;
}

void TraceRecorder::AddSpan(std::string_view track, std::string_view name, int64_t start_us,
                            int64_t end_us, std::vector<TraceArg> args) {
  // Render outside the lock: only the append is serialised.
  Span span{0, std::string(name), start_us, std::max<int64_t>(0, end_us - start_us),
            RenderArgs(args)};
  std::lock_guard lock(mu_);
  if (spans_.size() >= options_.max_events) {
    ++dropped_;
    return;
  }
  span.track = TrackIdLocked(track);
  spans_.push_back(std::move(span));
}

Status TraceRecorder::WriteJson(const std::string& path) const {
  std::vector<const Span*> spans;
  std::vector<std::string> names;
  uint64_t dropped = 0;
  {
    std::lock_guard lock(mu_);
    spans.reserve(spans_.size());
    for (const Span& s : spans_) spans.push_back(&s);
    names = track_names_;
    dropped = dropped_;
  }
  // Parents before their children: by start, then longer first, then by track.
  std::stable_sort(spans.begin(), spans.end(), [](const Span* a, const Span* b) {
    if (a->start_us != b->start_us) return a->start_us < b->start_us;
    if (a->dur_us != b->dur_us) return a->dur_us > b->dur_us;
    return a->track < b->track;
  });

  // Through the job's confined directory, to a fresh temporary file (O_EXCL, never through a
  // symlink, a unique name per call: several threads may flush to the same path), renamed over
  // `path` (common/safe_path.h).
  const Status written = WriteFileAtomically(path, [&](int fd) -> Status {
    FdWriter w(fd);
    w.Append(
        "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock\":\"steady, us since trace epoch\"");
    w.Append(",\"dropped_events\":" + std::to_string(dropped));
    w.Append(",\"max_events\":" + std::to_string(options_.max_events));
    w.Append("},\"traceEvents\":[\n");
    w.Append(R"({"ph":"M","pid":1,"tid":0,"name":"process_name","args":{"name":)" +
             JsonString(options_.process_name) + "}}");
    // Track i is thread i+1 (tid 0 is the process), sorted in creation order.
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string tid = std::to_string(i + 1);
      w.Append(",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" + tid +
               ",\"name\":\"thread_name\",\"args\":{\"name\":" + JsonString(names[i]) + "}}");
      w.Append(",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" + tid +
               ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + std::to_string(i) +
               "}}");
    }
    std::string line;
    for (const Span* s : spans) {
      line = ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":";
      line += std::to_string(s->track + 1);
      line += ",\"ts\":";
      line += std::to_string(s->start_us);
      line += ",\"dur\":";
      line += std::to_string(s->dur_us);
      line += ",\"name\":";
      line += JsonString(s->name);
      if (!s->args_json.empty()) {
        line += ",\"args\":";
        line += s->args_json;
      }
      line += '}';
      w.Append(line);
    }
    w.Append("\n]}\n");
    const int err = w.Flush();
    return err == 0 ? OkStatus() : ErrnoError(err, "write " + path);
  });
  return written.WithContext("cannot write trace file " + path);
}

Status TraceRecorder::StepFinished(int64_t step) {
  if (options_.path.empty() || options_.flush_every_steps <= 0 ||
      step % options_.flush_every_steps != 0) {
    return OkStatus();
  }
  return WriteJson(options_.path);
}

size_t TraceRecorder::size() const {
  std::lock_guard lock(mu_);
  return spans_.size();
}

uint64_t TraceRecorder::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

std::vector<std::string> TraceRecorder::track_names() const {
  std::lock_guard lock(mu_);
  return track_names_;
}

ScopedSpan::~ScopedSpan() {
  if (recorder_ != nullptr) {
    recorder_->AddSpan(track_, name_, start_us_, NowMicros(), std::move(args_));
  }
}

}  // namespace offloadd::trainer
