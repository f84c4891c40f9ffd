#include "train/job_file_config.h"

#include <google/protobuf/descriptor.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "client/cpp/job_file.h"
#include "daemon/node/node_probe.h"
#include "executor/gpu_probe.h"
#include "job/job_validator.h"
#include "job/train_job_config.h"

namespace offloadd::trainer {
namespace {

namespace v1 = offloadd::v1;
using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

std::vector<std::string> Split(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream in(key);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  if (!key.empty() && key.back() == '.') parts.push_back("");
  return parts;
}

std::string FieldNames(const Descriptor* d) {
  std::string names;
  for (int i = 0; i < d->field_count(); ++i) names += (i ? ", " : "") + d->field(i)->name();
  return names;
}

// OK when `parts` name a field of JobSpec: messages are walked into, a map's key is any word and
// its value walked into when a message; scalars, enums and lists end the path.
Status CheckKey(const std::string& key, const std::vector<std::string>& parts) {
  const Descriptor* message = v1::JobSpec::descriptor();
  std::string at = "JobSpec";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) return InvalidArgumentError("--set " + key + ": an empty field name");
    if (message == nullptr) {
      return InvalidArgumentError("--set " + key + ": " + at + " has no fields (it is a value)");
    }
    const FieldDescriptor* f = message->FindFieldByName(parts[i]);
    if (f == nullptr) {
      return InvalidArgumentError("--set " + key + ": " + at + " has no field '" + parts[i] +
                                  "' (its fields: " + FieldNames(message) + ")");
    }
    at = i == 0 ? f->name() : at + "." + f->name();
    message = f->type() == FieldDescriptor::TYPE_MESSAGE && !f->is_repeated() ? f->message_type()
                                                                              : nullptr;
    if (f->is_map()) {  // labels.team, offload.activations.layer_overrides.3
      if (++i == parts.size()) break;
      if (parts[i].empty()) return InvalidArgumentError("--set " + key + ": an empty map key");
      const FieldDescriptor* value = f->message_type()->map_value();
      message = value->type() == FieldDescriptor::TYPE_MESSAGE ? value->message_type() : nullptr;
      at += "." + parts[i];
    }
  }
  return OkStatus();
}

// Sets node[parts[i]]...[parts.back()] = value, making the mappings on the way.
Status SetPath(YAML::Node node, const std::vector<std::string>& parts, size_t i,
               const YAML::Node& value, const std::string& key) {
  if (!node.IsMap() && !node.IsNull()) {
    return InvalidArgumentError("--set " + key + ": the job file gives '" + parts[i - 1] +
                                "' a value that is not a mapping");
  }
  if (i + 1 == parts.size()) {
    node[parts[i]] = value;
    return OkStatus();
  }
  YAML::Node child = node[parts[i]];
  if (!child.IsDefined() || child.IsNull()) {
    node[parts[i]] = YAML::Node(YAML::NodeType::Map);
    child = node[parts[i]];
  }
  return SetPath(child, parts, i + 1, value, key);
}

// What the daemon's CreateJob budgets a job against, probed here (the GPUs as the daemon's
// executor probe reports them).
daemon::NodeBudget ProbeThisNode() {
  std::string problem;
  daemon::SetProbedGpus(daemon::ParseGpuProbe(executor::ProbeGpusJson(), &problem), problem);
  const daemon::NodeFacts facts = daemon::ProbeNodeResources({});
  daemon::NodeBudget node;
  node.host_memory_bytes = facts.memory.total_bytes;
  node.gpus = facts.gpus;
  node.gpu_driver_problem = facts.gpu_driver_problem;
  node.cpu_cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  return node;
}

}  // namespace

StatusOr<std::string> ApplySetOverrides(const std::string& yaml_text,
                                        const std::vector<std::string>& sets) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(std::string("the job file is not valid YAML: ") + e.what());
  }
  if (root.IsNull() || !root.IsDefined()) root = YAML::Node(YAML::NodeType::Map);
  for (const std::string& set : sets) {
    const size_t eq = set.find('=');
    if (eq == std::string::npos) {
      return InvalidArgumentError("--set " + set + ": expected KEY=VALUE (a dotted job.proto " +
                                  "field path, e.g. training.max_steps=20)");
    }
    const std::string key = set.substr(0, eq);
    const std::vector<std::string> parts = Split(key);
    RETURN_IF_ERROR(CheckKey(key, parts));
    YAML::Node value;
    try {
      value = YAML::Load(set.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      return InvalidArgumentError("--set " + key + ": the value is not YAML: " + e.what());
    }
    RETURN_IF_ERROR(SetPath(root, parts, 0, value, key));
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str());
}

StatusOr<TrainConfig> TrainConfigFromJobFile(const std::string& path,
                                             const std::vector<std::string>& sets,
                                             const JobFileBinaries& binaries) {
  std::ifstream in(path);
  if (!in) return ErrnoError(errno, "cannot read job file " + path);
  std::stringstream text;
  text << in.rdbuf();
  ASSIGN_OR_RETURN(const std::string yaml, ApplySetOverrides(text.str(), sets));
  const std::string source = sets.empty() ? path : path + " with --set";
  ASSIGN_OR_RETURN(const v1::JobSpec spec, client::ParseJobSpec(yaml, source));
  // As the daemon's CreateJob: every file may be read (offloadd-train runs as its user).
  const daemon::NodeBudget node = ProbeThisNode();
  daemon::ValidationResult valid = daemon::ValidateJobSpec(spec, daemon::PathPolicy({"/"}), node);
  if (!valid.ok()) {
    std::vector<client::FieldViolation> violations;
    for (const auto& v : valid.violations) violations.push_back({v.field, v.description});
    return InvalidArgumentError(client::DescribeViolations(source, violations));
  }
  v1::Job job;
  job.set_id("offloadd-train");  // names its NVMe subdirectories
  *job.mutable_spec() = std::move(valid.resolved);
  daemon::TrainerEnvironment env = daemon::DefaultTrainerEnvironment();
  env.set_has_gpu(!node.gpus.empty());
  env.set_worker_binary(binaries.worker_binary);
  env.set_store_binary(binaries.store_binary);
  env.set_trace_steps(0);  // --trace asks for one
  ASSIGN_OR_RETURN(TrainConfig config, daemon::MakeTrainConfig(job, env));
  ASSIGN_OR_RETURN(config.resume_from, daemon::ResumePoint(job));
  return config;
}

}  // namespace offloadd::trainer
