#include "client/offloadctl/cli.h"

#include <ostream>

#include "client/offloadctl/exit_codes.h"
#include "client/offloadctl/render.h"
#include "client/offloadctl/version.h"

namespace offloadctl {

OutputFormat Options::format() const {
  if (json) return OutputFormat::kJson;
  return ParseOutputFormat(output).value_or(OutputFormat::kTable);
}

std::vector<std::string> JobStateNames() {
  std::vector<std::string> names;
  const auto* d = offloadd::v1::JobState_descriptor();
  for (int i = 0; i < d->value_count(); ++i) {
    const auto s = static_cast<offloadd::v1::JobState>(d->value(i)->number());
    if (s != offloadd::v1::JOB_STATE_UNSPECIFIED) names.push_back(JobStateName(s));
  }
  return names;
}

namespace {

constexpr const char* kFooter =
    "Global flags may come before or after the command; --flag=value and --flag value are the\n"
    "same. `offloadctl COMMAND --help` describes one command.\n\n";

void AddGlobalFlags(CLI::App& app, Options* o) {
  app.add_option("--target", o->connect.target,
                 "unix:///path.sock or host:port ($OFFLOADD_TARGET, else the default socket)")
      ->type_name("T")
      ->capture_default_str();
  app.add_option("--tls-ca", o->connect.tls_ca_file, "CA certificate for TCP targets")
      ->type_name("FILE");
  app.add_option("--tls-server-name", o->connect.tls_server_name, "certificate name to check (TCP)")
      ->type_name("NAME");
  app.add_option("--token-file", o->connect.auth_token_file, "bearer token file for TCP targets")
      ->type_name("FILE");
  app.add_option_function<double>(
         "--timeout",
         [o](const double& s) {
           o->connect.timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
         },
         "per-call deadline in seconds (default 30)")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber);
  auto* output = app.add_option("-o,--output", o->output,
                                "output format: table (for people), json or yaml; `watch -o json` "
                                "prints one JSON object per event (JSON Lines); `metrics` also csv")
                     ->type_name("FORMAT")
                     ->check(CLI::IsMember({"table", "json", "yaml", "csv"}))
                     ->capture_default_str();
  app.add_flag("--json", o->json, "same as -o json")->excludes(output);
}

CLI::App* Command(CLI::App& app, Options* o, const std::string& name, const std::string& help) {
  CLI::App* sub = app.add_subcommand(name, help);
  // Flags the command does not know (the global ones) are handed to the app.
  sub->fallthrough();
  sub->footer("Global flags (--target, --tls-ca, --tls-server-name, --token-file, --timeout, "
              "-o/--output, --json) may also be given here; see offloadctl --help.");
  sub->callback([o, name] { o->command = name; });
  return sub;
}

void AddJobId(CLI::App* sub, Options* o) {
  sub->add_option("JOB", o->job_id, "job id (job-...)")->required();
}

void AddCommands(CLI::App& app, Options* o) {
  Command(app, o, "health", "check that the daemon is serving (exit 0 when SERVING, 5 when not)");
  Command(app, o, "node", "show GPUs, memory, NUMA, store directories");

  CLI::App* submit = Command(app, o, "submit", "submit the job described by a YAML job file");
  submit->add_option("FILE", o->job_file, "the job file (YAML or JSON); - reads it from stdin")
      ->type_name("FILE")
      ->required();
  auto* validate = submit->add_flag(
      "--validate-only", o->validate_only,
      "check the job on the daemon (paths, model, tokenizer, datasets, ranges, memory) and print "
      "it as it would run, without queueing it");
  submit->add_flag("--watch", o->watch, "then watch the job as `watch` does, exiting as it ends")
      ->excludes(validate);

  CLI::App* list = Command(app, o, "list", "list jobs");
  list->add_option("--state", o->states, "only jobs in this state; repeat for several")
      ->type_name("STATE")
      ->transform(CLI::IsMember(JobStateNames(), CLI::ignore_case));

  CLI::App* get = Command(app, o, "get", "show one job");
  AddJobId(get, o);
  get->add_flag("--wait", o->wait,
                "wait until the job ends, then show it and exit as `watch` does (0, 1, 3)");

  CLI::App* describe = Command(
      app, o, "describe",
      "show one job in full: state and why, spec, placement (its GPUs), the plan and setup it "
      "logged, its last events, checkpoints and output directory");
  AddJobId(describe, o);
  describe->add_option("--events", o->events, "how many of the last events to show")
      ->type_name("N")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  CLI::App* logs = Command(app, o, "logs",
                           "print a job's log (what its executors logged: setup, plan, warnings, "
                           "errors), as the daemon keeps it with the job");
  AddJobId(logs, o);
  logs->add_flag("-f,--follow", o->follow, "keep printing new lines until the job ends");

  CLI::App* del = Command(app, o, "delete",
                          "remove a job that ended from the daemon's records (its record and "
                          "events); its output directory stays unless --purge");
  AddJobId(del, o);
  del->add_flag("--purge", o->purge,
                "also remove the job's output directory (checkpoints, the exported model), as you; "
                "refused for a job that has not ended");

  CLI::App* cancel = Command(app, o, "cancel", "cancel a job");
  AddJobId(cancel, o);
  cancel->add_option("REASON", o->reason, "why, recorded with the job");
  cancel->add_flag("--force", o->force,
                   "kill the job's processes now (SIGKILL) instead of letting them stop at the next step");
  AddJobId(Command(app, o, "pause", "checkpoint and pause a running job"), o);
  AddJobId(Command(app, o, "resume", "re-queue a paused job"), o);
  AddJobId(Command(app, o, "checkpoints", "list a job's checkpoints (step, loss, size, path)"), o);
  CLI::App* metrics =
      Command(app, o, "metrics",
              "print a job's metrics history, one row per step (loss, learning rate, "
              "grad norm, tokens/s, aux loss, eval loss), as the daemon keeps it with "
              "the job; -o csv, json, yaml or table");
  AddJobId(metrics, o);
  metrics->add_option("--after-step", o->after_step, "only the steps after this one")
      ->type_name("STEP");
  AddJobId(Command(app, o, "watch",
                   "stream a job's events until it ends, resuming after a dropped connection; on "
                   "a terminal, progress redraws one status line (bar, loss, tok/s, ETA). Exit 0 "
                   "when the job succeeded, 1 when it failed, 3 when it was cancelled"),
           o);

  CLI::App* convert = Command(
      app, o, "convert",
      "turn a Hugging Face TrainingArguments JSON, a TRL, Axolotl or LLaMA-Factory YAML, or a "
      "DeepSpeed ds_config.json into a job file (printed, or written with --out; a chat template "
      "is written beside it), listing on stderr every key it dropped and why; several inputs merge "
      "(training arguments plus a ds_config.json). A value the job could not be validated with "
      "exits 6 naming the input and key");
  convert->add_option("FILE", o->convert_files, "configurations to convert; - reads one from stdin")
      ->type_name("FILE")
      ->required();
  convert->add_option("--from", o->convert_from,
                      "their kind: auto (guessed per file), hf, trl, axolotl, llamafactory, deepspeed")
      ->check(CLI::IsMember({"auto", "hf", "trl", "axolotl", "llamafactory", "deepspeed"}))
      ->capture_default_str();
  convert->add_option("--model", o->convert_model, "model.path of the job (replaces the inputs')")
      ->type_name("DIR");
  convert->add_option("--dataset", o->convert_datasets,
                      "a dataset.paths entry, replacing the inputs' datasets (their format applies); "
                      "repeat for several")
      ->type_name("PATH");
  convert->add_option("--output-dir", o->convert_output_dir, "output_dir of the job (replaces the inputs')")
      ->type_name("DIR");
  convert->add_flag("--validate", o->convert_validate,
                    "ask the daemon (--target) to validate the converted job as submit --validate-only "
                    "does; its problems exit 6 naming the key each came from, and nothing is left written");
  convert->add_option("--out", o->convert_out_file, "write the job file here (an existing file is refused)")
      ->type_name("FILE");

  CLI::App* completion = Command(app, o, "completion", "print a shell completion script");
  completion->add_option("SHELL", o->shell, "bash or zsh")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh"}));
  completion->footer(
      "bash: source <(offloadctl completion bash), or save it as\n"
      "  /etc/bash_completion.d/offloadctl\n"
      "zsh:  source <(offloadctl completion zsh)");
}

}  // namespace

std::unique_ptr<CLI::App> BuildApp(Options* o, const std::string& default_target) {
  o->connect.target = default_target;
  auto app = std::make_unique<CLI::App>("offloadctl: command-line client for offloadd",
                                        "offloadctl");
  app->set_version_flag("--version", std::string("offloadctl (offloadd) ") + OFFLOADCTL_VERSION,
                        "print the version and exit");
  app->require_subcommand(1);
  app->fallthrough();
  AddGlobalFlags(*app, o);
  AddCommands(*app, o);
  app->footer(std::string(kFooter) + kExitCodeHelp);
  app->failure_message([](const CLI::App* failed, const CLI::Error& e) {
    // CLI11 calls this on the app; the command, when one was given, is its parsed subcommand.
    const auto subs = failed->get_subcommands();
    const std::string name = subs.empty() ? "" : subs.front()->get_name();
    const std::string where = name.empty() ? "" : name + ": ";
    const std::string help = name.empty() ? "offloadctl --help" : "offloadctl " + name + " --help";
    std::string what = e.what();
    if (name.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      // CLI11 says "A subcommand is required" for a missing or a misspelt command alike.
      std::string commands;
      for (const CLI::App* sub : failed->get_subcommands([](const CLI::App*) { return true; })) {
        commands += (commands.empty() ? "" : ", ") + sub->get_name();
      }
      const auto rest = failed->remaining();
      what = rest.empty() || rest.front().rfind('-', 0) == 0
                 ? "no command given (one of: " + commands + ")"
                 : "unknown command '" + rest.front() + "' (one of: " + commands + ")";
    }
    return "offloadctl: " + where + what + "\nRun '" + help + "' for usage.\n";
  });
  return app;
}

int Parse(CLI::App& app, int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e, out, err);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  return -1;
}

}  // namespace offloadctl
