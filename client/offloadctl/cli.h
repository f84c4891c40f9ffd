#pragma once
// offloadctl's command line, declared once with CLI11: the commands, their flags and help, and
// the global flags, which are accepted before or after the command (`--target=X get JOB` and
// `get JOB --target X` are the same). BuildApp only parses into Options; the commands run
// elsewhere (commands/*.cc), so the parsing is unit-tested without a daemon.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/cpp/offloadd_client.h"
#include "client/offloadctl/output.h"

namespace offloadctl {

struct Options {
  offloadd::client::ConnectOptions connect;
  std::string output = "table";  // -o/--output
  bool json = false;             // --json, the older spelling of -o json
  // The command given and its arguments.
  std::string command;
  std::string job_id;            // get, describe, logs, cancel, pause, resume, checkpoints, watch
  std::string reason;            // cancel
  bool force = false;            // cancel --force
  std::string job_file;          // submit; "-" is stdin
  bool validate_only = false;    // submit
  bool watch = false;            // submit
  bool wait = false;             // get
  bool follow = false;           // logs -f
  int64_t after_step = -1;       // metrics --after-step (-1: from the first row, step 0)
  bool purge = false;            // delete --purge
  int events = 20;               // describe --events: how many of the last events
  std::vector<std::string> states;  // list, short lower-case names ("running")
  std::string shell;             // completion
  // convert
  std::vector<std::string> convert_files;  // "-" is stdin
  std::string convert_from = "auto";
  std::string convert_model, convert_output_dir, convert_out_file;
  std::vector<std::string> convert_datasets;
  bool convert_validate = false;  // ask the daemon to validate the converted job

  OutputFormat format() const;
};

// The app; parsing `argv` with it fills `*options`, which must outlive it. `default_target` is
// the --target default ($OFFLOADD_TARGET, else the daemon's default socket).
std::unique_ptr<CLI::App> BuildApp(Options* options, const std::string& default_target);

// Parses argv. Returns -1 when the command should run, else the exit status (0 after --help or
// --version, kExitUsage after a usage error, printed to `out`/`err`).
int Parse(CLI::App& app, int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// Short names of the job states a job can be listed by ("queued", "running", ...).
std::vector<std::string> JobStateNames();

}  // namespace offloadctl
