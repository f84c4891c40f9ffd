// JobManager's reads of a job's history: its metrics rows and its events, a page at a time
// (ListJobMetrics, ListJobEvents).
#include <algorithm>
#include <string>

#include "daemon/jobs/job_manager.h"

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

namespace {
constexpr int kDefaultMetricRows = 1000, kMaxMetricRows = 10000;
constexpr int kDefaultEvents = 100, kMaxEvents = 1000;

StatusOr<int> PageSize(int limit, int default_size, int max_size) {
  if (limit < 0) return InvalidArgumentError("limit must not be negative, got " + std::to_string(limit));
  if (limit == 0) return default_size;
  return std::min(limit, max_size);
}
}  // namespace

StatusOr<JobStore::MetricsPage> JobManager::Metrics(const std::string& id, std::optional<int64_t> after_step,
                                                    int limit) {
  ASSIGN_OR_RETURN(const int rows, PageSize(limit, kDefaultMetricRows, kMaxMetricRows));
  RETURN_IF_ERROR(store_->Get(id).status());  // NOT_FOUND for an unknown job
  return store_->Metrics(id, after_step, rows);
}

StatusOr<JobManager::EventsPage> JobManager::Events(const std::string& id, int64_t after, int limit, bool progress,
                                                    bool logs) {
  ASSIGN_OR_RETURN(const int size, PageSize(limit, kDefaultEvents, kMaxEvents));
  if (after < 0) return InvalidArgumentError("after must not be negative, got " + std::to_string(after));
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

}  // namespace offloadd::daemon
