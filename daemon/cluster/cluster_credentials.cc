#include "daemon/cluster/cluster_credentials.h"

#include <fstream>
#include <sstream>

#include "daemon/server/token_auth.h"

namespace offloadd::daemon {
namespace {

StatusOr<std::string> ReadPem(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  if (!in) return ErrnoError(errno, key + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find("-----BEGIN ") == std::string::npos) {
    return InvalidArgumentError(key + " " + path + ": not a PEM file");
  }
  return ss.str();
}

// The cluster's one token: a bare token (no client names between daemons).
StatusOr<std::vector<ClientToken>> ClusterToken(const ClusterConfig& cluster) {
  ASSIGN_OR_RETURN(std::vector<ClientToken> tokens, ReadTokenFile(cluster.token_file));
  if (tokens.size() != 1 || !tokens[0].name.empty()) {
    return InvalidArgumentError("cluster.token_file " + cluster.token_file +
                                ": expected one bare token (the same file on every host), got " +
                                std::to_string(tokens.size()) + " named line(s)");
  }
  return tokens;
}

class BearerToken final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerToken(std::string token) : value_("Bearer " + std::move(token)) {}
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({"authorization", value_});
    return grpc::Status::OK;
  }

 private:
  const std::string value_;
};

}  // namespace

StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClusterServerCredentials(
    const ClusterConfig& cluster) {
  ASSIGN_OR_RETURN(std::string cert, ReadPem(cluster.tls_cert_file, "cluster.tls_cert_file"));
  ASSIGN_OR_RETURN(std::string key, ReadPem(cluster.tls_key_file, "cluster.tls_key_file"));
  ASSIGN_OR_RETURN(std::string ca, ReadPem(cluster.tls_ca_file, "cluster.tls_ca_file"));
  ASSIGN_OR_RETURN(std::vector<ClientToken> tokens, ClusterToken(cluster));
  grpc::SslServerCredentialsOptions opts(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  opts.pem_root_certs = ca;
  opts.pem_key_cert_pairs.push_back({key, cert});
  auto creds = grpc::SslServerCredentials(opts);
  creds->SetAuthMetadataProcessor(MakeTokenAuthProcessor(std::move(tokens)));
  return creds;
}

StatusOr<std::shared_ptr<grpc::Channel>> ClusterChannel(const ClusterConfig& cluster,
                                                        const PeerConfig& peer) {
  ASSIGN_OR_RETURN(std::string cert, ReadPem(cluster.tls_cert_file, "cluster.tls_cert_file"));
  ASSIGN_OR_RETURN(std::string key, ReadPem(cluster.tls_key_file, "cluster.tls_key_file"));
  ASSIGN_OR_RETURN(std::string ca, ReadPem(cluster.tls_ca_file, "cluster.tls_ca_file"));
  ASSIGN_OR_RETURN(std::vector<ClientToken> tokens, ClusterToken(cluster));
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = ca;
  opts.pem_private_key = key;
  opts.pem_cert_chain = cert;
  auto creds = grpc::CompositeChannelCredentials(
      grpc::SslCredentials(opts),
      grpc::MetadataCredentialsFromPlugin(std::make_unique<BearerToken>(tokens[0].token)));
  grpc::ChannelArguments args;
  // A peer that stops answering (its host down, the network cut) is found by the keepalive:
  // pings every second of a quiet stream, each answered within lost_host_seconds.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(cluster.lost_host_seconds * 1000));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(peer.address, creds, args);
}

Status CheckClusterFiles(const ClusterConfig& cluster) {
  if (cluster.listen.empty() && cluster.peers.empty()) return OkStatus();
  return ClusterServerCredentials(cluster).status();
}

}  // namespace offloadd::daemon
