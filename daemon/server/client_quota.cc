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

ClientQuotaLimits QuotaLimitsFor(uint32_t max_active_jobs, uint32_t max_watchers,
                                 uint32_t max_threads, uint32_t reserved_threads) {
  ClientQuotaLimits l;
  l.max_active_jobs = max_active_jobs;
  l.max_watchers = max_watchers;
  const uint32_t reserve =
      reserved_threads > 0 ? reserved_threads : std::clamp<uint32_t>(max_threads / 8, 2, 64);
  // Two threads stay with gRPC's pollers (one completion queue, one to two pollers), which accept
  // the calls; a call that finds none would be refused by gRPC itself.
  constexpr uint32_t kPollers = 2;
  l.max_held_calls = max_threads > reserve + kPollers ? max_threads - reserve - kPollers : 1;
  l.max_held_calls_per_client = std::max<uint32_t>(1, l.max_held_calls / 2);
  // A client's CreateJob calls are bounded by its share of the threads alone: one user's many
  // concurrent creators (a load test, a pipeline) are served, at most 2 validating at once.
  l.max_creates_per_client = l.max_held_calls_per_client;
  return l;
}

ClientQuota::Lease::~Lease() {
  if (quota_ != nullptr) quota_->ReleaseLease(client_, kind_);
}

void ClientQuota::ReleaseLease(const std::string& client, Lease::Kind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  Client& c = it->second;
  switch (kind) {
    case Lease::Kind::kWatch:
      --c.watchers;
      --held_;
      break;
    case Lease::Kind::kCreate:
      --c.creates;
      --held_;
      break;
    case Lease::Kind::kValidation:
      --c.validations;
      --validations_;
      slot_freed_.notify_all();
      break;
  }
  DropIfIdle(client);
}

Status ClientQuota::CheckHeldLocked(const std::string& client, const Client& c,
                                    const char* what) const {
  const int mine = c.watchers + c.creates;
  if (held_ >= static_cast<int64_t>(limits_.max_held_calls)) {
    return ResourceExhaustedError(
        std::string(what) + " refused: the server has " + std::to_string(held_) +
        " CreateJob and WatchJob calls in progress, all the threads it gives them "
        "(server.max_threads less server.reserved_threads, kept for job control and "
        "health); retry later");
  }
  if (mine >= static_cast<int64_t>(limits_.max_held_calls_per_client)) {
    return ResourceExhaustedError(
        std::string(what) + " refused: client " + client + " has " + std::to_string(mine) +
        " CreateJob and WatchJob calls in progress, its share (" +
        std::to_string(limits_.max_held_calls_per_client) +
        ", half of the threads server.max_threads gives them); close a stream or "
        "wait for a call to answer");
  }
  return OkStatus();
}

StatusOr<ClientQuota::Lease> ClientQuota::AcquireWatcher(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  Client& c = clients_[client];
  if (c.watchers >= static_cast<int64_t>(limits_.max_watchers)) {
    const int open = c.watchers;
    DropIfIdle(client);
    return ResourceExhaustedError("client " + client + " has " + std::to_string(open) +
                                  " WatchJob streams open, the server.max_watchers_per_client "
                                  "limit; close one first");
  }
  if (Status held = CheckHeldLocked(client, c, "WatchJob"); !held.ok()) {
    DropIfIdle(client);
    return held;
  }
  ++c.watchers;
  ++held_;
  return Lease(this, client, Lease::Kind::kWatch);
}

StatusOr<ClientQuota::Lease> ClientQuota::AcquireCreate(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  Client& c = clients_[client];
  if (c.creates >= static_cast<int64_t>(limits_.max_creates_per_client)) {
    const int open = c.creates;
    DropIfIdle(client);
    return ResourceExhaustedError(
        "client " + client + " has " + std::to_string(open) +
        " CreateJob calls in progress (validating or waiting for one of the " +
        std::to_string(limits_.validation_slots) +
        " validation slots), the most one client may have (its share of the threads "
        "server.max_threads gives CreateJob and WatchJob); wait for one to answer");
  }
  if (Status held = CheckHeldLocked(client, c, "CreateJob"); !held.ok()) {
    DropIfIdle(client);
    return held;
  }
  ++c.creates;
  ++held_;
  return Lease(this, client, Lease::Kind::kCreate);
}

StatusOr<ClientQuota::Lease> ClientQuota::AcquireValidation(
    const std::string& client, const std::function<bool()>& stop,
    std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  waiting_.emplace_back(ticket, client);
  // The first waiter whose client is under its share takes the next free slot: FIFO, except that
  // a client at its share does not hold up the others.
  const auto my_turn = [&] {
    if (validations_ >= static_cast<int64_t>(limits_.validation_slots)) return false;
    for (const auto& [t, who] : waiting_) {
      auto it = clients_.find(who);
      const int taken = it == clients_.end() ? 0 : it->second.validations;
      if (taken < static_cast<int64_t>(limits_.validation_slots_per_client)) return t == ticket;
    }
    return false;
  };
  Status refused;
  while (!my_turn()) {
    if (stop && stop()) {
      refused = CancelledError("CreateJob was cancelled while waiting for a validation slot");
      break;
    }
    if (std::chrono::steady_clock::now() >= until) {
      refused = ResourceExhaustedError(
          "no job validation slot came free in time (" + std::to_string(limits_.validation_slots) +
          " validations at once, at most " + std::to_string(limits_.validation_slots_per_client) +
          " for one client); retry CreateJob later");
      break;
    }
    slot_freed_.wait_for(lock, std::chrono::milliseconds(100));
  }
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), std::make_pair(ticket, client)));
  if (!refused.ok()) {
    slot_freed_.notify_all();  // a waiter behind this one may be first now
    DropIfIdle(client);
    return refused;
  }
  ++clients_[client].validations;
  ++validations_;
  slot_freed_.notify_all();  // the next eligible waiter may take another free slot
  return Lease(this, client, Lease::Kind::kValidation);
}

void ClientQuota::Adopt(const std::string& client, const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Client& c = clients_[client];
  if (std::find(c.jobs.begin(), c.jobs.end(), job_id) == c.jobs.end()) c.jobs.push_back(job_id);
}

Status ClientQuota::Reserve(const std::string& client,
                            const std::function<bool(const std::string&)>& active) {
  std::lock_guard<std::mutex> lock(mu_);
  Client& c = clients_[client];
  // Asked only at the limit: a job list below it needs no pruning, and a CreateJob then costs no
  // job lookups (200 concurrent clients each looking up every earlier job churned the allocator).
  if (c.jobs.size() + static_cast<size_t>(c.pending) >= limits_.max_active_jobs) {
    c.jobs.erase(std::remove_if(c.jobs.begin(), c.jobs.end(),
                                [&](const std::string& id) { return !active(id); }),
                 c.jobs.end());
  }
  const int held = static_cast<int>(c.jobs.size()) + c.pending;
  if (held >= static_cast<int64_t>(limits_.max_active_jobs)) {
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

int ClientQuota::held_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

int ClientQuota::validations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return validations_;
}

void ClientQuota::DropIfIdle(const std::string& client) {
  auto it = clients_.find(client);
  if (it != clients_.end() && it->second.jobs.empty() && it->second.pending == 0 &&
      it->second.watchers == 0 && it->second.creates == 0 && it->second.validations == 0) {
    clients_.erase(it);
  }
}

}  // namespace offloadd::daemon
