#pragma once
// The daemon config's `cluster:` section (config.h ClusterConfig): read, checked and printed here,
// called by config.cc's ParseConfig, Validate and ConfigToYaml.

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/config/yaml_reader.h"

namespace offloadd::daemon {

void ReadCluster(const YAML::Node& node, const YamlReader& r, ClusterConfig* c);
// Cross-field checks, each error naming its key (cluster.peers[1].address, ...).
void ValidateCluster(const ClusterConfig& c, std::vector<std::string>* errors);
void EmitCluster(YAML::Emitter& e, const ClusterConfig& c);
// cluster.name's default: this machine's hostname.
std::string DefaultClusterName();

}  // namespace offloadd::daemon
