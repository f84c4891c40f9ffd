// offloadctl: command-line client for offloadd. Thin over the C++ SDK (client/cpp).
#include <google/protobuf/util/json_util.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "client/cpp/job_file.h"
#include "client/cpp/offloadd_client.h"
#include "client/offloadctl/render.h"
#include "client/offloadctl/watch_view.h"

namespace {

using offloadd::Status;
using offloadd::client::Client;

constexpr const char* kUsage = R"(usage: offloadctl [global flags] COMMAND [ARGS]

Commands:
  health                 check that the daemon is serving (exit 0 when SERVING)
  node                   show GPUs, memory, NUMA, store directories
  submit FILE [--validate-only | --watch]
                         submit the job described by a YAML job file; --validate-only checks it
                         on the daemon (paths, model, tokenizer, datasets, ranges, memory) and
                         prints the job as it would run; --watch then watches it as `watch` does
  list [--state S]...    list jobs (S: queued, running, paused, succeeded, failed, ...)
  get JOB                show one job
  cancel JOB [REASON]    cancel a job
  pause JOB              checkpoint and pause a running job
  resume JOB             re-queue a paused job
  checkpoints JOB        list a job's checkpoints
  watch JOB              stream a job's events until it ends, resuming after a dropped
                         connection; on a terminal, progress redraws one status line (bar, loss,
                         tok/s, ETA). Exit 0 when the job SUCCEEDED, 1 when it failed or was
                         cancelled

Global flags:
  --target T             unix:///path.sock or host:port (default $OFFLOADD_TARGET or
                         unix:///run/offloadd/offloadd.sock)
  --tls-ca FILE          CA certificate for TCP targets
  --tls-server-name N    certificate name to check (TCP)
  --token-file FILE      bearer token file for TCP targets
  --timeout SECONDS      per-call deadline (default 30)
  --json                 print responses as JSON
)";

struct Flags {
  offloadd::client::ConnectOptions connect;
  bool json = false;
  std::vector<std::string> args;
};

int Usage(const std::string& error) {
  std::fprintf(stderr, "offloadctl: %s\n\n%s", error.c_str(), kUsage);
  return 2;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "offloadctl: %s\n", s.ToString().c_str());
  return 1;
}

template <typename Message>
void PrintJson(const Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  std::fputs(out.c_str(), stdout);
}

// Shows the job's events until it ends (WatchView on a terminal, one line per event otherwise).
// The exit status says how it ended: 0 SUCCEEDED, 1 anything else or an error.
int WatchToEnd(Client& c, const std::string& job_id, bool json) {
  offloadctl::WatchView view(!json && offloadctl::StdoutIsLiveTerminal(), offloadctl::StdoutColumns());
  auto job = c.Wait(job_id, [&](const offloadd::v1::JobEvent& e) {
    if (json) PrintJson(e);
    else std::fputs(view.OnEvent(e).c_str(), stdout);
    std::fflush(stdout);
  });
  std::fputs(view.Finish().c_str(), stdout);
  std::fflush(stdout);
  if (!job.ok()) return Fail(job.status());
  if (job->state() == offloadd::v1::JOB_STATE_SUCCEEDED) return 0;
  std::string why = job->error().message();
  if (why.empty() && !job->transitions().empty()) why = job->transitions().rbegin()->reason();
  std::fprintf(stderr, "offloadctl: job %s ended %s%s%s\n", job_id.c_str(),
               offloadctl::JobStateName(job->state()).c_str(), why.empty() ? "" : ": ", why.c_str());
  return 1;
}

int Run(Flags& f) {
  auto connected = Client::Connect(f.connect);
  if (!connected.ok()) return Fail(connected.status());
  Client& c = **connected;
  const std::string cmd = f.args[0];
  const auto need_id = [&]() -> bool { return f.args.size() >= 2; };

  if (cmd == "health") {
    auto h = c.CheckHealth();
    if (!h.ok()) return Fail(h.status());
    std::printf("%s\n", offloadd::client::HealthStatusName(*h));
    return *h == offloadd::client::HealthStatus::kServing ? 0 : 1;
  }
  if (cmd == "node") {
    auto n = c.GetNodeInfo();
    if (!n.ok()) return Fail(n.status());
    if (f.json) PrintJson(*n);
    else std::fputs(offloadctl::RenderNodeInfo(*n).c_str(), stdout);
    return 0;
  }
  if (cmd == "submit") {
    if (f.args.size() < 2) return Usage("submit needs a job file");
    bool validate_only = false;
    bool watch = false;
    for (size_t i = 2; i < f.args.size(); ++i) {
      if (f.args[i] == "--validate-only") validate_only = true;
      else if (f.args[i] == "--watch") watch = true;
      else return Usage("submit: unknown argument '" + f.args[i] + "'");
    }
    if (validate_only && watch) return Usage("submit: --validate-only and --watch exclude each other");
    auto spec = offloadd::client::LoadJobFile(f.args[1]);
    if (!spec.ok()) return Fail(spec.status());
    auto job = c.CreateJob(*spec, validate_only);
    if (!job.ok()) return Fail(job.status());
    if (validate_only) {
      std::printf("%s: valid. The job would run as:\n", f.args[1].c_str());
      PrintJson(job->spec());
      return 0;
    }
    if (f.json) PrintJson(*job);
    else std::fputs(offloadctl::RenderJob(*job).c_str(), stdout);
    if (watch) {
      std::fflush(stdout);
      return WatchToEnd(c, job->id(), f.json);
    }
    return 0;
  }
  if (cmd == "list") {
    offloadd::v1::ListJobsRequest req;
    for (size_t i = 1; i + 1 < f.args.size(); i += 2) {
      if (f.args[i] != "--state") return Usage("list takes only --state S");
      offloadd::v1::JobState st;
      if (!offloadd::v1::JobState_Parse("JOB_STATE_" + offloadctl::Upper(f.args[i + 1]), &st)) {
        return Usage("unknown job state '" + f.args[i + 1] + "'");
      }
      req.add_states(st);
    }
    auto r = c.ListJobs(req);
    if (!r.ok()) return Fail(r.status());
    if (f.json) PrintJson(*r);
    else std::fputs(offloadctl::RenderJobList(*r).c_str(), stdout);
    return 0;
  }
  if (cmd == "get" || cmd == "cancel" || cmd == "pause" || cmd == "resume") {
    if (!need_id()) return Usage(cmd + " needs a job id");
    offloadd::StatusOr<offloadd::v1::Job> j =
        cmd == "get"      ? c.GetJob(f.args[1])
        : cmd == "cancel" ? c.CancelJob(f.args[1], f.args.size() > 2 ? f.args[2] : "")
        : cmd == "pause"  ? c.PauseJob(f.args[1])
                          : c.ResumeJob(f.args[1]);
    if (!j.ok()) return Fail(j.status());
    if (f.json) PrintJson(*j);
    else std::fputs(offloadctl::RenderJob(*j).c_str(), stdout);
    return 0;
  }
  if (cmd == "checkpoints") {
    if (!need_id()) return Usage("checkpoints needs a job id");
    auto r = c.ListCheckpoints(f.args[1]);
    if (!r.ok()) return Fail(r.status());
    PrintJson(*r);
    return 0;
  }
  if (cmd == "watch") {
    if (!need_id()) return Usage("watch needs a job id");
    return WatchToEnd(c, f.args[1], f.json);
  }
  return Usage("unknown command '" + cmd + "'");
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (const char* t = std::getenv("OFFLOADD_TARGET"); t != nullptr && *t) f.connect.target = t;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::exit(Usage(std::string(name) + " needs a value"));
      }
      return argv[++i];
    };
    if (!f.args.empty()) {
      f.args.push_back(a);
    } else if (a == "--target") {
      f.connect.target = value("--target");
    } else if (a == "--tls-ca") {
      f.connect.tls_ca_file = value("--tls-ca");
    } else if (a == "--tls-server-name") {
      f.connect.tls_server_name = value("--tls-server-name");
    } else if (a == "--token-file") {
      f.connect.auth_token_file = value("--token-file");
    } else if (a == "--timeout") {
      const double s = std::atof(value("--timeout"));
      if (s <= 0) return Usage("--timeout must be a positive number of seconds");
      f.connect.timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
    } else if (a == "--json") {
      f.json = true;
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a.rfind("--", 0) == 0) {
      return Usage("unknown flag " + a);
    } else {
      f.args.push_back(a);
    }
  }
  if (f.args.empty()) return Usage("no command given");
  return Run(f);
}
