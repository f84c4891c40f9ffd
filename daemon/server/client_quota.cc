#include "daemon/server/client_quota.h"

#include <algorithm>

namespace offloadd::daemon {

std::string ClientKey(std::string_view peer) {
  if (peer.rfind("unix:", 0) == 0 || peer.rfind("unix-abstract:", 0) == 0 || peer.empty()) {
    return "unix";
  }
  const size_t colon = peer.rfind(':');
  const size_t scheme = peer.find(':');
  if (colon == std::string_view::npos || colon == scheme) return std::string(peer);
  const std::string_view port = peer.substr(colon + 1);
  if (port.empty() || !std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return std::string(peer);
  }
  return std::string(peer.substr(0, colon));  // drop the port
}

ClientQuota::WatchSlot::~WatchSlot() {
  if (quota_ == nullptr) return;
  std::lock_guard<std::mutex> lock(quota_->mu_);
  auto it = quota_->clients_.find(client_);
  if (it == quota_->clients_.end()) return;
  --it->second.watchers;
  quota_->DropIfIdle(client_);
}

StatusOr<ClientQuota::WatchSlot> ClientQuota::AcquireWatcher(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  Client& c = clients_[client];
  if (c.watchers >= static_cast<int>(max_watchers_)) {
    const int open = c.watchers;
    DropIfIdle(client);
    return ResourceExhaustedError("client " + client + " has " + std::to_string(open) +
                                  " WatchJob streams open, the server.max_watchers_per_client "
                                  "limit; close one first");
  }
  ++c.watchers;
  return WatchSlot(this, client);
}

Status ClientQuota::Reserve(const std::string& client,
                            const std::function<bool(const std::string&)>& active) {
  std::lock_guard<std::mutex> lock(mu_);
  Client& c = clients_[client];
  // Asked only at the limit: a job list below it needs no pruning, and a CreateJob then costs no
  // job lookups (200 concurrent clients each looking up every earlier job churned the allocator).
  if (c.jobs.size() + static_cast<size_t>(c.pending) >= max_jobs_) {
    c.jobs.erase(std::remove_if(c.jobs.begin(), c.jobs.end(),
                                [&](const std::string& id) { return !active(id); }),
                 c.jobs.end());
  }
  const int held = static_cast<int>(c.jobs.size()) + c.pending;
  if (held >= static_cast<int>(max_jobs_)) {
    DropIfIdle(client);
    return ResourceExhaustedError(
        "client " + client + " has " + std::to_string(held) +
        " active jobs (queued, running or paused), the server.max_active_jobs_per_client limit; "
        "wait for one to finish or cancel one");
  }
  ++c.pending;
  return OkStatus();
}

void ClientQuota::Commit(const std::string& client, const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Client& c = clients_[client];
  c.pending = std::max(0, c.pending - 1);
  if (std::find(c.jobs.begin(), c.jobs.end(), job_id) == c.jobs.end()) c.jobs.push_back(job_id);
}

void ClientQuota::Release(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  it->second.pending = std::max(0, it->second.pending - 1);
  DropIfIdle(client);
}

int ClientQuota::watchers(const std::string& client) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.watchers;
}

void ClientQuota::DropIfIdle(const std::string& client) {
  auto it = clients_.find(client);
  if (it != clients_.end() && it->second.jobs.empty() && it->second.pending == 0 &&
      it->second.watchers == 0) {
    clients_.erase(it);
  }
}

}  // namespace offloadd::daemon
