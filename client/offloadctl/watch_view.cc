#include "client/offloadctl/watch_view.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "client/offloadctl/render.h"

namespace offloadctl {
namespace {

constexpr const char* kClearToEol = "\x1b[K";
constexpr int kWideBar = 24;
constexpr int kNarrowBar = 10;

double Seconds(const google::protobuf::Timestamp& t) {
  return static_cast<double>(t.seconds()) + t.nanos() * 1e-9;
}

}  // namespace

WatchView::WatchView(bool live, int columns) : live_(live), columns_(std::max(columns, 20)) {}

offloadd::v1::JobProgress WatchView::WithEta(const offloadd::v1::JobProgress& progress,
                                             const google::protobuf::Timestamp& at) {
  offloadd::v1::JobProgress p = progress;
  if (!have_first_) {
    have_first_ = true;
    first_step_ = p.step();
    first_time_ = Seconds(at);
  }
  const int64_t left = p.max_steps() - p.step();
  if (p.has_eta() || p.max_steps() <= 0 || left < 0) return p;
  double per_step = 0;
  if (p.has_step_time()) {
    per_step = static_cast<double>(p.step_time().seconds()) + p.step_time().nanos() * 1e-9;
  } else if (p.step() > first_step_) {
    per_step = (Seconds(at) - first_time_) / static_cast<double>(p.step() - first_step_);
  }
  if (per_step > 0)
    p.mutable_eta()->set_seconds(static_cast<int64_t>(std::llround(per_step * left)));
  return p;
}

std::string WatchView::StatusLine(const offloadd::v1::JobProgress& progress) const {
  const size_t fit =
      static_cast<size_t>(columns_ - 1);  // the last column would wrap on some terminals
  std::string line = RenderProgressLine(progress, kWideBar);
  if (line.size() > fit) line = RenderProgressLine(progress, kNarrowBar);
  if (line.size() > fit) line.resize(fit);
  return line;
}

std::string WatchView::OnEvent(const offloadd::v1::JobEvent& event) {
  if (!live_) return RenderEvent(event);
  if (event.has_progress()) {
    status_ = StatusLine(WithEta(event.progress(), event.time()));
    return "\r" + status_ + kClearToEol;
  }
  // Replace the status line by the event's line, then draw the status line again below it.
  std::string out = status_.empty() ? std::string() : std::string("\r") + kClearToEol;
  out += RenderEvent(event);
  return out + status_;
}

std::string WatchView::Finish() {
  if (!live_ || status_.empty()) return "";
  status_.clear();
  return "\n";
}

bool StdoutIsLiveTerminal() {
  if (isatty(STDOUT_FILENO) != 1) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

int StdoutColumns() {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c != nullptr && std::atoi(c) > 0) return std::atoi(c);
  return 80;
}

}  // namespace offloadctl
