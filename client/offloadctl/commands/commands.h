#pragma once
// offloadctl's commands, each a function of the parsed Options that prints its result to stdout
// (errors to stderr) and returns the process's exit status (client/offloadctl/exit_codes.h).

#include <cstddef>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "client/cpp/offloadd_client.h"
#include "client/offloadctl/cli.h"

namespace offloadctl {

// Runs options.command; connects to the daemon when the command needs it.
int RunCommand(const Options& options, const CLI::App& app);

// Commands that talk to the daemon (commands/daemon.cc, commands/jobs.cc, commands/describe.cc).
int RunHealth(offloadd::client::Client& c, const Options& o);
int RunNode(offloadd::client::Client& c, const Options& o);
int RunSubmit(offloadd::client::Client& c, const Options& o);
int RunList(offloadd::client::Client& c, const Options& o);
int RunGet(offloadd::client::Client& c, const Options& o);
int RunJobAction(offloadd::client::Client& c, const Options& o);  // cancel, pause, resume
int RunCheckpoints(offloadd::client::Client& c, const Options& o);
// commands/metrics.cc
int RunMetrics(offloadd::client::Client& c, const Options& o);
// commands/describe.cc (describe, logs, delete)
int RunDescribe(offloadd::client::Client& c, const Options& o);
int RunLogs(offloadd::client::Client& c, const Options& o);
int RunDelete(offloadd::client::Client& c, const Options& o);
int RunWatch(offloadd::client::Client& c, const Options& o);

// Commands that need no daemon (commands/convert.cc).
int RunConvert(const Options& o);

// The text of `path`, or of stdin for "-"; nullopt and an error naming `what` ("job file") when it
// cannot be read (`stdin_usage`, e.g. "submit -", names the empty-stdin case), is not a regular
// file (a FIFO, a device, a socket) or holds more than `max_bytes`.
std::optional<std::string> ReadInputFile(const std::string& path, const std::string& what,
                                         const std::string& stdin_usage, size_t max_bytes,
                                         std::string* error);
// Bounds on what ReadInputFile reads: a configuration to convert is a few KiB (a TrainingArguments
// JSON, a ds_config.json, an Axolotl YAML); a job file may list 256 dataset paths of 4 KiB each.
inline constexpr size_t kMaxConfigFileBytes = 1 << 20;
inline constexpr size_t kMaxJobFileBytes = 8 << 20;

// Prints "offloadctl: COMMAND: <status>" to stderr; returns the status's exit code.
int Fail(const std::string& command, const offloadd::Status& s);
// Prints "offloadctl: COMMAND: <message>" to stderr; returns `code`.
int Fail(const std::string& command, const std::string& message, int code);

// Shell completion scripts generated from `app`'s commands and flags (commands/completion.cc).
std::string BashCompletion(const CLI::App& app);
std::string ZshCompletion(const CLI::App& app);

}  // namespace offloadctl
