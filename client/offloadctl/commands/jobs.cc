// The job commands: submit, list, get, cancel/pause/resume, checkpoints, watch (describe and logs:
// describe.cc).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "client/cpp/job_file.h"
#include "common/units.h"
#include "client/offloadctl/commands/commands.h"
#include "client/offloadctl/commands/print.h"
#include "client/offloadctl/exit_codes.h"
#include "client/offloadctl/render.h"
#include "client/offloadctl/watch_view.h"

namespace offloadctl {

namespace {

using offloadd::client::Client;

// Shows the job's events until it ends: WatchView on a terminal, one line per event otherwise,
// one JSON object per line for -o json, one YAML document per event for -o yaml. Returns the
// exit status for how it ended.
int WatchToEnd(Client& c, const std::string& command, const std::string& job_id,
               OutputFormat format) {
  const bool table = format == OutputFormat::kTable;
  WatchView view(table && StdoutIsLiveTerminal(), StdoutColumns());
  auto job = c.Wait(job_id, [&](const offloadd::v1::JobEvent& e) {
    const std::string text = format == OutputFormat::kJson   ? ToJson(e, /*one_line=*/true)
                             : format == OutputFormat::kYaml ? "---\n" + ToYaml(e)
                                                             : view.OnEvent(e);
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  });
  std::fputs(view.Finish().c_str(), stdout);
  std::fflush(stdout);
  if (!job.ok()) return Fail(command, job.status());
  const int code = ExitCodeForJobState(job->state());
  if (code == kExitOk) return code;
  std::string why = job->error().message();
  if (why.empty() && !job->transitions().empty()) why = job->transitions().rbegin()->reason();
  return Fail(command,
              "job " + job_id + " ended " + JobStateName(job->state()) + (why.empty() ? "" : ": ") + why,
              code);
}


// A job file with problems: the daemon validates the part that read, so its problems (paths,
// ranges, memory) come back in the same run as the file's own.
int FailWithEveryProblem(Client& c, const std::string& source, const offloadd::client::JobFileContents& read) {
  std::vector<offloadd::client::FieldViolation> all = read.violations;
  std::string note;
  auto daemon = c.CreateJob(read.spec, /*validate_only=*/true);
  if (!daemon.ok() && daemon.status().code() == offloadd::StatusCode::kInvalidArgument) {
    all = offloadd::client::MergeViolations(std::move(all), c.last_field_violations());
  } else if (!daemon.ok()) {
    note = "\n(the daemon did not check the rest: " + daemon.status().ToString() + ")";
  }
  return Fail("submit", offloadd::client::DescribeViolations(source, all) + note, kExitInvalid);
}

}  // namespace

int RunSubmit(Client& c, const Options& o) {
  std::string error;
  const auto text = ReadInputFile(o.job_file, "job file", "submit -", kMaxJobFileBytes, &error);
  if (!text) return Fail("submit", error, kExitUsage);
  const std::string source = o.job_file == "-" ? "<stdin>" : o.job_file;
  auto spec = offloadd::client::ReadJobSpec(*text, source);
  if (!spec.ok()) return Fail("submit", spec.status());
  if (!spec->violations.empty()) return FailWithEveryProblem(c, source, *spec);
  auto job = c.CreateJob(spec->spec, o.validate_only);
  if (!job.ok()) return Fail("submit", job.status());
  const OutputFormat format = o.format();
  if (o.validate_only) {
    if (format == OutputFormat::kTable) {
      std::printf("%s: valid. The job would run as:\n", source.c_str());
      std::fputs(ToJson(job->spec()).c_str(), stdout);
      // The model's family and the parts the engine assembles it from.
      if (!job->model().parts().empty()) {
        std::printf("model: %s (%s), %s parameters\n",
                    TerminalText(job->model().parts()).c_str(),
                    TerminalText(job->model().architecture()).c_str(),
                    std::to_string(job->model().parameters()).c_str());
      }
      // The step priced on the daemon's node (its node profile, and a shape profile when a run of
      // this shape recorded one there).
      if (job->has_step_estimate()) {
        std::printf("Predicted step: %s\n", TerminalText(job->step_estimate().text()).c_str());
        const offloadd::v1::StepEstimate& e = job->step_estimate();
        if (!e.host_text().empty()) {
          std::printf("Predicted host memory: %s\n", TerminalText(e.host_text()).c_str());
          std::printf("Per tier of the optimizer states: RAM: host %s, disk 0; NVMe: host %s, disk %s\n",
                      offloadd::FormatByteSize(e.ram_tier_host_bytes()).c_str(),
                      offloadd::FormatByteSize(e.nvme_tier_host_bytes()).c_str(),
                      offloadd::FormatByteSize(e.nvme_tier_disk_bytes()).c_str());
        }
      }
    } else {
      Print(job->spec(), format, "");
    }
    return kExitOk;
  }
  if (o.watch && format == OutputFormat::kJson) {
    // One line, so the job and the events after it are one JSON Lines stream.
    std::fputs(ToJson(*job, /*one_line=*/true).c_str(), stdout);
  } else {
    Print(*job, format, RenderJob(*job));
  }
  if (!o.watch) return kExitOk;
  std::fflush(stdout);
  return WatchToEnd(c, "submit", job->id(), format);
}

int RunList(Client& c, const Options& o) {
  offloadd::v1::ListJobsRequest req;
  for (const std::string& name : o.states) {
    offloadd::v1::JobState st;
    if (!offloadd::v1::JobState_Parse("JOB_STATE_" + Upper(name), &st)) {
      return Fail("list", "unknown job state '" + name + "'", kExitUsage);
    }
    req.add_states(st);
  }
  // Every page: the daemon ends a page at a count or a size (large job records), so one response
  // need not hold every job.
  offloadd::v1::ListJobsResponse all;
  do {
    auto r = c.ListJobs(req);
    if (!r.ok()) return Fail("list", r.status());
    for (auto& job : *r->mutable_jobs()) *all.add_jobs() = std::move(job);
    req.set_page_token(r->next_page_token());
  } while (!req.page_token().empty());
  Print(all, o.format(), RenderJobList(all));
  return kExitOk;
}

int RunGet(Client& c, const Options& o) {
  auto j = o.wait ? c.Wait(o.job_id) : c.GetJob(o.job_id);
  if (!j.ok()) return Fail("get", j.status());
  Print(*j, o.format(), RenderJob(*j));
  return o.wait ? ExitCodeForJobState(j->state()) : kExitOk;
}

int RunJobAction(Client& c, const Options& o) {
  const std::string& cmd = o.command;
  offloadd::StatusOr<offloadd::v1::Job> j = cmd == "cancel" ? c.CancelJob(o.job_id, o.reason, o.force)
                                            : cmd == "pause" ? c.PauseJob(o.job_id)
                                                             : c.ResumeJob(o.job_id);
  if (!j.ok()) return Fail(cmd, j.status());
  Print(*j, o.format(), RenderJob(*j));
  return kExitOk;
}

int RunCheckpoints(Client& c, const Options& o) {
  auto r = c.ListCheckpoints(o.job_id);
  if (!r.ok()) return Fail("checkpoints", r.status());
  Print(*r, o.format(), RenderCheckpoints(*r));
  return kExitOk;
}

int RunWatch(Client& c, const Options& o) { return WatchToEnd(c, "watch", o.job_id, o.format()); }

}  // namespace offloadctl
