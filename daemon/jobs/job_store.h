#pragma once
// JobStore: durable job records and per-job event logs in an embedded SQLite database (WAL mode),
// so a restarted daemon still shows every job and a WatchJob client can resume from a cursor.
//
// Records are the API's own protobuf messages (Job, JobEvent) stored as serialized blobs, with
// the columns needed for filtering and ordering (state, priority, submission sequence) kept
// alongside. Thread-safe: one connection guarded by a mutex (SQLite serialises writers anyway).

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "offloadd/v1/job.pb.h"

struct sqlite3;

namespace offloadd::daemon {

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`. Errors name the file.
  static StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();

  // ALREADY_EXISTS if the id is taken.
  // Also records job.request_id() when set, as a key of job.submitted_by()'s (FAILED_PRECONDITION
  // when another job of that client holds it): request ids are per client (issue #29 item 8).
  Status Insert(const offloadd::v1::Job& job);
  // The job `client` created with this CreateJob request_id; NOT_FOUND when none. Keys recorded
  // before request ids were per client are found with an empty `client`.
  StatusOr<std::string> JobForRequest(const std::string& client, const std::string& request_id);
  // NOT_FOUND if the job does not exist.
  Status Update(const offloadd::v1::Job& job);
  StatusOr<offloadd::v1::Job> Get(const std::string& id);

  struct Page {
    std::vector<offloadd::v1::Job> jobs;
    std::string next_page_token;  // empty on the last page
  };
  // Jobs in submission order, `page_size` at most, after `page_token` (from a previous Page),
  // only those in `states` when it is not empty. INVALID_ARGUMENT for a malformed token.
  StatusOr<Page> List(const std::vector<offloadd::v1::JobState>& states, int page_size,
                      const std::string& page_token);
  // Jobs in any of `states`, highest priority first, then in submission order.
  StatusOr<std::vector<offloadd::v1::Job>> InStates(const std::vector<offloadd::v1::JobState>& states);
  // The number of jobs in each state that has any (one indexed query, no records read).
  StatusOr<std::map<offloadd::v1::JobState, int64_t>> CountByState();

  // Appends an event, assigning the next cursor of that job (1, 2, ...); returns the cursor.
  StatusOr<int64_t> AppendEvent(offloadd::v1::JobEvent* event);
  // Updates the job's record and appends `event` (to that job's log) in one transaction: a crash
  // of the daemon leaves both or neither, so the record never runs ahead of the event log (a
  // resumed job decides from the log which steps it has reported). Returns the event's cursor.
  StatusOr<int64_t> UpdateAndAppend(const offloadd::v1::Job& job, offloadd::v1::JobEvent* event);
  // Events with cursor > after_cursor, oldest first, at most `limit`.
  StatusOr<std::vector<offloadd::v1::JobEvent>> Events(const std::string& job_id, int64_t after_cursor,
                                                       int limit);

 private:
  explicit JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  Status Exec(const char* sql);
  Status Error(const std::string& what);
  // The bodies of Update and AppendEvent; the caller holds mu_.
  Status UpdateLocked(const offloadd::v1::Job& job);
  StatusOr<int64_t> AppendEventLocked(offloadd::v1::JobEvent* event);

  std::mutex mu_;
  sqlite3* db_;
  std::string path_;
};

}  // namespace offloadd::daemon
