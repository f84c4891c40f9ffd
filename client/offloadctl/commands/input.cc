// Reading offloadctl's input files (job files, configurations to convert).
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "client/offloadctl/commands/commands.h"

namespace offloadctl {

// A job file's or configuration's text, from `path` or ("-") stdin; an error message and nullopt when it cannot
// be read.
std::optional<std::string> ReadInputFile(const std::string& path, const std::string& what,
                                         const std::string& stdin_usage, std::string* error) {
  std::stringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
    if (text.str().empty()) *error = "the " + what + " on stdin (" + stdin_usage + ") is empty";
    return text.str().empty() ? std::nullopt : std::optional(text.str());
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    *error = "the " + what + " '" + path + "' does not exist";
    return std::nullopt;
  }
  if (std::filesystem::is_directory(path, ec)) {
    *error = "'" + path + "' is a directory, not a " + what;
    return std::nullopt;
  }
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read the " + what + " '" + path + "': " + std::strerror(errno);
    return std::nullopt;
  }
  text << in.rdbuf();
  return text.str();
}

}  // namespace offloadctl
