#pragma once
// What daemons of one cluster prove to each other (docs/security.md, "Between daemons"): mutual
// TLS, each end presenting a certificate that cluster.tls_ca_file's CA signed, and the cluster's
// bearer token (cluster.token_file: one bare token, mode 0600, the same file on every host) on
// every call. Files are read when called; errors name the key and the file.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "daemon/config/config.h"

namespace offloadd::daemon {

// The peer listener's: a client without a certificate of the CA, or without the token, is refused.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClusterServerCredentials(
    const ClusterConfig& cluster);

// A coordinator's channel to `peer`: its certificate must be the CA's, ours is presented, and
// every call carries the token. The channel's keepalive finds a silent peer within
// cluster.lost_host_seconds.
StatusOr<std::shared_ptr<grpc::Channel>> ClusterChannel(const ClusterConfig& cluster,
                                                        const PeerConfig& peer);

// Everything the two above read, checked at startup (CheckStartup) and by --validate-config.
Status CheckClusterFiles(const ClusterConfig& cluster);

}  // namespace offloadd::daemon
