// offloadctl convert: other tools' configurations to a job file (client/cpp/config_convert.h).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "client/cpp/config_convert.h"
#include "client/offloadctl/commands/commands.h"
#include "client/offloadctl/exit_codes.h"

namespace offloadctl {
namespace {

using offloadd::client::ConvertedJob;

void PrintReport(const ConvertedJob& job, std::ostream& err) {
  if (!job.dropped.empty()) {
    err << "offloadctl: convert: " << job.dropped.size() << " key(s) dropped that change what is trained:\n";
    for (const auto& d : job.dropped) {
      err << "  " << d.source << ": " << d.key << " = " << d.value << ": " << d.reason << "\n";
    }
  }
  if (!job.operational.empty()) {
    err << "offloadctl: convert: " << job.operational.size()
        << " key(s) about running and reporting dropped (offloadd has its own; -o json gives each reason):";
    for (const auto& d : job.operational) err << " " << d.key;
    err << "\n";
  }
  for (const auto& n : job.notes) err << "offloadctl: convert: note: " << n << "\n";
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
    auto text = ReadInputFile(f, "configuration", "convert -", &error);
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
    std::error_code ec;
    if (std::filesystem::exists(o.convert_out_file, ec)) {
      return Fail("convert", "'" + o.convert_out_file + "' exists; it is not overwritten", kExitUsage);
    }
    std::ofstream out(o.convert_out_file);
    out << job->job_yaml;
    out.close();
    if (!out) return Fail("convert", "cannot write '" + o.convert_out_file + "'", kExitError);
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
