// offloadctl: command-line client for offloadd. Thin over the C++ SDK (client/cpp): cli.cc
// declares the command line, commands/*.cc run the commands.
#include <cstdlib>
#include <iostream>

#include "client/offloadctl/cli.h"
#include "client/offloadctl/commands/commands.h"

int main(int argc, char** argv) {
  std::string target = offloadd::client::kDefaultTarget;
  if (const char* t = std::getenv("OFFLOADD_TARGET"); t != nullptr && *t) target = t;
  offloadctl::Options options;
  auto app = offloadctl::BuildApp(&options, target);
  if (const int rc = offloadctl::Parse(*app, argc, argv, std::cout, std::cerr); rc >= 0) return rc;
  return offloadctl::RunCommand(options, *app);
}
