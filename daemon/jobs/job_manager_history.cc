// JobManager's reads of a job's history: its metrics rows and its events, a page at a time
// (ListJobMetrics, ListJobEvents), its checkpoints, and the watch that follows its events.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/jobs/job_manager.h"

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

namespace {
constexpr int kDefaultMetricRows = 1000, kMaxMetricRows = 10000;
constexpr int kDefaultEvents = 100, kMaxEvents = 1000;

StatusOr<int> PageSize(int limit, int default_size, int max_size) {
  if (limit < 0)
    return InvalidArgumentError("limit must not be negative, got " + std::to_string(limit));
  if (limit == 0) return default_size;
  return std::min(limit, max_size);
}
}  // namespace

StatusOr<JobStore::MetricsPage> JobManager::Metrics(const std::string& id,
                                                    std::optional<int64_t> after_step, int limit) {
  ASSIGN_OR_RETURN(const int rows, PageSize(limit, kDefaultMetricRows, kMaxMetricRows));
  RETURN_IF_ERROR(store_->Get(id).status());  // NOT_FOUND for an unknown job
  return store_->Metrics(id, after_step, rows);
}

StatusOr<JobManager::EventsPage> JobManager::Events(const std::string& id, int64_t after, int limit,
                                                    bool progress, bool logs) {
  ASSIGN_OR_RETURN(const int size, PageSize(limit, kDefaultEvents, kMaxEvents));
  if (after < 0)
    return InvalidArgumentError("after must not be negative, got " + std::to_string(after));
  RETURN_IF_ERROR(store_->Get(id).status());
  EventsPage page;
  page.next_after = after;
  size_t bytes = 0;
  // Read in chunks until the page is full or the log ends: with progress or logs left out, a
  // chunk may hold none of the events asked for.
  while (true) {
    ASSIGN_OR_RETURN(auto chunk, store_->Events(id, page.next_after, size + 1));
    if (chunk.empty()) return page;
    for (v1::JobEvent& e : chunk) {
      if (static_cast<int>(page.events.size()) == size) {
        page.has_more = true;
        return page;
      }
      const int64_t cursor = e.cursor();
      const bool wanted = (progress || !e.has_progress()) && (logs || !e.has_log());
      if (wanted) {
        const size_t n = e.ByteSizeLong();
        // A page stays under about kListPageBytes (and holds at least one event): far below
        // gRPC's 4 MiB message limit with 1000 log lines of 8 KiB.
        if (!page.events.empty() && bytes + n > kListPageBytes) {
          page.has_more = true;
          return page;
        }
        bytes += n;
        page.events.push_back(std::move(e));
      }
      page.next_after = cursor;
    }
  }
}

StatusOr<std::vector<v1::Checkpoint>> JobManager::Checkpoints(const std::string& id) {
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  std::vector<v1::Checkpoint> out;
  int64_t cursor = 0;
  while (true) {
    ASSIGN_OR_RETURN(auto events, store_->Events(id, cursor, 1000));
    if (events.empty()) break;
    for (const auto& e : events) {
      struct stat st {};
      if (e.has_checkpoint_saved() && stat(e.checkpoint_saved().path().c_str(), &st) == 0) {
        // A checkpoint written again after a resume from an older one replaces its first entry.
        std::erase_if(
            out, [&](const v1::Checkpoint& c) { return c.path() == e.checkpoint_saved().path(); });
        out.push_back(e.checkpoint_saved());
      }
      cursor = e.cursor();
    }
  }
  return out;
}

Status JobManager::Watch(const std::string& id, int64_t after_cursor,
                         const std::function<bool(const v1::JobEvent&)>& sink,
                         const std::function<bool()>& cancelled, int poll_ms) {
  // Registered before the first read, so any event appended after a read that came back empty
  // shows in the slot.
  std::shared_ptr<WatchSlot> slot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& s = watch_slots_[id];
    if (!s) s = std::make_shared<WatchSlot>();
    ++s->watchers;
    slot = s;
  }
  struct Leave {
    JobManager* m;
    const std::string& id;
    ~Leave() {
      std::lock_guard<std::mutex> lock(m->mu_);
      auto it = m->watch_slots_.find(id);
      if (it != m->watch_slots_.end() && --it->second->watchers == 0) m->watch_slots_.erase(it);
    }
  } leave{this, id};

  int64_t cursor = after_cursor;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) {
        return UnavailableError(
            "the daemon is shutting down; watch again after it restarts with after_cursor=" +
            std::to_string(cursor));
      }
    }
    ASSIGN_OR_RETURN(auto events, store_->Events(id, cursor, 256));
    if (events.empty()) {
      // Read the state under mu_: a transition updates the job and appends its event under mu_,
      // so a final state seen here has its event in the store already (read without mu_, the
      // update could show before the event is appended, and the watch would end without it).
      ASSIGN_OR_RETURN(v1::Job job, [&] {
        std::lock_guard<std::mutex> lock(mu_);
        return store_->Get(id);
      }());
      if (IsFinalState(job.state())) {
        ASSIGN_OR_RETURN(auto last, store_->Events(id, cursor, 256));
        if (last.empty()) return OkStatus();
        events = std::move(last);
      }
    }
    for (const auto& e : events) {
      if (!sink(e)) return CancelledError("watcher stopped");
      cursor = e.cursor();
    }
    if (cancelled()) return CancelledError("watcher went away");
    if (events.empty()) {
      // Sleep until the job has an event past `cursor`; wake every poll_ms only to notice a
      // watcher that went away.
      std::unique_lock<std::mutex> lock(mu_);
      while (!shutting_down_ && slot->last_cursor <= cursor) {
        if (slot->appended.wait_for(lock, std::chrono::milliseconds(poll_ms)) ==
            std::cv_status::timeout) {
          lock.unlock();
          if (cancelled()) return CancelledError("watcher went away");
          lock.lock();
        }
      }
    }
  }
}

}  // namespace offloadd::daemon
