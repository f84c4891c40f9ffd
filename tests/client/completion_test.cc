// The completion scripts list every command and flag of the app they are generated from.
#include <gtest/gtest.h>

#include "client/offloadctl/cli.h"
#include "client/offloadctl/commands/commands.h"

namespace offloadctl {
namespace {

TEST(OffloadctlCompletion, BashListsEveryCommandAndFlag) {
  Options o;
  auto app = BuildApp(&o, "unix:///x.sock");
  const std::string script = BashCompletion(*app);
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
    EXPECT_NE(script.find(" " + sub->get_name() + ")"), std::string::npos) << sub->get_name();
  }
  for (const char* word : {"--target", "--tls-ca", "--output", "--validate-only", "--watch",
                           "--state", "--wait", "--version", "complete -F _offloadctl offloadctl"}) {
    EXPECT_NE(script.find(word), std::string::npos) << word;
  }
  // Values come from the IsMember checks: formats, job states, shells.
  EXPECT_NE(script.find("table json yaml"), std::string::npos) << script;
  EXPECT_NE(script.find("running"), std::string::npos);
  EXPECT_NE(script.find("bash zsh"), std::string::npos);
  EXPECT_EQ(ZshCompletion(*app).rfind("#compdef offloadctl\n", 0), 0u);
}

}  // namespace
}  // namespace offloadctl
