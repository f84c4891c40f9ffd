#pragma once
// ClientQuota: per-client limits on active jobs (QUEUED, RUNNING or PAUSED ones it created since
// the daemon started) and on concurrent WatchJob streams (issue #18, the security review's
// limits). A TCP client named in the token file is "token:<name>" (token_auth.h); another is its
// transport address without the port: "ipv4:10.0.0.7", "ipv6:[::1]";
// a Unix-socket client is its user, "unix:uid=<uid>" (PeerCredentials, unix_peer_listener.h); a
// Unix peer string without credentials is "unix".
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::daemon {

// The client a gRPC peer string names ("ipv4:127.0.0.1:51234" -> "ipv4:127.0.0.1").
std::string ClientKey(std::string_view peer);

class ClientQuota {
 public:
  ClientQuota(uint32_t max_active_jobs, uint32_t max_watchers)
      : max_jobs_(max_active_jobs), max_watchers_(max_watchers) {}

  // A WatchJob stream's slot, released when destroyed.
  class WatchSlot {
   public:
    WatchSlot(WatchSlot&& o) noexcept : quota_(o.quota_), client_(std::move(o.client_)) {
      o.quota_ = nullptr;
    }
    WatchSlot(const WatchSlot&) = delete;
    WatchSlot& operator=(const WatchSlot&) = delete;
    WatchSlot& operator=(WatchSlot&&) = delete;
    ~WatchSlot();

   private:
    friend class ClientQuota;
    WatchSlot(ClientQuota* q, std::string client) : quota_(q), client_(std::move(client)) {}
    ClientQuota* quota_;
    std::string client_;
  };

  // RESOURCE_EXHAUSTED naming the limit when the client already has max_watchers streams.
  StatusOr<WatchSlot> AcquireWatcher(const std::string& client);

  // Reserves a job for `client`: RESOURCE_EXHAUSTED naming the limit when its jobs that are
  // still active and its pending reservations reach max_active_jobs. `active` is asked for each
  // job it created only when the list has reached the limit (then the ended ones are dropped). Follow with Commit (the job exists) or Release (it was not created).
  Status Reserve(const std::string& client, const std::function<bool(const std::string&)>& active);
  void Commit(const std::string& client, const std::string& job_id);
  void Release(const std::string& client);

  int watchers(const std::string& client) const;

 private:
  struct Client {
    std::vector<std::string> jobs;
    int pending = 0;
    int watchers = 0;
  };
  void DropIfIdle(const std::string& client);  // mu_ held

  const uint32_t max_jobs_, max_watchers_;
  mutable std::mutex mu_;
  std::map<std::string, Client> clients_;
};

}  // namespace offloadd::daemon
