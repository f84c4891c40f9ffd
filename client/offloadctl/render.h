#pragma once
// Human-readable rendering of API messages for offloadctl.

#include <string>
#include <string_view>
#include <vector>

#include "offloadd/v1/job_service.pb.h"
#include "offloadd/v1/node_service.pb.h"

namespace offloadctl {

std::string Upper(std::string s);

// Text from the daemon (display names, labels, paths, reasons, error messages: whatever a user put
// in a job spec or a file name) made safe to show on a terminal: control characters (C0, DEL and
// C1, which terminals take as escape sequences, bells or cursor moves), bidirectional-override
// characters and invalid UTF-8 are shown escaped ("\x1b", "\u202e"); the rest, other languages'
// letters included, as it is. TerminalText keeps the text on one line (a line break shows as
// "\n", so a display name cannot forge a row of `offloadctl list`); TerminalLines keeps line
// breaks, for messages of several lines. JSON and YAML output escape by their own rules instead.
std::string TerminalText(std::string_view s);
std::string TerminalLines(std::string_view s);
// "succeeded" for JOB_STATE_SUCCEEDED.
std::string JobStateName(offloadd::v1::JobState s);
std::string RenderNodeInfo(const offloadd::v1::NodeInfo& n);
std::string RenderJob(const offloadd::v1::Job& j);
std::string RenderJobList(const offloadd::v1::ListJobsResponse& r);
// `offloadctl checkpoints`: a table of STEP, LOSS, SIZE, CREATED, PATH, oldest first.
std::string RenderCheckpoints(const offloadd::v1::ListCheckpointsResponse& r);
// What `offloadctl describe` shows of a job besides RenderJob's summary. `gpus`: the node's GPUs
// the job runs on now (from NodeInfo); `events`: its events without progress, oldest first.
struct JobDescription {
  offloadd::v1::Job job;
  std::vector<int> gpus;
  bool placement_known = false;  // the node's GPUs could be read
  std::vector<offloadd::v1::JobEvent> events;
  offloadd::v1::ListCheckpointsResponse checkpoints;
};
// Sections: the summary, times and transitions, placement, setup and plan (the log lines of the
// latest run before its first step), the spec (as the JSON `-o json` shows), the last
// `last_events` events, checkpoints, output directory.
std::string RenderDescription(const JobDescription& d, int last_events, const std::string& spec_text);
// One log line: "2026-11-28 02:00:01 UTC  warning  message".
std::string RenderLogLine(const offloadd::v1::JobEvent& e);
std::string RenderEvent(const offloadd::v1::JobEvent& e);
// One status line for a terminal: "step 120/1000 [####......]  12%  loss 2.3412  lr 3.0e-04
// 1234 tok/s  ETA 0:12:34" with a bar `bar_width` characters wide.
std::string RenderProgressLine(const offloadd::v1::JobProgress& p, int bar_width = 24);

}  // namespace offloadctl
