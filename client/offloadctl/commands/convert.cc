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
#include "client/cpp/job_file.h"
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
        << " key(s) about how their run is driven dropped (offloadd has its own; -o json gives each reason):";
    for (const auto& d : job.operational) err << " " << TerminalText(d.key);
    err << "\n";
  }
  for (const auto& n : job.notes) err << "offloadctl: convert: note: " << TerminalText(n) << "\n";
  if (job.unset_keys > 0 || !job.internals.empty()) {
    err << "offloadctl: convert: " << job.unset_keys + job.internals.size()
        << " more key(s) dropped with nothing lost: off values, library internals, logging and hub (-o json "
           "lists them)\n";
  }
  if (!job.missing.empty()) {
    static const std::map<std::string, std::string> kFlag = {
        {"model.path", "--model"}, {"dataset.paths", "--dataset"}, {"output_dir", "--output-dir"}};
    err << "offloadctl: convert: still needed before submitting:";
    for (const auto& m : job.missing) err << " " << m << " (" << kFlag.at(m) << ")";
    err << "\n";
  }
}

// The input and key behind a job field the daemon found a problem with: the field itself, or the
// nearest field above it that an input set.
std::string KeyBehind(const ConvertedJob& job, std::string field) {
  for (;;) {
    if (auto it = job.set_by.find(field); it != job.set_by.end()) return it->second;
    const size_t cut = field.find_last_of(".[");
    if (cut == std::string::npos) return "";
    field.resize(cut);
  }
}

// The daemon's validate-only verdict on the written job file; on problems, the files written are
// removed and each problem is named with the key it came from.
int ValidateWithDaemon(const Options& o, const ConvertedJob& job, const std::vector<std::string>& written) {
  auto remove_written = [&] {
    for (const std::string& path : written) ::unlink(path.c_str());
  };
  auto read = offloadd::client::ReadJobSpec(job.job_yaml, "the converted job file");
  auto connected = offloadd::client::Client::Connect(o.connect);
  if (!read.ok() || !connected.ok()) {
    remove_written();
    return Fail("convert", (!read.ok() ? read.status() : connected.status()).ToString(), kExitUsage);
  }
  offloadd::client::Client& c = **connected;
  auto verdict = c.CreateJob(read->spec, /*validate_only=*/true);
  if (verdict.ok()) return kExitOk;
  remove_written();
  if (verdict.status().code() != offloadd::StatusCode::kInvalidArgument) {
    return Fail("convert", "the daemon could not validate the converted job: " + verdict.status().ToString(),
                ExitCodeFor(verdict.status().code()));
  }
  std::string message = "the daemon refuses the converted job:";
  for (const auto& v : c.last_field_violations()) {
    const std::string by = KeyBehind(job, v.field);
    message += "\n  " + (by.empty() ? v.field : by + " (" + v.field + ")") + ": " + v.description;
  }
  if (c.last_field_violations().empty()) message += " " + verdict.status().ToString();
  return Fail("convert", message, kExitInvalid);
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
  over.job_file = o.convert_out_file;
  auto job = offloadd::client::ConvertConfigs(inputs, *kind, over);
  if (!job.ok()) return Fail("convert", job.status().message(), kExitInvalid);
  if (o.convert_validate && o.convert_out_file.empty()) {
    return Fail("convert", "--validate checks the job file it writes: give --out FILE", kExitUsage);
  }
  std::vector<std::string> written;
  for (const auto& f : job->files) {  // beside the job file, which names them
    if (const int rc = WriteNewFile(f.path, f.text); rc != kExitOk) {
      for (const std::string& path : written) ::unlink(path.c_str());
      return rc;
    }
    written.push_back(f.path);
  }
  if (!o.convert_out_file.empty()) {
    if (const int rc = WriteNewFile(o.convert_out_file, job->job_yaml); rc != kExitOk) {
      for (const std::string& path : written) ::unlink(path.c_str());
      return rc;
    }
    written.push_back(o.convert_out_file);
  }
  if (o.convert_validate) {
    PrintReport(*job, std::cerr);
    return ValidateWithDaemon(o, *job, written);
  }
  if (o.format() == OutputFormat::kJson) {
    nlohmann::json j = {{"job_yaml", job->job_yaml}, {"kinds", job->kinds}, {"notes", job->notes},
                        {"missing", job->missing}, {"unset_keys", job->unset_keys}};
    for (const auto& [list, keys] : {std::pair{"dropped", &job->dropped}, std::pair{"operational", &job->operational},
                                      std::pair{"internals", &job->internals}}) {
      j[list] = nlohmann::json::array();
      for (const auto& d : *keys) {
        j[list].push_back({{"source", d.source}, {"key", d.key}, {"value", d.value}, {"reason", d.reason}});
      }
    }
    j["files"] = nlohmann::json::array();
    for (const auto& f : job->files) j["files"].push_back(f.path);
    std::cout << j.dump(2) << "\n";
  } else if (o.convert_out_file.empty()) {
    std::cout << job->job_yaml;
  }
  PrintReport(*job, std::cerr);
  return kExitOk;
}

}  // namespace offloadctl
