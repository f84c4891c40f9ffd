#pragma once
// UnixPeerListener: the daemon's own accept loop on its Unix socket, so that every local client
// is known by the user it runs as. gRPC's Unix listener gives handlers only the socket's path
// ("unix:/run/offloadd/offloadd.sock"): every local user was one client to the per-client limits.
// Here each connection's SO_PEERCRED (pid, uid, gid, fixed by the kernel at connect) is read
// before the connection is handed to the gRPC server (grpc::AddInsecureChannelFromFd), whose
// handlers then see the peer "fd:<n>"; PeerCredentials maps that back to "unix:uid=<uid>".
//
// Thread-safe. The accept thread stops in Stop() (or the destructor), which closes the listening
// socket; connections already handed over belong to the gRPC server.

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "common/status.h"
#include "ipc/unique_fd.h"

namespace grpc {
class Server;
}

namespace offloadd::daemon {

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Connection fd -> the credentials of the process that connected. The fd number names the
// connection in gRPC's peer string while the connection is open; a later connection that reuses
// the number replaces the entry before gRPC sees it.
class PeerCredentials {
 public:
  void Set(int fd, PeerCred cred);
  // The credentials behind a peer string "fd:<n>"; nullopt for any other peer.
  std::optional<PeerCred> Lookup(std::string_view peer) const;
  // The client a peer string names for per-client limits: "unix:uid=<uid>" for a connection this
  // listener accepted, else ClientKey(peer) (TCP clients by address).
  std::string ClientFor(std::string_view peer) const;

 private:
  mutable std::mutex mu_;
  std::map<int, PeerCred> by_fd_;
};

class UnixPeerListener {
 public:
  // socket + bind(bind_path) + listen. The caller makes the path private until it is published
  // (PrivateSocketBinding).
  static StatusOr<std::unique_ptr<UnixPeerListener>> Bind(const std::string& bind_path,
                                                          std::shared_ptr<PeerCredentials> peers);
  ~UnixPeerListener();

  // Starts accepting: every connection is recorded in the PeerCredentials and handed to `server`
  // (started, and outliving Stop()).
  void Start(grpc::Server* server);
  void Stop();
  int64_t accepted() const { return accepted_.load(); }

 private:
  UnixPeerListener(ipc::UniqueFd listen_fd, ipc::UniqueFd wake_fd, std::shared_ptr<PeerCredentials> peers)
      : listen_fd_(std::move(listen_fd)), wake_fd_(std::move(wake_fd)), peers_(std::move(peers)) {}
  void AcceptLoop(grpc::Server* server);

  ipc::UniqueFd listen_fd_;
  ipc::UniqueFd wake_fd_;  // eventfd: Stop() wakes the accept loop
  std::shared_ptr<PeerCredentials> peers_;
  std::thread thread_;
  std::atomic<int64_t> accepted_{0};
};

}  // namespace offloadd::daemon
