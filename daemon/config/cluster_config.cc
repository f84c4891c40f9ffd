#include "daemon/config/cluster_config.h"

#include <unistd.h>

#include <set>

namespace offloadd::daemon {
namespace {

bool ValidPeerAddress(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  const std::string port = s.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return false;
  const unsigned long p = std::stoul(port);
  return p > 0 && p <= 65535;
}

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

void ReadCluster(const YAML::Node& n, const YamlReader& r, ClusterConfig* c) {
  if (!r.CheckMap(
          n, {"name", "listen", "advertise_address", "tls_cert_file", "tls_key_file", "tls_ca_file",
              "token_file", "peers", "reserve_timeout_seconds", "lost_host_seconds"})) {
    return;
  }
  r.String(n, "name", &c->name);
  r.String(n, "listen", &c->listen);
  r.String(n, "advertise_address", &c->advertise_address);
  r.String(n, "tls_cert_file", &c->tls_cert_file);
  r.String(n, "tls_key_file", &c->tls_key_file);
  r.String(n, "tls_ca_file", &c->tls_ca_file);
  r.String(n, "token_file", &c->token_file);
  r.Double(n, "reserve_timeout_seconds", &c->reserve_timeout_seconds, 1, 3600);
  r.Double(n, "lost_host_seconds", &c->lost_host_seconds, 1, 3600);
  const YAML::Node peers = n["peers"];
  if (!peers || peers.IsNull()) return;
  if (!peers.IsSequence()) {
    r.Error("peers", "expected a list of {name, address}");
    return;
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    const YamlReader pr = r.Child("peers[" + std::to_string(i) + "]");
    PeerConfig p;
    if (!pr.CheckMap(peers[i], {"name", "address"})) continue;
    pr.String(peers[i], "name", &p.name);
    pr.String(peers[i], "address", &p.address);
    c->peers.push_back(std::move(p));
  }
}

void ValidateCluster(const ClusterConfig& c, std::vector<std::string>* errors) {
  const bool used = !c.listen.empty() || !c.peers.empty();
  if (!used) return;
  if (!c.listen.empty() && !ValidPeerAddress(c.listen)) {
    errors->push_back("cluster.listen: expected host:port, got '" + c.listen + "'");
  }
  for (const auto& [value, key] :
       {std::pair{c.tls_cert_file, "tls_cert_file"}, std::pair{c.tls_key_file, "tls_key_file"},
        std::pair{c.tls_ca_file, "tls_ca_file"}, std::pair{c.token_file, "token_file"}}) {
    if (value.empty()) {
      errors->push_back(std::string("cluster.") + key +
                        ": required with cluster.listen or cluster.peers (daemons talk over "
                        "mutual TLS with the cluster's bearer token)");
    } else if (value.front() != '/') {
      errors->push_back(std::string("cluster.") + key + ": must be an absolute path, got '" +
                        value + "'");
    }
  }
  if (!c.peers.empty() && c.advertise_address.empty()) {
    errors->push_back(
        "cluster.advertise_address: required with cluster.peers (the address the peers reach "
        "this host's rendezvous at)");
  }
  std::set<std::string> names = {c.name};
  for (size_t i = 0; i < c.peers.size(); ++i) {
    const PeerConfig& p = c.peers[i];
    const std::string key = "cluster.peers[" + std::to_string(i) + "]";
    if (p.name.empty()) {
      errors->push_back(key + ".name: required");
    } else if (!names.insert(p.name).second) {
      errors->push_back(key + ".name: '" + p.name +
                        "' names another host of the cluster (or this one, cluster.name)");
    }
    if (!ValidPeerAddress(p.address)) {
      errors->push_back(key + ".address: expected host:port, got '" + p.address + "'");
    }
  }
}

void EmitCluster(YAML::Emitter& e, const ClusterConfig& c) {
  e << YAML::Key << "cluster" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << c.name;
  e << YAML::Key << "listen" << YAML::Value << c.listen;
  e << YAML::Key << "advertise_address" << YAML::Value << c.advertise_address;
  e << YAML::Key << "tls_cert_file" << YAML::Value << c.tls_cert_file;
  e << YAML::Key << "tls_key_file" << YAML::Value << c.tls_key_file;
  e << YAML::Key << "tls_ca_file" << YAML::Value << c.tls_ca_file;
  e << YAML::Key << "token_file" << YAML::Value << c.token_file;
  e << YAML::Key << "peers" << YAML::Value << YAML::BeginSeq;
  for (const PeerConfig& p : c.peers) {
    e << YAML::BeginMap << YAML::Key << "name" << YAML::Value << p.name << YAML::Key << "address"
      << YAML::Value << p.address << YAML::EndMap;
  }
  e << YAML::EndSeq;
  e << YAML::Key << "reserve_timeout_seconds" << YAML::Value << c.reserve_timeout_seconds;
  e << YAML::Key << "lost_host_seconds" << YAML::Value << c.lost_host_seconds;
  e << YAML::EndMap;
}

std::string DefaultClusterName() { return HostName(); }

}  // namespace offloadd::daemon
