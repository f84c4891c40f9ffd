// Dispatch, errors, and the commands about the daemon itself (health, node).
#include <cstdio>
#include <iostream>

#include "client/offloadctl/commands/commands.h"
#include "client/offloadctl/commands/print.h"
#include "client/offloadctl/exit_codes.h"
#include "client/offloadctl/render.h"

namespace offloadctl {

int Fail(const std::string& command, const std::string& message, int code) {
  // Messages carry the daemon's errors and the user's paths and names: escaped for the terminal.
  std::fprintf(stderr, "offloadctl: %s%s%s\n", command.c_str(), command.empty() ? "" : ": ",
               TerminalLines(message).c_str());
  return code;
}

int Fail(const std::string& command, const offloadd::Status& s) {
  return Fail(command, s.ToString(), ExitCodeFor(s.code()));
}

int RunHealth(offloadd::client::Client& c, const Options& o) {
  auto h = c.CheckHealth();
  if (!h.ok()) return Fail("health", h.status());
  const std::string name = offloadd::client::HealthStatusName(*h);
  switch (o.format()) {
    case OutputFormat::kJson: std::printf("{\n  \"status\": \"%s\"\n}\n", name.c_str()); break;
    case OutputFormat::kYaml: std::printf("status: %s\n", name.c_str()); break;
    case OutputFormat::kTable: std::printf("%s\n", name.c_str()); break;
  }
  return *h == offloadd::client::HealthStatus::kServing ? kExitOk : kExitUnreachable;
}

int RunNode(offloadd::client::Client& c, const Options& o) {
  auto n = c.GetNodeInfo();
  if (!n.ok()) return Fail("node", n.status());
  Print(*n, o.format(), RenderNodeInfo(*n));
  return kExitOk;
}

int RunCommand(const Options& o, const CLI::App& app) {
  if (o.command == "completion") {
    std::cout << (o.shell == "zsh" ? ZshCompletion(app) : BashCompletion(app));
    return kExitOk;
  }
  if (o.command == "convert") return RunConvert(o);
  if (o.output == "csv" && o.command != "metrics") {
    return Fail(o.command, "-o csv: only `offloadctl metrics` prints CSV (use table, json or yaml)",
                kExitUsage);
  }
  auto connected = offloadd::client::Client::Connect(o.connect);
  // Connect only builds the channel: what fails here is the flags (target, TLS files).
  if (!connected.ok()) return Fail("", connected.status().ToString(), kExitUsage);
  offloadd::client::Client& c = **connected;
  const std::string& cmd = o.command;
  if (cmd == "health") return RunHealth(c, o);
  if (cmd == "node") return RunNode(c, o);
  if (cmd == "submit") return RunSubmit(c, o);
  if (cmd == "list") return RunList(c, o);
  if (cmd == "get") return RunGet(c, o);
  if (cmd == "describe") return RunDescribe(c, o);
  if (cmd == "logs") return RunLogs(c, o);
  if (cmd == "delete") return RunDelete(c, o);
  if (cmd == "cancel" || cmd == "pause" || cmd == "resume") return RunJobAction(c, o);
  if (cmd == "checkpoints") return RunCheckpoints(c, o);
  if (cmd == "metrics") return RunMetrics(c, o);
  if (cmd == "watch") return RunWatch(c, o);
  return Fail("", "unknown command '" + cmd + "'", kExitUsage);
}

}  // namespace offloadctl
