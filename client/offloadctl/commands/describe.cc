// describe, logs and delete: one job in full, its log, and its removal. Both read the job's events from the daemon's
// event log (WatchJob until_now: the events it has, without following), which keeps what the
// job's executors logged (offloadd.internal LogLine -> JobEvent.log).
#include <cstdio>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "client/offloadctl/commands/commands.h"
#include "client/offloadctl/commands/print.h"
#include "client/offloadctl/exit_codes.h"
#include "client/offloadctl/render.h"

namespace offloadctl {

namespace {

using offloadd::client::Client;

// The job's events as they are now (progress left out: describe and logs show neither).
offloadd::StatusOr<std::vector<offloadd::v1::JobEvent>> EventsNow(Client& c, const std::string& job_id,
                                                                  bool logs_only) {
  offloadd::v1::WatchJobRequest req;
  req.set_job_id(job_id);
  req.set_include_progress(false);
  req.set_until_now(true);
  std::vector<offloadd::v1::JobEvent> events;
  const offloadd::Status s = c.WatchJob(req, [&](const offloadd::v1::JobEvent& e) {
    if (!logs_only || e.has_log()) events.push_back(e);
    return true;
  });
  if (!s.ok()) return s;
  return events;
}

nlohmann::ordered_json Tree(const google::protobuf::Message& m) {
  return nlohmann::ordered_json::parse(ToJson(m, /*one_line=*/true));
}

}  // namespace

int RunDescribe(Client& c, const Options& o) {
  JobDescription d;
  auto job = c.GetJob(o.job_id);
  if (!job.ok()) return Fail("describe", job.status());
  d.job = std::move(*job);
  auto events = EventsNow(c, o.job_id, /*logs_only=*/false);
  if (!events.ok()) return Fail("describe", events.status());
  d.events = std::move(*events);
  auto checkpoints = c.ListCheckpoints(o.job_id);
  if (!checkpoints.ok()) return Fail("describe", checkpoints.status());
  d.checkpoints = std::move(*checkpoints);
  // Placement: the node's GPUs that name this job. A daemon that cannot say leaves it unknown
  // rather than failing the whole description.
  if (auto node = c.GetNodeInfo(); node.ok()) {
    d.placement_known = true;
    for (const auto& g : node->gpus()) {
      if (g.job_id() == d.job.id()) d.gpus.push_back(g.index());
    }
  }
  const OutputFormat format = o.format();
  if (format == OutputFormat::kTable) {
    std::fputs(TerminalLines(RenderDescription(d, o.events, ToJson(d.job.spec()))).c_str(), stdout);
    return kExitOk;
  }
  nlohmann::ordered_json out;
  out["job"] = Tree(d.job);
  out["gpus"] = d.gpus;
  auto& list = out["events"] = nlohmann::ordered_json::array();
  const size_t first = d.events.size() > static_cast<size_t>(o.events) ? d.events.size() - o.events : 0;
  for (size_t i = first; i < d.events.size(); ++i) list.push_back(Tree(d.events[i]));
  out["checkpoints"] = Tree(d.checkpoints)["checkpoints"];
  out["output_dir"] = d.job.spec().output_dir();
  const std::string json = out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fputs(format == OutputFormat::kJson ? json.c_str() : JsonToYaml(json).c_str(), stdout);
  return kExitOk;
}

int RunLogs(Client& c, const Options& o) {
  const OutputFormat format = o.format();
  const auto print = [format](const offloadd::v1::JobEvent& e) {
    if (!e.has_log()) return;
    const std::string text = format == OutputFormat::kJson   ? ToJson(e, /*one_line=*/true)
                             : format == OutputFormat::kYaml ? "---\n" + ToYaml(e)
                                                             : RenderLogLine(e);
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  };
  if (o.follow) {
    // Until the job ends, reconnecting as `watch` does.
    auto job = c.Wait(o.job_id, print);
    if (!job.ok()) return Fail("logs", job.status());
    return kExitOk;
  }
  auto events = EventsNow(c, o.job_id, /*logs_only=*/true);
  if (!events.ok()) return Fail("logs", events.status());
  for (const auto& e : *events) print(e);
  return kExitOk;
}

int RunDelete(Client& c, const Options& o) {
  auto job = c.GetJob(o.job_id);
  if (!job.ok()) return Fail("delete", job.status());
  const offloadd::v1::JobState st = job->state();
  const bool ended = st == offloadd::v1::JOB_STATE_SUCCEEDED || st == offloadd::v1::JOB_STATE_FAILED ||
                     st == offloadd::v1::JOB_STATE_CANCELLED;
  const std::string dir = job->spec().output_dir();
  if (o.purge && !ended) {
    return Fail("delete",
                "job " + o.job_id + " is " + JobStateName(st) +
                    ": --purge removes the output directory only of a job that ended; cancel it first",
                kExitError);
  }
  auto deleted = c.DeleteJob(o.job_id);
  if (!deleted.ok()) return Fail("delete", deleted.status());
  std::string purged;
  if (o.purge && !dir.empty()) {
    // Removed by this process, as the user who asks: only what they may remove goes.
    namespace fs = std::filesystem;
    const fs::path path(dir);
    std::error_code ec;
    const auto status = fs::symlink_status(path, ec);
    if (!path.is_absolute() || path.relative_path().empty() || path == path.root_path()) {
      return Fail("delete", "job " + o.job_id + " deleted; its output directory '" + dir +
                                "' is not one --purge removes (not an absolute path below /)",
                  kExitError);
    }
    if (ec || !fs::exists(status)) {
      purged = " (output directory " + dir + " not found on this host: nothing removed)";
    } else if (!fs::is_directory(status)) {
      return Fail("delete", "job " + o.job_id + " deleted; its output directory " + dir +
                                " is not a directory (a symlink or a file): not removed",
                  kExitError);
    } else if (fs::remove_all(path, ec); ec) {
      return Fail("delete", "job " + o.job_id + " deleted; removing its output directory " + dir +
                                " failed: " + ec.message(),
                  kExitError);
    } else {
      purged = " and its output directory " + dir;
    }
  }
  if (o.format() == OutputFormat::kTable) {
    std::printf("%s\n", TerminalText("deleted job " + o.job_id + purged).c_str());
  } else {
    Print(*deleted, o.format(), "");
  }
  return kExitOk;
}

}  // namespace offloadctl
