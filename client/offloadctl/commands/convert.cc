// offloadctl convert: other tools' configurations to a job file (client/cpp/config_convert.h).
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>

#include "client/cpp/config_convert.h"
#include "client/offloadctl/commands/commands.h"
#include "client/offloadctl/exit_codes.h"
#include "client/offloadctl/render.h"

namespace offloadctl {
namespace {

using offloadd::client::ConvertedJob;

// Creates `path` and writes `text` into it. O_CREAT | O_EXCL never follows a symlink, dangling or
// not, and never opens an existing file, so --out can neither overwrite a file nor write through a
// link to somewhere else; a failed write removes what it created.
int WriteNewFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) {
      struct stat st {};
      const bool link = ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
      return Fail("convert",
                  "'" + path + "' exists" +
                      (link ? " (a symbolic link, which is not followed)" : "") +
                      "; it is not overwritten",
                  kExitUsage);
    }
    return Fail("convert", "cannot create '" + path + "': " + std::strerror(errno), kExitError);
  }
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(path.c_str());
    return Fail("convert", "cannot write '" + path + "': " + std::strerror(err), kExitError);
  }
  return kExitOk;
}

void PrintReport(const ConvertedJob& job, std::ostream& err) {
  if (!job.dropped.empty()) {
    err << "offloadctl: convert: " << job.dropped.size() << " key(s) dropped that change what is trained:\n";
    for (const auto& d : job.dropped) {
      err << "  " << TerminalText(d.source) << ": " << TerminalText(d.key) << " = "
          << TerminalText(d.value) << ": " << TerminalText(d.reason) << "\n";
    }
  }
  if (!job.operational.empty()) {
    err << "offloadctl: convert: " << job.operational.size()
        << " key(s) about running and reporting dropped (offloadd has its own; -o json gives each reason):";
    for (const auto& d : job.operational) err << " " << TerminalText(d.key);
    err << "\n";
  }
  for (const auto& n : job.notes) err << "offloadctl: convert: note: " << TerminalText(n) << "\n";
  if (job.unset_keys > 0) {
    err << "offloadctl: convert: " << job.unset_keys
        << " key(s) left at an off value (null, false, empty, no) were dropped; nothing is lost with them\n";
  }
  if (!job.missing.empty()) {
    static const std::map<std::string, std::string> kFlag = {
        {"model.path", "--model"}, {"dataset.paths", "--dataset"}, {"output_dir", "--output-dir"}};
    err << "offloadctl: convert: still needed before submitting:";
    for (const auto& m : job.missing) err << " " << m << " (" << kFlag.at(m) << ")";
    err << "\n";
  }
}

}  // namespace

int RunConvert(const Options& o) {
  auto kind = offloadd::client::ParseConfigKind(o.convert_from == "trl" ? "hf" : o.convert_from);
  if (!kind.ok()) return Fail("convert", kind.status().message(), kExitUsage);
  std::vector<offloadd::client::ConfigInput> inputs;
  for (const std::string& f : o.convert_files) {
    std::string error;
    auto text = ReadInputFile(f, "configuration", "convert -", kMaxConfigFileBytes, &error);
    if (!text) return Fail("convert", error, kExitUsage);
    inputs.push_back({f == "-" ? "<stdin>" : f, *text});
  }
  offloadd::client::ConvertOverrides over;
  over.model_path = o.convert_model;
  over.output_dir = o.convert_output_dir;
  over.dataset_paths = o.convert_datasets;
  auto job = offloadd::client::ConvertConfigs(inputs, *kind, over);
  if (!job.ok()) return Fail("convert", job.status().message(), kExitInvalid);
  if (!o.convert_out_file.empty()) {
    if (const int rc = WriteNewFile(o.convert_out_file, job->job_yaml); rc != kExitOk) return rc;
  }
  if (o.format() == OutputFormat::kJson) {
    nlohmann::json j = {{"job_yaml", job->job_yaml}, {"kinds", job->kinds}, {"notes", job->notes},
                        {"missing", job->missing}, {"unset_keys", job->unset_keys}};
    for (const char* list : {"dropped", "operational"}) {
      j[list] = nlohmann::json::array();
      for (const auto& d : std::string(list) == "dropped" ? job->dropped : job->operational) {
        j[list].push_back({{"source", d.source}, {"key", d.key}, {"value", d.value}, {"reason", d.reason}});
      }
    }
    std::cout << j.dump(2) << "\n";
  } else if (o.convert_out_file.empty()) {
    std::cout << job->job_yaml;
  }
  PrintReport(*job, std::cerr);
  return kExitOk;
}

}  // namespace offloadctl
