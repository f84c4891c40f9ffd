// offloadctl's command line: flags before or after the command, --x=v and --x v, per-command
// help, usage errors and --version, parsed without a daemon.
#include "client/offloadctl/cli.h"

#include <gtest/gtest.h>

#include <sstream>

#include "client/offloadctl/exit_codes.h"

namespace offloadctl {
namespace {

struct Parsed {
  Options options;
  int rc = 0;
  std::string out;
  std::string err;
};

Parsed ParseArgs(std::vector<std::string> args) {
  Parsed p;
  auto app = BuildApp(&p.options, "unix:///default.sock");
  args.insert(args.begin(), "offloadctl");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  p.rc = Parse(*app, static_cast<int>(argv.size()), argv.data(), out, err);
  p.out = out.str();
  p.err = err.str();
  return p;
}

TEST(OffloadctlCli, GlobalFlagsBeforeOrAfterTheCommand) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--target", "unix:///a.sock", "--timeout", "2.5", "-o", "yaml", "get", "job-1"},
           {"--target=unix:///a.sock", "--timeout=2.5", "--output=yaml", "get", "job-1"},
           {"get", "job-1", "--target", "unix:///a.sock", "--timeout", "2.5", "-o", "yaml"},
           {"get", "--target=unix:///a.sock", "job-1", "--timeout=2.5", "-o", "yaml"},
       }) {
    const Parsed p = ParseArgs(args);
    EXPECT_EQ(p.rc, -1) << p.err;
    EXPECT_EQ(p.options.command, "get");
    EXPECT_EQ(p.options.job_id, "job-1");
    EXPECT_EQ(p.options.connect.target, "unix:///a.sock");
    EXPECT_EQ(p.options.connect.timeout, std::chrono::milliseconds(2500));
    EXPECT_EQ(p.options.format(), OutputFormat::kYaml);
  }
}

TEST(OffloadctlCli, DefaultsAndJsonAlias) {
  Parsed p = ParseArgs({"list"});
  EXPECT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.options.connect.target, "unix:///default.sock");
  EXPECT_EQ(p.options.format(), OutputFormat::kTable);
  p = ParseArgs({"node", "--json"});
  EXPECT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.options.format(), OutputFormat::kJson);
}

TEST(OffloadctlCli, CommandArguments) {
  Parsed p = ParseArgs({"submit", "-", "--watch"});
  EXPECT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.options.job_file, "-");
  EXPECT_TRUE(p.options.watch);
  p = ParseArgs({"list", "--state", "running", "--state=FAILED"});
  EXPECT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.options.states, (std::vector<std::string>{"running", "failed"}));
  p = ParseArgs({"cancel", "job-2", "no longer needed"});
  EXPECT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.options.job_id, "job-2");
  EXPECT_EQ(p.options.reason, "no longer needed");
}

TEST(OffloadctlCli, UsageErrorsExit2AndNameTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const auto& c : std::vector<Case>{
           {{}, "no command given"},
           {{"frobnicate"}, "frobnicate"},
           {{"get"}, "JOB"},
           {{"get", "job-1", "--bogus"}, "--bogus"},
           {{"-o", "xml", "list"}, "xml"},
           {{"list", "--state", "sleeping"}, "sleeping"},
           {{"--timeout", "-1", "health"}, "timeout"},
           {{"submit", "job.yaml", "--watch", "--validate-only"}, "exclude"},
           {{"--json", "-o", "yaml", "node"}, "exclude"},
       }) {
    const Parsed p = ParseArgs(c.args);
    EXPECT_EQ(p.rc, kExitUsage) << testing::PrintToString(c.args);
    EXPECT_NE(p.err.find(c.says), std::string::npos) << p.err;
    EXPECT_EQ(p.err.rfind("offloadctl: ", 0), 0u) << p.err;
  }
}

TEST(OffloadctlCli, HelpForEachCommandNamesItsFlags) {
  Parsed p = ParseArgs({"--help"});
  EXPECT_EQ(p.rc, 0);
  for (const char* word : {"submit", "watch", "--target", "--output", "Exit status", "5  daemon"}) {
    EXPECT_NE(p.out.find(word), std::string::npos) << word << "\n" << p.out;
  }
  p = ParseArgs({"submit", "--help"});
  EXPECT_EQ(p.rc, 0);
  EXPECT_NE(p.out.find("--validate-only"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("--watch"), std::string::npos) << p.out;
  p = ParseArgs({"list", "--help"});
  EXPECT_NE(p.out.find("--state"), std::string::npos) << p.out;
}

TEST(OffloadctlCli, Version) {
  const Parsed p = ParseArgs({"--version"});
  EXPECT_EQ(p.rc, 0);
  EXPECT_NE(p.out.find("offloadctl (offloadd) "), std::string::npos) << p.out;
}

TEST(OffloadctlCli, JobStateNames) {
  const auto names = JobStateNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "running"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "unspecified"), names.end());
}

}  // namespace
}  // namespace offloadctl
