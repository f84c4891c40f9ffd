#pragma once
// What `offloadctl watch` prints for a job's event stream.
//
// On a terminal (`live`), progress events redraw one status line in place ("\r", the line,
// clear-to-end-of-line "\x1b[K"): step/max bar, loss, learning rate, tokens/s and ETA. Every other
// event (state changes, logs, checkpoints) is printed on its own line above the status line,
// which is then drawn again below it. Otherwise (a pipe, a file) each event is one line, as
// RenderEvent writes it, so logs and scripts see one record per event.
//
// Pure text in, text out (no I/O), so the rendering is unit-tested. Not thread-safe.

#include <cstdint>
#include <string>

#include "offloadd/v1/job.pb.h"

namespace offloadctl {

class WatchView {
 public:
  // `columns`: the terminal's width; the status line is cut to fit so "\r" redraws it cleanly.
  WatchView(bool live, int columns);

  // The text to write for `event`.
  std::string OnEvent(const offloadd::v1::JobEvent& event);
  // The text to write when the watch ends: ends the status line so what follows starts on a
  // line of its own.
  std::string Finish();

  // The status line for `progress` as it is drawn now (bar narrowed and line cut to fit), with
  // the ETA estimated from the steps seen so far when the daemon sends none.
  std::string StatusLine(const offloadd::v1::JobProgress& progress) const;

 private:
  // Fills progress.eta from the step rate between the first and this progress event.
  offloadd::v1::JobProgress WithEta(const offloadd::v1::JobProgress& progress,
                                    const google::protobuf::Timestamp& at);

  bool live_;
  int columns_;
  std::string status_;  // the status line on screen, empty when none is
  bool have_first_ = false;
  int64_t first_step_ = 0;
  double first_time_ = 0;  // seconds since the epoch of the first progress event
};

// Whether stdout is a terminal that understands "\r" and "\x1b[K", and its width in columns.
bool StdoutIsLiveTerminal();
int StdoutColumns();

}  // namespace offloadctl
