#pragma once
// ClientQuota: per-client limits (the security review's limits):
//   - active jobs: QUEUED, RUNNING or PAUSED ones the client created (rebuilt from the job store
//     when the daemon starts, Adopt);
//   - concurrent WatchJob streams;
//   - calls that last: CreateJob, which holds a server thread while it waits for a validation
//     slot and validates, and WatchJob streams (callback API: no thread, but counted alike, so
//     that one client's streams stay within its share too): all clients together at most
//     `max_held_calls`, the threads of server.max_threads not kept for job control and health,
//     and one client at most its share of them, so that one client cannot take every thread;
//   - CreateJob calls in progress per client, and the validation slots: `validation_slots` at
//     once, one client at most `validation_slots_per_client` of them.
// A TCP client named in the token file is "token:<name>" (token_auth.h); another is its
// transport address without the port: "ipv4:10.0.0.7", "ipv6:[::1]";
// a Unix-socket client is its user, "unix:uid=<uid>" (PeerCredentials, unix_peer_listener.h); a
// Unix peer string without credentials is "unix".
// Thread-safe.
#include <chrono>
#include <condition_variable>
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

struct ClientQuotaLimits {
  uint32_t max_active_jobs = 1000;  // server.max_active_jobs_per_client
  uint32_t max_watchers = 1024;     // server.max_watchers_per_client
  // CreateJob and WatchJob calls in progress, all clients together, and one client's share.
  uint32_t max_held_calls = UINT32_MAX;
  uint32_t max_held_calls_per_client = UINT32_MAX;
  // CreateJob calls of one client in progress (validating or waiting for a slot).
  uint32_t max_creates_per_client = UINT32_MAX;
  // CreateJob validations at once, all clients together, and one client's share.
  uint32_t validation_slots = 4;
  uint32_t validation_slots_per_client = 2;
};

// The limits derived from the server settings: server.max_threads less the reserved threads
// (server.reserved_threads, 0: max_threads / 8 within [2, 64]) and the listener's pollers are for
// CreateJob and WatchJob, and one client may hold half of those.
ClientQuotaLimits QuotaLimitsFor(uint32_t max_active_jobs, uint32_t max_watchers,
                                 uint32_t max_threads, uint32_t reserved_threads);

class ClientQuota {
 public:
  explicit ClientQuota(const ClientQuotaLimits& limits) : limits_(limits) {}
  ClientQuota(uint32_t max_active_jobs, uint32_t max_watchers)
      : ClientQuota(ClientQuotaLimits{max_active_jobs, max_watchers}) {}

  // A held resource (a WatchJob stream, a CreateJob call, a validation slot), released when
  // destroyed.
  class Lease {
   public:
    enum class Kind { kWatch, kCreate, kValidation };
    Lease(Lease&& o) noexcept : quota_(o.quota_), client_(std::move(o.client_)), kind_(o.kind_) {
      o.quota_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease();

   private:
    friend class ClientQuota;
    Lease(ClientQuota* q, std::string client, Kind kind)
        : quota_(q), client_(std::move(client)), kind_(kind) {}
    ClientQuota* quota_;
    std::string client_;
    Kind kind_;
  };
  using WatchSlot = Lease;

  // RESOURCE_EXHAUSTED naming the limit when the client already has max_watchers streams, or
  // when the stream would pass the held-call limits.
  StatusOr<Lease> AcquireWatcher(const std::string& client);

  // A CreateJob call in progress: RESOURCE_EXHAUSTED naming the limit when the client already has
  // max_creates_per_client of them, or when the call would pass the held-call limits.
  StatusOr<Lease> AcquireCreate(const std::string& client);

  // One of the validation slots, within the client's share: waits until one is free (FIFO among
  // the clients that may take one), `stop()` turns true (CANCELLED; asked every 100 ms: the
  // synchronous gRPC API has no cancellation callback) or `until` passes (RESOURCE_EXHAUSTED).
  StatusOr<Lease> AcquireValidation(const std::string& client, const std::function<bool()>& stop,
                                    std::chrono::steady_clock::time_point until);

  // Reserves a job for `client`: RESOURCE_EXHAUSTED naming the limit when its jobs that are
  // still active and its pending reservations reach max_active_jobs. `active` is asked for each
  // job it created only when the list has reached the limit (then the ended ones are dropped).
  // Follow with Commit (the job exists) or Release (it was not created).
  Status Reserve(const std::string& client, const std::function<bool(const std::string&)>& active);
  void Commit(const std::string& client, const std::string& job_id);
  void Release(const std::string& client);
  // Counts an existing job of `client` (the job store's active jobs when the daemon starts).
  void Adopt(const std::string& client, const std::string& job_id);

  int watchers(const std::string& client) const;
  int held_calls() const;
  int validations() const;
  const ClientQuotaLimits& limits() const { return limits_; }

 private:
  struct Client {
    std::vector<std::string> jobs;
    int pending = 0;
    int watchers = 0;
    int creates = 0;
    int validations = 0;
  };
  void DropIfIdle(const std::string& client);  // mu_ held
  // RESOURCE_EXHAUSTED when one more held call of `client` would pass the limits; mu_ held.
  Status CheckHeldLocked(const std::string& client, const Client& c, const char* what) const;
  void ReleaseLease(const std::string& client, Lease::Kind kind);

  const ClientQuotaLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable slot_freed_;
  std::map<std::string, Client> clients_;
  int held_ = 0;         // CreateJob calls and WatchJob streams in progress
  int validations_ = 0;  // validation slots taken
  uint64_t next_ticket_ = 0;
  std::vector<std::pair<uint64_t, std::string>> waiting_;  // validation waiters, FIFO
};

}  // namespace offloadd::daemon
